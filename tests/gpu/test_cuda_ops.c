// Every op of the cuda backend against the cpu one (ggml's test-backend-ops): the same random
// inputs (fixed seed) are uploaded to both backends, each runs the op, and each output is
// compared by its normalised error max |cuda - cpu| / max |cpu|. Outputs an op overwrites
// start as NaN on both sides, so an element the op leaves unwritten fails; gradients start from
// the same random values, and their error is normalised by the change the cpu op made, so a
// backward that overwrites instead of accumulating fails too. Prints one row per output (op,
// shape, error, bound, the cuda op's time, PASS/FAIL); exits 1 on any failure, 77 when there is
// no usable CUDA device (SKIP), 2 on a bad argument.
//
// Usage: test_cuda_ops [fp32]. init starts the backend once per process, so one run tests one
// compute mode: bf16 (the default, as training.mixed_precision_param) or, with fp32, fp32
// compute, where GEMMs and attention are held to the fp32 reduction bound.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/bf16.h"
#include "core/nf4.h"
#include "kernels/kernels.h"

enum { CPU, GPU, N_SIDES };
static const KernelOps *side[N_SIDES];

#define BOUND_BF16 2e-2    // bf16 operands (8-bit significand: 2^-9 relative), fp32 accumulation
#define BOUND_FP32 1e-5    // fp32 elementwise math: a few ulps of the largest value
#define BOUND_REDUCE 1e-4  // fp32 sums over long rows, added in another order
// FP8 tensor-core GEMMs: Hopper adds the products in an accumulator narrower than fp32 before
// promoting to it (DeepSeek-V3's report, 3.3.2); on an H200, K = 2048..4096 gave 1.0-1.3e-4.
#define BOUND_FLOAT8_GEMM 5e-4
#define BOUND_EXACT 0.0    // moves, lookups and single roundings: bit for bit
#define BOUND_BF16_STORE 8e-3  // an fp32 result stored in bf16: one rounding (2^-9) either way
#define TIME_REPS 20       // cuda runs per timing
#define MAX_OUTPUTS 3

static double bound_compute;  // GEMMs and attention: BOUND_BF16, or BOUND_REDUCE in fp32 compute
static void *sync_word;       // 4 bytes of cuda memory whose download waits for the queue
static int n_checks, n_failed;

// ---- host data -------------------------------------------------------------------------------

static uint64_t rng_state = 20240901;

static uint64_t rng_next(void) {  // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_range(double lo, double hi) {
    return lo + (hi - lo) * (double)(rng_next() >> 11) / (double)(1ull << 53);
}

static int rng_int(int lo, int hi) { return lo + (int)(rng_next() % (uint64_t)(hi - lo)); }

static void *host_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_cuda_ops: out of host memory (%zu bytes)\n", bytes);
        exit(3);
    }
    return p;
}

static float *host_random(size_t n, double lo, double hi) {
    float *x = host_alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)rng_range(lo, hi);
    return x;
}

// ---- tensors held by both backends -----------------------------------------------------------

// One tensor in each backend's memory, holding the same bytes; init keeps the host values it
// started from when it started random (the base that an accumulating op's change is measured
// from), else NULL.
typedef struct {
    void *at[N_SIDES];
    size_t bytes;
    float *init;
} Pair;

#define F(pair, s) ((float *)(pair).at[s])
#define I(pair, s) ((const int *)(pair).at[s])
#define H(pair, s) ((uint16_t *)(pair).at[s])

static void *side_alloc(int s, size_t bytes) {
    void *p = side[s]->alloc(bytes);
    if (!p) {
        fprintf(stderr, "test_cuda_ops: %s: cannot allocate %zu bytes\n", side[s]->name, bytes);
        exit(3);
    }
    return p;
}

static Pair pair_alloc(size_t bytes) {
    Pair p = {.bytes = bytes};
    for (int s = 0; s < N_SIDES; s++) p.at[s] = side_alloc(s, bytes);
    return p;
}

static Pair pair_of(const void *host, size_t bytes) {
    Pair p = pair_alloc(bytes);
    for (int s = 0; s < N_SIDES; s++) side[s]->upload(p.at[s], host, bytes);
    return p;
}

// Takes ownership of x (n floats), which becomes the pair's init.
static Pair pair_adopt(float *x, size_t n) {
    Pair p = pair_of(x, n * sizeof *x);
    p.init = x;
    return p;
}

static Pair pair_random(size_t n, double lo, double hi) {
    return pair_adopt(host_random(n, lo, hi), n);
}

static Pair pair_zeros(size_t n) {
    float *x = host_alloc(n * sizeof *x);
    memset(x, 0, n * sizeof *x);
    return pair_adopt(x, n);
}

static Pair pair_nan(size_t n) {
    float *x = host_alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    Pair p = pair_of(x, n * sizeof *x);
    free(x);
    return p;
}

// n bf16 NaNs: a typed op's bf16 output before it runs.
static Pair pair_nan16(size_t n) {
    uint16_t *x = host_alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = 0x7fc0u;
    Pair p = pair_of(x, n * sizeof *x);
    free(x);
    return p;
}

static Pair pair_ints(const int *x, size_t n) { return pair_of(x, n * sizeof *x); }

// Both sides back to the init values (after a timing has rerun an op on them).
static void pair_reset(Pair *p) {
    for (int s = 0; s < N_SIDES; s++) side[s]->upload(p->at[s], p->init, p->bytes);
}

static void pair_free(Pair *p) {
    for (int s = 0; s < N_SIDES; s++) side[s]->free(p->at[s]);
    free(p->init);
    *p = (Pair){0};
}

static void *pair_download(const Pair *p, int s) {
    void *h = host_alloc(p->bytes);
    side[s]->download(h, p->at[s], p->bytes);
    return h;
}

// The cpu side's bytes copied to the cuda side: a backward then reads the same saved
// activations on both, so that its check measures the backward alone.
static void pair_share_cpu(Pair *p) {
    void *h = pair_download(p, CPU);
    side[GPU]->upload(p->at[GPU], h, p->bytes);
    free(h);
}

// ---- comparing and reporting -----------------------------------------------------------------

typedef enum {
    CMP_NORMALISED,  // max |cuda - cpu| / max |cpu|
    CMP_INCREMENT,   // max |cuda - cpu| / max |cpu - init|: an accumulated gradient's error
    CMP_BITS32,      // the fraction of floats whose bits differ (any NaN matches any NaN)
    CMP_BITS16,      // the same over bf16 values
    CMP_NORMALISED16,  // CMP_NORMALISED over bf16 values (a typed op's bf16 output)
    CMP_BYTES,       // the fraction of bytes that differ (float8 codes)
} Compare;

typedef struct {
    const char *name;       // "" for an op's only output
    const Pair *pair;       // NULL for a scalar result
    const double *scalar;   // [N_SIDES] the op's returned values, when pair is NULL
    Compare cmp;
    double bound;
} Output;

// A NaN on either side makes the error NaN, which no bound passes; so does an infinity (the
// lse of a row that sees no key) that the other side does not match exactly.
static double error_normalised(const float *cpu, const float *gpu, const float *base, size_t n) {
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(cpu[i]) || isnan(gpu[i])) return NAN;
        if (isinf(cpu[i]) || isinf(gpu[i])) {
            if (cpu[i] != gpu[i]) return NAN;
            continue;
        }
        err = fmax(err, fabs((double)gpu[i] - cpu[i]));
        scale = fmax(scale, fabs((double)cpu[i] - (base ? base[i] : 0.0f)));
    }
    return scale > 0.0 ? err / scale : err;
}

static double error_bits32(const float *cpu, const float *gpu, size_t n) {
    size_t differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += !(isnan(cpu[i]) && isnan(gpu[i])) && memcmp(&cpu[i], &gpu[i], 4) != 0;
    return n ? (double)differ / (double)n : 0.0;
}

static bool bf16_is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

static double error_bits16(const uint16_t *cpu, const uint16_t *gpu, size_t n) {
    size_t differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += !(bf16_is_nan(cpu[i]) && bf16_is_nan(gpu[i])) && cpu[i] != gpu[i];
    return n ? (double)differ / (double)n : 0.0;
}

static double error_normalised16(const uint16_t *cpu, const uint16_t *gpu, size_t n) {
    float *c = host_alloc(n * sizeof *c), *g = host_alloc(n * sizeof *g);
    for (size_t i = 0; i < n; i++) c[i] = bf16_to_float(cpu[i]), g[i] = bf16_to_float(gpu[i]);
    double err = error_normalised(c, g, NULL, n);
    free(c), free(g);
    return err;
}

static double error_bytes(const uint8_t *cpu, const uint8_t *gpu, size_t n) {
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += cpu[i] != gpu[i];
    return n ? (double)differ / (double)n : 0.0;
}

static double error_scalar(double cpu, double gpu) {
    if (isnan(cpu) || isnan(gpu)) return NAN;
    return cpu != 0.0 ? fabs(gpu - cpu) / fabs(cpu) : fabs(gpu);
}

static double output_error(const Output *o) {
    if (!o->pair) return error_scalar(o->scalar[CPU], o->scalar[GPU]);
    void *cpu = pair_download(o->pair, CPU), *gpu = pair_download(o->pair, GPU);
    size_t n = o->pair->bytes / 4;
    double err = NAN;
    switch (o->cmp) {
    case CMP_NORMALISED: err = error_normalised(cpu, gpu, NULL, n); break;
    case CMP_INCREMENT: err = error_normalised(cpu, gpu, o->pair->init, n); break;
    case CMP_BITS32: err = error_bits32(cpu, gpu, n); break;
    case CMP_BITS16: err = error_bits16(cpu, gpu, o->pair->bytes / 2); break;
    case CMP_NORMALISED16: err = error_normalised16(cpu, gpu, o->pair->bytes / 2); break;
    case CMP_BYTES: err = error_bytes(cpu, gpu, o->pair->bytes); break;
    }
    free(cpu), free(gpu);
    return err;
}

static void report(const char *op, const Output *o, const char *shape, double err, double us) {
    bool pass = err <= o->bound;  // false for NaN
    char name[64];
    snprintf(name, sizeof name, "%s%s%s", op, o->name[0] ? " " : "", o->name);
    printf("%-37s %-44s %10.3g %8.0e %10.1f  %s\n", name, shape, err, o->bound, us,
           pass ? "PASS" : "FAIL");
    fflush(stdout);  // a crash in a later op keeps the rows before it
    n_checks++;
    n_failed += !pass;
}

// ---- running an op on both sides -------------------------------------------------------------

// Runs one op on side s with the arguments in ctx.
typedef void (*OpRun)(int s, void *ctx);

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Mean microseconds of one cuda run over TIME_REPS runs queued back to back, between two
// one-float downloads (each waits for everything queued before it).
static double time_us(OpRun run, void *ctx) {
    float word;
    side[GPU]->download(&word, sync_word, sizeof word);
    double t0 = now_s();
    for (int r = 0; r < TIME_REPS; r++) run(GPU, ctx);
    side[GPU]->download(&word, sync_word, sizeof word);
    return (now_s() - t0) * 1e6 / TIME_REPS;
}

// Runs the op once on each side, compares its outputs, then times it: the timing reruns the op
// on its own results, so it comes after the comparison.
static void op_check(const char *op, const char *shape, OpRun run, void *ctx,
                     const Output *outputs, int n_outputs) {
    for (int s = 0; s < N_SIDES; s++) run(s, ctx);
    double err[MAX_OUTPUTS];
    for (int i = 0; i < n_outputs; i++) err[i] = output_error(&outputs[i]);
    double us = time_us(run, ctx);
    for (int i = 0; i < n_outputs; i++) report(op, &outputs[i], shape, err[i], us);
}

// ---- memory ----------------------------------------------------------------------------------

// One memory op's operands: src and dst (floats), a region of dst_offset/src_offset floats
// on, and for copy_rows the row geometry in floats.
typedef struct {
    Pair dst, src;
    size_t dst_offset, src_offset, n;  // copy and zero: n floats
    size_t dst_pitch, src_pitch, row, rows;
} MemArgs;

static void copy_run(int s, void *ctx) {
    MemArgs *a = ctx;
    side[s]->copy(F(a->dst, s) + a->dst_offset, F(a->src, s) + a->src_offset, a->n * 4);
}

static void copy_rows_run(int s, void *ctx) {
    MemArgs *a = ctx;
    side[s]->copy_rows(F(a->dst, s) + a->dst_offset, a->dst_pitch * 4,
                       F(a->src, s) + a->src_offset, a->src_pitch * 4, a->row * 4, a->rows);
}

static void zero_run(int s, void *ctx) {
    MemArgs *a = ctx;
    side[s]->zero(F(a->dst, s) + a->dst_offset, a->n * 4);
}

static void alloc_run(int s, void *ctx) {
    MemArgs *a = ctx;
    if (a->dst.at[s]) side[s]->free(a->dst.at[s]);
    a->dst.at[s] = side_alloc(s, a->dst.bytes);
}

// Every destination starts from the same random values, not NaN: the bytes outside the region
// must survive, and the whole destination is compared bit for bit.
static void check_memory(void) {
    size_t n = (1u << 22) + 11;
    MemArgs a = {.dst = pair_random(n, -1, 1), .src = pair_random(n, -1, 1), .dst_offset = 3,
                 .src_offset = 5, .n = n - 8};
    Output out[] = {{"", &a.dst, NULL, CMP_BITS32, BOUND_EXACT}};
    char shape[64];
    snprintf(shape, sizeof shape, "%zu floats, src+5 -> dst+3", a.n);
    op_check("copy", shape, copy_run, &a, out, 1);
    a.dst_pitch = 41, a.src_pitch = 37, a.row = 29, a.rows = (n - 8) / 41;
    snprintf(shape, sizeof shape, "%zu rows of 29, pitch 37 -> 41", a.rows);
    pair_reset(&a.dst);
    op_check("copy_rows", shape, copy_rows_run, &a, out, 1);
    a.dst_offset = 7, a.n = n - 100;
    snprintf(shape, sizeof shape, "%zu floats at dst+7", a.n);
    pair_reset(&a.dst);
    op_check("zero", shape, zero_run, &a, out, 1);
    pair_free(&a.dst), pair_free(&a.src);

    MemArgs z = {.dst = {.bytes = n * 4}};
    Output zeroed[] = {{"", &z.dst, NULL, CMP_BITS32, BOUND_EXACT}};
    snprintf(shape, sizeof shape, "%zu floats", n);
    op_check("alloc (zeroed)", shape, alloc_run, &z, zeroed, 1);
    pair_free(&z.dst);
}

// ---- matmul ----------------------------------------------------------------------------------

typedef struct {
    Pair a, b, c;
    Dtype ab;
    int m, n, k;
    bool ta, tb;
    float beta;
} MatmulArgs;

static void matmul_run(int s, void *ctx) {
    MatmulArgs *a = ctx;
    side[s]->matmul(F(a->c, s), a->a.at[s], a->b.at[s], a->ab, a->m, a->n, a->k, a->ta, a->tb,
                    a->beta);
}

// n random values in [-1, 1) stored as ab.
static Pair pair_operand(size_t n, Dtype ab) {
    if (ab == DTYPE_FP32) return pair_random(n, -1, 1);
    uint16_t *h = host_alloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = bf16_from_float((float)rng_range(-1, 1));
    Pair p = pair_of(h, n * sizeof *h);
    free(h);
    return p;
}

// beta 0 must not read c, which starts as NaN; beta 1 adds onto a c as large as the product
// (entries ~ sqrt(k) / 3), so that dropping it fails. bf16 operands are the same on both
// sides: only the order of the fp32 sums differs.
static void check_matmul(Dtype ab, int m, int n, int k, bool ta, bool tb, float beta) {
    size_t mn = (size_t)m * n;
    double c_scale = sqrt((double)k);
    MatmulArgs a = {pair_operand((size_t)m * k, ab), pair_operand((size_t)k * n, ab),
                    beta == 0.0f ? pair_nan(mn) : pair_random(mn, -c_scale, c_scale),
                    ab, m, n, k, ta, tb, beta};
    char shape[64];
    snprintf(shape, sizeof shape, "%s %dx%dx%d %c%c beta=%g", dtype_name(ab), m, n, k,
             ta ? 'T' : 'N', tb ? 'T' : 'N', beta);
    Output out[] = {{"", &a.c, NULL, beta == 0.0f ? CMP_NORMALISED : CMP_INCREMENT,
                     ab == DTYPE_BF16 ? BOUND_REDUCE : bound_compute}};
    op_check("matmul", shape, matmul_run, &a, out, 1);
    pair_free(&a.a), pair_free(&a.b), pair_free(&a.c);
}

// Odd sizes in every transpose case, then the 1B flavor's FFN at 8192 tokens (B=4, T=2048):
// the forward x W1^T and the weight gradient dW2 += dy^T h; fp32 and bf16 operands.
static void check_matmuls(void) {
    for (Dtype ab = DTYPE_FP32; ab <= DTYPE_BF16; ab++) {
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int beta = 0; beta < 2; beta++)
                    check_matmul(ab, 67, 45, 33, ta, tb, (float)beta);
        check_matmul(ab, 8192, 8192, 2048, false, true, 0.0f);
        check_matmul(ab, 2048, 8192, 8192, true, false, 1.0f);
    }
}

// ---- rmsnorm ---------------------------------------------------------------------------------

typedef struct {
    Pair out, rstd, x, w, dout, dx, dw;
    int n, dim;
    Dtype out_type;
} RmsArgs;

static void rmsnorm_forward_run(int s, void *ctx) {
    RmsArgs *a = ctx;
    side[s]->rmsnorm_forward(a->out.at[s], a->out_type, F(a->rstd, s), F(a->x, s), F(a->w, s),
                             a->n, a->dim, 1e-5f);
}

static void rmsnorm_backward_run(int s, void *ctx) {
    RmsArgs *a = ctx;
    side[s]->rmsnorm_backward(F(a->dx, s), F(a->dw, s), F(a->dout, s), F(a->x, s), F(a->w, s),
                              F(a->rstd, s), a->n, a->dim);
}

static void rmsnorm_backward_frozen_run(int s, void *ctx) {  // a frozen weight: no dweight
    RmsArgs *a = ctx;
    side[s]->rmsnorm_backward(F(a->dx, s), NULL, F(a->dout, s), F(a->x, s), F(a->w, s),
                              F(a->rstd, s), a->n, a->dim);
}

// The forward with an fp32 output, and with a bf16 one (out_type): bf16 normed rows.
static void check_rmsnorm(int n, int dim) {
    size_t nd = (size_t)n * dim;
    RmsArgs a = {pair_nan(nd), pair_nan(n), pair_random(nd, -2, 2), pair_random(dim, -1, 1),
                 pair_random(nd, -1, 1), pair_random(nd, -1, 1), pair_random(dim, -1, 1), n, dim,
                 DTYPE_FP32};
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d dim=%d", n, dim);
    Output fwd[] = {{"out", &a.out, NULL, CMP_NORMALISED, BOUND_FP32},
                    {"rstd", &a.rstd, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("rmsnorm_fwd", shape, rmsnorm_forward_run, &a, fwd, 2);
    RmsArgs typed = a;
    typed.out = pair_nan16(nd), typed.out_type = DTYPE_BF16;
    Output fwd16[] = {{"out", &typed.out, NULL, CMP_NORMALISED16, BOUND_BF16_STORE}};
    op_check("rmsnorm_fwd bf16", shape, rmsnorm_forward_run, &typed, fwd16, 1);
    pair_free(&typed.out);
    pair_share_cpu(&a.rstd);
    Output bwd[] = {{"dx", &a.dx, NULL, CMP_INCREMENT, BOUND_REDUCE},
                    {"dweight", &a.dw, NULL, CMP_INCREMENT, BOUND_REDUCE}};
    op_check("rmsnorm_bwd", shape, rmsnorm_backward_run, &a, bwd, 2);
    op_check("rmsnorm_bwd frozen", shape, rmsnorm_backward_frozen_run, &a, bwd, 1);
    Pair *all[] = {&a.out, &a.rstd, &a.x, &a.w, &a.dout, &a.dx, &a.dw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

// ---- rope ------------------------------------------------------------------------------------

typedef struct {
    Pair out, x, cos, sin, pos, dout, dx;
    int B, T, H, hd;
    bool in_place;  // forward with out == x (out starts as x's values)
} RopeArgs;

static void rope_forward_run(int s, void *ctx) {
    RopeArgs *a = ctx;
    const float *x = a->in_place ? F(a->out, s) : F(a->x, s);
    side[s]->rope_forward(F(a->out, s), x, F(a->cos, s), F(a->sin, s), I(a->pos, s), a->B * a->T,
                          a->T, a->H, a->hd);
}

static void rope_backward_run(int s, void *ctx) {
    RopeArgs *a = ctx;
    side[s]->rope_backward(F(a->dx, s), F(a->dout, s), F(a->cos, s), F(a->sin, s), I(a->pos, s),
                           a->B * a->T, a->T, a->H, a->hd);
}

// (max_pos, hd/2) angle tables at Llama 3's theta 500000.
static void rope_tables(RopeArgs *a, int max_pos) {
    size_t n = (size_t)max_pos * a->hd / 2;
    float *c = host_alloc(n * sizeof *c), *s = host_alloc(n * sizeof *s);
    for (int p = 0; p < max_pos; p++)
        for (int i = 0; i < a->hd / 2; i++) {
            double theta = p * pow(500000.0, -2.0 * i / a->hd);
            c[(size_t)p * a->hd / 2 + i] = (float)cos(theta);
            s[(size_t)p * a->hd / 2 + i] = (float)sin(theta);
        }
    a->cos = pair_adopt(c, n), a->sin = pair_adopt(s, n);
}

// Positions are a scrambled subset of [0, 2T), as a context-parallel shard or a decode sees.
static void check_rope(int B, int T, int H, int hd) {
    size_t n = (size_t)B * T * H * hd;
    RopeArgs a = {.out = pair_nan(n), .x = pair_random(n, -1, 1), .dout = pair_random(n, -1, 1),
                  .dx = pair_nan(n), .B = B, .T = T, .H = H, .hd = hd};
    rope_tables(&a, 2 * T);
    int *pos = host_alloc((size_t)T * sizeof *pos);
    for (int t = 0; t < T; t++) pos[t] = (int)(((int64_t)t * 7 + 3) % (2 * T));
    a.pos = pair_ints(pos, (size_t)T);
    free(pos);
    char shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d H=%d hd=%d", B, T, H, hd);
    Output fwd[] = {{"", &a.out, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("rope_fwd", shape, rope_forward_run, &a, fwd, 1);
    pair_free(&a.out);
    a.out = pair_of(a.x.init, n * sizeof(float));
    a.in_place = true;
    op_check("rope_fwd in place", shape, rope_forward_run, &a, fwd, 1);
    Output bwd[] = {{"dx", &a.dx, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("rope_bwd", shape, rope_backward_run, &a, bwd, 1);
    Pair *all[] = {&a.out, &a.x, &a.cos, &a.sin, &a.pos, &a.dout, &a.dx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

// ---- attention -------------------------------------------------------------------------------

typedef struct {
    Pair q, k, v, out, lse, dout, dq, dk, dv, q_doc, kv_doc;
    void *workspace[N_SIDES];  // each backend's own attention_workspace_bytes
    AttnShape shape;           // its q_doc, kv_doc are each side's pairs above
} AttnArgs;

static AttnShape attention_shape(const AttnArgs *a, int s) {
    AttnShape shape = a->shape;
    shape.q_doc = I(a->q_doc, s), shape.kv_doc = I(a->kv_doc, s);
    return shape;
}

static void attention_forward_run(int s, void *ctx) {
    AttnArgs *a = ctx;
    AttnShape shape = attention_shape(a, s);
    side[s]->attention_forward(F(a->out, s), F(a->lse, s), F(a->q, s), F(a->k, s), F(a->v, s),
                               &shape, a->workspace[s]);
}

static void attention_backward_run(int s, void *ctx) {
    AttnArgs *a = ctx;
    AttnShape shape = attention_shape(a, s);
    side[s]->attention_backward(F(a->dq, s), F(a->dk, s), F(a->dv, s), F(a->dout, s), F(a->q, s),
                                F(a->k, s), F(a->v, s), F(a->out, s), F(a->lse, s), &shape,
                                a->workspace[s]);
}

// Document ids (B, T) of the rows from global position start: sequence b's position p is in
// document (p + 5b) / doc_len (all in one document when doc_len is 0).
static Pair attention_documents(int B, int T, int start, int doc_len) {
    int *doc = host_alloc((size_t)B * T * sizeof *doc);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) doc[b * T + t] = doc_len ? (start + t + 5 * b) / doc_len : 0;
    Pair p = pair_ints(doc, (size_t)B * T);
    free(doc);
    return p;
}

// q and k in [-2, 2) give scores of standard deviation ~1.3: softmaxes far from uniform, as in
// a trained model. The backward reads the cpu forward's out and lse on both sides.
static void check_attention(AttnShape sh, int doc_len) {
    size_t nq = (size_t)sh.B * sh.Tq * sh.n_heads * sh.head_dim;
    size_t nkv = (size_t)sh.B * sh.Tk * sh.n_kv_heads * sh.head_dim;
    AttnArgs a = {pair_random(nq, -2, 2),  pair_random(nkv, -2, 2),
                  pair_random(nkv, -1, 1), pair_nan(nq),
                  pair_nan((size_t)sh.B * sh.n_heads * sh.Tq), pair_random(nq, -1, 1),
                  pair_random(nq, -1, 1),  pair_random(nkv, -1, 1),
                  pair_random(nkv, -1, 1), attention_documents(sh.B, sh.Tq, sh.q_start, doc_len),
                  attention_documents(sh.B, sh.Tk, sh.kv_start, doc_len), {NULL, NULL}, sh};
    for (int s = 0; s < N_SIDES; s++) {
        AttnShape shape = attention_shape(&a, s);
        a.workspace[s] = side_alloc(s, side[s]->attention_workspace_bytes(&shape));
    }
    static const char *masks[] = {"causal", "none", "document"};
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d Tq=%d Tk=%d H=%d KV=%d hd=%d", sh.B, sh.Tq, sh.Tk,
             sh.n_heads, sh.n_kv_heads, sh.head_dim);
    if (sh.q_start || sh.kv_start || sh.mask != ATTN_CAUSAL)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), " q@%d kv@%d %s",
                 sh.q_start, sh.kv_start, masks[sh.mask]);
    Output fwd[] = {{"out", &a.out, NULL, CMP_NORMALISED, bound_compute},
                    {"lse", &a.lse, NULL, CMP_NORMALISED, bound_compute}};
    op_check("attention_fwd", shape, attention_forward_run, &a, fwd, 2);
    pair_share_cpu(&a.out), pair_share_cpu(&a.lse);
    Output bwd[] = {{"dq", &a.dq, NULL, CMP_INCREMENT, bound_compute},
                    {"dk", &a.dk, NULL, CMP_INCREMENT, bound_compute},
                    {"dv", &a.dv, NULL, CMP_INCREMENT, bound_compute}};
    op_check("attention_bwd", shape, attention_backward_run, &a, bwd, 3);
    for (int s = 0; s < N_SIDES; s++) side[s]->free(a.workspace[s]);
    Pair *all[] = {&a.q,  &a.k,  &a.v,  &a.out,  &a.lse,  &a.dout,
                   &a.dq, &a.dk, &a.dv, &a.q_doc, &a.kv_doc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

// One (B, T) block causally against itself.
static AttnShape attention_plain(int B, int T, int H, int KV, int hd) {
    return (AttnShape){.B = B, .Tq = T, .Tk = T, .n_heads = H, .n_kv_heads = KV, .head_dim = hd};
}

// A query chunk (Tq rows from q_start) against a key/value chunk (Tk rows from kv_start).
static AttnShape attention_chunks(int B, int Tq, int Tk, int H, int KV, int hd, int q_start,
                                  int kv_start, AttnMask mask) {
    AttnShape s = attention_plain(B, Tq, H, KV, hd);
    s.Tk = Tk, s.q_start = q_start, s.kv_start = kv_start, s.mask = mask;
    return s;
}

typedef struct {
    Pair out, lse, out2, lse2;
    int B, T, H, hd;
} AttnMergeArgs;

static void attention_merge_run(int s, void *ctx) {
    AttnMergeArgs *a = ctx;
    side[s]->attention_merge(F(a->out, s), F(a->lse, s), F(a->out2, s), F(a->lse2, s), a->B,
                             a->T, a->H, a->hd);
}

// Partial results whose rows saw no key on one side (every 7th on the first, every 5th on the
// second) or on both (every 35th): lse -inf there.
static void check_attention_merge(int B, int T, int H, int hd) {
    size_t n = (size_t)B * T * H * hd, nl = (size_t)B * H * T;
    float *lse = host_random(nl, -3, 3), *lse2 = host_random(nl, -3, 3);
    for (size_t i = 0; i < nl; i++) {
        if (i % 7 == 0) lse[i] = -INFINITY;
        if (i % 5 == 0) lse2[i] = -INFINITY;
    }
    AttnMergeArgs a = {pair_random(n, -1, 1), pair_adopt(lse, nl), pair_random(n, -1, 1),
                   pair_adopt(lse2, nl), B, T, H, hd};
    char shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d H=%d hd=%d", B, T, H, hd);
    Output out[] = {{"out", &a.out, NULL, CMP_NORMALISED, BOUND_FP32},
                    {"lse", &a.lse, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("attention_merge", shape, attention_merge_run, &a, out, 2);
    pair_free(&a.out), pair_free(&a.lse), pair_free(&a.out2), pair_free(&a.lse2);
}

typedef struct {
    Pair out, q, k_cache, v_cache;
    int n_ctx, H, KV, hd;
} DecodeArgs;

static void attention_decode_run(int s, void *ctx) {
    DecodeArgs *a = ctx;
    side[s]->attention_decode(F(a->out, s), F(a->q, s), F(a->k_cache, s), F(a->v_cache, s),
                              a->n_ctx, a->H, a->KV, a->hd);
}

// The cache holds 64 rows past n_ctx, all NaN: reading one fails.
static Pair decode_cache(int n_ctx, int KV, int hd) {
    size_t width = (size_t)KV * hd, n = (size_t)(n_ctx + 64) * width;
    float *x = host_random(n, -2, 2);
    for (size_t i = (size_t)n_ctx * width; i < n; i++) x[i] = NAN;
    return pair_adopt(x, n);
}

static void check_attention_decode(int n_ctx, int H, int KV, int hd) {
    DecodeArgs a = {pair_nan((size_t)H * hd), pair_random((size_t)H * hd, -2, 2),
                    decode_cache(n_ctx, KV, hd), decode_cache(n_ctx, KV, hd), n_ctx, H, KV, hd};
    char shape[64];
    snprintf(shape, sizeof shape, "n_ctx=%d H=%d KV=%d hd=%d", n_ctx, H, KV, hd);
    Output out[] = {{"", &a.out, NULL, CMP_NORMALISED, bound_compute}};
    op_check("attention_decode", shape, attention_decode_run, &a, out, 1);
    pair_free(&a.out), pair_free(&a.q), pair_free(&a.k_cache), pair_free(&a.v_cache);
}

// GQA groups of 1 and 4, head_dim 64 and 128, T off the 64-row tiles; then the 1B flavor's
// heads and a larger-head shape at T = 2048. Then context parallel's chunk pairs: keys before
// the queries, overlapping (the first rows see none), all after (no row sees any), equal
// offsets (cuDNN's case), a short query chunk against a long one; no mask; documents, as one
// block and as a chunk pair; and the merge.
static void check_attentions(void) {
    check_attention(attention_plain(2, 200, 8, 2, 64), 0);
    check_attention(attention_plain(2, 200, 8, 8, 128), 0);
    check_attention(attention_plain(1, 77, 4, 1, 128), 0);
    check_attention(attention_plain(1, 2048, 32, 8, 64), 0);
    check_attention(attention_plain(1, 2048, 16, 4, 128), 0);
    check_attention(attention_chunks(2, 200, 300, 8, 2, 64, 300, 0, ATTN_CAUSAL), 0);
    check_attention(attention_chunks(2, 256, 256, 8, 2, 64, 0, 128, ATTN_CAUSAL), 0);
    check_attention(attention_chunks(1, 100, 120, 4, 1, 128, 0, 500, ATTN_CAUSAL), 0);
    check_attention(attention_chunks(2, 200, 200, 8, 2, 64, 512, 512, ATTN_CAUSAL), 0);
    check_attention(attention_chunks(1, 77, 333, 4, 4, 128, 256, 0, ATTN_CAUSAL), 0);
    check_attention(attention_chunks(2, 150, 250, 8, 2, 64, 0, 0, ATTN_NONE), 0);
    check_attention(attention_chunks(2, 300, 300, 8, 2, 64, 0, 0, ATTN_DOCUMENT), 70);
    check_attention(attention_chunks(2, 128, 256, 8, 8, 128, 256, 64, ATTN_DOCUMENT), 100);
    check_attention_merge(2, 200, 8, 64);
    check_attention_merge(1, 77, 4, 128);
    check_attention_decode(1, 8, 2, 64);
    check_attention_decode(129, 32, 8, 64);
    check_attention_decode(300, 8, 8, 128);
    check_attention_decode(2048, 16, 4, 128);
    check_attention_decode(300, 16, 1, 576);  // MLA's latent (DeepSeek-V3): one kv head
}

// ---- swiglu ----------------------------------------------------------------------------------

typedef struct {
    Pair out, gate, up, dout, dgate, dup;
    size_t n;
    Dtype out_type;
} SwigluArgs;

static void swiglu_forward_run(int s, void *ctx) {
    SwigluArgs *a = ctx;
    side[s]->swiglu_forward(a->out.at[s], a->out_type, F(a->gate, s), F(a->up, s), a->n);
}

static void swiglu_backward_run(int s, void *ctx) {
    SwigluArgs *a = ctx;
    side[s]->swiglu_backward(a->dgate.at[s], a->dup.at[s], a->out.at[s], a->out_type,
                             F(a->dout, s), F(a->gate, s), F(a->up, s), a->n);
}

// gate in [-12, 12): silu's saturated tails on both sides.
static void check_swiglu(size_t n) {
    SwigluArgs a = {pair_nan(n), pair_random(n, -12, 12), pair_random(n, -1, 1),
                    pair_random(n, -1, 1), pair_nan(n), pair_nan(n), n, DTYPE_FP32};
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    Output fwd[] = {{"", &a.out, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("swiglu_fwd", shape, swiglu_forward_run, &a, fwd, 1);
    SwigluArgs typed = a;
    typed.out = pair_nan16(n), typed.out_type = DTYPE_BF16;
    Output fwd16[] = {{"", &typed.out, NULL, CMP_NORMALISED16, BOUND_BF16_STORE}};
    op_check("swiglu_fwd bf16", shape, swiglu_forward_run, &typed, fwd16, 1);
    // backward writes out too (selective checkpointing's recompute of it): NaN until it does
    pair_free(&a.out), a.out = pair_nan(n);
    Output bwd[] = {{"dgate", &a.dgate, NULL, CMP_NORMALISED, BOUND_FP32},
                    {"dup", &a.dup, NULL, CMP_NORMALISED, BOUND_FP32},
                    {"out", &a.out, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("swiglu_bwd", shape, swiglu_backward_run, &a, bwd, 3);
    typed.dgate = pair_nan16(n), typed.dup = pair_nan16(n);
    pair_free(&typed.out), typed.out = pair_nan16(n);
    Output bwd16[] = {{"dgate", &typed.dgate, NULL, CMP_NORMALISED16, BOUND_BF16_STORE},
                      {"dup", &typed.dup, NULL, CMP_NORMALISED16, BOUND_BF16_STORE},
                      {"out", &typed.out, NULL, CMP_NORMALISED16, BOUND_BF16_STORE}};
    op_check("swiglu_bwd bf16", shape, swiglu_backward_run, &typed, bwd16, 3);
    pair_free(&typed.out), pair_free(&typed.dgate), pair_free(&typed.dup);
    Pair *all[] = {&a.out, &a.gate, &a.up, &a.dout, &a.dgate, &a.dup};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

// ---- embedding -------------------------------------------------------------------------------

typedef struct {
    Pair out, tokens, table, dout, dtable;
    int n, dim, vocab_start, rows;
} EmbArgs;

static void embedding_forward_run(int s, void *ctx) {
    EmbArgs *a = ctx;
    side[s]->embedding_forward(F(a->out, s), I(a->tokens, s), F(a->table, s), a->n, a->dim,
                               a->vocab_start, a->rows);
}

static void embedding_backward_run(int s, void *ctx) {
    EmbArgs *a = ctx;
    side[s]->embedding_backward(F(a->dtable, s), F(a->dout, s), I(a->tokens, s), a->n, a->dim,
                                a->vocab_start, a->rows);
}

// The slice [vocab_start, vocab_start + rows) of a vocabulary, with tokens drawn from [lo, hi):
// those outside the slice (and -1) are another slice's (zero rows, no gradient). A narrow
// [lo, hi) sends thousands of gradients to each of a few rows, in a sum whose order differs
// between the sides.
static void check_embedding(int n, int dim, int vocab_start, int rows, int lo, int hi) {
    size_t nd = (size_t)n * dim, td = (size_t)rows * dim;
    int *tokens = host_alloc((size_t)n * sizeof *tokens);
    for (int i = 0; i < n; i++) tokens[i] = rng_int(lo, hi);
    EmbArgs a = {pair_nan(nd), pair_ints(tokens, (size_t)n), pair_random(td, -1, 1),
                 pair_random(nd, -1, 1), pair_random(td, -1, 1), n, dim, vocab_start, rows};
    free(tokens);
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d dim=%d slice %d+%d ids [%d,%d)", n, dim, vocab_start,
             rows, lo, hi);
    Output fwd[] = {{"", &a.out, NULL, CMP_BITS32, BOUND_EXACT}};
    op_check("embedding_fwd", shape, embedding_forward_run, &a, fwd, 1);
    Output bwd[] = {{"dtable", &a.dtable, NULL, CMP_INCREMENT,
                     hi - lo < 64 ? BOUND_REDUCE : BOUND_FP32}};
    op_check("embedding_bwd", shape, embedding_backward_run, &a, bwd, 1);
    pair_free(&a.out), pair_free(&a.tokens), pair_free(&a.table), pair_free(&a.dout);
    pair_free(&a.dtable);
}

// ---- cross-entropy ---------------------------------------------------------------------------

typedef struct {
    Pair losses, logits, targets, dlogits;
    Pair lse, target_logit, row_lse;  // the slice ops': outputs, and the whole row's lse
    int n, vocab, vocab_start;
    bool aliased;  // backward with dlogits == logits
} CeArgs;

#define CE_DLOSS 0.7f

static void ce_forward_run(int s, void *ctx) {
    CeArgs *a = ctx;
    side[s]->cross_entropy_forward(F(a->losses, s), F(a->logits, s), I(a->targets, s), a->n,
                                   a->vocab);
}

static void ce_backward_run(int s, void *ctx) {
    CeArgs *a = ctx;
    const Pair *logits = a->aliased ? &a->dlogits : &a->logits;
    side[s]->cross_entropy_backward(F(a->dlogits, s), F(*logits, s), I(a->targets, s), a->n,
                                    a->vocab, CE_DLOSS);
}

static void ce_slice_forward_run(int s, void *ctx) {
    CeArgs *a = ctx;
    side[s]->cross_entropy_slice_forward(F(a->lse, s), F(a->target_logit, s), F(a->logits, s),
                                         I(a->targets, s), a->n, a->vocab, a->vocab_start);
}

static void ce_slice_backward_run(int s, void *ctx) {
    CeArgs *a = ctx;
    const Pair *logits = a->aliased ? &a->dlogits : &a->logits;
    side[s]->cross_entropy_slice_backward(F(a->dlogits, s), F(*logits, s), F(a->row_lse, s),
                                          I(a->targets, s), a->n, a->vocab, a->vocab_start,
                                          CE_DLOSS);
}

// Logits in [-8, 8) plus a row offset of up to +-200, at which a naive exp overflows; targets
// drawn from [0, target_hi).
static void ce_inputs(CeArgs *a, int n, int vocab, int target_hi) {
    float *x = host_random((size_t)n * vocab, -8, 8);
    for (int i = 0; i < n; i++) {
        float offset = (float)rng_range(-200, 200);
        for (int j = 0; j < vocab; j++) x[(size_t)i * vocab + j] += offset;
    }
    int *targets = host_alloc((size_t)n * sizeof *targets);
    for (int i = 0; i < n; i++) targets[i] = rng_int(0, target_hi);
    targets[0] = 0, targets[n - 1] = target_hi - 1;
    a->logits = pair_adopt(x, (size_t)n * vocab);
    a->targets = pair_ints(targets, (size_t)n);
    a->n = n, a->vocab = vocab;
    free(targets);
}

// The aliased backward overwrites a copy of the logits; its error is normalised as an output's.
static void check_ce_backward(CeArgs *a, const char *op, OpRun run, const char *shape) {
    size_t nv = (size_t)a->n * a->vocab;
    a->dlogits = pair_random(nv, -1, 1);
    Output bwd[] = {{"", &a->dlogits, NULL, CMP_INCREMENT, BOUND_REDUCE}};
    op_check(op, shape, run, a, bwd, 1);
    pair_free(&a->dlogits);
    a->dlogits = pair_of(a->logits.init, nv * sizeof(float));
    a->aliased = true;
    char aliased[64];
    snprintf(aliased, sizeof aliased, "%s aliased", op);
    bwd[0].cmp = CMP_NORMALISED;
    op_check(aliased, shape, run, a, bwd, 1);
    a->aliased = false;
    pair_free(&a->dlogits);
}

static void check_cross_entropy(int n, int vocab) {
    CeArgs a = {.losses = pair_nan((size_t)n)};
    ce_inputs(&a, n, vocab, vocab);
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d vocab=%d", n, vocab);
    Output fwd[] = {{"", &a.losses, NULL, CMP_NORMALISED, BOUND_REDUCE}};
    op_check("cross_entropy_fwd", shape, ce_forward_run, &a, fwd, 1);
    check_ce_backward(&a, "cross_entropy_bwd", ce_backward_run, shape);
    pair_free(&a.losses), pair_free(&a.logits), pair_free(&a.targets);
}

typedef struct {
    Pair x, out;
    Dtype dtype;
    size_t n;
} DropoutArgs;

static void dropout_run(int s, void *ctx) {
    DropoutArgs *a = ctx;
    side[s]->dropout(a->out.at[s], a->x.at[s], a->dtype, a->n, 0.3f, 0x1234567887654321ull);
}

// LoRA's dropout: the same elements dropped and the same values, bit for bit, in fp32 and bf16.
static void check_dropout(size_t n) {
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu fp32", n);
    DropoutArgs a = {pair_random(n, -2, 2), pair_nan(n), DTYPE_FP32, n};
    Output fp32[] = {{"", &a.out, NULL, CMP_BITS32, BOUND_EXACT}};
    op_check("dropout", shape, dropout_run, &a, fp32, 1);
    pair_free(&a.x), pair_free(&a.out);
    uint16_t *h = host_alloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = (uint16_t)(0x3c00u + rng_int(0, 0x800));
    snprintf(shape, sizeof shape, "n=%zu bf16", n);
    a = (DropoutArgs){pair_of(h, n * 2), pair_of(h, n * 2), DTYPE_BF16, n};
    Output bf16[] = {{"", &a.out, NULL, CMP_BITS16, BOUND_EXACT}};
    op_check("dropout", shape, dropout_run, &a, bf16, 1);
    pair_free(&a.x), pair_free(&a.out);
    free(h);
}

typedef struct {
    Pair x, keep;
    int n;
    size_t width;
} MaskArgs;

static void zero_masked_rows_run(int s, void *ctx) {
    MaskArgs *a = ctx;
    side[s]->zero_masked_rows(F(a->x, s), I(a->keep, s), a->n, a->width);
}

// SFT's loss mask over n rows of width floats, every third row ignored.
static void check_zero_masked_rows(int n, size_t width) {
    int *keep = host_alloc((size_t)n * sizeof *keep);
    for (int i = 0; i < n; i++) keep[i] = i % 3 != 1;
    MaskArgs a = {.x = pair_random((size_t)n * width, -1, 1), .keep = pair_ints(keep, (size_t)n),
                  .n = n, .width = width};
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d width=%zu", n, width);
    Output out[] = {{"", &a.x, NULL, CMP_BITS32, BOUND_EXACT}};
    op_check("zero_masked_rows", shape, zero_masked_rows_run, &a, out, 1);
    pair_free(&a.x), pair_free(&a.keep);
    free(keep);
}

// The whole row's lse that the slice backward takes: the slice's own (in double) plus what the
// other slices would add, log(1 + u) for u in [0, 3).
static Pair ce_row_lse(const CeArgs *a) {
    float *lse = host_alloc((size_t)a->n * sizeof *lse);
    for (int i = 0; i < a->n; i++) {
        const float *x = a->logits.init + (size_t)i * a->vocab;
        double mx = x[0], sum = 0.0;
        for (int j = 1; j < a->vocab; j++) mx = fmax(mx, x[j]);
        for (int j = 0; j < a->vocab; j++) sum += exp(x[j] - mx);
        lse[i] = (float)(mx + log(sum) + log1p(rng_range(0, 3)));
    }
    return pair_adopt(lse, (size_t)a->n);
}

// A slice [vocab_start, vocab_start + vocab) of a full_vocab row; targets anywhere in the row.
static void check_cross_entropy_slice(int n, int vocab, int vocab_start, int full_vocab) {
    CeArgs a = {.lse = pair_nan((size_t)n), .target_logit = pair_nan((size_t)n),
                .vocab_start = vocab_start};
    ce_inputs(&a, n, vocab, full_vocab);
    a.row_lse = ce_row_lse(&a);
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d slice %d+%d of %d", n, vocab_start, vocab, full_vocab);
    Output fwd[] = {{"lse", &a.lse, NULL, CMP_NORMALISED, BOUND_REDUCE},
                    {"target_logit", &a.target_logit, NULL, CMP_BITS32, BOUND_EXACT}};
    op_check("cross_entropy_slice_fwd", shape, ce_slice_forward_run, &a, fwd, 2);
    check_ce_backward(&a, "cross_entropy_slice_bwd", ce_slice_backward_run, shape);
    pair_free(&a.lse), pair_free(&a.target_logit), pair_free(&a.row_lse);
    pair_free(&a.logits), pair_free(&a.targets);
}

typedef struct {
    Pair sums, lse, max, losses, lse_out, sums_in, target_logit;
    int n;
} MergeArgs;

static void merge_exp_run(int s, void *ctx) {
    MergeArgs *a = ctx;
    side[s]->cross_entropy_merge_exp(F(a->sums, s), F(a->lse, s), F(a->max, s), a->n);
}

static void merge_finish_run(int s, void *ctx) {
    MergeArgs *a = ctx;
    side[s]->cross_entropy_merge_finish(F(a->losses, s), F(a->lse_out, s), F(a->max, s),
                                        F(a->sums_in, s), F(a->target_logit, s), a->n);
}

// max is the largest slice's lse, so lse - max <= 0, and the sums over slices lie in [1, 4).
static void check_cross_entropy_merge(int n) {
    float *lse = host_random((size_t)n, 0, 12), *max = host_alloc((size_t)n * sizeof *max);
    for (int i = 0; i < n; i++) max[i] = lse[i] + (float)rng_range(0, 3);
    MergeArgs a = {pair_nan((size_t)n), pair_adopt(lse, (size_t)n), pair_adopt(max, (size_t)n),
                   pair_nan((size_t)n), pair_nan((size_t)n), pair_random((size_t)n, 1, 4),
                   pair_random((size_t)n, -5, 5), n};
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d", n);
    Output exp_out[] = {{"", &a.sums, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("cross_entropy_merge_exp", shape, merge_exp_run, &a, exp_out, 1);
    Output finish[] = {{"losses", &a.losses, NULL, CMP_NORMALISED, BOUND_FP32},
                       {"lse", &a.lse_out, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("cross_entropy_merge_finish", shape, merge_finish_run, &a, finish, 2);
    Pair *all[] = {&a.sums, &a.lse, &a.max, &a.losses, &a.lse_out, &a.sums_in, &a.target_logit};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

// ---- elementwise and reductions --------------------------------------------------------------

typedef struct {
    Pair y, x;
    size_t n;
    double result[N_SIDES];  // sum and sum_squares
} VecArgs;

#define SCALE_FACTOR -0.3f

static void add_run(int s, void *ctx) {
    VecArgs *a = ctx;
    side[s]->add(F(a->y, s), F(a->x, s), a->n);
}

static void scale_run(int s, void *ctx) {
    VecArgs *a = ctx;
    side[s]->scale(F(a->y, s), a->n, SCALE_FACTOR);
}

static void sum_run(int s, void *ctx) {
    VecArgs *a = ctx;
    a->result[s] = side[s]->sum(F(a->x, s), a->n);
}

static void sum_squares_run(int s, void *ctx) {
    VecArgs *a = ctx;
    a->result[s] = side[s]->sum_squares(F(a->x, s), a->n);
}

// add and scale round once per element, so they match bit for bit. x in [-0.5, 1.5) has a
// positive mean, as the losses that sum adds: its sum does not cancel to a few ulps.
static void check_vector_ops(size_t n) {
    VecArgs a = {pair_random(n, -1, 1), pair_random(n, -0.5, 1.5), n, {0, 0}};
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    Output y[] = {{"", &a.y, NULL, CMP_BITS32, BOUND_EXACT}};
    op_check("add", shape, add_run, &a, y, 1);
    pair_reset(&a.y);
    op_check("scale", shape, scale_run, &a, y, 1);
    Output scalar[] = {{"", NULL, a.result, CMP_NORMALISED, BOUND_FP32}};
    op_check("sum", shape, sum_run, &a, scalar, 1);
    op_check("sum_squares", shape, sum_squares_run, &a, scalar, 1);
    pair_free(&a.y), pair_free(&a.x);
}

typedef struct {
    Pair f, h;  // floats, bf16 bits
    size_t n;
} Bf16Args;

static void to_bf16_run(int s, void *ctx) {
    Bf16Args *a = ctx;
    side[s]->to_bf16(H(a->h, s), F(a->f, s), a->n);
}

static void from_bf16_run(int s, void *ctx) {
    Bf16Args *a = ctx;
    side[s]->from_bf16(F(a->f, s), H(a->h, s), a->n);
}

// Special floats for rounding: NaNs (one whose payload is only in the dropped bits, which a
// plain rounding carries into infinity), infinities, zeros, ties to even both ways, the largest
// float (rounds to infinity), a subnormal.
static const uint32_t BF16_SPECIALS[] = {
    0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,
    0x3f808000u, 0x3f818000u, 0x3f80c000u, 0xbf818000u, 0x7f7fffffu, 0x00000001u, 0x00018000u,
};
#define N_BF16_SPECIALS (sizeof BF16_SPECIALS / sizeof BF16_SPECIALS[0])

// to_bf16 over random bit patterns (every exponent) after the specials; from_bf16 over all
// 65536 bf16 values, NaNs included, and the random ones after them.
static void check_bf16(size_t n) {
    uint32_t *f = host_alloc(n * sizeof *f);
    uint16_t *h = host_alloc(n * sizeof *h), *poison = host_alloc(n * sizeof *poison);
    for (size_t i = 0; i < n; i++) {
        f[i] = i < N_BF16_SPECIALS ? BF16_SPECIALS[i] : (uint32_t)rng_next();
        h[i] = i < 65536 ? (uint16_t)i : (uint16_t)rng_next();
        poison[i] = 0x7fffu;  // a NaN
    }
    Bf16Args a = {pair_of(f, n * 4), pair_of(poison, n * 2), n};
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    Output to[] = {{"", &a.h, NULL, CMP_BITS16, BOUND_EXACT}};
    op_check("to_bf16", shape, to_bf16_run, &a, to, 1);
    pair_free(&a.f), pair_free(&a.h);
    a = (Bf16Args){pair_nan(n), pair_of(h, n * 2), n};
    Output from[] = {{"", &a.f, NULL, CMP_BITS32, BOUND_EXACT}};
    op_check("from_bf16", shape, from_bf16_run, &a, from, 1);
    pair_free(&a.f), pair_free(&a.h);
    free(f), free(h), free(poison);
}

// ---- adamw -----------------------------------------------------------------------------------

typedef struct {
    Pair p, g, m, v;
    size_t n;
    int step;
} AdamArgs;

static void adamw_run(int s, void *ctx) {
    AdamArgs *a = ctx;
    side[s]->adamw_update(F(a->p, s), F(a->g, s), F(a->m, s), F(a->v, s), a->n, 1e-2f, 0.9f,
                          0.95f, 1e-8f, 0.1f, a->step);
}

// The parameter's error is normalised by its update (~lr): p - p_old keeps only a few bits of
// p's ulp, hence the reduction bound. Step 1 starts from zero moments, a later step from
// random ones (v >= 0).
static void check_adamw(size_t n, int step) {
    AdamArgs a = {pair_random(n, -1, 1), pair_random(n, -1, 1),
                  step == 1 ? pair_zeros(n) : pair_random(n, -0.1, 0.1),
                  step == 1 ? pair_zeros(n) : pair_random(n, 0, 0.01), n, step};
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu step=%d", n, step);
    Output out[] = {{"param", &a.p, NULL, CMP_INCREMENT, BOUND_REDUCE},
                    {"m", &a.m, NULL, CMP_NORMALISED, BOUND_FP32},
                    {"v", &a.v, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("adamw_update", shape, adamw_run, &a, out, 3);
    pair_free(&a.p), pair_free(&a.g), pair_free(&a.m), pair_free(&a.v);
}

typedef struct {
    Pair ema, p;
    size_t n;
} EmaArgs;

static void ema_run(int s, void *ctx) {
    EmaArgs *a = ctx;
    side[s]->ema_update(F(a->ema, s), F(a->p, s), a->n, 0.25f);
}

// The average moves by a quarter of its distance to the weights: its error is normalised by
// that move (cuda may fuse the multiply-add, the cpu rounds twice).
static void check_ema(size_t n) {
    EmaArgs a = {pair_random(n, -1, 1), pair_random(n, -1, 1), n};
    char shape[32];
    snprintf(shape, sizeof shape, "n=%zu", n);
    Output out[] = {{"ema", &a.ema, NULL, CMP_INCREMENT, BOUND_FP32}};
    op_check("ema_update", shape, ema_run, &a, out, 1);
    pair_free(&a.ema), pair_free(&a.p);
}

typedef struct {
    Pair outer, momentum, param, delta;
    size_t n;
} OuterArgs;

static void outer_run(int s, void *ctx) {
    OuterArgs *a = ctx;
    side[s]->outer_sgd_update(F(a->outer, s), F(a->momentum, s), F(a->param, s), F(a->delta, s),
                              a->n, 0.7f, 0.9f, true, 0.25f);
}

// DiLoCo's outer step: the weights move by lr times the momentum-corrected pseudo-gradient,
// their error normalised by that move (cuda may fuse the multiply-adds).
static void check_outer_sgd(size_t n) {
    OuterArgs a = {pair_random(n, -1, 1), pair_random(n, -0.01, 0.01), pair_random(n, -1, 1),
                   pair_random(n, -0.01, 0.01), n};
    char shape[32];
    snprintf(shape, sizeof shape, "n=%zu", n);
    Output out[] = {{"outer", &a.outer, NULL, CMP_INCREMENT, BOUND_FP32},
                    {"momentum", &a.momentum, NULL, CMP_NORMALISED, BOUND_FP32},
                    {"param", &a.param, NULL, CMP_INCREMENT, BOUND_FP32}};
    op_check("outer_sgd_update", shape, outer_run, &a, out, 3);
    pair_free(&a.outer), pair_free(&a.momentum), pair_free(&a.param), pair_free(&a.delta);
}

// ---- diffusion transformer (FLUX) ------------------------------------------------------------

typedef struct {
    Pair out, mean, rstd, x, dout, dx;
    int n, dim;
} LnArgs;

static void layernorm_forward_run(int s, void *ctx) {
    LnArgs *a = ctx;
    side[s]->layernorm_forward(F(a->out, s), F(a->mean, s), F(a->rstd, s), F(a->x, s), a->n,
                               a->dim, 1e-6f);
}

static void layernorm_backward_run(int s, void *ctx) {
    LnArgs *a = ctx;
    side[s]->layernorm_backward(F(a->dx, s), F(a->dout, s), F(a->x, s), F(a->mean, s),
                                F(a->rstd, s), a->n, a->dim);
}

// x in [1, 5): rows far from centred, so the variance pass must not cancel against the mean.
static void check_layernorm(int n, int dim) {
    size_t nd = (size_t)n * dim;
    LnArgs a = {pair_nan(nd), pair_nan(n), pair_nan(n), pair_random(nd, 1, 5),
                pair_random(nd, -1, 1), pair_random(nd, -1, 1), n, dim};
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d dim=%d", n, dim);
    Output fwd[] = {{"out", &a.out, NULL, CMP_NORMALISED, BOUND_FP32},
                    {"mean", &a.mean, NULL, CMP_NORMALISED, BOUND_REDUCE},
                    {"rstd", &a.rstd, NULL, CMP_NORMALISED, BOUND_REDUCE}};
    op_check("layernorm_fwd", shape, layernorm_forward_run, &a, fwd, 3);
    pair_share_cpu(&a.mean), pair_share_cpu(&a.rstd);
    Output bwd[] = {{"dx", &a.dx, NULL, CMP_INCREMENT, BOUND_REDUCE}};
    op_check("layernorm_bwd", shape, layernorm_backward_run, &a, bwd, 1);
    Pair *all[] = {&a.out, &a.mean, &a.rstd, &a.x, &a.dout, &a.dx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

typedef struct {
    Pair out, x, dout, dx;
    size_t n;
    bool gelu;      // GELU-tanh, else SiLU
    bool in_place;  // forward with out == x (out starts as x's values)
} ActArgs;

static void activation_forward_run(int s, void *ctx) {
    ActArgs *a = ctx;
    const float *x = a->in_place ? F(a->out, s) : F(a->x, s);
    if (a->gelu)
        side[s]->gelu_tanh_forward(F(a->out, s), x, a->n);
    else
        side[s]->silu_forward(F(a->out, s), x, a->n);
}

static void activation_backward_run(int s, void *ctx) {
    ActArgs *a = ctx;
    if (a->gelu)
        side[s]->gelu_tanh_backward(F(a->dx, s), F(a->dout, s), F(a->x, s), a->n);
    else
        side[s]->silu_backward(F(a->dx, s), F(a->dout, s), F(a->x, s), a->n);
}

// x in [-12, 12): both saturated tails.
static void check_activation(bool gelu, size_t n) {
    ActArgs a = {pair_nan(n), pair_random(n, -12, 12), pair_random(n, -1, 1),
                 pair_random(n, -1, 1), n, gelu, false};
    const char *name = gelu ? "gelu_tanh" : "silu";
    char shape[64], op[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    Output fwd[] = {{"", &a.out, NULL, CMP_NORMALISED, BOUND_FP32}};
    snprintf(op, sizeof op, "%s_fwd", name);
    op_check(op, shape, activation_forward_run, &a, fwd, 1);
    pair_free(&a.out);
    a.out = pair_of(a.x.init, n * sizeof(float));
    a.in_place = true;
    snprintf(op, sizeof op, "%s_fwd in place", name);
    op_check(op, shape, activation_forward_run, &a, fwd, 1);
    Output bwd[] = {{"dx", &a.dx, NULL, CMP_INCREMENT, BOUND_FP32}};
    snprintf(op, sizeof op, "%s_bwd", name);
    op_check(op, shape, activation_backward_run, &a, bwd, 1);
    Pair *all[] = {&a.out, &a.x, &a.dout, &a.dx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

// The modulation (B, 6 dim) as a FLUX double block's linear writes it: shift, scale and gate are
// its chunks 0, 1 and 2, rows ld = 6 dim apart. out doubles as the gated residual's y, x as h.
typedef struct {
    Pair out, x, mod, dout, dx, dmod;
    int B, T, dim, ld;
    bool in_place;  // modulate_forward with out == x (out starts as x's values)
} ModArgs;

static void modulate_forward_run(int s, void *ctx) {
    ModArgs *a = ctx;
    const float *x = a->in_place ? F(a->out, s) : F(a->x, s), *mod = F(a->mod, s);
    side[s]->modulate_forward(F(a->out, s), x, mod, mod + a->dim, a->ld, a->B, a->T, a->dim);
}

static void modulate_backward_run(int s, void *ctx) {
    ModArgs *a = ctx;
    float *dmod = F(a->dmod, s);
    side[s]->modulate_backward(F(a->dx, s), dmod, dmod + a->dim, F(a->dout, s), F(a->x, s),
                               F(a->mod, s) + a->dim, a->ld, a->B, a->T, a->dim);
}

static void gated_add_forward_run(int s, void *ctx) {
    ModArgs *a = ctx;
    side[s]->gated_add_forward(F(a->out, s), F(a->x, s), F(a->mod, s) + 2 * a->dim, a->ld, a->B,
                               a->T, a->dim);
}

static void gated_add_backward_run(int s, void *ctx) {
    ModArgs *a = ctx;
    side[s]->gated_add_backward(F(a->dx, s), F(a->dmod, s) + 2 * a->dim, F(a->dout, s),
                                F(a->x, s), F(a->mod, s) + 2 * a->dim, a->ld, a->B, a->T, a->dim);
}

// The chunks neither op touches must keep their values: dmod is compared whole.
static void check_modulation(int B, int T, int dim) {
    size_t n = (size_t)B * T * dim, nv = (size_t)B * 6 * dim;
    ModArgs a = {pair_nan(n), pair_random(n, -2, 2), pair_random(nv, -1, 1),
                 pair_random(n, -1, 1), pair_random(n, -1, 1), pair_random(nv, -1, 1),
                 B, T, dim, 6 * dim, false};
    char shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d dim=%d", B, T, dim);
    Output fwd[] = {{"", &a.out, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("modulate_fwd", shape, modulate_forward_run, &a, fwd, 1);
    pair_free(&a.out);
    a.out = pair_of(a.x.init, n * sizeof(float));
    a.in_place = true;
    op_check("modulate_fwd in place", shape, modulate_forward_run, &a, fwd, 1);
    Output bwd[] = {{"dx", &a.dx, NULL, CMP_INCREMENT, BOUND_FP32},
                    {"dmod", &a.dmod, NULL, CMP_INCREMENT, BOUND_REDUCE}};
    op_check("modulate_bwd", shape, modulate_backward_run, &a, bwd, 2);
    pair_free(&a.out);
    a.out = pair_random(n, -1, 1);
    Output gated[] = {{"y", &a.out, NULL, CMP_INCREMENT, BOUND_FP32}};
    op_check("gated_add_fwd", shape, gated_add_forward_run, &a, gated, 1);
    pair_reset(&a.dx), pair_reset(&a.dmod);  // the timing above accumulated into them
    op_check("gated_add_bwd", shape, gated_add_backward_run, &a, bwd, 2);
    Pair *all[] = {&a.out, &a.x, &a.mod, &a.dout, &a.dx, &a.dmod};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

typedef struct {
    Pair y, bias, dy, dbias;
    int n, dim;
} BiasArgs;

static void bias_add_run(int s, void *ctx) {
    BiasArgs *a = ctx;
    side[s]->bias_add(F(a->y, s), F(a->bias, s), a->n, a->dim);
}

static void bias_backward_run(int s, void *ctx) {
    BiasArgs *a = ctx;
    side[s]->bias_backward(F(a->dbias, s), F(a->dy, s), a->n, a->dim);
}

static void check_bias(int n, int dim) {
    size_t nd = (size_t)n * dim;
    BiasArgs a = {pair_random(nd, -1, 1), pair_random(dim, -1, 1), pair_random(nd, -1, 1),
                  pair_random(dim, -1, 1), n, dim};
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d dim=%d", n, dim);
    Output fwd[] = {{"y", &a.y, NULL, CMP_INCREMENT, BOUND_FP32}};
    op_check("bias_add", shape, bias_add_run, &a, fwd, 1);
    Output bwd[] = {{"dbias", &a.dbias, NULL, CMP_INCREMENT, BOUND_REDUCE}};
    op_check("bias_backward", shape, bias_backward_run, &a, bwd, 1);
    Pair *all[] = {&a.y, &a.bias, &a.dy, &a.dbias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

typedef struct {
    Pair out, t;
    int B, dim;
} TimeArgs;

static void timestep_embedding_run(int s, void *ctx) {
    TimeArgs *a = ctx;
    side[s]->timestep_embedding(F(a->out, s), F(a->t, s), a->B, a->dim, 10000.0f, 1000.0f);
}

// FLUX's max_period and time_factor, t in [0, 1): angles up to 1000 rad.
static void check_timestep_embedding(int B, int dim) {
    TimeArgs a = {pair_nan((size_t)B * dim), pair_random(B, 0, 1), B, dim};
    char shape[64];
    snprintf(shape, sizeof shape, "B=%d dim=%d", B, dim);
    Output out[] = {{"", &a.out, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("timestep_embedding", shape, timestep_embedding_run, &a, out, 1);
    pair_free(&a.out), pair_free(&a.t);
}

typedef struct {
    Pair sq, pred, target, dpred;
    int n, dim;
} SqArgs;

static void squared_error_forward_run(int s, void *ctx) {
    SqArgs *a = ctx;
    side[s]->squared_error_forward(F(a->sq, s), F(a->pred, s), F(a->target, s), a->n, a->dim);
}

static void squared_error_backward_run(int s, void *ctx) {
    SqArgs *a = ctx;
    side[s]->squared_error_backward(F(a->dpred, s), F(a->pred, s), F(a->target, s),
                                    (size_t)a->n * a->dim, 1.0f / a->n);
}

static void check_squared_error(int n, int dim) {
    size_t nd = (size_t)n * dim;
    SqArgs a = {pair_nan(n), pair_random(nd, -1, 1), pair_random(nd, -1, 1),
                pair_random(nd, -0.01, 0.01), n, dim};
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d dim=%d", n, dim);
    Output fwd[] = {{"", &a.sq, NULL, CMP_NORMALISED, BOUND_REDUCE}};
    op_check("squared_error_fwd", shape, squared_error_forward_run, &a, fwd, 1);
    Output bwd[] = {{"dpred", &a.dpred, NULL, CMP_INCREMENT, BOUND_FP32}};
    op_check("squared_error_bwd", shape, squared_error_backward_run, &a, bwd, 1);
    Pair *all[] = {&a.sq, &a.pred, &a.target, &a.dpred};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

// FLUX.1's shapes: hidden 3072, 8192 tokens (two 1024x1024 images: 4096 image + 512 text tokens
// each, as T below), 64 channels a patch; then odd sizes.
static void check_flux(void) {
    check_layernorm(8192, 3072);
    check_layernorm(67, 1000);
    for (int gelu = 0; gelu < 2; gelu++) {
        check_activation(gelu, 5);
        check_activation(gelu, (size_t)8192 * 3072 + 13);
    }
    check_modulation(2, 4608, 3072);
    check_modulation(3, 5, 40);
    check_bias(8192, 3072);
    check_bias(67, 1000);
    check_timestep_embedding(64, 256);
    check_timestep_embedding(3, 33);
    check_squared_error(8192, 64);
    check_squared_error(67, 1000);
}

// ---- mixture of experts ----------------------------------------------------------------------

// One MoE layer's ops on n tokens of width dim, E experts of hidden width, k choices each.
// Every op after the router reads the cpu side's router and sort outputs (shared to the cuda
// side), so that a near-tie the two sides' scores break differently cannot spread.
#define MOE_MAX_EXPERTS 256
typedef struct {
    MoeRouter r;
    int n, dim, hidden, capacity, rows;  // rows: kept after the sort
    int offsets_host[MOE_MAX_EXPERTS + 1];  // the sort's offsets (E + 1), for grouped_matmul
    Pair logits, bias, scores, weight, experts, dweight, dlogits;
    Pair counts, offsets, row_of_slot;
    Pair x, sorted, y, dw_slots;          // tokens (n, dim), rows (rows, dim), y (n, dim), (n*k)
    Pair a, w, c, da, dc, dwe;            // grouped GEMM: (rows, dim), (E, hidden, dim), ...
    Pair stats, daux;                     // balance loss: f then P (2, n / MOE_SEQ, E), (n, E)
    bool trans_a, trans_b;                // the grouped GEMM's form under test
} MoeArgs;

static void router_forward_run(int s, void *ctx) {
    MoeArgs *a = ctx;
    side[s]->moe_router_forward(F(a->weight, s), (int *)a->experts.at[s], F(a->scores, s),
                                F(a->logits, s), F(a->bias, s), &a->r, a->n);
}

static void router_backward_run(int s, void *ctx) {
    MoeArgs *a = ctx;
    side[s]->moe_router_backward(F(a->dlogits, s), F(a->dweight, s), F(a->scores, s),
                                 I(a->experts, s), &a->r, a->n);
}

static void sort_run(int s, void *ctx) {
    MoeArgs *a = ctx;
    side[s]->moe_sort((int *)a->counts.at[s], (int *)a->offsets.at[s],
                      (int *)a->row_of_slot.at[s], I(a->experts, s), a->n * a->r.top_k,
                      a->r.n_experts, a->capacity);
}

static void permute_run(int s, void *ctx) {
    MoeArgs *a = ctx;
    side[s]->moe_permute(F(a->sorted, s), F(a->x, s), F(a->weight, s), I(a->row_of_slot, s),
                         a->n, a->r.top_k, a->dim);
}

static void unpermute_run(int s, void *ctx) {
    MoeArgs *a = ctx;
    side[s]->moe_unpermute(F(a->y, s), F(a->sorted, s), F(a->weight, s), I(a->row_of_slot, s),
                           a->n, a->r.top_k, a->dim);
}

static void weight_grad_run(int s, void *ctx) {
    MoeArgs *a = ctx;
    side[s]->moe_weight_grad(F(a->dw_slots, s), F(a->x, s), F(a->sorted, s),
                             I(a->row_of_slot, s), a->n, a->r.top_k, a->dim);
}

// forward c = a w_e^T (beta 0); input gradient da += dc w_e; weight gradient dwe += dc^T a.
static void grouped_run(int s, void *ctx) {
    MoeArgs *a = ctx;
    int E = a->r.n_experts;
    if (a->trans_b)
        side[s]->grouped_matmul(F(a->c, s), F(a->a, s), F(a->w, s), a->offsets_host, E,
                                a->hidden, a->dim, false, true, 0.0f);
    else if (!a->trans_a)
        side[s]->grouped_matmul(F(a->da, s), F(a->dc, s), F(a->w, s), a->offsets_host, E, a->dim,
                                a->hidden, false, false, 1.0f);
    else
        side[s]->grouped_matmul(F(a->dwe, s), F(a->dc, s), F(a->a, s), a->offsets_host, E,
                                a->dim, a->hidden, true, false, 1.0f);
}

// The balance loss's sequences: n tokens are n / MOE_SEQ of them.
#define MOE_SEQ 256

static void aux_stats_run(int s, void *ctx) {
    MoeArgs *a = ctx;
    size_t half = (size_t)a->n / MOE_SEQ * a->r.n_experts;
    side[s]->moe_aux_stats(F(a->stats, s), F(a->stats, s) + half, F(a->scores, s),
                           I(a->experts, s), &a->r, a->n, 0, MOE_SEQ);
}

static void aux_backward_run(int s, void *ctx) {
    MoeArgs *a = ctx;
    side[s]->moe_aux_backward(F(a->daux, s), F(a->stats, s), F(a->scores, s), &a->r, a->n, 0,
                              MOE_SEQ, 0.37f);
}

// From the router's shared outputs: the statistics (cuda adds them with atomics, in another
// order) and the gradient through the normalised scores and the score function.
static void check_moe_aux(MoeArgs *a, const char *shape) {
    size_t E = (size_t)a->r.n_experts, seqs = (size_t)a->n / MOE_SEQ;
    // The gradient accumulated so far on the increment's scale (dloss / T times normalised
    // scores: 1e-6..1e-4): O(1) contents would round each sum at 6e-8 and swamp the error of
    // the increment itself (an H200 run measured 1e-3 of it that way, all of it rounding).
    a->stats = pair_random(2 * seqs * E, 0, 1);
    a->daux = pair_random((size_t)a->n * E, -1e-5, 1e-5);
    Output stats[] = {{"", &a->stats, NULL, CMP_INCREMENT, BOUND_REDUCE}};
    op_check("moe_aux_stats", shape, aux_stats_run, a, stats, 1);
    pair_share_cpu(&a->stats);
    Output bwd[] = {{"dlogits", &a->daux, NULL, CMP_INCREMENT, BOUND_REDUCE}};
    op_check("moe_aux_backward", shape, aux_backward_run, a, bwd, 1);
    pair_free(&a->stats), pair_free(&a->daux);
}

static void check_moe_router(MoeArgs *a, const char *shape) {
    Output fwd[] = {{"weight", &a->weight, NULL, CMP_NORMALISED, BOUND_FP32},
                    {"experts", &a->experts, NULL, CMP_BITS32, BOUND_EXACT},
                    {"scores", &a->scores, NULL, CMP_NORMALISED, BOUND_FP32}};
    op_check("moe_router_fwd", shape, router_forward_run, a, fwd, 3);
    pair_share_cpu(&a->weight), pair_share_cpu(&a->experts), pair_share_cpu(&a->scores);
    Output bwd[] = {{"dlogits", &a->dlogits, NULL, CMP_INCREMENT, BOUND_REDUCE}};
    op_check("moe_router_bwd", shape, router_backward_run, a, bwd, 1);
    Output sort[] = {{"counts", &a->counts, NULL, CMP_BITS32, BOUND_EXACT},
                     {"offsets", &a->offsets, NULL, CMP_BITS32, BOUND_EXACT},
                     {"row_of_slot", &a->row_of_slot, NULL, CMP_BITS32, BOUND_EXACT}};
    op_check("moe_sort", shape, sort_run, a, sort, 3);
    pair_share_cpu(&a->offsets), pair_share_cpu(&a->row_of_slot);
    side[CPU]->download(a->offsets_host, a->offsets.at[CPU],
                        (size_t)(a->r.n_experts + 1) * sizeof(int));
    a->rows = a->offsets_host[a->r.n_experts];
}

// The permute writes every kept row and the unpermute adds each token's slots in slot order
// with the same roundings on both sides: both bit for bit.
static void check_moe_dispatch(MoeArgs *a, const char *shape) {
    size_t nd = (size_t)a->n * a->dim, rd = (size_t)a->rows * a->dim;
    a->x = pair_random(nd, -1, 1), a->sorted = pair_nan(rd), a->y = pair_random(nd, -1, 1);
    a->dw_slots = pair_random((size_t)a->n * a->r.top_k, -1, 1);
    Output perm[] = {{"", &a->sorted, NULL, CMP_BITS32, BOUND_EXACT}};
    op_check("moe_permute", shape, permute_run, a, perm, 1);
    Output unperm[] = {{"", &a->y, NULL, CMP_BITS32, BOUND_EXACT}};
    op_check("moe_unpermute", shape, unpermute_run, a, unperm, 1);
    Output wg[] = {{"dweight", &a->dw_slots, NULL, CMP_INCREMENT, BOUND_REDUCE}};
    op_check("moe_weight_grad", shape, weight_grad_run, a, wg, 1);
    pair_free(&a->x), pair_free(&a->sorted), pair_free(&a->y), pair_free(&a->dw_slots);
}

static void check_grouped_matmul(MoeArgs *a, const char *shape) {
    size_t E = (size_t)a->r.n_experts, rd = (size_t)a->rows * a->dim;
    size_t rh = (size_t)a->rows * a->hidden, wsz = E * a->hidden * a->dim;
    a->a = pair_random(rd, -1, 1), a->w = pair_random(wsz, -1, 1), a->c = pair_nan(rh);
    a->dc = pair_random(rh, -1, 1), a->da = pair_random(rd, -1, 1), a->dwe = pair_random(wsz, -1, 1);
    Output fwd[] = {{"", &a->c, NULL, CMP_NORMALISED, bound_compute}};
    Output dx[] = {{"", &a->da, NULL, CMP_INCREMENT, bound_compute}};
    Output dw[] = {{"", &a->dwe, NULL, CMP_INCREMENT, bound_compute}};
    a->trans_a = false, a->trans_b = true;
    op_check("grouped_matmul a w^T", shape, grouped_run, a, fwd, 1);
    a->trans_b = false;
    op_check("grouped_matmul dc w", shape, grouped_run, a, dx, 1);
    a->trans_a = true;
    op_check("grouped_matmul dc^T a", shape, grouped_run, a, dw, 1);
    pair_free(&a->a), pair_free(&a->w), pair_free(&a->c), pair_free(&a->dc), pair_free(&a->da);
    pair_free(&a->dwe);
}

// The bias keeps the first and the last expert from ever being chosen (empty groups at both
// ends), and the capacity (when > 0) drops the busiest experts' later slots.
static void check_moe(MoeRouter r, int n, int dim, int hidden, int capacity) {
    int E = r.n_experts, k = r.top_k;
    if (E > MOE_MAX_EXPERTS) exit(3);
    float *bias = host_random((size_t)E, -0.1, 0.1);
    bias[0] = bias[E - 1] = -10.0f;
    MoeArgs a = {.r = r, .n = n, .dim = dim, .hidden = hidden, .capacity = capacity};
    size_t nk = (size_t)n * k;
    a.logits = pair_random((size_t)n * E, -4, 4), a.bias = pair_adopt(bias, (size_t)E);
    a.scores = pair_nan((size_t)n * E), a.weight = pair_nan(nk), a.experts = pair_nan(nk);
    a.dweight = pair_random(nk, -1, 1), a.dlogits = pair_random((size_t)n * E, -1, 1);
    a.counts = pair_nan((size_t)E), a.offsets = pair_nan((size_t)E + 1);
    a.row_of_slot = pair_nan(nk);
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d E=%d k=%d G=%d/%d %s%s cap=%d", n, E, k, r.n_groups,
             r.limited_groups, r.score_func == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax",
             r.route_norm ? " norm" : "", capacity);
    check_moe_router(&a, shape);
    check_moe_aux(&a, shape);
    snprintf(shape, sizeof shape, "n=%d k=%d dim=%d rows=%d", n, k, dim, a.rows);
    check_moe_dispatch(&a, shape);
    snprintf(shape, sizeof shape, "E=%d rows=%d dim=%d hidden=%d", E, a.rows, dim, hidden);
    check_grouped_matmul(&a, shape);
    pair_free(&a.logits), pair_free(&a.bias), pair_free(&a.scores), pair_free(&a.weight);
    pair_free(&a.experts), pair_free(&a.dweight), pair_free(&a.dlogits), pair_free(&a.counts);
    pair_free(&a.offsets), pair_free(&a.row_of_slot);
}

// debugmodel_moe's shapes, then a DeepSeek-like group-limited router with a capacity.
static void check_moes(void) {
    check_moe((MoeRouter){.n_experts = 8, .top_k = 2, .score_func = MOE_SCORE_SOFTMAX,
                          .route_scale = 1.0f},
              2048, 256, 768, 0);
    check_moe((MoeRouter){.n_experts = 64, .top_k = 6, .score_func = MOE_SCORE_SIGMOID,
                          .n_groups = 8, .limited_groups = 3, .route_norm = true,
                          .route_scale = 2.5f},
              4096, 512, 1408, 4096 * 6 / 64);
}

// ---- float8 ----------------------------------------------------------------------------------

// x (rows, cols) with rows' magnitudes 2^-10 to 2^9 apart, so that rowwise amaxes and scales
// differ from row to row and from the tensor's.
static float *float8_host_input(int rows, int cols) {
    float *x = host_random((size_t)rows * cols, -1, 1);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) x[(size_t)r * cols + c] *= ldexpf(1.0f, r % 20 - 10);
    return x;
}

typedef struct {
    Pair x, amax, out, scale_inv;
    int rows, cols;
    Float8Cast cast;
} Float8Args;

static void float8_amax_run(int s, void *ctx) {
    Float8Args *a = ctx;
    side[s]->float8_amax(F(a->amax, s), F(a->x, s), a->rows, a->cols, &a->cast);
}

static void float8_quantize_run(int s, void *ctx) {
    Float8Args *a = ctx;
    side[s]->float8_quantize((uint8_t *)a->out.at[s], F(a->scale_inv, s), F(a->amax, s),
                             F(a->x, s), a->rows, a->cols, &a->cast);
}

// amax, scales and bytes bit for bit: both backends run core/float8.h's casts.
static void check_float8_quantize(int rows, int cols, Float8Cast cast) {
    size_t count = !cast.rowwise ? 1 : cast.transpose ? (size_t)cols : (size_t)rows;
    Float8Args a = {pair_adopt(float8_host_input(rows, cols), (size_t)rows * cols),
                    pair_nan(count), pair_nan(((size_t)rows * cols + 3) / 4), pair_nan(count),
                    rows, cols, cast};
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%d %s %s%s%s", rows, cols,
             cast.kind == FLOAT8_E4M3FN ? "e4m3" : "e5m2", cast.rowwise ? "rowwise" : "tensor",
             cast.transpose ? " T" : "", cast.pow2_scales ? " pow2" : "");
    Output amax[] = {{"", &a.amax, NULL, CMP_BITS32, BOUND_EXACT}};
    op_check("float8_amax", shape, float8_amax_run, &a, amax, 1);
    Output cast_out[] = {{"bytes", &a.out, NULL, CMP_BYTES, BOUND_EXACT},
                         {"scale_inv", &a.scale_inv, NULL, CMP_BITS32, BOUND_EXACT}};
    a.out.bytes = (size_t)rows * cols;  // compare the codes, not the rounding-up tail
    op_check("float8_quantize", shape, float8_quantize_run, &a, cast_out, 2);
    Pair *all[] = {&a.x, &a.amax, &a.out, &a.scale_inv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

typedef struct {
    Pair a, a_scale_inv, b, b_scale_inv, c;
    void *workspace[N_SIDES];
    Float8Kind a_kind, b_kind;
    int m, n, k;
    bool rowwise;
    float beta;
} Float8GemmArgs;

static void matmul_float8_run(int s, void *ctx) {
    Float8GemmArgs *a = ctx;
    side[s]->matmul_float8(F(a->c, s), (const uint8_t *)a->a.at[s], F(a->a_scale_inv, s),
                           a->a_kind, (const uint8_t *)a->b.at[s], F(a->b_scale_inv, s),
                           a->b_kind, a->m, a->n, a->k, a->rowwise, a->beta, a->workspace[s]);
}

// A K-contiguous operand (rows, k) quantised on the cpu (host memory), then given to both sides.
static void float8_operand(Pair *bytes, Pair *scale_inv, int rows, int k, Float8Kind kind,
                           bool rowwise) {
    Float8Cast cast = {kind, rowwise, false, rowwise};
    size_t count = rowwise ? (size_t)rows : 1;
    float *x = float8_host_input(rows, k), *amax = host_alloc(count * sizeof *amax);
    float *inv = host_alloc(count * sizeof *inv);
    uint8_t *q = host_alloc((size_t)rows * k);
    side[CPU]->float8_amax(amax, x, rows, k, &cast);
    side[CPU]->float8_quantize(q, inv, amax, x, rows, k, &cast);
    *bytes = pair_of(q, (size_t)rows * k);
    *scale_inv = pair_of(inv, count * sizeof *inv);
    free(x), free(amax), free(inv), free(q);
}

// The same float8 operands on both sides: only the summation order, the accumulator's width (and
// where cuBLASLt applies the scales) differ. beta 0 must not read c (NaN); beta 1 adds
// onto a c as large as the product.
static void check_matmul_float8(const char *gemm, int m, int n, int k, Float8Kind a_kind,
                                Float8Kind b_kind, bool rowwise, float beta) {
    Float8GemmArgs a = {.a_kind = a_kind, .b_kind = b_kind, .m = m, .n = n, .k = k,
                        .rowwise = rowwise, .beta = beta};
    float8_operand(&a.a, &a.a_scale_inv, m, k, a_kind, rowwise);
    float8_operand(&a.b, &a.b_scale_inv, n, k, b_kind, rowwise);
    size_t mn = (size_t)m * n;
    a.c = beta == 0.0f ? pair_nan(mn) : pair_random(mn, -100, 100);
    for (int s = 0; s < N_SIDES; s++) {
        size_t bytes = side[s]->matmul_float8_workspace_bytes(m, n, k);
        a.workspace[s] = bytes ? side_alloc(s, bytes) : NULL;
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%s %dx%dx%d %s%s beta=%g", gemm, m, n, k,
             a_kind == FLOAT8_E4M3FN ? "e4m3" : "e5m2", b_kind == FLOAT8_E4M3FN ? "e4m3" : "e5m2",
             beta);
    Output out[] = {{"", &a.c, NULL, beta == 0.0f ? CMP_NORMALISED : CMP_INCREMENT,
                     BOUND_FLOAT8_GEMM}};
    op_check(rowwise ? "matmul_float8 rowwise" : "matmul_float8 tensorwise", shape,
             matmul_float8_run, &a, out, 1);
    for (int s = 0; s < N_SIDES; s++)
        if (a.workspace[s]) side[s]->free(a.workspace[s]);
    Pair *all[] = {&a.a, &a.a_scale_inv, &a.b, &a.b_scale_inv, &a.c};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

static void float8_transpose_run(int s, void *ctx) {
    Float8Args *a = ctx;
    side[s]->float8_transpose((uint8_t *)a->out.at[s], (const uint8_t *)a->x.at[s], a->rows,
                              a->cols);
}

// Every byte value at a shape that is no multiple of the tiles: the codes move, bit for bit.
static void check_float8_transpose(int rows, int cols) {
    size_t n = (size_t)rows * cols;
    uint8_t *codes = host_alloc(n);
    for (size_t i = 0; i < n; i++) codes[i] = (uint8_t)(i * 7 + i / 256);
    Float8Args a = {.x = pair_of(codes, n), .out = pair_alloc(n), .rows = rows, .cols = cols};
    free(codes);
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%d", rows, cols);
    Output out[] = {{"bytes", &a.out, NULL, CMP_BYTES, BOUND_EXACT}};
    op_check("float8_transpose", shape, float8_transpose_run, &a, out, 1);
    pair_free(&a.x);
    pair_free(&a.out);
}

typedef struct {
    Pair a, a_scale_inv, b, b_scale_inv, c;
    void *workspace[N_SIDES];
    const int *offsets;
    int groups, n, k;
    bool weight_grad;
    float beta;
} GroupedFloat8Args;

static void grouped_matmul_float8_run(int s, void *ctx) {
    GroupedFloat8Args *a = ctx;
    side[s]->grouped_matmul_float8(F(a->c, s), (const uint8_t *)a->a.at[s], F(a->a_scale_inv, s),
                                   (const uint8_t *)a->b.at[s], F(a->b_scale_inv, s), a->offsets,
                                   a->groups, a->n, a->k, a->weight_grad, a->beta,
                                   a->workspace[s]);
}

// The weight gradient's operand: x (rows, cols) cast on the cpu group by group along the
// tokens, each group's bytes (cols, its rows) and cols scales (models/linear.c's layout).
static void float8_group_operand(Pair *bytes, Pair *scale_inv, const int *offsets, int groups,
                                 int cols) {
    Float8Cast cast = {FLOAT8_E4M3FN, true, true, true};
    int rows = offsets[groups];
    size_t count = (size_t)groups * cols;
    float *x = float8_host_input(rows, cols), *amax = host_alloc(count * sizeof *amax);
    float *inv = host_alloc(count * sizeof *inv);
    uint8_t *q = host_alloc((size_t)rows * cols + 1);
    for (int g = 0; g < groups; g++) {
        size_t r0 = (size_t)offsets[g], at = (size_t)g * cols;
        int m = offsets[g + 1] - offsets[g];
        side[CPU]->float8_amax(amax + at, x + r0 * cols, m, cols, &cast);
        side[CPU]->float8_quantize(q + r0 * cols, inv + at, amax + at, x + r0 * cols, m, cols,
                                   &cast);
    }
    *bytes = pair_of(q, (size_t)rows * cols);
    *scale_inv = pair_of(inv, count * sizeof *inv);
    free(x), free(amax), free(inv), free(q);
}

// torchao's MoE grouped GEMMs, rowwise e4m3: the forward form (a (rows, k) against the experts'
// b (groups, n, k)) and the weight gradient's (per-group casts along the tokens), on groups of
// token counts that are no multiple of 16 (cuda pads them) and one without rows.
static void check_grouped_matmul_float8(bool weight_grad, int n, int k, float beta) {
    static const int offsets[] = {0, 300, 300, 377, 393, 1393};
    int groups = 5, rows = offsets[groups];
    GroupedFloat8Args a = {.offsets = offsets, .groups = groups, .n = n, .k = k,
                           .weight_grad = weight_grad, .beta = beta};
    if (weight_grad) {
        float8_group_operand(&a.a, &a.a_scale_inv, offsets, groups, k);
        float8_group_operand(&a.b, &a.b_scale_inv, offsets, groups, n);
    } else {
        float8_operand(&a.a, &a.a_scale_inv, rows, k, FLOAT8_E4M3FN, true);
        float8_operand(&a.b, &a.b_scale_inv, groups * n, k, FLOAT8_E4M3FN, true);
    }
    size_t count = weight_grad ? (size_t)groups * k * n : (size_t)rows * n;
    a.c = beta == 0.0f ? pair_nan(count) : pair_random(count, -100, 100);
    for (int s = 0; s < N_SIDES; s++) {
        size_t bytes = side[s]->grouped_matmul_float8_workspace_bytes(rows, groups, n, k,
                                                                      weight_grad);
        a.workspace[s] = bytes ? side_alloc(s, bytes) : NULL;
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%s n=%d k=%d beta=%g", weight_grad ? "dw" : "out", n, k,
             beta);
    Output out[] = {{"", &a.c, NULL, beta == 0.0f ? CMP_NORMALISED : CMP_INCREMENT,
                     BOUND_FLOAT8_GEMM}};
    op_check("grouped_matmul_float8", shape, grouped_matmul_float8_run, &a, out, 1);
    for (int s = 0; s < N_SIDES; s++)
        if (a.workspace[s]) side[s]->free(a.workspace[s]);
    Pair *all[] = {&a.a, &a.a_scale_inv, &a.b, &a.b_scale_inv, &a.c};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

// Every cast form at odd sizes, then a linear layer's three GEMMs (x (M, K), w (N, K), dy (M,
// N)) in torchao's two recipes: tensorwise e4m3 forward with e5m2 gradients, rowwise e4m3
// throughout; and an m that is no multiple of anything.
static void check_float8(void) {
    for (int kind = FLOAT8_E4M3FN; kind <= FLOAT8_E5M2; kind++)
        for (int rowwise = 0; rowwise < 2; rowwise++)
            for (int transpose = 0; transpose < 2; transpose++)
                check_float8_quantize(1000, 333, (Float8Cast){kind, rowwise, transpose, rowwise});
    check_float8_quantize(8192, 2048, (Float8Cast){FLOAT8_E4M3FN, true, true, true});
    check_float8_transpose(1000, 333);
    check_float8_transpose(4096, 2048);
    int M = 4096, K = 2048, N = 1024;
    for (int rowwise = 0; rowwise < 2; rowwise++) {
        Float8Kind grad = rowwise ? FLOAT8_E4M3FN : FLOAT8_E5M2;
        check_matmul_float8("out", M, N, K, FLOAT8_E4M3FN, FLOAT8_E4M3FN, rowwise, 0.0f);
        check_matmul_float8("dx", M, K, N, grad, FLOAT8_E4M3FN, rowwise, 0.0f);
        check_matmul_float8("dw", N, K, M, grad, FLOAT8_E4M3FN, rowwise, 1.0f);
        check_matmul_float8("odd m", 37, 48, 80, FLOAT8_E4M3FN, grad, rowwise, 1.0f);
    }
    check_grouped_matmul_float8(false, 512, 256, 0.0f);
    check_grouped_matmul_float8(false, 256, 512, 1.0f);
    check_grouped_matmul_float8(true, 512, 256, 1.0f);
    check_grouped_matmul_float8(true, 256, 512, 0.0f);
}

// ---- QLoRA's NF4 weights ---------------------------------------------------------------------

typedef struct {
    Pair blob, x;
    size_t n, cols, first_row, first_col, rows, box_cols;
} Nf4Args;

static void nf4_dequantize_run(int s, void *ctx) {
    Nf4Args *a = ctx;
    side[s]->nf4_dequantize(F(a->x, s), (const uint8_t *)a->blob.at[s], a->n, a->cols,
                            a->first_row, a->first_col, a->rows, a->box_cols);
}

// A weight (rows x cols) quantized on the host (core/nf4.h), its box at (first_row, first_col)
// of box_rows x box_cols dequantized on both sides, bit for bit: the whole weight, or a
// tensor-parallel rank's rows or columns.
static void check_nf4_dequantize(size_t rows, size_t cols, size_t first_row, size_t first_col,
                                 size_t box_rows, size_t box_cols) {
    size_t n = rows * cols, box_n = box_rows * box_cols;
    float *w = host_random(n, -0.05, 0.05);
    uint8_t *blob = host_alloc(nf4_bytes(n));
    nf4_quantize(blob, w, n);
    Nf4Args a = {.blob = pair_of(blob, nf4_bytes(n)), .x = pair_alloc(box_n * sizeof(float)),
                 .n = n, .cols = cols, .first_row = first_row, .first_col = first_col,
                 .rows = box_rows, .box_cols = box_cols};
    free(w), free(blob);
    char shape[96];
    snprintf(shape, sizeof shape, "%zux%zu at (%zu, %zu) %zux%zu", rows, cols, first_row,
             first_col, box_rows, box_cols);
    Output out[] = {{"", &a.x, NULL, CMP_BYTES, BOUND_EXACT}};
    op_check("nf4_dequantize", shape, nf4_dequantize_run, &a, out, 1);
    pair_free(&a.blob);
    pair_free(&a.x);
}

// ---- setup -----------------------------------------------------------------------------------

static int table_need(const KernelOps *k, const char *member, bool present) {
    if (!present) printf("FAIL: the %s backend has no %s\n", k->name, member);
    return !present;
}

// The number of NULL entries: each fails here, before any check can call it.
static int table_holes(const KernelOps *k) {
    int holes = 0;
#define NEED(member) holes += table_need(k, #member, k->member != NULL)
    NEED(describe), NEED(init), NEED(queue), NEED(alloc), NEED(free), NEED(upload);
    NEED(download), NEED(copy), NEED(copy_rows), NEED(zero), NEED(matmul);
    NEED(rmsnorm_forward), NEED(rmsnorm_backward), NEED(rope_forward), NEED(rope_backward);
    NEED(attention_workspace_bytes), NEED(attention_forward), NEED(attention_backward);
    NEED(attention_merge);
    NEED(attention_decode), NEED(swiglu_forward), NEED(swiglu_backward);
    NEED(embedding_forward), NEED(embedding_backward), NEED(cross_entropy_forward);
    NEED(cross_entropy_backward), NEED(cross_entropy_slice_forward);
    NEED(cross_entropy_slice_backward), NEED(cross_entropy_merge_exp);
    NEED(cross_entropy_merge_finish), NEED(layernorm_forward), NEED(layernorm_backward);
    NEED(gelu_tanh_forward), NEED(gelu_tanh_backward), NEED(silu_forward), NEED(silu_backward);
    NEED(modulate_forward), NEED(modulate_backward), NEED(gated_add_forward);
    NEED(gated_add_backward), NEED(bias_add), NEED(bias_backward), NEED(timestep_embedding);
    NEED(squared_error_forward), NEED(squared_error_backward), NEED(add), NEED(scale);
    NEED(sum_squares), NEED(sum);
    NEED(moe_router_forward), NEED(moe_router_backward), NEED(moe_sort), NEED(moe_permute);
    NEED(moe_unpermute), NEED(moe_weight_grad), NEED(grouped_matmul), NEED(moe_aux_stats);
    NEED(moe_aux_backward);
    NEED(to_bf16), NEED(from_bf16), NEED(adamw_update), NEED(ema_update);
    NEED(outer_sgd_update);
    NEED(float8_amax), NEED(float8_quantize), NEED(matmul_float8_workspace_bytes);
    NEED(matmul_float8), NEED(float8_transpose), NEED(grouped_matmul_float8_workspace_bytes);
    NEED(grouped_matmul_float8), NEED(nf4_dequantize);
#undef NEED
    return holes;
}

// Exits 77 (SKIP) without a cuda backend or a device, 1 when a table has holes.
static void backends_start(bool bf16) {
    side[CPU] = kernels_backend("cpu");
    side[GPU] = kernels_backend("cuda");
    if (!side[GPU]) {
        printf("SKIP: titan was built without the cuda backend (make CUDA=1)\n");
        exit(77);
    }
    if (table_holes(side[CPU]) + table_holes(side[GPU])) exit(1);
    KernelInit init = {.local_rank = 0, .precision.param = bf16 ? DTYPE_BF16 : DTYPE_FP32};
    char why[256] = "";
    if (!side[GPU]->init(&init, why, sizeof why)) {
        printf("SKIP: %s\n", why);
        exit(77);
    }
    if (!side[CPU]->init(&init, why, sizeof why)) {
        fprintf(stderr, "test_cuda_ops: cpu backend: %s\n", why);
        exit(3);
    }
    for (int s = 0; s < N_SIDES; s++) {
        char line[512];
        side[s]->describe(line, sizeof line);
        printf("%s\n", line);
    }
    sync_word = side_alloc(GPU, sizeof(float));
    bound_compute = bf16 ? BOUND_BF16 : BOUND_REDUCE;
}

static void check_all(void) {
    check_memory();
    check_matmuls();
    check_rmsnorm(8192, 2048);
    check_rmsnorm(67, 1000);
    check_rope(2, 200, 8, 128);
    check_rope(4, 2048, 32, 64);
    check_attentions();
    check_swiglu(5);
    check_swiglu((size_t)8192 * 2048 + 13);
    check_embedding(8192, 2048, 1000, 3000, -1, 5000);
    check_embedding(8192, 2048, 1000, 3000, 999, 1007);
    check_cross_entropy(256, 32000);
    check_cross_entropy(4, 128256);
    check_cross_entropy_slice(256, 10000, 12000, 32000);
    check_cross_entropy_slice(4, 64128, 64128, 128256);
    check_cross_entropy_merge(8192);
    check_zero_masked_rows(256, 32000);
    check_dropout((size_t)4096 * 1024 + 7);
    check_zero_masked_rows(4096, 1);
    check_flux();
    check_moes();
    check_vector_ops(0);
    check_vector_ops(5);
    check_vector_ops(((size_t)1 << 24) + 7);
    check_bf16(N_BF16_SPECIALS);
    check_bf16(((size_t)1 << 24) + 3);
    check_adamw(5, 1);
    check_adamw(((size_t)1 << 24) + 5, 1);
    check_adamw(((size_t)1 << 24) + 5, 10);
    check_ema(5);
    check_ema(((size_t)1 << 24) + 5);
    check_outer_sgd(5);
    check_outer_sgd(((size_t)1 << 20) + 5);
    check_float8();
    check_nf4_dequantize(1, 1, 0, 0, 1, 1);
    check_nf4_dequantize(4113, 1037, 0, 0, 4113, 1037);  // odd: a short last block and group
    check_nf4_dequantize(4113, 1037, 1000, 0, 2000, 1037);  // column-parallel rows
    check_nf4_dequantize(4113, 1037, 0, 333, 4113, 500);    // row-parallel columns
}

int main(int argc, char **argv) {
    bool fp32 = argc == 2 && strcmp(argv[1], "fp32") == 0;
    if (argc > 2 || (argc == 2 && !fp32)) {
        fprintf(stderr, "usage: %s [fp32]\n", argv[0]);
        return 2;
    }
    backends_start(!fp32);
    printf("%-37s %-44s %10s %8s %10s  %s\n", "op", "shape", "error", "bound", "time (us)",
           "result");
    check_all();
    printf("test_cuda_ops (%s compute): %d checks, %d failed\n", fp32 ? "fp32" : "bf16", n_checks,
           n_failed);
    return n_failed ? 1 : 0;
}
