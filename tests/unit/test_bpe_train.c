// BPE trainer tests: merges worked out by hand on two toy corpora, the tiktoken file format,
// byte-identical output for 1 and 2 threads, round trip and compression on Jane Austen with an
// independent rank-based encoder (tiktoken's algorithm, written out here), and the one-line
// usage errors of `titan tokenizer train`.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "data/bpe_train.h"
#include "data/pretokenize.h"

#include "tests/unit/test_support.h"

#define AUSTEN "build/test-data/corpus/austen.txt"

static BpeVocab train_text(const char *text, int64_t vocab_size, int threads, BpeTrainStats *st) {
    BpeDocument doc = {text, strlen(text)};
    return bpe_train(&(BpeTrainInput){&doc, 1}, vocab_size, threads, st);
}

static void expect_merges(const BpeVocab *v, const char *const *want, int n) {
    assert_int_equal(v->n_tokens, 256 + n);
    for (int r = 0; r < 256; r++) {
        assert_int_equal(v->offsets[r + 1] - v->offsets[r], 1);
        assert_int_equal(v->bytes[v->offsets[r]], r);
    }
    for (int i = 0; i < n; i++) {
        int64_t at = v->offsets[256 + i], len = v->offsets[257 + i] - at;
        assert_int_equal(len, strlen(want[i]));
        assert_memory_equal(v->bytes + at, want[i], (size_t)len);
    }
}

// Wikipedia's example: in "aaabdaaabac" (one piece), "aa" occurs 4 times (overlapping) and
// merges first, leaving Z a b d Z a b a c; then "Za" and "ab" both occur twice and the lower
// pair ('a', 'b') = (97, 98) < (256, 97) wins: Z Y d Z Y a c; then "ZY" = "aaab" twice: X d X a
// c, where no pair occurs twice, so training stops after 3 merges. (minbpe breaks the tie by
// first occurrence and takes "Za" instead; Wikipedia's Y = ab agrees with the rule here.)
static void test_wikipedia_example(void **state) {
    (void)state;
    BpeTrainStats st;
    BpeVocab v = train_text("aaabdaaabac", 2048, 1, &st);
    const char *want[] = {"aa", "ab", "aaab"};
    expect_merges(&v, want, 3);
    assert_int_equal(st.merges, 3);
    assert_true(st.stopped_early);
    assert_int_equal(st.pieces, 1);
    bpe_vocab_free(&v);
}

// Sennrich et al.'s corpus, pre-tokenized by cl100k: "low" x1, " low" x4, " lower" x2,
// " newest" x6, " widest" x3. Weighted pair counts: "es" 9 and "st" 9 tie and (e, s) < (s, t)
// wins; then "est" 9; "lo" 7 and "ow" 7 tie, (l, o) wins; "low" 7 (1 + 4 + 2). Then five pairs
// at 6, lowest first: " n" (32, 110) < " low" (32, 259) < "ew" (101, 119), then " new" and
// " newest". At 3: " w" (32, 119) < "dest" (100, 257), then "idest" (105, 266) < (265, 105),
// " widest". At 2: "er" (101, 114) < (261, 101), then " lower". Every piece is one token now:
// 15 merges and an early stop.
static void test_sennrich_example(void **state) {
    (void)state;
    const char *text = "low low low low low lower lower newest newest newest newest newest "
                       "newest widest widest widest";
    BpeTrainStats st;
    BpeVocab v = train_text(text, 2048, 2, &st);
    const char *ranked[] = {"es",      "est", "lo",   "low",   " n",      " low", "ew",     " new",
                            " newest", " w",  "dest", "idest", " widest", "er",   " lower"};
    expect_merges(&v, ranked, 15);
    assert_true(st.stopped_early);
    assert_int_equal(st.pieces, 5);
    bpe_vocab_free(&v);
    // A vocabulary of 258 + 2 keeps the first two merges and does not count as an early stop.
    v = train_text(text, 260, 1, &st);
    expect_merges(&v, ranked, 2);
    assert_false(st.stopped_early);
    bpe_vocab_free(&v);
}

// ---- The file, read back independently ----

typedef struct {
    int n;
    char **bytes;
    size_t *len;
    int *sorted;  // ranks ordered by bytes, for lookup
} Ranks;

static int b64_value(char c) {
    const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *p = strchr(alphabet, c);
    return c && p ? (int)(p - alphabet) : -1;
}

// Decodes padded base64; returns the byte count, or -1 on anything malformed.
static long b64_decode(const char *s, size_t n, char *out) {
    if (n == 0 || n % 4) return -1;
    long j = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++)  // '=' pads only the last two places of the last quad
            v[k] = s[i + k] == '=' && i + 4 == n && k >= 2 ? 0 : b64_value(s[i + k]);
        for (int k = 0; k < 4; k++)
            if (v[k] < 0) return -1;
        uint32_t x = (uint32_t)(v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3]);
        out[j++] = (char)(x >> 16);
        if (s[i + 2] != '=') out[j++] = (char)(x >> 8);
        if (s[i + 3] != '=') out[j++] = (char)x;
    }
    return j;
}

static const Ranks *sort_ctx;

static int bytes_compare(const char *a, size_t la, const char *b, size_t lb) {
    int c = memcmp(a, b, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

static int rank_compare(const void *pa, const void *pb) {
    int a = *(const int *)pa, b = *(const int *)pb;
    const Ranks *r = sort_ctx;
    return bytes_compare(r->bytes[a], r->len[a], r->bytes[b], r->len[b]);
}

// Reads a rank file, checking each line is "<base64> <rank>" with ranks 0, 1, 2, ...
static Ranks ranks_read(const char *path) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    Ranks r = {0};
    char line[4096], buf[4096];
    while (fgets(line, sizeof(line), f)) {
        char *space = strchr(line, ' ');
        assert_non_null(space);
        assert_int_equal(atoi(space + 1), r.n);
        char want_tail[32];
        snprintf(want_tail, sizeof(want_tail), " %d\n", r.n);
        assert_string_equal(space, want_tail);
        long len = b64_decode(line, (size_t)(space - line), buf);
        assert_true(len > 0);
        r.bytes = realloc(r.bytes, (size_t)(r.n + 1) * sizeof(char *));
        r.len = realloc(r.len, (size_t)(r.n + 1) * sizeof(size_t));
        r.bytes[r.n] = malloc((size_t)len);
        memcpy(r.bytes[r.n], buf, (size_t)len);
        r.len[r.n++] = (size_t)len;
    }
    fclose(f);
    r.sorted = malloc((size_t)r.n * sizeof(int));
    for (int i = 0; i < r.n; i++) r.sorted[i] = i;
    sort_ctx = &r;
    qsort(r.sorted, (size_t)r.n, sizeof(int), rank_compare);
    sort_ctx = NULL;
    return r;
}

static void ranks_free(Ranks *r) {
    for (int i = 0; i < r->n; i++) free(r->bytes[i]);
    free(r->bytes), free(r->len), free(r->sorted);
}

static int rank_find(const Ranks *r, const char *s, size_t len) {
    int lo = 0, hi = r->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, t = r->sorted[mid];
        int c = bytes_compare(r->bytes[t], r->len[t], s, len);
        if (c == 0) return t;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

// tiktoken's byte-pair encoding of one piece: start from its bytes and repeatedly merge the
// adjacent pair whose concatenation has the lowest rank. Writes ranks to ids; returns count.
static size_t piece_encode(const Ranks *r, const char *piece, size_t len, int *ids) {
    size_t start[512], n = len;  // token i is piece[start[i], start[i + 1])
    assert_true(len < 511);
    for (size_t i = 0; i <= len; i++) start[i] = i;
    for (;;) {
        int best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            int k = rank_find(r, piece + start[i], start[i + 2] - start[i]);
            if (k >= 0 && (best < 0 || k < best)) best = k, at = i;
        }
        if (best < 0) break;
        memmove(start + at + 1, start + at + 2, (n - at - 1) * sizeof(size_t));
        n--;
    }
    for (size_t i = 0; i < n; i++) ids[i] = rank_find(r, piece + start[i], start[i + 1] - start[i]);
    return n;
}

typedef struct {
    const Ranks *ranks;
    size_t tokens, bytes;
    char *decoded;  // the concatenated bytes of every id, to compare with the text
} EncodeRun;

static void piece_check(const char *piece, size_t len, void *ctx) {
    EncodeRun *run = ctx;
    int ids[512];
    size_t n = piece_encode(run->ranks, piece, len, ids);
    for (size_t i = 0; i < n; i++) {
        assert_true(ids[i] >= 0);
        memcpy(run->decoded + run->bytes, run->ranks->bytes[ids[i]], run->ranks->len[ids[i]]);
        run->bytes += run->ranks->len[ids[i]];
    }
    run->tokens += n;
}

static void austen_train_write(const char *text, size_t len, int threads, const char *path) {
    BpeDocument doc = {text, len};
    BpeTrainStats st;
    double t0 = omp_get_wtime();
    BpeVocab v = bpe_train(&(BpeTrainInput){&doc, 1}, 2048, threads, &st);
    print_message("austen, %d threads: %lld pieces, %d merges, %.2f s\n", threads,
                  (long long)st.pieces, st.merges, omp_get_wtime() - t0);
    assert_int_equal(v.n_tokens, 2046);
    assert_int_equal(st.merges, 2046 - 256);
    assert_false(st.stopped_early);
    bpe_vocab_write(&v, path);
    bpe_vocab_free(&v);
}

static bool files_equal(const char *a, const char *b) {
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "cmp -s %s %s", a, b);
    return system(cmd) == 0;
}

// Every merged token splits into two earlier tokens: the file is a valid BPE rank file.
static void expect_ranks_mergeable(const Ranks *r) {
    for (int t = 256; t < r->n; t++) {
        bool found = false;
        for (size_t k = 1; k < r->len[t] && !found; k++) {
            int a = rank_find(r, r->bytes[t], k), b = rank_find(r, r->bytes[t] + k, r->len[t] - k);
            found = a >= 0 && a < t && b >= 0 && b < t;
        }
        assert_true(found);
    }
}

// Trains on Austen with 1 and 2 threads (byte-identical files), then checks the file's format
// and encodes the whole text with it: the ids decode to the text, at > 2.5 bytes per token.
static void test_austen(void **state) {
    (void)state;
    size_t len = 0;
    char *text = file_slurp(AUSTEN, &len);
    if (!text) skip();
    char one[300], two[300];
    snprintf(one, sizeof(one), "%s/austen1.tiktoken", dir);
    snprintf(two, sizeof(two), "%s/austen2.tiktoken", dir);
    austen_train_write(text, len, 1, one);
    austen_train_write(text, len, 2, two);
    assert_true(files_equal(one, two));

    Ranks r = ranks_read(one);
    assert_int_equal(r.n, 2046);
    for (int b = 0; b < 256; b++) assert_true(r.len[b] == 1 && (unsigned char)r.bytes[b][0] == b);
    expect_ranks_mergeable(&r);

    Pretokenizer *pre;
    char err[256];
    assert_true(pretokenizer_try_create(&pre, PRETOKENIZE_CL100K, "the cl100k pattern", err,
                                        sizeof(err)));
    EncodeRun run = {.ranks = &r, .decoded = malloc(len)};
    pretokenizer_split(pre, text, len, piece_check, &run);
    assert_int_equal(run.bytes, len);
    assert_memory_equal(run.decoded, text, len);
    double ratio = (double)len / (double)run.tokens;
    print_message("austen, vocab 2048: %zu tokens, %.3f bytes/token\n", run.tokens, ratio);
    assert_true(ratio > 2.5);
    pretokenizer_free(pre);
    free(run.decoded), free(text);
    ranks_free(&r);
}

// Several documents, some files' worth, split across chunks and threads: same file, and the
// same as training on the documents in another order (counts do not depend on order).
static void test_threads_and_order(void **state) {
    (void)state;
    enum { N_DOCS = 40 };
    char *texts[N_DOCS];
    BpeDocument docs[N_DOCS], reversed[N_DOCS];
    for (int d = 0; d < N_DOCS; d++) {
        size_t cap = 300000, at = 0;
        texts[d] = malloc(cap);
        for (int line = 0; at + 100 < cap; line++)
            at += (size_t)snprintf(texts[d] + at, cap - at, "Line %d of document %d: x%dy%d!\n",
                                   line, d, line * 7 % 13, (line + d) % 5);
        docs[d] = (BpeDocument){texts[d], at};
        reversed[N_DOCS - 1 - d] = docs[d];
    }
    const BpeDocument *orders[] = {docs, docs, reversed};
    int threads[] = {1, 2, 2};
    char path[3][300];
    for (int k = 0; k < 3; k++) {
        BpeTrainStats st;
        BpeVocab v = bpe_train(&(BpeTrainInput){orders[k], N_DOCS}, 600, threads[k], &st);
        snprintf(path[k], sizeof(path[k]), "%s/docs%d.tiktoken", dir, k);
        bpe_vocab_write(&v, path[k]);
        bpe_vocab_free(&v);
    }
    assert_true(files_equal(path[0], path[1]));
    assert_true(files_equal(path[0], path[2]));
    for (int d = 0; d < N_DOCS; d++) free(texts[d]);
}

// ---- The command ----

static void file_write(const char *name, const char *text) {
    char path[300];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

// Runs `titan tokenizer train` with a space-separated argument line; @ stands for the scratch
// directory.
static void command_run(const char *args) {
    char expanded[2048] = "";
    for (const char *p = args; *p; p++) {
        size_t n = strlen(expanded);
        if (*p == '@') snprintf(expanded + n, sizeof(expanded) - n, "%s", dir);
        else expanded[n] = *p, expanded[n + 1] = '\0';
    }
    char *argv[32];
    int argc = 0;
    argv[argc++] = "train";
    for (char *tok = strtok(expanded, " "); tok; tok = strtok(NULL, " ")) argv[argc++] = tok;
    tokenizer_train_main(argc, argv);
}

static void expect_command_error(const char *args, const char *message) {
    char want[1024];
    snprintf(want, sizeof(want), "titan: error: tokenizer train: %s\n", message);
    expect_die_user(command_run, args, want);
}

#define USAGE \
    "usage: titan tokenizer train --vocab-size N --out FILE.tiktoken [--threads T] FILE..."

static void test_command_errors(void **state) {
    (void)state;
    file_write("a.txt", "hello world\n");
    file_write("empty.txt", "");
    expect_command_error("--out @/o.tiktoken @/a.txt", "--vocab-size is required; " USAGE);
    expect_command_error("--vocab-size 257 --out @/o.tiktoken @/a.txt",
                         "--vocab-size 257 must be an integer in [258, 2147483648]");
    expect_command_error("--vocab-size 2147483649 --out @/o.tiktoken @/a.txt",
                         "--vocab-size 2147483649 must be an integer in [258, 2147483648]");
    expect_command_error("--vocab-size 1k --out @/o.tiktoken @/a.txt",
                         "--vocab-size 1k must be an integer in [258, 2147483648]");
    expect_command_error("--vocab-size 300 @/a.txt", "--out is required; " USAGE);
    expect_command_error("--vocab-size 300 --out @/o.tiktoken", "no input files; " USAGE);
    expect_command_error("--vocab-size 300 --out @/o.tiktoken --threads 0 @/a.txt",
                         "--threads 0 must be an integer in [1, 1024]");
    expect_command_error("--vocab-size 300 --out @/o.tiktoken --merges 3 @/a.txt",
                         "bad option --merges; " USAGE);
    // Inputs are datasets (data/dataset.h), which name the empty or missing one.
    char want[600];
    snprintf(want, sizeof(want), "titan: error: dataset %s/empty.txt holds no documents\n", dir);
    expect_die_user(command_run, "--vocab-size 300 --out @/o.tiktoken @/empty.txt", want);
    snprintf(want, sizeof(want), "titan: error: dataset %s/missing.txt does not exist\n", dir);
    expect_die_user(command_run, "--vocab-size 300 --out @/o.tiktoken @/a.txt @/missing.txt", want);
}

// A good run writes the file under its name only (no .tmp left) with the expected ranks.
static void test_command_writes_file(void **state) {
    (void)state;
    file_write("w1.txt", "aaabdaaabac");
    file_write("w2.txt", "\n");  // a piece of its own, with no pair
    command_run("--vocab-size 2048 --threads 2 --out @/w.tiktoken @/w1.txt @/w2.txt");
    char path[300];
    snprintf(path, sizeof(path), "%s/w.tiktoken", dir);
    Ranks r = ranks_read(path);
    assert_int_equal(r.n, 259);
    assert_int_equal(r.len[258], 4);
    assert_memory_equal(r.bytes[258], "aaab", 4);
    ranks_free(&r);
    snprintf(path, sizeof(path), "%s/w.tiktoken.tmp", dir);
    assert_int_equal(access(path, F_OK), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wikipedia_example),
        cmocka_unit_test(test_sennrich_example),
        cmocka_unit_test(test_austen),
        cmocka_unit_test(test_threads_and_order),
        cmocka_unit_test(test_command_errors),
        cmocka_unit_test(test_command_writes_file),
    };
    return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
