// Sample grids: a set of images written as one PNG, so a user sees what a model draws.
#pragma once

// Pixels between neighbouring images, filled with grey 128 (visible against the black and
// the white of any sample); cells past the last image are that grey too.
#define PNG_GRID_GUTTER 2

// The smallest cell a grid shows an image in: a 16 x 16 digit drawn 1:1 is a speck.
#define PNG_GRID_MIN_CELL 96

// The integer factor that draws an H x W image at least PNG_GRID_MIN_CELL on its longer side
// (1 for an image that large already).
int png_grid_scale(int H, int W);

// Writes n images (n, C, H, W), C = 1 (grey) or 3 (RGB), values in [-1, 1], as one 8-bit PNG
// of rows rows and ceil(n / rows) columns: image k in row k / columns, column k % columns,
// each pixel a scale x scale block (nearest neighbour: the model's pixels as they are).
// A value v becomes the byte floor((v + 1) * 127.5 + 0.5), in double, after clamping v to
// [-1, 1] (NaN as -1): -1 is 0, 0 is 128, 1 is 255. Written to path.tmp, then renamed;
// die_user naming the path when it cannot be written.
void png_grid_write(const char *path, const float *images, int n, int C, int H, int W, int rows,
                    int scale);
