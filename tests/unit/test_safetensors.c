// safetensors tests: bit-exact F32 round trips, BF16 rounding to nearest even, files written by
// hand as the format's README describes them (so the reader is not only checked against our own
// writer), sharded folders, and the one-line refusal of each kind of malformed input.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "checkpoint/safetensors.h"
#include "core/bf16.h"
#include "core/errors.h"

#include "tests/unit/test_support.h"

static float from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// A file as the format's README lays it out: u64 little-endian header length, header, data.
static void craft(const char *path, const char *header, const void *data, size_t n) {
    size_t len = strlen(header);
    uint8_t *bytes = xmalloc(8 + len + n);
    for (int i = 0; i < 8; i++) bytes[i] = (uint8_t)((uint64_t)len >> (8 * i));
    memcpy(bytes + 8, header, len);
    memcpy(bytes + 8 + len, data, n);
    bytes_write(path, bytes, 8 + len + n);
    free(bytes);
}

static void test_f32_roundtrip_bit_exact(void **state) {
    (void)state;
    float w[12], s = 0;
    for (int i = 0; i < 12; i++) w[i] = from_bits(0x3f800001u * (uint32_t)(i + 1) ^ 0x5a5a5u);
    s = from_bits(0xc0490fdbu);  // -pi
    int64_t shape[2] = {3, 4};
    CkptTensor list[] = {{.path = "w", .ndim = 2, .shape = shape, .data = w}, {.path = "scalar", .ndim = 0, .shape = NULL, .data = &s}};
    char path[300];
    path_make(path, sizeof path, "f32.safetensors");
    safetensors_save(path, list, 2, SAFETENSORS_F32);

    Safetensors st;
    safetensors_open(path, &st);
    assert_int_equal(st.n_tensors, 2);
    float w2[12], s2;
    safetensors_read(&st, "w", 2, shape, w2);
    safetensors_read(&st, "scalar", 0, NULL, &s2);
    assert_memory_equal(w, w2, sizeof w);
    assert_memory_equal(&s, &s2, 4);
    safetensors_close(&st);

    // The header is padded to 8 bytes and carries transformers' {"format": "pt"}.
    FILE *f = fopen(path, "rb");
    uint64_t n = 0;
    uint8_t le[8];
    assert_int_equal(fread(le, 1, 8, f), 8);
    for (int i = 7; i >= 0; i--) n = n << 8 | le[i];
    char *header = xcalloc(n + 1, 1);
    assert_int_equal(fread(header, 1, n, f), n);
    fclose(f);
    assert_int_equal(n % 8, 0);
    assert_non_null(strstr(header, "\"__metadata__\":{\"format\":\"pt\"}"));
    assert_non_null(
        strstr(header, "\"w\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}"));
    free(header);
}

static void test_bf16_rounds_to_nearest_even(void **state) {
    (void)state;
    // ties go to the even neighbour, anything above a tie up, NaN stays NaN
    const uint32_t in[] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0xbf7fffffu,
                           0x7f800000u, 0x7fc00001u};
    const uint16_t want[] = {0x3f80, 0x3f82, 0x3f81, 0x3f80, 0xbf80, 0x7f80, 0x7fc0};
    float x[7], back[7];
    for (int i = 0; i < 7; i++) x[i] = from_bits(in[i]);
    int64_t n = 7;
    CkptTensor t = {.path = "x", .ndim = 1, .shape = &n, .data = x};
    char path[300];
    path_make(path, sizeof path, "bf16.safetensors");
    safetensors_save(path, &t, 1, SAFETENSORS_BF16);
    Safetensors st;
    safetensors_open(path, &st);
    assert_int_equal(st.tensors[0].dtype, SAFETENSORS_BF16);
    assert_int_equal(st.tensors[0].end - st.tensors[0].begin, 14);
    safetensors_read(&st, "x", 1, &n, back);
    safetensors_close(&st);
    for (int i = 0; i < 7; i++) {
        uint32_t bits;
        memcpy(&bits, &back[i], 4);
        assert_int_equal(bits, (uint32_t)want[i] << 16);
    }
}

// A file written by hand: BF16 read exactly, a scalar F32, offsets in any order.
static void test_reads_handwritten_file(void **state) {
    (void)state;
    char path[300];
    path_make(path, sizeof path, "hand.safetensors");
    const uint8_t data[] = {0x00, 0x00, 0x60, 0x40,   // b: 3.5f
                            0x80, 0x3f, 0x00, 0xc0};  // a: bf16 1.0, -2.0
    craft(path, "{\"__metadata__\":{\"who\":\"hand\"},\"a\":{\"dtype\":\"BF16\",\"shape\":[2],"
          "\"data_offsets\":[4,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}",
          data, sizeof data);
    Safetensors st;
    safetensors_open(path, &st);
    float a[2], b;
    int64_t two = 2;
    safetensors_read(&st, "a", 1, &two, a);
    safetensors_read(&st, "b", 0, NULL, &b);
    safetensors_close(&st);
    assert_true(a[0] == 1.0f && a[1] == -2.0f && b == 3.5f);
}

// A folder of two shards and an index: each tensor from its own file.
static void test_sharded_folder(void **state) {
    (void)state;
    char sub[300], path[400];
    path_make(sub, sizeof sub, "sharded");
    float x[3] = {1, 2, 3}, y[2] = {4, 5}, back[3];
    int64_t n3 = 3, n2 = 2;
    CkptTensor tx = {.path = "x", .ndim = 1, .shape = &n3, .data = x}, ty = {.path = "y", .ndim = 1, .shape = &n2, .data = y};
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", sub);
    safetensors_save(path, &tx, 1, SAFETENSORS_F32);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", sub);
    safetensors_save(path, &ty, 1, SAFETENSORS_BF16);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", sub);
    const char *index = "{\"metadata\":{\"total_size\":16},\"weight_map\":{"
                        "\"x\":\"model-00001-of-00002.safetensors\","
                        "\"y\":\"model-00002-of-00002.safetensors\"}}";
    bytes_write(path, index, strlen(index));
    Safetensors st;
    safetensors_open(sub, &st);
    assert_int_equal(st.n_files, 2);
    safetensors_read(&st, "x", 1, &n3, back);
    assert_memory_equal(back, x, sizeof x);
    safetensors_read(&st, "y", 1, &n2, back);
    assert_memory_equal(back, y, sizeof y);
    safetensors_close(&st);

    // an index naming a tensor its shard does not hold
    const char *wrong = "{\"weight_map\":{\"x\":\"model-00002-of-00002.safetensors\"}}";
    bytes_write(path, wrong, strlen(wrong));
    char err[1024], want[1024];
    assert_false(safetensors_try_open(sub, &st, err, sizeof err));
    snprintf(want, sizeof want, "safetensors index %s: weight_map puts 'x' in "
             "%s/model-00002-of-00002.safetensors, which has no such tensor", path, sub);
    assert_string_equal(err, want);
}

// The reason safetensors_try_open gives for a file with this header and 8 data bytes.
static void expect_refused(const char *header, const char *reason) {
    char path[300], err[1024], want[1024];
    path_make(path, sizeof path, "bad.safetensors");
    const uint8_t data[8] = {0};
    craft(path, header, data, sizeof data);
    Safetensors st;
    assert_false(safetensors_try_open(path, &st, err, sizeof err));
    snprintf(want, sizeof want, "safetensors %s: %s", path, reason);
    assert_string_equal(err, want);
}

static void test_malformed_headers(void **state) {
    (void)state;
    expect_refused("{\"a\":", "header is not JSON (byte 5: unexpected token near end of file)");
    expect_refused("[1, 2]", "header is not a JSON object");
    expect_refused("{\"a\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
                   "tensor 'a' has dtype 'F16'; titan reads F32 and BF16");
    expect_refused("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", "tensor 'a' has no dtype");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,8]}}",
                   "tensor 'a' has no shape of at most 8 non-negative sizes");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}",
                   "tensor 'a' has no data_offsets [begin, end]");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                   "tensor 'a' has data_offsets [0, 16] outside the data section's 8 bytes");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}",
                   "tensor 'a' has data_offsets [4, 0] outside the data section's 8 bytes");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
                   "tensor 'a' of shape (3) and dtype F32 spans 8 bytes of data_offsets instead "
                   "of 12");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[2,6]}}",
                   "tensors 'a' and 'b' overlap");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   "header is not JSON (byte 57: duplicate object key near '\"a\"')");
    expect_refused("{\"__metadata__\":3}", "__metadata__ is not an object of strings");
    expect_refused("{\"__metadata__\":{\"format\":1}}", "__metadata__ is not an object of strings");
    // The tensors tile the data section: no hole before, between or after them.
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   "data bytes 0 to 4 belong to no tensor (before 'a')");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   "data bytes 0 to 4 belong to no tensor (before 'b')");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                   "4 bytes after the last tensor's data belong to no tensor");
}

static void test_bad_lengths(void **state) {
    (void)state;
    char path[300], err[1024], want[1024];
    Safetensors st;
    path_make(path, sizeof path, "short.safetensors");
    bytes_write(path, "\x05\x00\x00", 3);
    assert_false(safetensors_try_open(path, &st, err, sizeof err));
    snprintf(want, sizeof want, "safetensors %s has 3 bytes, too few for its 8-byte header "
             "length", path);
    assert_string_equal(err, want);
    bytes_write(path, "\xff\x00\x00\x00\x00\x00\x00\x00{}", 10);
    assert_false(safetensors_try_open(path, &st, err, sizeof err));
    snprintf(want, sizeof want, "safetensors %s: header length 255 does not fit the file's 10 "
             "bytes (not a safetensors file?)", path);
    assert_string_equal(err, want);
    path_make(path, sizeof path, "absent.safetensors");
    assert_false(safetensors_try_open(path, &st, err, sizeof err));
    snprintf(want, sizeof want, "safetensors path %s does not exist", path);
    assert_string_equal(err, want);
}

static void test_read_refusals(void **state) {
    (void)state;
    char path[300], err[1024], want[1024];
    path_make(path, sizeof path, "read.safetensors");
    float x[4] = {0};
    int64_t four = 4, two_by_two[2] = {2, 2};
    CkptTensor t = {.path = "x", .ndim = 1, .shape = &four, .data = x};
    safetensors_save(path, &t, 1, SAFETENSORS_F32);
    Safetensors st;
    safetensors_open(path, &st);
    assert_false(safetensors_try_read(&st, "y", 1, &four, x, err, sizeof err));
    snprintf(want, sizeof want, "safetensors %s has no tensor y", path);
    assert_string_equal(err, want);
    assert_false(safetensors_try_read(&st, "x", 2, two_by_two, x, err, sizeof err));
    snprintf(want, sizeof want, "safetensors %s: tensor x has shape (4) but the model expects "
             "(2, 2)", path);
    assert_string_equal(err, want);
    safetensors_close(&st);
}

static void open_or_die(const char *path) {
    Safetensors st;
    safetensors_open(path, &st);
}

static void test_open_dies_with_one_line(void **state) {
    (void)state;
    char path[300], want[1024];
    path_make(path, sizeof path, "garbage.safetensors");
    bytes_write(path, "not a safetensors file at all", 29);
    snprintf(want, sizeof want, "titan: error: safetensors %s: header length %llu does not fit "
             "the file's 29 bytes (not a safetensors file?)\n", path,
             0x6173206120746f6eull);  // "not a sa" read as a little-endian u64
    expect_die_user(open_or_die, path, want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_roundtrip_bit_exact),
        cmocka_unit_test(test_bf16_rounds_to_nearest_even),
        cmocka_unit_test(test_reads_handwritten_file),
        cmocka_unit_test(test_sharded_folder),
        cmocka_unit_test(test_malformed_headers),
        cmocka_unit_test(test_bad_lengths),
        cmocka_unit_test(test_read_refusals),
        cmocka_unit_test(test_open_dies_with_one_line),
    };
    return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
