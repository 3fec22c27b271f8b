// PNG grid tests: grids of grey and RGB images read back with libpng, checked for their size,
// each image's pixels in its cell (with the stated rounding and clamping), the gutters and the
// empty cells; an unwritable path is one line and exit 2.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <png.h>
#include <stdlib.h>

#include "infer/png_grid.h"

#include "tests/unit/test_support.h"

#define H 3
#define W 4
#define G PNG_GRID_GUTTER

// Image k's value at (c, y, x): a spread over [-1.5, 1.5], so both clamps are met.
static float value(int k, int c, int y, int x) {
    return -1.5f + (float)((k * 7 + c * 5 + y * W + x) % 31) / 10.0f;
}

static uint8_t byte_expected(float v) {
    if (v <= -1.0f) return 0;
    if (v >= 1.0f) return 255;
    return (uint8_t)floor(((double)v + 1.0) * 127.5 + 0.5);
}

// The PNG at path as 8-bit pixels of C channels, malloc'd; its size in *width, *height.
static uint8_t *png_read(const char *path, int C, int *width, int *height) {
    png_image png = {.version = PNG_IMAGE_VERSION};
    assert_true(png_image_begin_read_from_file(&png, path));
    assert_int_equal(png.format, C == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB);
    uint8_t *pixels = malloc(PNG_IMAGE_SIZE(png));
    assert_true(png_image_finish_read(&png, NULL, pixels, 0, NULL));
    *width = (int)png.width, *height = (int)png.height;
    return pixels;
}

// n images in a grid of rows rows, each pixel drawn as a scale x scale block: every pixel of
// the PNG is its image's byte or gutter grey.
static void grid_check(int n, int C, int rows, int scale) {
    float *images = malloc((size_t)n * C * H * W * sizeof(float));
    for (int k = 0; k < n; k++)
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    images[((k * C + c) * H + y) * W + x] = value(k, c, y, x);
    images[0] = NAN;  // image 0's first value: taken as -1
    char path[512];
    path_make(path, sizeof(path), "grid.png");
    png_grid_write(path, images, n, C, H, W, rows, scale);
    int cols = (n + rows - 1) / rows, width, height, SH = H * scale, SW = W * scale;
    uint8_t *pixels = png_read(path, C, &width, &height);
    assert_int_equal(width, cols * SW + (cols - 1) * G);
    assert_int_equal(height, rows * SH + (rows - 1) * G);
    for (int py = 0; py < height; py++)
        for (int px = 0; px < width; px++)
            for (int c = 0; c < C; c++) {
                int y = py % (SH + G), x = px % (SW + G), k = py / (SH + G) * cols + px / (SW + G);
                uint8_t want = 128;  // gutter or empty cell
                if (y < SH && x < SW && k < n)
                    want = byte_expected(value(k, c, y / scale, x / scale));
                if (y < scale && x < scale && k == 0 && c == 0) want = 0;  // the NaN
                assert_int_equal(pixels[((size_t)py * width + px) * C + c], want);
            }
    free(pixels);
    free(images);
}

static void test_grey_grid(void **state) {
    (void)state;
    grid_check(5, 1, 2, 1);  // 2 rows of 3: the last cell empty
    grid_check(1, 1, 1, 1);  // one image, no gutter
    grid_check(5, 1, 2, 3);  // each pixel a 3 x 3 block
}

static void test_rgb_grid(void **state) {
    (void)state;
    grid_check(6, 3, 3, 1);
    grid_check(6, 3, 3, 2);
}

// Small images are drawn at least PNG_GRID_MIN_CELL on their longer side; large ones 1:1.
static void test_scale(void **state) {
    (void)state;
    assert_int_equal(png_grid_scale(16, 16), 6);  // the digits: 96 x 96 cells
    assert_int_equal(png_grid_scale(16, 48), 2);
    assert_int_equal(png_grid_scale(96, 10), 1);
    assert_int_equal(png_grid_scale(1024, 1024), 1);
}

// The rounding's fixed points: -1, 0 and 1 are 0, 128 and 255.
static void test_levels(void **state) {
    (void)state;
    assert_int_equal(byte_expected(-1.0f), 0);
    float levels[3] = {-1.0f, 0.0f, 1.0f};
    char path[512];
    path_make(path, sizeof(path), "levels.png");
    png_grid_write(path, levels, 3, 1, 1, 1, 1, 1);
    int width, height;
    uint8_t *pixels = png_read(path, 1, &width, &height);
    assert_int_equal(width, 3 + 2 * G);
    assert_int_equal(pixels[0], 0);
    assert_int_equal(pixels[1 + G], 128);
    assert_int_equal(pixels[2 + 2 * G], 255);
    free(pixels);
}

static void grid_write_to(const char *path) {
    float x = 0;
    png_grid_write(path, &x, 1, 1, 1, 1, 1, 1);
}

static void test_unwritable(void **state) {
    (void)state;
    char path[512], want[1200];
    path_make(path, sizeof(path), "no/such/dir/grid.png");
    snprintf(want, sizeof(want), "titan: error: cannot write PNG %s.tmp: No such file or "
             "directory\n", path);
    expect_die_user(grid_write_to, path, want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grey_grid),
        cmocka_unit_test(test_rgb_grid),
        cmocka_unit_test(test_scale),
        cmocka_unit_test(test_levels),
        cmocka_unit_test(test_unwritable),
    };
    return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
