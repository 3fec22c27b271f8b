// Tokenizer tests: every reference vector (tiktoken's ids for GPT-2, cl100k_base and Llama 3,
// the last from both its tiktoken and its tokenizer.json file) encodes exactly and decodes
// back; special tokens; byte fallback for invalid UTF-8; the `bytes` vocabulary; small
// hand-written files in each format; two threads encoding at once; the one-line errors.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/errors.h"
#include "data/tokenizer.h"
#include "data/tokenizer_impl.h"  // tokenizer_lookup, for the naive reference merge

#include "tests/unit/test_support.h"

#define TOKENIZERS "build/test-data/tokenizers/"

enum { GPT2, CL100K, LLAMA3_TIKTOKEN, LLAMA3_JSON, N_REFERENCE };

static const struct {
    const char *path, *vectors;
    int vocab_size, bos, eos, first_special;
    const char *format;
} REFERENCE[N_REFERENCE] = {
    [GPT2] = {TOKENIZERS "gpt2", "gpt2", 50257, 50256, 50256, 50256, "gpt2"},
    [CL100K] = {TOKENIZERS "cl100k_base.tiktoken", "cl100k_base", 100277, -1, 100257, 100257,
                "tiktoken"},
    [LLAMA3_TIKTOKEN] = {TOKENIZERS "llama3/tokenizer.model", "llama3", 128256, 128000, 128001,
                         128000, "tiktoken"},
    [LLAMA3_JSON] = {TOKENIZERS "llama3/tokenizer.json", "llama3", 128256, 128000, 128001,
                     128000, "huggingface"},
};

static Tokenizer *reference[N_REFERENCE];

static int reference_load(void **state) {
    (void)state;
    for (int i = 0; i < N_REFERENCE; i++) reference[i] = tokenizer_load(REFERENCE[i].path);
    return 0;
}

static int reference_free(void **state) {
    (void)state;
    for (int i = 0; i < N_REFERENCE; i++) tokenizer_free(reference[i]);
    return 0;
}

// The encoding of text must be want (n ids), and its decoding the text again.
static void expect_encoding(const Tokenizer *t, const char *text, size_t len,
                            const int32_t *want, size_t n) {
    int32_t *ids = NULL;
    size_t cap = 0, got = tokenizer_encode(t, text, len, &ids, &cap), back_len;
    assert_int_equal(got, n);
    assert_memory_equal(ids, want, n * sizeof(int32_t));
    char *back = tokenizer_decode(t, ids, got, &back_len);
    assert_int_equal(back_len, len);
    assert_memory_equal(back, text, len);
    free(back);
    free(ids);
}

// A vectors file: one {"text", "ids"} object a line.
typedef struct {
    json_t *lines[400];
    int n;
} Vectors;

static Vectors vectors_read(const char *name) {
    char path[256];
    snprintf(path, sizeof path, TOKENIZERS "vectors/%s.jsonl", name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    Vectors v = {.n = 0};
    char line[65536];
    while (fgets(line, sizeof line, f)) {
        assert_true(v.n < 400);
        v.lines[v.n] = json_loads(line, 0, NULL);
        assert_non_null(v.lines[v.n++]);
    }
    fclose(f);
    assert_true(v.n > 300);
    return v;
}

static void vectors_free(Vectors *v) {
    for (int i = 0; i < v->n; i++) json_decref(v->lines[i]);
}

static const char *vector_text(const json_t *line, size_t *len) {
    const json_t *text = json_object_get(line, "text");
    *len = json_string_length(text);
    return json_string_value(text);
}

static size_t vector_ids(const json_t *line, int32_t *ids, size_t cap) {
    const json_t *array = json_object_get(line, "ids");
    size_t i;
    json_t *id;
    assert_true(json_array_size(array) <= cap);
    json_array_foreach(array, i, id) ids[i] = (int32_t)json_integer_value(id);
    return json_array_size(array);
}

static void vectors_check(int which) {
    Vectors v = vectors_read(REFERENCE[which].vectors);
    static int32_t want[1 << 16];
    for (int i = 0; i < v.n; i++) {
        size_t len, n = vector_ids(v.lines[i], want, 1 << 16);
        const char *text = vector_text(v.lines[i], &len);
        expect_encoding(reference[which], text, len, want, n);
    }
    vectors_free(&v);
}

static void test_vectors_gpt2(void **state) { (void)state, vectors_check(GPT2); }
static void test_vectors_cl100k(void **state) { (void)state, vectors_check(CL100K); }

// cl100k's holes (100256, 100261..100275: ids no token has, as in tiktoken) decode to no bytes,
// so generate cannot stop with an internal error when a model samples one.
static void test_vocabulary_holes_decode_empty(void **state) {
    (void)state;
    const int32_t with_holes[] = {97, 100256, 100261, 100275, 98}, without[] = {97, 98};
    size_t len, want_len;
    char *text = tokenizer_decode(reference[CL100K], with_holes, 5, &len);
    char *want = tokenizer_decode(reference[CL100K], without, 2, &want_len);
    assert_int_equal(want_len, 2);
    assert_int_equal(len, want_len);
    assert_memory_equal(text, want, len);
    free(text);
    free(want);
}
static void test_vectors_llama3_tiktoken(void **state) {
    (void)state, vectors_check(LLAMA3_TIKTOKEN);
}
static void test_vectors_llama3_json(void **state) { (void)state, vectors_check(LLAMA3_JSON); }

static void expect_token(const Tokenizer *t, int32_t id, const char *text) {
    size_t len;
    const char *bytes = tokenizer_token_bytes(t, id, &len);
    assert_int_equal(len, strlen(text));
    assert_memory_equal(bytes, text, len);
}

static void test_specials(void **state) {
    (void)state;
    for (int i = 0; i < N_REFERENCE; i++) {
        assert_int_equal(tokenizer_vocab_size(reference[i]), REFERENCE[i].vocab_size);
        assert_int_equal(tokenizer_bos_id(reference[i]), REFERENCE[i].bos);
        assert_int_equal(tokenizer_eos_id(reference[i]), REFERENCE[i].eos);
        assert_string_equal(tokenizer_format(reference[i]), REFERENCE[i].format);
    }
    expect_token(reference[GPT2], 50256, "<|endoftext|>");
    expect_token(reference[CL100K], 100257, "<|endoftext|>");
    expect_token(reference[CL100K], 100258, "<|fim_prefix|>");
    expect_token(reference[CL100K], 100259, "<|fim_middle|>");
    expect_token(reference[CL100K], 100260, "<|fim_suffix|>");
    expect_token(reference[CL100K], 100276, "<|endofprompt|>");
    expect_token(reference[LLAMA3_TIKTOKEN], 128006, "<|start_header_id|>");
    expect_token(reference[LLAMA3_TIKTOKEN], 128009, "<|eot_id|>");
    expect_token(reference[LLAMA3_TIKTOKEN], 128255, "<|reserved_special_token_250|>");
    // The rank file's built-in list against tokenizer.json's added_tokens, all 256.
    for (int32_t id = 128000; id < 128256; id++) {
        size_t len;
        const char *name = tokenizer_token_bytes(reference[LLAMA3_JSON], id, &len);
        char text[64];
        snprintf(text, sizeof text, "%.*s", (int)len, name);
        expect_token(reference[LLAMA3_TIKTOKEN], id, text);
    }
}

// A special token's text is ordinary text to encode: it never yields the special id.
static void test_specials_not_encoded(void **state) {
    (void)state;
    const char *text = "<|endoftext|><|begin_of_text|>";
    for (int i = 0; i < N_REFERENCE; i++) {
        int32_t *ids = NULL;
        size_t cap = 0, n = tokenizer_encode(reference[i], text, strlen(text), &ids, &cap);
        assert_true(n > 2);
        for (size_t k = 0; k < n; k++) assert_true(ids[k] < REFERENCE[i].first_special);
        free(ids);
    }
}

static void test_invalid_utf8_round_trip(void **state) {
    (void)state;
    const char text[] = "\xff\xfe abc \xc3";
    for (int i = 0; i < N_REFERENCE; i++) {
        int32_t *ids = NULL;
        size_t cap = 0, len, n = tokenizer_encode(reference[i], text, sizeof text - 1, &ids, &cap);
        char *back = tokenizer_decode(reference[i], ids, n, &len);
        assert_int_equal(len, sizeof text - 1);
        assert_memory_equal(back, text, len);
        expect_token(reference[i], ids[0], "\xff");  // each invalid byte is its own token
        expect_token(reference[i], ids[1], "\xfe");
        expect_token(reference[i], ids[n - 1], "\xc3");
        free(back);
        free(ids);
    }
}

// Both threads encode every text; each must get the single-threaded ids.
static void test_two_threads_agree(void **state) {
    (void)state;
    Vectors v = vectors_read("llama3");
    const Tokenizer *t = reference[LLAMA3_TIKTOKEN];
    int mismatches = 0;
#pragma omp parallel num_threads(2) reduction(+ : mismatches)
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < v.n; i++) {
            int32_t want[4096], *ids = NULL;
            size_t len, cap = 0, n = vector_ids(v.lines[i], want, 4096);
            const char *text = vector_text(v.lines[i], &len);
            size_t got = tokenizer_encode(t, text, len, &ids, &cap);
            mismatches += got != n || memcmp(ids, want, n * sizeof(int32_t)) != 0;
            free(ids);
        }
    }
    assert_int_equal(mismatches, 0);
    vectors_free(&v);
}

static void test_folder_and_merges_file_load(void **state) {
    (void)state;
    const char *text = "Hello world, tokenizers!";
    int32_t *want = NULL, *ids = NULL;
    size_t cap = 0, n = tokenizer_encode(reference[GPT2], text, strlen(text), &want, &cap);
    Tokenizer *t = tokenizer_load(TOKENIZERS "gpt2/vocab.bpe");
    assert_string_equal(tokenizer_format(t), "gpt2");
    cap = 0;
    assert_int_equal(tokenizer_encode(t, text, strlen(text), &ids, &cap), n);
    assert_memory_equal(ids, want, n * sizeof(int32_t));
    tokenizer_free(t);
    free(want);
    free(ids);
}

// tiktoken's byte_pair_merge as first published, written out independently of titan's pair
// table: rescan every boundary for the pair whose joined bytes have the lowest rank (a rank
// file's rank is the id), join it, repeat until no joined pair is a token. O(n^2).
static size_t naive_merge(const Tokenizer *t, const char *s, size_t n, int32_t *ids) {
    size_t *cut = malloc((n + 1) * sizeof(size_t)), m = n + 1;  // the part boundaries
    for (size_t i = 0; i <= n; i++) cut[i] = i;
    for (;;) {
        size_t best = 0;
        int32_t best_rank = INT32_MAX;
        for (size_t i = 0; i + 2 < m; i++) {
            int32_t rank = tokenizer_lookup(t, s + cut[i], cut[i + 2] - cut[i]);
            if (rank >= 0 && rank < best_rank) best_rank = rank, best = i;
        }
        if (best_rank == INT32_MAX) break;
        memmove(&cut[best + 1], &cut[best + 2], (m - best - 2) * sizeof(size_t));
        m--;
    }
    for (size_t i = 0; i + 1 < m; i++)
        ids[i] = tokenizer_lookup(t, s + cut[i], cut[i + 1] - cut[i]);
    free(cut);
    return m - 1;
}

// One long word (letters only, so one piece) of about len bytes into text: runs of one letter
// (equal ranks side by side: the leftmost must merge first) and random letters, some of them
// two or three bytes long. Returns its length.
static size_t long_word(char *text, size_t len, unsigned seed) {
    static const char *const LETTERS[] = {"a", "e", "t", "s", "q", "z", "\xc3\xa9", "\xc3\x9f",
                                          "\xd0\x96", "\xe4\xb8\xad", "\xe6\x96\x87"};
    const size_t n_letters = sizeof LETTERS / sizeof LETTERS[0];
    size_t at = 0;
    srand(seed);
    while (at + 3 * 40 < len) {
        bool run = rand() % 3 == 0;
        const char *letter = LETTERS[(size_t)rand() % n_letters];
        for (int i = 1 + rand() % 40; i > 0; i--) {
            if (!run) letter = LETTERS[(size_t)rand() % n_letters];
            at += (size_t)sprintf(text + at, "%s", letter);
        }
    }
    return at;
}

// A piece thousands of bytes long (which titan merges with a heap, in O(n log n)) gives the
// ids of the naive rescan, for both rank files; and Llama 3's tokenizer.json (merge-list
// ranks) gives its rank file's ids on a longer one.
static void test_long_piece_merges_as_tiktoken(void **state) {
    (void)state;
    static char text[40000];
    static int32_t want[40000];
    int32_t *ids = NULL;
    size_t cap = 0;
    for (int which = CL100K; which <= LLAMA3_TIKTOKEN; which++) {
        size_t len = long_word(text, 3000, (unsigned)which);
        size_t n = naive_merge(reference[which], text, len, want);
        assert_true(n > 100);
        expect_encoding(reference[which], text, len, want, n);
    }
    size_t len = long_word(text, sizeof text, 7);
    size_t n = tokenizer_encode(reference[LLAMA3_TIKTOKEN], text, len, &ids, &cap);
    memcpy(want, ids, n * sizeof(int32_t));
    expect_encoding(reference[LLAMA3_JSON], text, len, want, n);
    free(ids);
}

// A piece longer than TOKENIZER_PIECE_MAX merges in chunks of at most that many bytes, cut
// before a character that would straddle the cut: the ids are those of the chunks, each
// encoded on its own.
static void test_piece_cap(void **state) {
    (void)state;
    const size_t max = TOKENIZER_PIECE_MAX, len = 2 * max + 1000;
    char *text = malloc(len);
    srand(3);
    for (size_t i = 0; i < len; i++) text[i] = (char)('a' + rand() % 26);
    memcpy(text + max - 1, "\xc3\xa9", 2);  // the first cut falls inside this é
    memset(text + 2 * max - 500, 'a', 1001);   // the second inside a run, which merges pairwise
    const size_t cuts[] = {0, max - 1, 2 * max - 1, len};
    int32_t *want = NULL, *ids = NULL;
    size_t n = 0, cap = 0;
    for (int i = 0; i < 3; i++) {
        size_t got = tokenizer_encode(reference[CL100K], text + cuts[i], cuts[i + 1] - cuts[i],
                                      &ids, &cap);
        want = realloc(want, (n + got) * sizeof(int32_t));
        memcpy(want + n, ids, got * sizeof(int32_t));
        n += got;
    }
    expect_encoding(reference[CL100K], text, len, want, n);
    free(text), free(want), free(ids);
}

static void test_bytes(void **state) {
    (void)state;
    Tokenizer *t = tokenizer_load("bytes");
    assert_int_equal(tokenizer_vocab_size(t), 256);
    assert_int_equal(tokenizer_bos_id(t), -1);
    assert_int_equal(tokenizer_eos_id(t), -1);
    assert_string_equal(tokenizer_format(t), "bytes");
    const int32_t want[] = {'a', ' ', 0xff, 0, 'b'};
    expect_encoding(t, "a \xff\0b", 5, want, 5);
    tokenizer_free(t);
}

static void file_write(const char *name, const char *text, char *path, size_t pathlen) {
    snprintf(path, pathlen, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

// The lines of a rank file giving the 256 bytes their own ranks, in order (as `titan
// tokenizer train` writes them), into text; returns the end of what it wrote.
static char *byte_ranks(char *text) {
    static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int b = 0; b < 256; b++) text += sprintf(text, "%c%c== %d\n", B64[b >> 2], B64[(b & 3) << 4], b);
    return text;
}

// A rank file as `titan tokenizer train` writes it: the 256 bytes in order, then merges.
static void test_titan_rank_file(void **state) {
    (void)state;
    char text[256 * 12 + 64], path[300];
    sprintf(byte_ranks(text), "YWI= 256\nYWJj 257\n");  // "ab", "abc"
    file_write("titan.tiktoken", text, path, sizeof path);
    Tokenizer *t = tokenizer_load(path);
    assert_int_equal(tokenizer_vocab_size(t), 260);
    assert_int_equal(tokenizer_bos_id(t), 258);
    assert_int_equal(tokenizer_eos_id(t), 259);
    expect_token(t, 258, "<|begin_of_text|>");
    const int32_t want[] = {257, 256, 'a', ' ', 256, 'd'};
    expect_encoding(t, "abcaba abd", 10, want, 6);
    tokenizer_free(t);
}

// GPT-2's bytes_to_unicode, written out independently: the byte-level spelling of byte b.
static void byte_level_char(int b, char *out) {
    static int shifted[256];
    for (int c = 0, next = 256; c < 256; c++) {
        bool printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174;
        shifted[c] = printable ? c : next++;
    }
    int cp = shifted[b];
    if (cp < 0x80) sprintf(out, "%c", cp);
    else sprintf(out, "%c%c", 0xc0 | cp >> 6, 0x80 | (cp & 0x3f));
}

// A byte-level vocab object giving each byte its own id, but the byte `skip` (-1: none), then
// the entries `more` (without braces); returns the end of what it wrote.
static char *byte_vocab(char *text, int skip, const char *more) {
    char c[3];
    text += sprintf(text, "{");
    for (int b = 0; b < 256; b++) {
        if (b == skip) continue;
        byte_level_char(b, c);
        text += sprintf(text, "\"%s%s\": %d, ", c[0] == '"' || c[0] == '\\' ? "\\" : "", c, b);
    }
    return text + sprintf(text, "%s}", more);
}

// A tokenizer.json with that vocab, the merges (a JSON array's members), the pre_tokenizer
// object pre and an added token 258.
static void huggingface_write_pre(const char *name, int skip, const char *vocab,
                                  const char *merges, const char *pre, char *path,
                                  size_t pathlen) {
    char text[8192], *at = text;
    at += sprintf(at, "{\"model\": {\"type\": \"BPE\", \"vocab\": ");
    at = byte_vocab(at, skip, vocab);
    sprintf(at, ", \"merges\": [%s]}, \"pre_tokenizer\": %s, "
                "\"added_tokens\": [{\"id\": 258, \"content\": \"<|endoftext|>\", "
                "\"special\": true}]}", merges, pre);
    file_write(name, text, path, pathlen);
}

// The same with GPT-2's pre-tokenizer, a lone ByteLevel.
static void huggingface_write(const char *name, int skip, const char *vocab, const char *merges,
                              char *path, size_t pathlen) {
    huggingface_write_pre(name, skip, vocab, merges, "{\"type\": \"ByteLevel\"}", path, pathlen);
}

// " a" and " ab" in byte-level spelling, and their merges in the two spellings of a merge.
#define HF_VOCAB "\"\xc4\xa0" "a\": 256, \"\xc4\xa0" "ab\": 257"
#define HF_MERGES "\"\xc4\xa0 a\", [\"\xc4\xa0" "a\", \"b\"]"

// A tokenizer.json with the two merge spellings ("a b" and [a, b]) and an added token.
static void test_small_huggingface_file(void **state) {
    (void)state;
    char path[300];
    huggingface_write("tokenizer.json", -1, HF_VOCAB, HF_MERGES, path, sizeof path);
    Tokenizer *t = tokenizer_load(path);
    assert_int_equal(tokenizer_vocab_size(t), 259);
    assert_int_equal(tokenizer_bos_id(t), 258);
    assert_int_equal(tokenizer_eos_id(t), 258);
    const int32_t want[] = {'b', 257, 'b', 256, 'c'};  // " abb" merges by both merge spellings
    expect_encoding(t, "b abb ac", 8, want, 5);
    tokenizer_free(t);
}

// GPT-2's two files in their own folder: encoder.json (the byte vocab, `vocab` and
// <|endoftext|>) and vocab.bpe (`merges`, one a line); the folder's path goes to path.
static void gpt2_write(const char *folder, int skip, const char *vocab, const char *merges,
                       char *path, size_t pathlen) {
    char text[8192], file[300];
    snprintf(path, pathlen, "%s/%s", dir, folder);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(file, sizeof file, "%s/encoder.json", folder);
    byte_vocab(text, skip, vocab);
    file_write(file, text, path, pathlen);
    snprintf(file, sizeof file, "%s/vocab.bpe", folder);
    snprintf(text, sizeof text, "#version: 0.2\n%s", merges);
    file_write(file, text, path, pathlen);
    snprintf(path, pathlen, "%s/%s", dir, folder);
}

static void test_small_gpt2_files(void **state) {
    (void)state;
    char path[300];
    gpt2_write("gpt2", -1, HF_VOCAB ", \"<|endoftext|>\": 258", "\xc4\xa0 a\n\xc4\xa0" "a b\n",
               path, sizeof path);
    Tokenizer *t = tokenizer_load(path);
    assert_string_equal(tokenizer_format(t), "gpt2");
    assert_int_equal(tokenizer_vocab_size(t), 259);
    assert_int_equal(tokenizer_eos_id(t), 258);
    const int32_t want[] = {'b', 257, 'b', 256, 'c'};
    expect_encoding(t, "b abb ac", 8, want, 5);
    tokenizer_free(t);
}

static void load_or_die(const char *path) { tokenizer_load(path); }

// The reason try_load gives for path, which must be "tokenizer <path><want_after_path>".
static void expect_path_error(const char *path, const char *want_after_path) {
    char err[512], want[1024];
    assert_null(tokenizer_try_load(path, err, sizeof err));
    snprintf(want, sizeof want, "tokenizer %s%s", path, want_after_path);
    assert_string_equal(err, want);
}

// The reason try_load gives for a file holding text.
static void expect_load_error(const char *name, const char *text, const char *want_after_path) {
    char path[300];
    file_write(name, text, path, sizeof path);
    expect_path_error(path, want_after_path);
}

static void test_errors(void **state) {
    (void)state;
    expect_die_user(load_or_die, "/nonexistent/tokenizer.model",
                    "titan: error: tokenizer /nonexistent/tokenizer.model: No such file or "
                    "directory\n");
    expect_load_error("bad.json", "{\"model\": {\n  \"type\": BPE}}",
                      ": invalid JSON at line 2, column 13: invalid token near 'BPE'");
    expect_load_error("word.json", "{\"model\": {\"type\": \"WordPiece\"}}",
                      ": not a BPE tokenizer (model.type is WordPiece)");
    // Control characters, in the file's text or in its strings, are escaped: one line.
    expect_load_error("escape.json", "{\"a\\\n\": 0}",
                      ": invalid JSON at line 2, column 0: invalid escape near '\"a\\\\\\n'");
    expect_load_error("type.json", "{\"model\": {\"type\": \"B\\nPE\"}}",
                      ": not a BPE tokenizer (model.type is B\\nPE)");
    expect_load_error("piece.json",
                      "{\"model\": {\"type\": \"BPE\"}, \"pre_tokenizer\": {\"type\": "
                      "\"ByteLevel\", \"add_prefix_space\": true}}",
                      ": pre_tokenizer is neither a Split regex then ByteLevel nor a ByteLevel "
                      "with its regex and no prefix space");
    expect_load_error("other.json", "{\"a\": \"b\"}",
                      ": neither a tokenizer.json nor an encoder.json");
    expect_load_error("encoder.json", "{\"a\": 0}",
                      ": a GPT-2 tokenizer needs vocab.bpe beside it");
    expect_load_error("rank.tiktoken", "IQ== 0\nIg== one\n", ":2: not a \"<base64> <rank>\" line");
    expect_load_error("b64.tiktoken", "IQ== 0\nI*== 1\n", ":2: bad base64");
    expect_load_error("empty.tiktoken", "IQ== 0\n= 1\n", ":2: an empty token");
    expect_load_error("short.tiktoken", "IQ== 0\n", " has no token for the byte 0x00");
}

// A Split pre-tokenizer with this regex (a JSON string's content).
#define SPLIT(regex) "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"" regex "\"}}"

static void encode_or_die(const char *path) {
    Tokenizer *t = tokenizer_load(path);
    int32_t *ids = NULL;
    size_t cap = 0;
    const char *text = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa c";
    tokenizer_encode(t, text, strlen(text), &ids, &cap);
}

// A regex whose match fails with a PCRE2 error (here a match limit it sets itself) is refused
// in one line, never read as "no match" (which would make the rest of the text one piece):
// at load when it fails on a sample text, else on the text where it fails.
static void test_regex_match_errors(void **state) {
    (void)state;
    char path[300], want[512];
    huggingface_write_pre("limit.json", -1, HF_VOCAB, HF_MERGES,
                          SPLIT("(*LIMIT_MATCH=1)\\\\s+(?!\\\\S)|\\\\s+|\\\\S+"), path,
                          sizeof path);
    expect_path_error(path, ": pre-tokenizer regex fails to match: match limit exceeded");
    // Fine on the sample (no 'a' in it), exponential on a run of 'a' without a 'b'.
    huggingface_write_pre("backtrack.json", -1, HF_VOCAB, HF_MERGES,
                          SPLIT("(*LIMIT_MATCH=100000)(?:a+)+b|\\\\s+|[^a\\\\s]+|a"), path,
                          sizeof path);
    Tokenizer *t = tokenizer_load(path);
    int32_t *ids = NULL;
    size_t cap = 0, n;
    char err[512];
    assert_true(tokenizer_try_encode(t, "a b", 3, &ids, &cap, &n, err, sizeof err));
    assert_int_equal(n, 3);
    const char *text = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa c";
    assert_false(tokenizer_try_encode(t, text, strlen(text), &ids, &cap, &n, err, sizeof err));
    snprintf(want, sizeof want,
             "tokenizer %s: the pre-tokenizer regex fails to match a text: match limit exceeded",
             path);
    assert_string_equal(err, want);
    tokenizer_free(t);
    free(ids);
    char line[600];
    snprintf(line, sizeof line, "titan: error: %s\n", want);
    expect_die_user(encode_or_die, path, line);
}

#define RANKS_IN_ORDER " was expected (ranks run 0, 1, 2, ... in order, without gaps or repeats)"

// A rank file must give ranks 0, 1, 2, ...: a gap (a line lost, a file cut at its start) or a
// repeat is refused at its line, and a byte without a rank is refused, since encoding starts
// from the bytes.
static void test_rank_file_gaps(void **state) {
    (void)state;
    char text[256 * 12 + 64];
    sprintf(byte_ranks(text), "YWI= 257\n");
    expect_load_error("gap.tiktoken", text, ":257: rank 257 where 256" RANKS_IN_ORDER);
    expect_load_error("twice.tiktoken", "IQ== 0\nIg== 0\n", ":2: rank 0 where 1" RANKS_IN_ORDER);
    expect_load_error("cut.tiktoken", "Ig== 1\n", ":1: rank 1 where 0" RANKS_IN_ORDER);
    expect_load_error("bytes.tiktoken", "IQ== 0\nIQ== 1\n",
                      ":2: the bytes of rank 1 repeat an earlier rank's");
    sprintf(byte_ranks(text) - strlen("/w== 255\n"), "\n");  // byte 0xff lost
    expect_load_error("nobyte.tiktoken", text, " has no token for the byte 0xff");
}

#define IDS_DENSE ", below the largest id 258 (ids run 0, 1, 2, ... without gaps)"

// The same for tokenizer.json: ids without gaps or repeats, merges of vocab tokens only, every
// byte a token.
static void test_huggingface_gaps(void **state) {
    (void)state;
    char path[300];
    huggingface_write("gap.json", -1, "\"\xc4\xa0" "ab\": 257", "", path, sizeof path);
    expect_path_error(path, ": no token has id 256" IDS_DENSE);
    huggingface_write("twice.json", -1, HF_VOCAB ", \"\xc4\xa0" "b\": 256", "", path,
                      sizeof path);
    expect_path_error(path, ": vocab entry \"\xc4\xa0" "b\" has id 256, which another token has");
    huggingface_write("key.json", -1, HF_VOCAB ", \"a\": 97", "", path, sizeof path);
    expect_path_error(path, ": invalid JSON at line 1, column 2514: duplicate object key near "
                            "'\"a\"'");
    huggingface_write("empty.json", -1, HF_VOCAB ", \"\": 300", "", path, sizeof path);
    expect_path_error(path, ": vocab entry \"\" is not byte-level text");
    huggingface_write("merge.json", -1, HF_VOCAB, "\"\xc4\xa0 a\", \"a x\"", path, sizeof path);
    expect_path_error(path, ": merge 1 is not a pair of vocab tokens");
    huggingface_write("repeat.json", -1, HF_VOCAB, HF_MERGES ", \"\xc4\xa0 a\"", path,
                      sizeof path);
    expect_path_error(path, ": merge 2 repeats merge 0");
    huggingface_write("byte.json", 'x', HF_VOCAB ", \"xx\": 120", "", path, sizeof path);
    expect_path_error(path, " has no token for the byte 0x78");
}

// And for GPT-2's encoder.json and vocab.bpe, whose merges are refused at their line.
static void test_gpt2_gaps(void **state) {
    (void)state;
    char path[300], encoder[320];
    gpt2_write("gap", -1, "\"\xc4\xa0" "ab\": 257, \"<|endoftext|>\": 258", "", path,
               sizeof path);
    snprintf(encoder, sizeof encoder, "%s/encoder.json", path);
    expect_path_error(encoder, ": no token has id 256" IDS_DENSE);
    gpt2_write("twice", -1, HF_VOCAB ", \"<|endoftext|>\": 256", "", path, sizeof path);
    snprintf(encoder, sizeof encoder, "%s/encoder.json", path);
    expect_path_error(encoder, ": vocab entry \"\xc4\xa0" "a\" has id 256, which another "
                               "token has");
    gpt2_write("merge", -1, HF_VOCAB ", \"<|endoftext|>\": 258", "\xc4\xa0 a\na x\n", path,
               sizeof path);
    snprintf(encoder, sizeof encoder, "%s/vocab.bpe", path);
    expect_path_error(encoder, ":3: not a merge of two vocab tokens");
    gpt2_write("repeat", -1, HF_VOCAB ", \"<|endoftext|>\": 258",
               "\xc4\xa0 a\n\xc4\xa0" "a b\n\n\xc4\xa0" "a b\n", path, sizeof path);
    snprintf(encoder, sizeof encoder, "%s/vocab.bpe", path);
    expect_path_error(encoder, ":5: repeats merge 1 (counting from 0 after the #version line)");
    gpt2_write("byte", 0, HF_VOCAB ", \"<|endoftext|>\": 258, \"\xc4\x80\xc4\x80\": 0", "",
               path, sizeof path);
    snprintf(encoder, sizeof encoder, "%s/encoder.json", path);
    expect_path_error(encoder, " has no token for the byte 0x00");
}

int main(void) {
    const struct CMUnitTest reference_tests[] = {
        cmocka_unit_test(test_vectors_gpt2),
        cmocka_unit_test(test_vectors_cl100k),
        cmocka_unit_test(test_vocabulary_holes_decode_empty),
        cmocka_unit_test(test_vectors_llama3_tiktoken),
        cmocka_unit_test(test_vectors_llama3_json),
        cmocka_unit_test(test_specials),
        cmocka_unit_test(test_specials_not_encoded),
        cmocka_unit_test(test_invalid_utf8_round_trip),
        cmocka_unit_test(test_two_threads_agree),
        cmocka_unit_test(test_folder_and_merges_file_load),
        cmocka_unit_test(test_long_piece_merges_as_tiktoken),
        cmocka_unit_test(test_piece_cap),
    };
    const struct CMUnitTest file_tests[] = {
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_titan_rank_file),
        cmocka_unit_test(test_small_huggingface_file),
        cmocka_unit_test(test_small_gpt2_files),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_rank_file_gaps),
        cmocka_unit_test(test_huggingface_gaps),
        cmocka_unit_test(test_gpt2_gaps),
        cmocka_unit_test(test_regex_match_errors),
    };
    return cmocka_run_group_tests(reference_tests, reference_load, reference_free) |
           cmocka_run_group_tests(file_tests, dir_setup, dir_teardown);
}
