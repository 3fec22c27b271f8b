#include "data/shard.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/errors.h"
#include "data/dataset.h"

// Shards are little-endian on disk and read in place through mmap.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shards assume a little-endian host");

#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)

// Bytes per token for a (magic, version) pair: titan's two versions, and llm.c's Llama 3
// shards (dev/data/data_common.py writes magic 20240801, version 7, uint32 tokens); 0 if unknown.
static int token_width(int32_t magic, int32_t version) {
    if (magic == SHARD_MAGIC && version == 1) return 2;
    if (magic == SHARD_MAGIC && version == 2) return 4;
    if (magic == SHARD_MAGIC_LLMC_LLAMA3 && version == 7) return 4;
    return 0;
}

static bool header_check(const uint8_t *map, size_t bytes, const char *file, int *width,
                         char *err, size_t errlen) {
    int32_t header[3];
    memcpy(header, map, sizeof(header));
    if (header[0] != SHARD_MAGIC && header[0] != SHARD_MAGIC_LLMC_LLAMA3)
        return error_set(err, errlen,
                    "token shard %s has bad magic %d (expected %d: not an llm.c/titan shard)", file,
                    header[0], SHARD_MAGIC);
    *width = token_width(header[0], header[1]);
    if (*width == 0)
        return error_set(err, errlen,
                    "token shard %s has unsupported version %d (1: uint16 tokens, 2: uint32)", file,
                    header[1]);
    int64_t want = SHARD_HEADER_BYTES + (int64_t)header[2] * *width;
    if (header[2] < 0 || (int64_t)bytes != want)
        return error_set(err, errlen,
                    "token shard %s is truncated or corrupt: its header promises %d tokens "
                    "(%lld bytes) but the file has %zu bytes",
                    file, header[2], (long long)want, bytes);
    return true;
}

static bool shard_map(TokenShard *sh, const char *file, char *err, size_t errlen) {
    int fd = open(file, O_RDONLY);
    if (fd < 0) return error_set(err, errlen, "cannot open token shard %s: %s", file, strerror(errno));
    struct stat st;
    SYS_CHECK(fstat(fd, &st));
    if (!S_ISREG(st.st_mode) || st.st_size < SHARD_HEADER_BYTES) {
        SYS_CHECK(close(fd));
        return error_set(err, errlen,
                    "token shard %s is truncated or not a shard (%lld bytes; the header is %d)",
                    file, (long long)st.st_size, SHARD_HEADER_BYTES);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) die_internal(__FILE__, __LINE__, "mmap %s: %s", file, strerror(errno));
    SYS_CHECK(close(fd));  // the mapping outlives the descriptor
    *sh = (TokenShard){.map = map, .bytes = (size_t)st.st_size,
                       .tokens = (const uint8_t *)map + SHARD_HEADER_BYTES};
    if (header_check(map, sh->bytes, file, &sh->width, err, errlen)) return true;
    SYS_CHECK(munmap(map, sh->bytes));
    return false;
}

static char **dir_list(const char *path, int *n, char *err, size_t errlen) {
    char **files = dataset_folder_files(path, dataset_file_is_shard, n);
    if (!files)
        error_set(err, errlen, "cannot read token dataset folder %s: %s", path, strerror(errno));
    else if (*n == 0)
        error_set(err, errlen, "token dataset folder %s has no .bin files", path);
    return files;
}

// The shard files of a dataset path, in stream order; *n = 0 (and err set) on failure.
static char **files_list(const char *path, int *n, char *err, size_t errlen) {
    struct stat st;
    *n = 0;
    if (stat(path, &st) != 0) {
        error_set(err, errlen, "token dataset %s does not exist", path);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) return dir_list(path, n, err, errlen);
    char **files = xmalloc(sizeof(char *));
    files[0] = strdup(path);
    CHECK(files[0]);
    *n = 1;
    return files;
}

static bool shards_map(TokenStream *s, char **files, int n, char *err, size_t errlen) {
    s->shards = xcalloc((size_t)n, sizeof(TokenShard));
    s->first = xcalloc((size_t)n + 1, sizeof(int64_t));
    for (int i = 0; i < n; i++) {
        if (!shard_map(&s->shards[i], files[i], err, errlen)) return false;
        s->n_shards = i + 1;
        const TokenShard *sh = &s->shards[i];
        int64_t count = (int64_t)(sh->bytes - SHARD_HEADER_BYTES) / sh->width;
        s->first[i + 1] = s->first[i] + count;
    }
    s->num_tokens = s->first[n];
    if (s->num_tokens == 0) return error_set(err, errlen, "token dataset %s holds no tokens", s->path);
    return true;
}

bool token_stream_try_open(TokenStream *s, const char *path, char *err, size_t errlen) {
    *s = (TokenStream){.path = strdup(path)};
    CHECK(s->path);
    int n;
    char **files = files_list(path, &n, err, errlen);
    bool ok = n > 0 && shards_map(s, files, n, err, errlen);
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    if (!ok) token_stream_close(s);
    return ok;
}

void token_stream_open(TokenStream *s, const char *path) {
    char err[1024];
    if (!token_stream_try_open(s, path, err, sizeof(err))) die_user("%s", err);
}

void token_stream_from_tokens(TokenStream *s, const char *path, int32_t *tokens, int64_t n) {
    *s = (TokenStream){.path = strdup(path), .n_shards = 1, .num_tokens = n, .owned = tokens};
    CHECK(s->path);
    s->shards = xcalloc(1, sizeof(TokenShard));
    s->shards[0] = (TokenShard){.tokens = (const uint8_t *)tokens, .width = 4};
    s->first = xcalloc(2, sizeof(int64_t));
    s->first[1] = n;
}

void token_stream_set_flags(TokenStream *s, uint8_t *flags) {
    CHECK(s->owned && !s->flags);
    s->flags = flags;
}

void token_stream_close(TokenStream *s) {
    for (int i = 0; i < s->n_shards; i++)
        if (s->shards[i].map) SYS_CHECK(munmap((void *)s->shards[i].map, s->shards[i].bytes));
    free(s->owned);
    free(s->flags);
    free(s->shards);
    free(s->first);
    free(s->path);
    *s = (TokenStream){0};
}

int64_t token_stream_num_tokens(const TokenStream *s) { return s->num_tokens; }

int64_t token_stream_num_windows(const TokenStream *s, int seq_len) {
    CHECK(seq_len > 0);
    int64_t n = (s->num_tokens - 1) / seq_len;
    if (n < 1)
        die_user("token dataset %s has %lld tokens, too few for one window of seq_len + 1 = %d",
                 s->path, (long long)s->num_tokens, seq_len + 1);
    return n;
}

static void tokens_copy(const TokenStream *s, int64_t start, int64_t count, int32_t *out) {
    for (int i = dataset_shard_find(s->first, s->n_shards, start); count > 0; i++) {
        CHECK(i < s->n_shards);
        int64_t offset = start - s->first[i], take = s->first[i + 1] - start;
        if (take > count) take = count;
        const uint8_t *tokens = s->shards[i].tokens;
        for (int64_t k = 0; k < take; k++)
            out[k] = s->shards[i].width == 2 ? ((const uint16_t *)tokens)[offset + k]
                                               : (int32_t)((const uint32_t *)tokens)[offset + k];
        out += take, start += take, count -= take;
    }
}

void token_stream_window(const TokenStream *s, int64_t w, int seq_len, int32_t *out) {
    CHECK(w >= 0);
    int64_t n = token_stream_num_windows(s, seq_len);
    tokens_copy(s, (w % n) * seq_len, (int64_t)seq_len + 1, out);
}

// out[t] = whether token t + offset of window w has the TOKEN_* bit.
static void window_bits(const TokenStream *s, int64_t w, int seq_len, int offset, uint8_t bit,
                        int32_t *out) {
    CHECK(w >= 0 && s->flags);
    const uint8_t *first = s->flags + (w % token_stream_num_windows(s, seq_len)) * seq_len;
    for (int t = 0; t < seq_len; t++) out[t] = (first[t + offset] & bit) != 0;
}

void token_stream_window_mask(const TokenStream *s, int64_t w, int seq_len, int32_t *out) {
    window_bits(s, w, seq_len, 1, TOKEN_TRAINED, out);
}

void token_stream_window_ends(const TokenStream *s, int64_t w, int seq_len, int32_t *out) {
    window_bits(s, w, seq_len, 0, TOKEN_ENDS_DOCUMENT, out);
}

static void tokens_write(FILE *f, const char *tmp, const uint32_t *tokens, int64_t n,
                         int version) {
    if (version == 2) {
        if (fwrite(tokens, 4, (size_t)n, f) != (size_t)n)
            die_user("cannot write %s: %s", tmp, strerror(errno));
        return;
    }
    uint16_t chunk[4096];
    for (int64_t i = 0; i < n; i += 4096) {
        size_t m = (size_t)(n - i < 4096 ? n - i : 4096);
        for (size_t k = 0; k < m; k++) {
            CHECK(tokens[i + (int64_t)k] < 65536);
            chunk[k] = (uint16_t)tokens[i + (int64_t)k];
        }
        if (fwrite(chunk, 2, m, f) != m) die_user("cannot write %s: %s", tmp, strerror(errno));
    }
}

void shard_write(const char *path, const uint32_t *tokens, int64_t n, int version) {
    CHECK(version == 1 || version == 2);
    CHECK(n >= 0 && n <= INT32_MAX);  // the header's count is an int32
    char *tmp;
    CHECK(asprintf(&tmp, "%s.tmp", path) >= 0);
    FILE *f = fopen(tmp, "wb");
    if (!f) die_user("cannot write token shard %s: %s", tmp, strerror(errno));
    int32_t header[SHARD_HEADER_INTS] = {SHARD_MAGIC, version, (int32_t)n};
    if (fwrite(header, sizeof(header), 1, f) != 1)
        die_user("cannot write %s: %s", tmp, strerror(errno));
    tokens_write(f, tmp, tokens, n, version);
    if (fflush(f) != 0) die_user("cannot write %s: %s", tmp, strerror(errno));
    SYS_CHECK(fsync(fileno(f)));
    CHECK(fclose(f) == 0);
    SYS_CHECK(rename(tmp, path));
    free(tmp);
}
