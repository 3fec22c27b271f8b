// Token shard tests: llm.c-format shards written and read back as windows (v1 and v2, across
// the files of a folder, wrapping as epochs), the one-line errors for bad shards, and a stream
// over tokens in memory. `titan tokenize` is tested in test_dataset.c.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/errors.h"
#include "data/shard.h"

#include "tests/unit/test_support.h"

static void test_v1_single_file_windows(void **state) {
    (void)state;
    char path[300];
    path_make(path, sizeof(path), "v1.bin");
    uint32_t tokens[101];
    for (int i = 0; i < 101; i++) tokens[i] = (uint32_t)(i * 649) % 65536;
    shard_write(path, tokens, 101, 1);
    // The file is exactly llm.c's layout: 1024-byte header, then uint16 tokens.
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 1024 + 2 * 101);
    TokenStream s;
    token_stream_open(&s, path);
    assert_int_equal(token_stream_num_tokens(&s), 101);
    assert_int_equal(token_stream_num_windows(&s, 10), 10);
    int32_t win[11];
    for (int64_t w = 0; w < 10; w++) {
        token_stream_window(&s, w, 10, win);
        for (int k = 0; k <= 10; k++) assert_int_equal(win[k], tokens[w * 10 + k]);
    }
    token_stream_close(&s);
}

static void test_v2_large_ids(void **state) {
    (void)state;
    char path[300];
    path_make(path, sizeof(path), "v2.bin");
    uint32_t tokens[9];
    for (int i = 0; i < 9; i++) tokens[i] = 128000u + (uint32_t)i * 1000u;  // beyond uint16
    shard_write(path, tokens, 9, 2);
    TokenStream s;
    token_stream_open(&s, path);
    int32_t win[5];
    token_stream_window(&s, 1, 4, win);
    for (int k = 0; k < 5; k++) assert_int_equal(win[k], tokens[4 + k]);
    token_stream_close(&s);
}

// llm.c's Llama 3 shards (dev/data/data_common.py): magic 20240801, version 7, uint32 tokens.
static void test_llmc_llama3_shard(void **state) {
    (void)state;
    char path[300];
    path_make(path, sizeof(path), "llama3.bin");
    struct {
        int32_t header[256];
        uint32_t tokens[5];
    } file = {{20240801, 7, 5}, {128000, 9906, 1917, 0, 128001}};
    bytes_write(path, &file, sizeof(file));
    TokenStream s;
    token_stream_open(&s, path);
    int32_t win[5];
    token_stream_window(&s, 0, 4, win);
    for (int k = 0; k < 5; k++) assert_int_equal(win[k], file.tokens[k]);
    token_stream_close(&s);
}

// A folder of a.bin (v1, 10 tokens), b.bin (empty), c.bin (v2, 7 tokens) and a non-shard:
// one stream of 17 tokens 0..16, in name order.
static void folder_make(char *folder, size_t n) {
    char path[320];
    path_make(folder, n, "folder");
    assert_int_equal(mkdir(folder, 0777), 0);
    uint32_t tokens[17];
    for (int i = 0; i < 17; i++) tokens[i] = (uint32_t)i;
    snprintf(path, sizeof(path), "%s/c.bin", folder);
    shard_write(path, tokens + 10, 7, 2);
    snprintf(path, sizeof(path), "%s/a.bin", folder);
    shard_write(path, tokens, 10, 1);
    snprintf(path, sizeof(path), "%s/b.bin", folder);
    shard_write(path, tokens, 0, 1);
    snprintf(path, sizeof(path), "%s/notes.txt", folder);
    bytes_write(path, "not a shard", 11);
}

static void test_folder_spans_files_and_wraps(void **state) {
    (void)state;
    char folder[300];
    folder_make(folder, sizeof(folder));
    TokenStream s;
    token_stream_open(&s, folder);
    assert_int_equal(s.n_shards, 3);
    assert_int_equal(token_stream_num_tokens(&s), 17);
    assert_int_equal(token_stream_num_windows(&s, 4), 4);
    int32_t win[5];
    // Window 2 = tokens 8..12: the end of a.bin, past the empty b.bin, into c.bin.
    token_stream_window(&s, 2, 4, win);
    for (int k = 0; k < 5; k++) assert_int_equal(win[k], 8 + k);
    // Window 3 ends on the stream's last token; window 4 + 2 wraps to window 2.
    token_stream_window(&s, 3, 4, win);
    assert_int_equal(win[4], 16);
    token_stream_window(&s, 6, 4, win);
    for (int k = 0; k < 5; k++) assert_int_equal(win[k], 8 + k);
    // One window of the whole stream.
    assert_int_equal(token_stream_num_windows(&s, 16), 1);
    int32_t all[17];
    token_stream_window(&s, 5, 16, all);
    for (int k = 0; k < 17; k++) assert_int_equal(all[k], k);
    token_stream_close(&s);
}

static void expect_open_error(const char *path, const char *want) {
    TokenStream s;
    char err[1024] = "";
    assert_false(token_stream_try_open(&s, path, err, sizeof(err)));
    assert_string_equal(err, want);
    assert_null(s.shards);
}

static void test_bad_shards(void **state) {
    (void)state;
    char path[300], want[600];
    path_make(path, sizeof(path), "missing.bin");
    snprintf(want, sizeof(want), "token dataset %s does not exist", path);
    expect_open_error(path, want);

    uint32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    path_make(path, sizeof(path), "cut.bin");
    shard_write(path, tokens, 8, 1);
    assert_int_equal(truncate(path, 1024 + 2 * 8 - 2), 0);
    snprintf(want, sizeof(want),
             "token shard %s is truncated or corrupt: its header promises 8 tokens (1040 bytes) "
             "but the file has 1038 bytes",
             path);
    expect_open_error(path, want);
    assert_int_equal(truncate(path, 100), 0);
    snprintf(want, sizeof(want),
             "token shard %s is truncated or not a shard (100 bytes; the header is 1024)", path);
    expect_open_error(path, want);

    int32_t header[256] = {20240521, 1, 0};
    path_make(path, sizeof(path), "magic.bin");
    bytes_write(path, header, sizeof(header));
    snprintf(want, sizeof(want),
             "token shard %s has bad magic 20240521 (expected 20240520: not an llm.c/titan shard)",
             path);
    expect_open_error(path, want);
    header[0] = SHARD_MAGIC, header[1] = 3;
    path_make(path, sizeof(path), "version.bin");
    bytes_write(path, header, sizeof(header));
    snprintf(want, sizeof(want),
             "token shard %s has unsupported version 3 (1: uint16 tokens, 2: uint32)", path);
    expect_open_error(path, want);

    path_make(path, sizeof(path), "empty_folder");
    assert_int_equal(mkdir(path, 0777), 0);
    snprintf(want, sizeof(want), "token dataset folder %s has no .bin files", path);
    expect_open_error(path, want);
    char shard[320];
    snprintf(shard, sizeof(shard), "%s/only.bin", path);
    shard_write(shard, tokens, 0, 2);
    snprintf(want, sizeof(want), "token dataset %s holds no tokens", path);
    expect_open_error(path, want);
}

static void windows_of_8(const char *path) {
    TokenStream s;
    token_stream_open(&s, path);
    token_stream_num_windows(&s, 8);
}

static void test_too_short_dies_once(void **state) {
    (void)state;
    char path[300], want[600];
    uint32_t tokens[8] = {0};
    path_make(path, sizeof(path), "short.bin");
    shard_write(path, tokens, 8, 1);
    snprintf(want, sizeof(want),
             "titan: error: token dataset %s has 8 tokens, too few for one window of seq_len + 1 "
             "= 9\n",
             path);
    expect_die_user(windows_of_8, path, want);
}

// A stream over tokens in memory reads as one shard of them would, and frees them on close.
static void test_stream_from_tokens(void **state) {
    (void)state;
    int32_t *tokens = malloc(23 * sizeof(int32_t));
    for (int i = 0; i < 23; i++) tokens[i] = 70000 + 3 * i;
    TokenStream s;
    token_stream_from_tokens(&s, "memory", tokens, 23);
    assert_int_equal(token_stream_num_tokens(&s), 23);
    assert_int_equal(token_stream_num_windows(&s, 5), 4);
    int32_t win[6];
    token_stream_window(&s, 5, 5, win);  // wraps to window 1: tokens 5..10
    for (int k = 0; k < 6; k++) assert_int_equal(win[k], 70000 + 3 * (5 + k));
    token_stream_close(&s);
    assert_null(s.owned);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v1_single_file_windows),
        cmocka_unit_test(test_v2_large_ids),
        cmocka_unit_test(test_llmc_llama3_shard),
        cmocka_unit_test(test_folder_spans_files_and_wraps),
        cmocka_unit_test(test_bad_shards),
        cmocka_unit_test(test_too_short_dies_once),
        cmocka_unit_test(test_stream_from_tokens),
    };
    return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
