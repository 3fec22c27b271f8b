// The cpu grouped GEMM against its limit, for scripts/bench_moe.sh:
//   bench_grouped_matmul EXPERTS DIM HIDDEN TOKENS TOP_K balanced|skewed
//   bench_grouped_matmul describe   (the cpu backend's line: threads, OpenBLAS kernels)
// The three GEMMs of one expert projection w (HIDDEN, DIM) over TOKENS * TOP_K routed rows:
// forward c = a w_e^T, input gradient da = dc w_e, weight gradient dw_e = dc^T a. Each runs
// four ways: kernels_backend("cpu")->grouped_matmul (the op, with its choice of threads); the
// two ways it chose between, a loop of ->matmul over experts with OpenBLAS's threads inside
// each, and the same sgemms under an OpenMP loop over experts (one thread each: OpenBLAS runs
// single-threaded inside a parallel region); and ONE ->matmul of the same total size (every
// row through one weight), the limit. balanced: every expert the same rows; skewed: expert e's
// share of rows proportional to 1 / (e + 1) (Zipf). Prints one markdown row per GEMM: GFLOP/s
// of each (2 rows DIM HIDDEN flops over the least time of calls made in turn, as other jobs
// only ever slow a call) and the op's time over the one sgemm's (grouped / one).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/errors.h"
#include "kernels/kernels.h"

static const KernelOps *cpu;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    float *c;
    const float *a, *b;
    const int *offsets;
    int groups, n, k;
    bool trans_a, trans_b;
} Gemm;

static void run_grouped(const Gemm *g) {
    cpu->grouped_matmul(g->c, g->a, g->b, g->offsets, g->groups, g->n, g->k, g->trans_a,
                        g->trans_b, 0.0f);
}

// The grouped GEMM as a loop of ->matmul over groups, in parallel (an OpenMP loop of
// single-threaded sgemms) or not (OpenBLAS's threads inside each).
static void run_loop(const Gemm *g, bool parallel) {
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int e = 0; e < g->groups; e++) {
        size_t r0 = (size_t)g->offsets[e];
        int m = g->offsets[e + 1] - g->offsets[e];
        size_t w = (size_t)e * g->n * g->k;
        if (g->trans_a)
            cpu->matmul(g->c + w, g->a + r0 * g->k, g->b + r0 * g->n, DTYPE_FP32, g->k, g->n, m,
                        true, false, 0.0f);
        else if (m > 0)
            cpu->matmul(g->c + r0 * g->n, g->a + r0 * g->k, g->b + w, DTYPE_FP32, m, g->n, g->k,
                        false, g->trans_b, 0.0f);
    }
}
static void run_blas_threads(const Gemm *g) { run_loop(g, false); }
static void run_omp_experts(const Gemm *g) { run_loop(g, true); }

// Every row through group 0's weight: one sgemm of the grouped one's size.
static void run_one(const Gemm *g) {
    int rows = g->offsets[g->groups];
    if (g->trans_a)
        cpu->matmul(g->c, g->a, g->b, DTYPE_FP32, g->k, g->n, rows, true, false, 0.0f);
    else
        cpu->matmul(g->c, g->a, g->b, DTYPE_FP32, rows, g->n, g->k, false, g->trans_b, 0.0f);
}

// Each way's least time over rounds that call the three in turn (so that other jobs' load, which
// only ever slows a call, falls on all three alike), for at least 1.5 s after a warmup round.
static void row(const char *what, const Gemm *g) {
    void (*runs[4])(const Gemm *) = {run_grouped, run_blas_threads, run_omp_experts, run_one};
    double best[4] = {1e30, 1e30, 1e30, 1e30}, start = 0.0;
    for (int round = 0; round < 4 || now_seconds() - start < 2.0; round++) {
        if (round == 1) start = now_seconds();
        for (int i = 0; i < 4; i++) {
            double t0 = now_seconds();
            runs[i](g);
            double t = now_seconds() - t0;
            if (round > 0 && t < best[i]) best[i] = t;
        }
    }
    double gflop = 2e-9 * g->offsets[g->groups] * g->n * g->k;
    printf("| %s | %.1f | %.1f | %.1f | %.1f | %.2f |\n", what, gflop / best[0],
           gflop / best[1], gflop / best[2], gflop / best[3], best[3] / best[0]);
}

static float *floats_filled(size_t n) {
    float *x = cpu->alloc(n * sizeof *x);
    CHECK(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    return x;
}

int main(int argc, char **argv) {
    cpu = kernels_backend("cpu");
    if (argc == 2 && strcmp(argv[1], "describe") == 0) {
        char line[512];
        cpu->describe(line, sizeof line);
        printf("%s\n", line);
        return 0;
    }
    if (argc != 7 || (strcmp(argv[6], "balanced") && strcmp(argv[6], "skewed"))) {
        fprintf(stderr, "usage: %s EXPERTS DIM HIDDEN TOKENS TOP_K balanced|skewed\n", argv[0]);
        return 2;
    }
    int E = atoi(argv[1]), D = atoi(argv[2]), F = atoi(argv[3]);
    int rows = atoi(argv[4]) * atoi(argv[5]);
    bool skewed = strcmp(argv[6], "skewed") == 0;
    int *offsets = calloc((size_t)E + 1, sizeof *offsets);
    double harmonic = 0.0;
    for (int e = 0; e < E; e++) harmonic += 1.0 / (e + 1);
    for (int e = 0; e < E; e++) {
        double share = skewed ? 1.0 / (e + 1) / harmonic : 1.0 / E;
        offsets[e + 1] = e == E - 1 ? rows : offsets[e] + (int)(share * rows);
    }
    float *a = floats_filled((size_t)rows * D), *dc = floats_filled((size_t)rows * F);
    float *w = floats_filled((size_t)E * F * D), *c = floats_filled((size_t)rows * F);
    float *da = floats_filled((size_t)rows * D), *dw = floats_filled((size_t)E * F * D);
    char what[128];
    snprintf(what, sizeof what, "%d x %d experts %s, rows %d", E, F, argv[6], rows);
    printf("| %s | | | | | |\n", what);
    row("forward a w^T", &(Gemm){c, a, w, offsets, E, F, D, false, true});
    row("input grad dc w", &(Gemm){da, dc, w, offsets, E, D, F, false, false});
    row("weight grad dc^T a", &(Gemm){dw, dc, a, offsets, E, D, F, true, false});
    cpu->free(a), cpu->free(dc), cpu->free(w), cpu->free(c), cpu->free(da), cpu->free(dw);
    free(offsets);
    return 0;
}
