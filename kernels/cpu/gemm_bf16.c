// The cpu backend's bf16 GEMMs (KernelInit.precision bf16): the numerics of cuBLASLt's
// CUBLAS_COMPUTE_32F_FAST_16BF on cuda, bf16 inputs rounded to nearest even (core/bf16.h) and
// fp32 accumulation, through oneDNN's bf16 matmul primitive (AMX or avx512_bf16 kernels where
// the cpu has them). Measured by scripts/bench_gemm.sh on the debug model's step: 0.31 of
// OpenBLAS sgemm's time at one thread on an AMX Xeon; oneDNN's f32 matmul is no faster than
// OpenBLAS, so fp32 stays on OpenBLAS. A cpu for which oneDNN has no bf16 matmul (before
// AVX-512) gets the exact emulation instead: the inputs rounded to bf16 but kept as floats, then
// sgemm, the same numbers (a product of two bf16 values is exact in fp32), only slower.
//
// Primitives are created the first time a shape is seen and kept (creating one JIT-compiles its
// kernels: far too slow per call), as cuda_matmul keeps its cuBLASLt plans. A grouped GEMM's
// per-group row count changes every step, so those primitives leave that dimension to run time
// (DNNL_RUNTIME_DIM_VAL: oneDNN's gemm:jit kernels, not brgemm's) and one serves every group.
// Threads: Debian's oneDNN runs on the same libgomp as titan and, called inside an OpenMP
// region, runs single-threaded (as OpenBLAS does), so the grouped GEMM's OpenMP over experts
// keeps working; the number of threads a primitive was made for is part of its key, since its
// blocking depends on it.
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/bf16.h"
#include "kernels/cpu/cpu.h"

#define DNNL_CHECK(call) \
    do { \
        dnnl_status_t status_ = (call); \
        if (status_ != dnnl_success) \
            die_internal(__FILE__, __LINE__, "%s: oneDNN status %d", #call, (int)status_); \
    } while (0)

// Distinct shapes in a run are a few dozen (each layer kind's forward and backward GEMMs, the
// head, validation and decoding batch sizes), as cuda_matmul's MATMUL_PLANS.
#define GEMM_BF16_PRIMITIVES 512

// What a primitive depends on; m or k is -1 when it is left to run time.
typedef struct {
    int m, n, k;
    bool trans_a, trans_b;
    float beta;
    int threads;
} GemmKey;

typedef struct {
    GemmKey key;
    dnnl_primitive_t prim;
} GemmPrimitive;

static struct {
    bool on, emulated;  // emulated: no oneDNN bf16 matmul on this cpu
    dnnl_engine_t engine;
    dnnl_stream_t *streams;  // one per OpenMP thread: each thread of a region executes its own
    int n_streams;
    GemmPrimitive prims[GEMM_BF16_PRIMITIVES];
    int n_prims;
    char kernels[160];  // what cpu_gemm_bf16_kernels says
    void *scratch[2];  // the rounded copies of a and b, grown to the largest call seen
    size_t scratch_bytes[2];
} gemm;

// The row-major (rows, cols) matrix held as (cols, rows) when trans, dense either way; a dim of
// -1 becomes DNNL_RUNTIME_DIM_VAL.
static dnnl_memory_desc_t gemm_matrix(int rows, int cols, bool trans, dnnl_data_type_t type) {
    dnnl_dim_t r = rows < 0 ? DNNL_RUNTIME_DIM_VAL : rows;
    dnnl_dim_t c = cols < 0 ? DNNL_RUNTIME_DIM_VAL : cols;
    dnnl_dims_t dims = {r, c}, strides = {trans ? 1 : c, trans ? r : 1};
    dnnl_memory_desc_t md;
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&md, 2, dims, type, strides));
    return md;
}

// beta != 0 is oneDNN's sum post-op: c = a b + beta c, c read only then (BLAS's contract).
// NULL when oneDNN has no implementation for this cpu.
static dnnl_primitive_desc_t gemm_primitive_desc(const GemmKey *key) {
    dnnl_memory_desc_t a = gemm_matrix(key->m, key->k, key->trans_a, dnnl_bf16);
    dnnl_memory_desc_t b = gemm_matrix(key->k, key->n, key->trans_b, dnnl_bf16);
    dnnl_memory_desc_t c = gemm_matrix(key->m, key->n, false, dnnl_f32);
    dnnl_matmul_desc_t desc;
    DNNL_CHECK(dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c));
    dnnl_primitive_attr_t attr;
    DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    if (key->beta != 0.0f) {
        dnnl_post_ops_t ops;
        DNNL_CHECK(dnnl_post_ops_create(&ops));
        DNNL_CHECK(dnnl_post_ops_append_sum(ops, key->beta));
        DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));
        DNNL_CHECK(dnnl_post_ops_destroy(ops));
    }
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t status = dnnl_primitive_desc_create(&pd, &desc, attr, gemm.engine, NULL);
    DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
    if (status == dnnl_unimplemented) return NULL;
    DNNL_CHECK(status);
    return pd;
}

static bool gemm_key_equal(const GemmKey *x, const GemmKey *y) {
    return x->m == y->m && x->n == y->n && x->k == y->k && x->trans_a == y->trans_a &&
           x->trans_b == y->trans_b && x->beta == y->beta && x->threads == y->threads;
}

// The key's primitive, made the first time it is asked for (the only time this op allocates).
// The table is shared by the threads of a grouped GEMM's region, hence the lock.
static dnnl_primitive_t gemm_primitive(const GemmKey *key) {
    dnnl_primitive_t prim = NULL;
#pragma omp critical(cpu_gemm_bf16_primitives)
    {
        for (int i = 0; i < gemm.n_prims && !prim; i++)
            if (gemm_key_equal(&gemm.prims[i].key, key)) prim = gemm.prims[i].prim;
        if (!prim) {
            if (gemm.n_prims == GEMM_BF16_PRIMITIVES)
                die_internal(__FILE__, __LINE__, "bf16 matmul: more than %d distinct shapes",
                             GEMM_BF16_PRIMITIVES);
            dnnl_primitive_desc_t pd = gemm_primitive_desc(key);
            CHECK(pd);  // the probe at start found an implementation
            DNNL_CHECK(dnnl_primitive_create(&prim, pd));
            DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
            gemm.prims[gemm.n_prims++] = (GemmPrimitive){*key, prim};
        }
    }
    return prim;
}

bool cpu_gemm_bf16_start(char *why, size_t len) {
    if (gemm.on) return true;
    if (dnnl_engine_create(&gemm.engine, dnnl_cpu, 0) != dnnl_success) {
        snprintf(why, len, "bf16 compute: oneDNN has no cpu engine");
        return false;
    }
    gemm.n_streams = omp_get_max_threads();
    gemm.streams = malloc((size_t)gemm.n_streams * sizeof *gemm.streams);
    CHECK(gemm.streams);
    for (int i = 0; i < gemm.n_streams; i++)
        DNNL_CHECK(dnnl_stream_create(&gemm.streams[i], gemm.engine, dnnl_stream_default_flags));
    // A probe of the debug model's size names the implementation oneDNN picks on this cpu (its
    // ISA, e.g. brg:avx512_core_amx_bf16); attention's tiles take bf16 too (attention.c).
    GemmKey probe = {256, 256, 256, false, true, 0.0f, omp_get_max_threads()};
    dnnl_primitive_desc_t pd = gemm_primitive_desc(&probe);
    const dnnl_version_t *v = dnnl_version();
    const char *impl = NULL;
    if (pd) DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    const char *tiles = cpu_small_gemm_dpbf16() ? "vdpbf16ps" : "fused multiply-adds";
    if (pd)
        snprintf(gemm.kernels, sizeof gemm.kernels,
                 "oneDNN %d.%d.%d bf16 matmul (%s), attention's bf16 tiles on %s", v->major,
                 v->minor, v->patch, impl, tiles);
    else
        snprintf(gemm.kernels, sizeof gemm.kernels,
                 "bf16-rounded inputs through sgemm (oneDNN %d.%d.%d has no bf16 matmul for "
                 "this cpu), attention's bf16 tiles on %s", v->major, v->minor, v->patch, tiles);
    if (pd) DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
    gemm.emulated = pd == NULL;
    gemm.on = true;
    return true;
}

bool cpu_gemm_bf16_on(void) { return gemm.on; }

bool cpu_gemm_bf16_emulated(void) { return gemm.emulated; }

const char *cpu_gemm_bf16_kernels(void) { return gemm.kernels; }

static void *gemm_scratch(int slot, size_t bytes) {
    CHECK(slot == 0 || slot == 1);
    if (bytes > gemm.scratch_bytes[slot]) {
        free(gemm.scratch[slot]);
        gemm.scratch[slot] = malloc(bytes);
        CHECK(gemm.scratch[slot]);
        gemm.scratch_bytes[slot] = bytes;
    }
    return gemm.scratch[slot];
}

uint16_t *cpu_gemm_bf16_round(int slot, const float *x, size_t n) {
    uint16_t *y = gemm_scratch(slot, n * sizeof *y);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) y[i] = bf16_from_float(x[i]);
    return y;
}

float *cpu_gemm_bf16_round_floats(int slot, const float *x, size_t n) {
    float *y = gemm_scratch(slot, n * sizeof *y);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) y[i] = bf16_to_float(bf16_from_float(x[i]));
    return y;
}

float *cpu_gemm_bf16_widen(int slot, const uint16_t *x, size_t n) {
    float *y = gemm_scratch(slot, n * sizeof *y);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) y[i] = bf16_to_float(x[i]);
    return y;
}

void cpu_gemm_bf16(float *c, const uint16_t *a, const uint16_t *b, int m, int n, int k,
                   bool trans_a, bool trans_b, float beta, bool runtime_rows) {
    if (m == 0 || n == 0) return;
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    // The grouped GEMM's varying dimension: the rows of a forward or input gradient (m), the
    // summed rows of a weight gradient (k, when a is transposed).
    GemmKey key = {m, n, k, trans_a, trans_b, beta, threads};
    if (runtime_rows) *(trans_a ? &key.k : &key.m) = -1;
    dnnl_primitive_t prim = gemm_primitive(&key);
    dnnl_memory_desc_t ad = gemm_matrix(m, k, trans_a, dnnl_bf16);
    dnnl_memory_desc_t bd = gemm_matrix(k, n, trans_b, dnnl_bf16);
    dnnl_memory_desc_t cd = gemm_matrix(m, n, false, dnnl_f32);
    dnnl_memory_t am, bm, cm;
    // The memory objects only wrap the pointers: made per call, since the threads of a region
    // execute concurrently and a runtime dimension's size is known only here.
    DNNL_CHECK(dnnl_memory_create(&am, &ad, gemm.engine, (void *)a));
    DNNL_CHECK(dnnl_memory_create(&bm, &bd, gemm.engine, (void *)b));
    DNNL_CHECK(dnnl_memory_create(&cm, &cd, gemm.engine, c));
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    int t = omp_get_thread_num();
    CHECK(t < gemm.n_streams);
    DNNL_CHECK(dnnl_primitive_execute(prim, gemm.streams[t], 3, args));
    DNNL_CHECK(dnnl_stream_wait(gemm.streams[t]));
    DNNL_CHECK(dnnl_memory_destroy(am));
    DNNL_CHECK(dnnl_memory_destroy(bm));
    DNNL_CHECK(dnnl_memory_destroy(cm));
}
