// NF4 (core/nf4.h) against bitsandbytes 0.50.2 on the cpu, through the fixture
// build/test-data/nf4/bnb_nf4.h5 (tests/reference/make_nf4_fixture.py): for each of its
// inputs, nf4_quantize's blob holds bitsandbytes' offset, double-quantization scales, absmax
// codes and packed codes byte for byte, and nf4_dequantize gives its dequantized tensor bit for
// bit, from nf4_quantize's blob and from one assembled of bitsandbytes' parts. The tables equal
// bitsandbytes', the blob's parts sit where nf4.h says, and a box of it dequantizes to those
// elements of the whole.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/nf4.h"

#define FIXTURE "build/test-data/nf4/bnb_nf4.h5"

// The fixture's cases: what each pins is in make_nf4_fixture.py.
static const char *const CASES[] = {"64x64",   "3x100",       "one",      "partial_group",
                                    "weights", "zero_blocks", "extremes", "all_zero"};

static hid_t fixture = -1;

static int fixture_open(void **state) {
    (void)state;
    fixture = H5Fopen(FIXTURE, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (fixture < 0) fprintf(stderr, "cannot open %s: run `make test-data`\n", FIXTURE);
    return fixture < 0 ? -1 : 0;
}

static int fixture_close(void **state) {
    (void)state;
    return H5Fclose(fixture) < 0 ? -1 : 0;
}

// Dataset `path` of the fixture, which must be stored as `type`, into a malloc'd buffer of
// *count elements.
static void *dataset_read(const char *path, hid_t type, size_t *count) {
    hid_t dset = H5Dopen2(fixture, path, H5P_DEFAULT);
    if (dset < 0) fail_msg("%s has no dataset %s", FIXTURE, path);
    hid_t stored = H5Dget_type(dset), space = H5Dget_space(dset);
    if (H5Tequal(stored, type) <= 0) fail_msg("%s: %s has another type", FIXTURE, path);
    *count = (size_t)H5Sget_simple_extent_npoints(space);
    void *data = malloc(*count * H5Tget_size(type) + 1);
    assert_non_null(data);
    assert_true(H5Dread(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    H5Tclose(stored), H5Sclose(space), H5Dclose(dset);
    return data;
}

// Fails, naming the first differing byte, unless got and want are equal.
static void bytes_check(const char *what, const char *part, const void *got, const void *want,
                        size_t size) {
    const uint8_t *g = got, *w = want;
    for (size_t i = 0; i < size; i++)
        if (g[i] != w[i])
            fail_msg("%s: %s byte %zu of %zu is 0x%02x, bitsandbytes' 0x%02x", what, part, i, size,
                     g[i], w[i]);
}

typedef struct {
    size_t n;
    float *x;                         // (n) the input, flattened
    uint8_t *codes, *absmax_codes;    // ((n+1)/2), (blocks)
    float *group_absmax, *offset;     // (groups), (1)
    float *dequantized;               // (n)
} Case;

// Part `part` of case `name`, which must hold `count` elements as nf4.h counts them.
static void *case_part(const char *name, const char *part, hid_t type, size_t count) {
    char path[64];
    snprintf(path, sizeof path, "/%s/%s", name, part);
    size_t got;
    void *data = dataset_read(path, type, &got);
    if (got != count) fail_msg("%s: %zu elements, nf4.h says %zu", path, got, count);
    return data;
}

static Case case_read(const char *name) {
    Case c;
    char path[64];
    snprintf(path, sizeof path, "/%s/x", name);
    c.x = dataset_read(path, H5T_IEEE_F32LE, &c.n);
    c.codes = case_part(name, "codes", H5T_STD_U8LE, (c.n + 1) / 2);
    c.absmax_codes = case_part(name, "absmax_codes", H5T_STD_U8LE, nf4_blocks(c.n));
    c.group_absmax = case_part(name, "group_absmax", H5T_IEEE_F32LE, nf4_groups(c.n));
    c.offset = case_part(name, "offset", H5T_IEEE_F32LE, 1);
    c.dequantized = case_part(name, "dequantized", H5T_IEEE_F32LE, c.n);
    return c;
}

static void case_free(Case *c) {
    free(c->x), free(c->codes), free(c->absmax_codes), free(c->group_absmax), free(c->offset);
    free(c->dequantized);
}

// The parts of blob against bitsandbytes', then its padding (zeros) and the guard byte after it.
static void blob_check(const char *name, const uint8_t *blob, const Case *c) {
    size_t n = c->n;
    bytes_check(name, "offset", blob, c->offset, sizeof(float));
    bytes_check(name, "group_absmax", blob + nf4_group_absmax_at(), c->group_absmax,
                nf4_groups(n) * sizeof(float));
    bytes_check(name, "absmax_codes", blob + nf4_absmax_codes_at(n), c->absmax_codes,
                nf4_blocks(n));
    bytes_check(name, "codes", blob + nf4_codes_at(n), c->codes, (n + 1) / 2);
    for (size_t i = nf4_codes_at(n) + (n + 1) / 2; i < nf4_bytes(n); i++)
        if (blob[i]) fail_msg("%s: padding byte %zu is 0x%02x", name, i, blob[i]);
    assert_int_equal(blob[nf4_bytes(n)], 0xa5);
}

static void test_matches_bitsandbytes(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
        Case c = case_read(CASES[k]);
        size_t size = nf4_bytes(c.n);
        uint8_t *blob = malloc(size + 1), *theirs = calloc(size, 1);
        float *out = malloc(c.n * sizeof(float));
        assert_true(blob && theirs && out);
        memset(blob, 0xa5, size + 1);
        nf4_quantize(blob, c.x, c.n);
        blob_check(CASES[k], blob, &c);
        nf4_dequantize(out, blob, c.n);
        bytes_check(CASES[k], "dequantized", out, c.dequantized, c.n * sizeof(float));

        // Dequantized from bitsandbytes' own parts, apart from nf4_quantize.
        memcpy(theirs, c.offset, sizeof(float));
        memcpy(theirs + nf4_group_absmax_at(), c.group_absmax, nf4_groups(c.n) * sizeof(float));
        memcpy(theirs + nf4_absmax_codes_at(c.n), c.absmax_codes, nf4_blocks(c.n));
        memcpy(theirs + nf4_codes_at(c.n), c.codes, (c.n + 1) / 2);
        memset(out, 0, c.n * sizeof(float));
        nf4_dequantize(out, theirs, c.n);
        bytes_check(CASES[k], "dequantized from bitsandbytes' parts", out, c.dequantized,
                    c.n * sizeof(float));
        free(blob), free(theirs), free(out);
        case_free(&c);
    }
}

static void test_tables(void **state) {
    (void)state;
    const float *levels = nf4_levels(), *map = nf4_dynamic_map();
    assert_true(levels[0] == -1.0f && levels[7] == 0.0f && levels[15] == 1.0f);
    for (int i = 0; i < 15; i++) assert_true(levels[i] < levels[i + 1]);
    size_t count;
    float *want = dataset_read("/nf4_levels", H5T_IEEE_F32LE, &count);
    assert_int_equal(count, 16);
    bytes_check("tables", "nf4_levels", levels, want, 16 * sizeof(float));
    free(want);
    want = dataset_read("/dynamic_map", H5T_IEEE_F32LE, &count);
    assert_int_equal(count, 256);
    bytes_check("tables", "dynamic_map", map, want, 256 * sizeof(float));
    // Increasing where bitsandbytes' is (everywhere in 0.50.2): the searches assume it.
    for (int i = 0; i < 255; i++) assert_int_equal(map[i] < map[i + 1], want[i] < want[i + 1]);
    assert_true(map[127] == 0.0f && map[255] == 1.0f);
    free(want);
}

// Where each part starts, counted by hand.
static void test_layout(void **state) {
    (void)state;
    assert_int_equal(nf4_bytes(0), 4);
    // n = 1: offset, 1 group absmax, 1 absmax code, 1 code byte, 3 bytes padding.
    assert_int_equal(nf4_group_absmax_at(), 4);
    assert_int_equal(nf4_absmax_codes_at(1), 8);
    assert_int_equal(nf4_codes_at(1), 9);
    assert_int_equal(nf4_bytes(1), 12);
    // n = 64 * 256 + 1: 257 blocks in 2 groups, 8193 code bytes.
    size_t n = 64 * 256 + 1;
    assert_int_equal(nf4_blocks(n), 257);
    assert_int_equal(nf4_groups(n), 2);
    assert_int_equal(nf4_absmax_codes_at(n), 12);
    assert_int_equal(nf4_codes_at(n), 12 + 257);
    assert_int_equal(nf4_bytes(n), 8464);
    // A multiple of everything: no padding.
    n = 64 * 256 * 2;
    assert_int_equal(nf4_bytes(n), 4 + 2 * 4 + 512 + n / 2);
}

// A box of rows and columns of a (rows, cols) tensor (a tensor-parallel rank's part) dequantizes
// to exactly those elements of the whole: boxes at odd offsets and widths, so that elements of
// a code byte are split between boxes and rows, and a box that ends in the short last block.
static void test_box_is_part_of_whole(void **state) {
    (void)state;
    const size_t rows = 37, cols = 53, n = rows * cols;
    float *x = malloc(n * sizeof *x), *whole = malloc(n * sizeof *whole), *box = malloc(n * 4);
    uint8_t *blob = aligned_alloc(4, (nf4_bytes(n) + 3) / 4 * 4);
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    nf4_quantize(blob, x, n);
    nf4_dequantize(whole, blob, n);
    const size_t boxes[][4] = {{0, 0, 37, 53}, {3, 7, 10, 31}, {1, 0, 36, 53}, {5, 52, 4, 1},
                               {36, 1, 1, 52}, {2, 17, 33, 2}};
    for (size_t k = 0; k < sizeof boxes / sizeof boxes[0]; k++) {
        size_t r0 = boxes[k][0], c0 = boxes[k][1], nr = boxes[k][2], nc = boxes[k][3];
        nf4_dequantize_box(box, blob, n, cols, r0, c0, nr, nc);
        for (size_t r = 0; r < nr; r++)
            assert_memory_equal(box + r * nc, whole + (r0 + r) * cols + c0, nc * sizeof(float));
    }
    free(x), free(whole), free(box), free(blob);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_matches_bitsandbytes),
        cmocka_unit_test(test_box_is_part_of_whole),
    };
    return cmocka_run_group_tests(tests, fixture_open, fixture_close);
}
