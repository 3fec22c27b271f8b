// Dataset tests: documents from .txt, .jsonl, .jsonl.gz and R's .rdb (a synthetic database,
// and Debian's Austen novels against build/test-data/corpus/austen.txt), folder order, the
// one-line errors; tokenizing them (BOS/EOS wrapping, the same tokens on any thread count);
// and `titan tokenize`, whose shards read back as the in-memory stream.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "data/dataset.h"
#include "data/shard.h"
#include "data/tokenize.h"
#include "data/tokenizer.h"

#include "tests/unit/test_support.h"

#define AUSTEN_RDB "build/test-data/janeaustenr.rdb"
#define AUSTEN_TXT "build/test-data/corpus/austen.txt"
#define LLAMA3 "build/test-data/tokenizers/llama3/tokenizer.json"
#define LLAMA3_BOS 128000
#define LLAMA3_EOS 128001

static void text_write(const char *path, const char *text) {
    bytes_write(path, text, strlen(text));
}

typedef struct {
    char *text[16];
    size_t len[16];
    int n;
} Docs;

static void docs_add(const char *text, size_t len, const DocParts *parts, uint64_t bytes_read,
                     void *ctx) {
    (void)parts, (void)bytes_read;
    Docs *d = ctx;
    assert_true(d->n < 16);
    d->text[d->n] = malloc(len);
    memcpy(d->text[d->n], text, len);
    d->len[d->n++] = len;
}

static void docs_free(Docs *d) {
    for (int i = 0; i < d->n; i++) free(d->text[i]);
    d->n = 0;
}

static void doc_expect(const Docs *d, int i, const char *text, size_t len) {
    assert_true(i < d->n);
    assert_int_equal(d->len[i], len);
    assert_memory_equal(d->text[i], text, len);
}

static void test_txt_is_one_document(void **state) {
    (void)state;
    char path[300];
    path_make(path, sizeof(path), "novel.txt");
    text_write(path, "h\xc3\xa9llo\n\xff world\n");  // invalid UTF-8 passes as it is
    Docs d = {0};
    assert_int_equal(dataset_for_each_document(path, docs_add, &d), 1);
    doc_expect(&d, 0, "h\xc3\xa9llo\n\xff world\n", 15);
    docs_free(&d);
    assert_int_equal(dataset_bytes(path), 15);
    assert_false(dataset_is_tokenized(path));
}

static void test_jsonl_text_fields(void **state) {
    (void)state;
    char path[300];
    path_make(path, sizeof(path), "docs.jsonl");
    text_write(path, "{\"text\": \"first\\nline\", \"id\": 1}\n"
                     "\n"
                     "  \t\r\n"
                     "{\"id\": 2, \"text\": \"caf\\u00e9\"}\r\n"
                     "{\"text\": \"\"}\n"
                     "{\"text\": \"x\\u0000y\"}");  // last line: no "\n"
    Docs d = {0};
    assert_int_equal(dataset_for_each_document(path, docs_add, &d), 3);  // "" is dropped
    doc_expect(&d, 0, "first\nline", 10);
    doc_expect(&d, 1, "caf\xc3\xa9", 5);
    doc_expect(&d, 2, "x\0y", 3);
    docs_free(&d);
}

// A line far longer than any read buffer, through zlib; and a .txt.gz as one document.
static void test_gzip_files(void **state) {
    (void)state;
    char path[300];
    size_t long_len = 300000;
    char *text = malloc(long_len + 1);
    for (size_t i = 0; i < long_len; i++) text[i] = (char)('a' + i % 26);
    text[long_len] = '\0';
    path_make(path, sizeof(path), "long.jsonl.gz");
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    gzprintf(f, "{\"text\": \"short\"}\n");
    assert_int_equal(gzputs(f, "{\"text\": \""), 10);
    assert_int_equal(gzputs(f, text), (int)long_len);
    gzprintf(f, "\"}\n{\"text\": \"last\"}\n");
    assert_int_equal(gzclose(f), Z_OK);
    Docs d = {0};
    assert_int_equal(dataset_for_each_document(path, docs_add, &d), 3);
    doc_expect(&d, 0, "short", 5);
    doc_expect(&d, 1, text, long_len);
    doc_expect(&d, 2, "last", 4);
    docs_free(&d);

    path_make(path, sizeof(path), "book.txt.gz");
    f = gzopen(path, "wb");
    gzputs(f, "a book\n");
    assert_int_equal(gzclose(f), Z_OK);
    assert_int_equal(dataset_for_each_document(path, docs_add, &d), 1);
    doc_expect(&d, 0, "a book\n", 7);
    docs_free(&d);
    free(text);
}

// C.txt, a.jsonl (two documents), b.md, an empty file; the hidden file and the subfolder are
// not read.
static void folder_make(char *folder, size_t n) {
    char path[400];
    path_make(folder, n, "mixed");
    assert_int_equal(mkdir(folder, 0777), 0);
    const char *files[][2] = {{"b.md", "bee"},
                              {"a.jsonl", "{\"text\":\"a1\"}\n{\"text\":\"a2\"}\n"},
                              {"C.txt", "sea"},
                              {"empty.txt", ""},
                              {".hidden.txt", "no"}};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", folder, files[i][0]);
        text_write(path, files[i][1]);
    }
    snprintf(path, sizeof(path), "%s/sub", folder);
    assert_int_equal(mkdir(path, 0777), 0);
    snprintf(path, sizeof(path), "%s/sub/deep.txt", folder);
    text_write(path, "no");
}

static void test_folder_order(void **state) {
    (void)state;
    char folder[300];
    folder_make(folder, sizeof(folder));
    Docs d = {0};
    assert_int_equal(dataset_for_each_document(folder, docs_add, &d), 4);
    doc_expect(&d, 0, "sea", 3);  // bytewise: "C" < "a"
    doc_expect(&d, 1, "a1", 2);
    doc_expect(&d, 2, "a2", 2);
    doc_expect(&d, 3, "bee", 3);
    docs_free(&d);
    assert_int_equal(dataset_bytes(folder), 3 + 28 + 3);
}

// ---- R lazy-load databases ----

typedef struct {
    uint8_t bytes[512];
    size_t n;
} Blob;

static void blob_int(Blob *b, int32_t v) {
    uint32_t u = (uint32_t)v;
    uint8_t be[4] = {(uint8_t)(u >> 24), (uint8_t)(u >> 16), (uint8_t)(u >> 8), (uint8_t)u};
    memcpy(b->bytes + b->n, be, 4);
    b->n += 4;
}

static void blob_string(Blob *b, const char *s) {  // a CHARSXP (ASCII); NULL for NA
    blob_int(b, 0x40009);
    blob_int(b, s ? (int32_t)strlen(s) : -1);
    if (s) memcpy(b->bytes + b->n, s, strlen(s)), b->n += strlen(s);
}

static void blob_header(Blob *b, int version) {
    memcpy(b->bytes, "X\n", 2);
    b->n = 2;
    blob_int(b, version), blob_int(b, 0x40201), blob_int(b, version == 3 ? 0x30500 : 0x20300);
    if (version == 3) blob_int(b, 5), memcpy(b->bytes + b->n, "UTF-8", 5), b->n += 5;
}

// A record as R writes one: the serialized size (big-endian), then the zlib stream.
static void record_append(FILE *f, const Blob *b) {
    uint8_t packed[1024];
    uLongf n = sizeof(packed);
    assert_int_equal(compress(packed, &n, b->bytes, b->n), Z_OK);
    Blob size = {0};
    blob_int(&size, (int32_t)b->n);
    assert_int_equal(fwrite(size.bytes, 1, 4, f), 4);
    assert_int_equal(fwrite(packed, 1, n, f), n);
}

// Version 2, a character vector with attributes (names) and an NA; an integer vector (skipped);
// version 3 with its encoding name.
static void rdb_make(const char *path) {
    FILE *f = fopen(path, "wb");
    Blob b;
    blob_header(&b, 2);
    blob_int(&b, 0x210);  // STRSXP with attributes
    blob_int(&b, 4);
    blob_string(&b, "one"), blob_string(&b, NULL), blob_string(&b, ""), blob_string(&b, "two");
    blob_int(&b, 0x402), blob_int(&b, 1);  // the attributes' pairlist, not read
    record_append(f, &b);
    blob_header(&b, 2);
    blob_int(&b, 13), blob_int(&b, 1), blob_int(&b, 42);  // INTSXP c(42L)
    record_append(f, &b);
    blob_header(&b, 3);
    blob_int(&b, 16), blob_int(&b, 2);
    blob_string(&b, "x"), blob_string(&b, "y");
    record_append(f, &b);
    fclose(f);
}

static void test_rdata_records(void **state) {
    (void)state;
    char path[300];
    path_make(path, sizeof(path), "Rdata.rdb");
    rdb_make(path);
    Docs d = {0};
    assert_int_equal(dataset_for_each_document(path, docs_add, &d), 2);
    doc_expect(&d, 0, "one\n\ntwo", 8);
    doc_expect(&d, 1, "x\ny", 3);
    docs_free(&d);
}

// austen.txt is the six novels of r-cran-janeaustenr's data/Rdata.rdb (each its lines joined
// by "\n") joined by "\n", as tests/data/austen_text.py (another reader) wrote it; `make
// test-data` fetches the .rdb and derives the text.
static void test_rdata_austen(void **state) {
    (void)state;
    Docs d = {0};
    assert_int_equal(dataset_for_each_document(AUSTEN_RDB, docs_add, &d), 6);
    size_t want_len, at = 0;
    char *want = file_slurp(AUSTEN_TXT, &want_len);
    assert_non_null(want);
    const char *titles[6] = {"EMMA",       "MANSFIELD PARK",      "NORTHANGER ABBEY",
                             "Persuasion", "PRIDE AND PREJUDICE", "SENSE AND SENSIBILITY"};
    for (int i = 0; i < 6; i++) {
        assert_memory_equal(d.text[i], titles[i], strlen(titles[i]));
        assert_true(at + d.len[i] <= want_len);
        assert_memory_equal(d.text[i], want + at, d.len[i]);
        at += d.len[i];
        if (i < 5) assert_int_equal(want[at++], '\n');
    }
    assert_int_equal(at, want_len);
    free(want);
    docs_free(&d);
}

// ---- errors ----

static void docs_count(const char *path) {
    Docs d = {0};
    dataset_for_each_document(path, docs_add, &d);
}

static void expect_docs_error(const char *name, const char *content, const char *fmt) {
    char path[300], want[700];
    path_make(path, sizeof(path), name);
    if (content) text_write(path, content);
    snprintf(want, sizeof(want), fmt, path);
    expect_die_user(docs_count, path, want);
}

static void test_errors(void **state) {
    (void)state;
#define NO_TEXT "no \"text\" field (nor \"prompt\" and \"completion\", strings, nor \"messages\")\n"
    expect_docs_error("no_text.jsonl", "{\"text\": \"a\"}\n\n{\"body\": \"b\"}\n",
                      "titan: error: %s:3: " NO_TEXT);
    expect_docs_error("array.jsonl", "[\"text\"]\n", "titan: error: %s:1: " NO_TEXT);
    expect_docs_error("number.jsonl", "{\"text\": 7}\n", "titan: error: %s:1: " NO_TEXT);
    expect_docs_error("half.jsonl", "{\"prompt\": \"a\"}\n", "titan: error: %s:1: " NO_TEXT);
#undef NO_TEXT
    expect_docs_error("bad.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\" \"c\"}\n",
                      "titan: error: %s:2:16: '}' expected near '\"c\"'\n");
    expect_docs_error("missing.txt", NULL, "titan: error: dataset %s does not exist\n");
    expect_docs_error("blank.jsonl", "\n\n", "titan: error: dataset %s holds no documents\n");
    char path[300], want[700];
    path_make(path, sizeof(path), "empty_folder");
    assert_int_equal(mkdir(path, 0777), 0);
    snprintf(want, sizeof(want), "titan: error: dataset %s holds no documents\n", path);
    expect_die_user(docs_count, path, want);
    uint32_t tokens[3] = {1, 2, 3};
    path_make(path, sizeof(path), "tokens.bin");
    shard_write(path, tokens, 3, 1);
    snprintf(want, sizeof(want),
             "titan: error: dataset %s is already tokenized (.bin token shards), not text\n", path);
    expect_die_user(docs_count, path, want);
    path_make(path, sizeof(path), "cut.jsonl.gz");
    gzFile f = gzopen(path, "wb");
    for (int i = 0; i < 1000; i++) gzprintf(f, "{\"text\": \"line %d\"}\n", i);
    assert_int_equal(gzclose(f), Z_OK);
    assert_int_equal(truncate(path, 1000), 0);
    snprintf(want, sizeof(want),
             "titan: error: cannot read dataset file %s: unexpected end of file\n", path);
    expect_die_user(docs_count, path, want);
    path_make(path, sizeof(path), "cut.rdb");
    bytes_write(path, "\0\0\0\x20x", 5);
    snprintf(want, sizeof(want),
             "titan: error: %s: the record at byte 0 is not a zlib stream of the size it states\n",
             path);
    expect_die_user(docs_count, path, want);
}

// ---- tokenizing ----

static int32_t *stream_tokens(const TokenStream *s, int64_t *n) {
    *n = token_stream_num_tokens(s);
    int32_t *all = malloc((size_t)*n * sizeof(int32_t));
    token_stream_window(s, 0, (int)*n - 1, all);  // one window of the whole stream
    return all;
}

// The bytes tokenizer has no BOS/EOS: the stream is the documents' bytes back to back.
static void test_stream_of_bytes(void **state) {
    (void)state;
    char folder[300];
    path_make(folder, sizeof(folder), "mixed");  // made by test_folder_order
    Tokenizer *t = tokenizer_load("bytes");
    TokenStream s;
    token_stream_from_dataset(&s, folder, t);
    int64_t n;
    int32_t *ids = stream_tokens(&s, &n);
    const char *want = "seaa1a2bee";
    assert_int_equal(n, strlen(want));
    for (int64_t i = 0; i < n; i++) assert_int_equal(ids[i], (unsigned char)want[i]);
    free(ids);
    token_stream_close(&s);
    tokenizer_free(t);
}

// Llama 3 has both: [BOS] ids [EOS] per document, ids as the tokenizer encodes each alone.
static void test_bos_eos_wrapping(void **state) {
    (void)state;
    char path[300];
    path_make(path, sizeof(path), "two.jsonl");
    const char *docs[2] = {"Emma Woodhouse, handsome, clever, and rich", "It is a truth"};
    text_write(path, "{\"text\": \"Emma Woodhouse, handsome, clever, and rich\"}\n"
                     "{\"text\": \"It is a truth\"}\n");
    Tokenizer *t = tokenizer_load(LLAMA3);
    int32_t want[64], *ids = NULL;
    size_t n_want = 0, cap = 0;
    for (int i = 0; i < 2; i++) {
        size_t n = tokenizer_encode(t, docs[i], strlen(docs[i]), &ids, &cap);
        want[n_want++] = LLAMA3_BOS;
        memcpy(want + n_want, ids, n * sizeof(int32_t));
        n_want += n;
        want[n_want++] = LLAMA3_EOS;
    }
    TokenStream s;
    token_stream_from_dataset(&s, path, t);
    int64_t n;
    int32_t *got = stream_tokens(&s, &n);
    assert_int_equal(n, n_want);
    assert_memory_equal(got, want, n_want * sizeof(int32_t));
    free(got), free(ids);
    token_stream_close(&s);
    tokenizer_free(t);
}

// A supervised example ("prompt", "completion") among text: [BOS] prompt completion [EOS],
// the prompt and the completion each encoded alone; trained are the completion's tokens and
// its EOS, and every token of the text document (the BOS never: nothing predicts it).
static void test_supervised_examples(void **state) {
    (void)state;
    char path[300];
    path_make(path, sizeof(path), "sft.jsonl");
    text_write(path, "{\"prompt\": \"Q: two plus two?\\nA:\", \"completion\": \" four\"}\n"
                     "{\"text\": \"It is a truth\"}\n");
    Tokenizer *t = tokenizer_load(LLAMA3);
    const char *parts[3] = {"Q: two plus two?\nA:", " four", "It is a truth"};
    int32_t want[64], *ids = NULL;
    uint8_t trained[64];
    size_t n_want = 0, cap = 0;
    for (int i = 0; i < 3; i++) {
        if (i != 1) want[n_want] = LLAMA3_BOS, trained[n_want++] = 0;
        size_t n = tokenizer_encode(t, parts[i], strlen(parts[i]), &ids, &cap);
        memcpy(want + n_want, ids, n * sizeof(int32_t));
        memset(trained + n_want, i > 0, n);
        n_want += n;
        if (i != 0)
            want[n_want] = LLAMA3_EOS, trained[n_want++] = TOKEN_TRAINED | TOKEN_ENDS_DOCUMENT;
    }
    TokenStream s;
    token_stream_from_dataset(&s, path, t);
    int64_t n;
    int32_t *got = stream_tokens(&s, &n);
    assert_int_equal(n, n_want);
    assert_memory_equal(got, want, n_want * sizeof(int32_t));
    assert_non_null(s.flags);
    assert_memory_equal(s.flags, trained, n_want);
    int32_t mask[64];  // window 0's targets: token t + 1's flag
    token_stream_window_mask(&s, 0, (int)n - 1, mask);
    for (int64_t i = 0; i + 1 < n; i++) assert_int_equal(mask[i], trained[i + 1] & TOKEN_TRAINED);
    free(got), free(ids);
    token_stream_close(&s);
    tokenizer_free(t);
}

// More documents than one parallel batch holds (65536), of lengths 0 to 101.
static void many_docs_make(const char *path) {
    gzFile f = gzopen(path, "wb");
    for (int i = 0; i < 70000; i++) {
        gzputs(f, "{\"text\": \"");
        for (int k = 0; k < (i * 37) % 97; k++) gzputc(f, "ab cd, ef. gh"[k % 13]);
        if (i % 5 == 0) gzputs(f, " \\u00e9t\\u00e9");
        gzputs(f, "\"}\n");
    }
    assert_int_equal(gzclose(f), Z_OK);
}

static void streams_agree_over_threads(const char *path, const Tokenizer *t) {
    int64_t n_one, n;
    int32_t *one = NULL;
    for (int threads = 1; threads <= 4; threads++) {
        omp_set_num_threads(threads);
        TokenStream s;
        token_stream_from_dataset(&s, path, t);
        int32_t *ids = stream_tokens(&s, &n);
        token_stream_close(&s);
        if (!one) {
            one = ids, n_one = n;
            continue;
        }
        assert_int_equal(n, n_one);
        assert_memory_equal(ids, one, (size_t)n * sizeof(int32_t));
        free(ids);
    }
    free(one);
}

static void test_thread_count_independent(void **state) {
    (void)state;
    char path[300];
    path_make(path, sizeof(path), "many.jsonl.gz");
    many_docs_make(path);
    const char *tokenizers[2] = {"bytes", LLAMA3};
    for (int i = 0; i < 2; i++) {
        Tokenizer *t = tokenizer_load(tokenizers[i]);
        streams_agree_over_threads(path, t);
        tokenizer_free(t);
    }
    omp_set_num_threads(omp_get_num_procs());
}

// ---- titan tokenize ----

static int32_t shard_version(const char *path) {
    int32_t header[2];
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(header, 4, 2, f), 2);
    fclose(f);
    assert_int_equal(header[0], SHARD_MAGIC);
    return header[1];
}

// Shards of 500000 tokens, read back as one dataset, equal the in-memory stream.
static void shards_match_memory(const char *tokenizer, const char *data, int version) {
    char out[300], shard[400];
    path_make(out, sizeof(out), version == 1 ? "shards_v1" : "shards_v2");
    char *argv[] = {"tokenize", "--tokenizer", (char *)tokenizer, "--out", out,
                    "--shard-tokens", "500000", (char *)data};
    assert_int_equal(tokenize_main(8, argv), 0);
    Tokenizer *t = tokenizer_load(tokenizer);
    TokenStream mem, disk;
    token_stream_from_dataset(&mem, data, t);
    token_stream_open(&disk, out);
    int64_t n_mem, n_disk;
    int32_t *want = stream_tokens(&mem, &n_mem), *got = stream_tokens(&disk, &n_disk);
    assert_int_equal(n_disk, n_mem);
    assert_memory_equal(got, want, (size_t)n_mem * sizeof(int32_t));
    assert_int_equal(disk.n_shards, (n_mem + 499999) / 500000);
    snprintf(shard, sizeof(shard), "%s/shard_%06d.bin", out, disk.n_shards - 1);
    assert_int_equal(shard_version(shard), version);
    free(want), free(got);
    token_stream_close(&mem), token_stream_close(&disk);
    tokenizer_free(t);
}

static void test_tokenize_writes_shards(void **state) {
    (void)state;
    char data[300];
    path_make(data, sizeof(data), "many.jsonl.gz");  // made by test_thread_count_independent
    shards_match_memory("bytes", data, 1);
    shards_match_memory(LLAMA3, data, 2);
}

static void tokenize_args(const char *args) {  // args: space-separated, after "tokenize"
    char *copy = strdup(args), *argv[16] = {"tokenize"};
    int argc = 1;
    for (char *a = strtok(copy, " "); a; a = strtok(NULL, " ")) argv[argc++] = a;
    tokenize_main(argc, argv);
}

static void expect_tokenize_error(const char *fmt, const char *want_fmt) {
    char args[700], want[1400];
    snprintf(args, sizeof(args), fmt, dir, dir);
    snprintf(want, sizeof(want), want_fmt, dir);
    expect_die_user(tokenize_args, args, want);
}

static void test_tokenize_errors(void **state) {
    (void)state;
    expect_tokenize_error("--tokenizer bytes %s/novel.txt",
                          "titan: error: usage: titan tokenize --tokenizer T --out DIR "
                          "[--shard-tokens N] DATASET...\n");
    expect_tokenize_error("--tokenizer bytes --out %s/never %s/nothing.txt",
                          "titan: error: dataset %s/nothing.txt does not exist\n");
    expect_tokenize_error("--tokenizer bytes --out %s/never --shard-tokens 0 %s/novel.txt",
                          "titan: error: tokenize: --shard-tokens 0 is not a whole number from 1 "
                          "to 2147483647\n");
    expect_tokenize_error("--tokenizer bytes --out %s/shards_v1 %s/novel.txt",
                          "titan: error: tokenize: %s/shards_v1 already holds token shards; "
                          "remove it or choose another --out\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_txt_is_one_document),
        cmocka_unit_test(test_jsonl_text_fields),
        cmocka_unit_test(test_gzip_files),
        cmocka_unit_test(test_folder_order),
        cmocka_unit_test(test_rdata_records),
        cmocka_unit_test(test_rdata_austen),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_stream_of_bytes),
        cmocka_unit_test(test_bos_eos_wrapping),
        cmocka_unit_test(test_thread_count_independent),
        cmocka_unit_test(test_tokenize_writes_shards),
        cmocka_unit_test(test_tokenize_errors),
        cmocka_unit_test(test_supervised_examples),
    };
    return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
