#include "infer/png_grid.h"

#include <math.h>
#include <png.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

static uint8_t pixel_byte(float v) {
    double x = isnan(v) ? -1.0 : fmin(fmax((double)v, -1.0), 1.0);
    return (uint8_t)floor((x + 1.0) * 127.5 + 0.5);
}

int png_grid_scale(int H, int W) {
    int side = H > W ? H : W;
    return side >= PNG_GRID_MIN_CELL ? 1 : (PNG_GRID_MIN_CELL + side - 1) / side;
}

// Image k into the grid's pixels (height, width, C), at its cell's corner (y0, x0), each of
// its pixels a scale x scale block.
static void image_place(uint8_t *grid, int width, const float *image, int C, int H, int W,
                        int scale, int y0, int x0) {
    for (int c = 0; c < C; c++)
        for (int y = 0; y < H * scale; y++)
            for (int x = 0; x < W * scale; x++)
                grid[((size_t)(y0 + y) * width + x0 + x) * C + c] =
                    pixel_byte(image[((size_t)c * H + y / scale) * W + x / scale]);
}

void png_grid_write(const char *path, const float *images, int n, int C, int H, int W, int rows,
                    int scale) {
    CHECK(n >= 1 && (C == 1 || C == 3) && H >= 1 && W >= 1 && rows >= 1 && rows <= n &&
          scale >= 1);
    int cols = (n + rows - 1) / rows, cell_h = H * scale, cell_w = W * scale;
    int width = cols * cell_w + (cols - 1) * PNG_GRID_GUTTER;
    int height = rows * cell_h + (rows - 1) * PNG_GRID_GUTTER;
    uint8_t *grid = xmalloc((size_t)width * height * C);  // (height, width, C)
    memset(grid, 128, (size_t)width * height * C);
    for (int k = 0; k < n; k++)
        image_place(grid, width, images + (size_t)k * C * H * W, C, H, W, scale,
                    k / cols * (cell_h + PNG_GRID_GUTTER), k % cols * (cell_w + PNG_GRID_GUTTER));
    png_image png = {.version = PNG_IMAGE_VERSION, .width = (png_uint_32)width,
                     .height = (png_uint_32)height,
                     .format = C == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB};
    char *tmp;
    CHECK(asprintf(&tmp, "%s.tmp", path) >= 0);
    // libpng's simplified API puts the reason in message (strerror when it cannot create tmp).
    if (!png_image_write_to_file(&png, tmp, 0, grid, 0, NULL))
        die_user("cannot write PNG %s: %s", tmp, png.message);
    if (rename(tmp, path) != 0) die_user("cannot write PNG %s: %s", path, strerror(errno));
    free(tmp);
    free(grid);
}
