// titan's host casts of a list of floats, as raw files for tests/reference/check_casts.py to
// compare with ml_dtypes bit for bit:
//   dump_casts IN.f32 OUT_DIR
// IN holds float32 values. OUT_DIR gets, one entry per input: e4m3fn.u8, e4m3fn_sat.u8,
// e5m2.u8, e5m2_sat.u8 (float8_from_float non-saturating and saturating), bf16.u16, and
// scale_e4m3fn.f32, scale_e5m2.f32 (float8_scale_from_amax, the input as amax); and each
// format's codes decoded: decode_e4m3fn.f32, decode_e5m2.f32 (256), decode_bf16.f32 (65536).
#include <stdio.h>
#include <stdlib.h>

#include "core/bf16.h"
#include "core/errors.h"
#include "core/float8.h"

static const char *out_dir;

static void write_out(const char *name, const void *data, size_t elem, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) die_user("dump_casts: cannot write %s: %s", path, strerror(errno));
    CHECK(fwrite(data, elem, n, f) == n);
    CHECK(fclose(f) == 0);
}

static float *read_floats(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) die_user("dump_casts: cannot read %s: %s", path, strerror(errno));
    SYS_CHECK(fseek(f, 0, SEEK_END));
    long bytes = ftell(f);
    SYS_CHECK(bytes);
    if (bytes % sizeof(float)) die_user("dump_casts: %s: %ld bytes, not float32s", path, bytes);
    rewind(f);
    *n = (size_t)bytes / sizeof(float);
    float *x = xmalloc((size_t)bytes);
    CHECK(fread(x, sizeof(float), *n, f) == *n);
    fclose(f);
    return x;
}

static void dump_float8(const float *x, size_t n, Float8Kind kind, const char *name) {
    uint8_t *code = xmalloc(n);
    float *scale = xmalloc(n * sizeof(float)), decoded[256];
    char file[64];
    for (int saturate = 0; saturate < 2; saturate++) {
        for (size_t i = 0; i < n; i++) code[i] = float8_from_float(x[i], kind, saturate);
        snprintf(file, sizeof file, "%s%s.u8", name, saturate ? "_sat" : "");
        write_out(file, code, 1, n);
    }
    for (size_t i = 0; i < n; i++) scale[i] = float8_scale_from_amax(x[i], kind);
    snprintf(file, sizeof file, "scale_%s.f32", name);
    write_out(file, scale, sizeof(float), n);
    for (int c = 0; c < 256; c++) decoded[c] = float8_to_float((uint8_t)c, kind);
    snprintf(file, sizeof file, "decode_%s.f32", name);
    write_out(file, decoded, sizeof(float), 256);
    free(code), free(scale);
}

static void dump_bf16(const float *x, size_t n) {
    uint16_t *code = xmalloc(n * sizeof(uint16_t));
    float *decoded = xmalloc(65536 * sizeof(float));
    for (size_t i = 0; i < n; i++) code[i] = bf16_from_float(x[i]);
    write_out("bf16.u16", code, sizeof(uint16_t), n);
    for (uint32_t c = 0; c < 65536; c++) decoded[c] = bf16_to_float((uint16_t)c);
    write_out("decode_bf16.f32", decoded, sizeof(float), 65536);
    free(code), free(decoded);
}

int main(int argc, char **argv) {
    if (argc != 3) die_user("usage: dump_casts IN.f32 OUT_DIR");
    out_dir = argv[2];
    size_t n;
    float *x = read_floats(argv[1], &n);
    dump_float8(x, n, FLOAT8_E4M3FN, "e4m3fn");
    dump_float8(x, n, FLOAT8_E5M2, "e5m2");
    dump_bf16(x, n);
    free(x);
    return 0;
}
