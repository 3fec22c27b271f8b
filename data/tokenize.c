#include "data/tokenize.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "core/errors.h"
#include "data/shard.h"

#define USAGE "usage: titan tokenize --tokenizer bytes --out OUT.bin FILE..."

// The seam for later tokenizers (BPE): every one emits at most one token per input byte, so an
// output buffer of len tokens always suffices. Returns the number of tokens written.
typedef struct {
    const char *name;
    int64_t vocab_size;
    int64_t (*encode)(const uint8_t *text, size_t len, uint32_t *out);
} Tokenizer;

static int64_t bytes_encode(const uint8_t *text, size_t len, uint32_t *out) {
    for (size_t i = 0; i < len; i++) out[i] = text[i];
    return (int64_t)len;
}

static const Tokenizer TOKENIZERS[] = {{"bytes", 256, bytes_encode}};

static const Tokenizer *tokenizer_find(const char *name) {
    for (size_t i = 0; i < sizeof(TOKENIZERS) / sizeof(TOKENIZERS[0]); i++)
        if (strcmp(TOKENIZERS[i].name, name) == 0) return &TOKENIZERS[i];
    die_user("tokenizer '%s' is not supported yet (only 'bytes')", name);
}

static size_t file_size(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) die_user("input file %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) die_user("input file %s is not a regular file", path);
    return (size_t)st.st_size;
}

static void file_read(const char *path, uint8_t *buf, size_t size) {
    FILE *f = fopen(path, "rb");
    if (!f) die_user("cannot read input file %s: %s", path, strerror(errno));
    if (fread(buf, 1, size, f) != size) die_user("input file %s changed while being read", path);
    CHECK(fclose(f) == 0);
}

typedef struct {
    const char *tokenizer, *out;
    char **files;
    int n_files;
} TokenizeArgs;

static TokenizeArgs args_parse(int argc, char **argv) {
    TokenizeArgs a = {.files = xmalloc((size_t)argc * sizeof(char *))};
    for (int i = 1; i < argc; i++) {
        bool has_value = i + 1 < argc;
        if (strcmp(argv[i], "--tokenizer") == 0 && has_value) a.tokenizer = argv[++i];
        else if (strcmp(argv[i], "--out") == 0 && has_value) a.out = argv[++i];
        else if (argv[i][0] == '-') die_user("tokenize: bad option %s; " USAGE, argv[i]);
        else a.files[a.n_files++] = argv[i];
    }
    if (!a.tokenizer || !a.out || a.n_files == 0) die_user(USAGE);
    return a;
}

int tokenize_main(int argc, char **argv) {
    TokenizeArgs a = args_parse(argc, argv);
    const Tokenizer *tok = tokenizer_find(a.tokenizer);
    size_t *sizes = xmalloc((size_t)a.n_files * sizeof(size_t)), total = 0;
    for (int i = 0; i < a.n_files; i++) total += sizes[i] = file_size(a.files[i]);
    if (total == 0) die_user("tokenize: the input files are empty");
    // A shard's header counts tokens in an int32, and no tokenizer emits more tokens than bytes.
    if (total > INT32_MAX) die_user("tokenize: %zu input bytes are more than a shard holds", total);
    uint8_t *text = xmalloc(total);
    uint32_t *tokens = xmalloc(total * sizeof(uint32_t));
    for (size_t i = 0, at = 0; i < (size_t)a.n_files; i++) {
        file_read(a.files[i], text + at, sizes[i]);
        at += sizes[i];
    }
    int64_t n_tokens = tok->encode(text, total, tokens);
    shard_write(a.out, tokens, n_tokens, tok->vocab_size <= 65536 ? 1 : 2);
    log_info("tokenize: %d files, %zu bytes -> %lld tokens (%s), wrote %s", a.n_files, total,
             (long long)n_tokens, tok->name, a.out);
    free(text), free(tokens), free(sizes), free(a.files);
    return 0;
}
