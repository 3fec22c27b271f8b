// The GEMMs of one training step on every cpu GEMM library at hand, for scripts/bench_gemm.sh:
//   bench_gemm THREADS < shapes
// A line of shapes is one GEMM as titan calls its sgemm (row-major):
//   label trans_a trans_b m n k lda ldb ldc beta in_parallel count
// (in_parallel: titan calls it inside an OpenMP region, one single-threaded GEMM per thread, as
// the attention tiles; count: calls per step). Each runs C = op(A) op(B) + beta C with
// OpenBLAS sgemm (the ratios' baseline; titan's attention tiles'), OpenBLAS sbgemm (bf16 inputs,
// fp32 C), BLIS bli_sgemm, oneDNN dnnl_sgemm (titan's fp32 GEMM since this table chose it),
// oneDNN matmul primitives in f32 and bf16 (created once per shape: what a primitive cache
// would hold; again with B packed once into oneDNN's own layout, untimed), and
// libxsmm's JIT kernels in f32 and bf16 (one per thread over a slab of C's rows; libxsmm has no
// threaded GEMM of its own without a BLAS behind it; the operands its kernels cannot take as
// titan holds them are packed once, untimed).
// A serial shape runs on THREADS threads; an in_parallel one as THREADS concurrent copies, each
// on one thread, its time per call the region's over THREADS. Times are the median over rounds
// that call every library in turn (so other jobs' load falls on all alike), a round's batch of
// calls at least 2 ms, after warm calls; the step totals also from each GEMM's least round,
// which other jobs can only lengthen. bf16 times exclude rounding fp32 inputs to bf16 (a
// line after the table gives that cost if every call did it). Every library's C is checked
// against a double-precision reference: max |C - ref| / max |ref|, within 1e-5 for f32 and 1e-2
// for bf16 inputs (their 8-bit significands); a library outside it is marked WRONG and the
// program exits 1.
// OpenBLAS's cblas.h before blis.h, which would include BLIS's own under the same guard.
#include <cblas.h>
// clang-format off
#include <blis.h>
// clang-format on
#include <dlfcn.h>
#include <dnnl.h>
#include <libxsmm.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SHAPES 128
#define MAX_THREADS 64

typedef struct {
    char label[64];
    int ta, tb, m, n, k, lda, ldb, ldc, par;
    float beta;
    double count;
} Shape;

// One shape's operands; a16, b16 are a, b rounded to bf16.
typedef struct {
    const Shape *s;
    float *a, *b, *c;  // (rows_a, lda), (rows_b, ldb), (m, ldc): per thread for in_parallel
    uint16_t *a16, *b16;
    size_t a_len, b_len, c_len;
} Operands;

typedef struct {
    const char *name;
    bool bf16;
    void *(*prepare)(const Operands *o);  // NULL: the library cannot run this shape
    void (*run)(const Operands *o, void *state, float *c);
    void (*release)(void *state);
} Library;

static int n_threads;
static char dnnl_impls[2][256];  // the distinct oneDNN matmul implementations, f32 and bf16

static void die(const char *what) {
    fprintf(stderr, "bench_gemm: %s\n", what);
    exit(3);
}
#define DNNL_CHECK(call) \
    do { \
        if ((call) != dnnl_success) die(#call); \
    } while (0)

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint16_t bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);  // round to nearest even
}

// Element (i, j) of the matrix x at leading dimension ld, transposed or not.
static double element(const float *x, int ld, int trans, int i, int j) {
    return trans ? x[(size_t)j * ld + i] : x[(size_t)i * ld + j];
}

// A library's non-NULL state when it needs none.
static void *stateless(const Operands *o) { return (void *)o; }
static void release_nothing(void *state) { (void)state; }

// ---- OpenBLAS -------------------------------------------------------------------------------

static CBLAS_TRANSPOSE cblas_trans(int t) { return t ? CblasTrans : CblasNoTrans; }

static void run_sgemm(const Operands *o, void *state, float *c) {
    const Shape *s = o->s;
    (void)state;
    cblas_sgemm(CblasRowMajor, cblas_trans(s->ta), cblas_trans(s->tb), s->m, s->n, s->k, 1.0f,
                o->a, s->lda, o->b, s->ldb, s->beta, c, s->ldc);
}

// cblas_sbgemm is only in OpenBLAS built with BUILD_BFLOAT16 (Debian's 0.3.21 is not): looked up
// at run time, its column n/a without it.
typedef void (*SbgemmFn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint,
                         blasint, blasint, float, const uint16_t *, blasint, const uint16_t *,
                         blasint, float, float *, blasint);

static void *prepare_sbgemm(const Operands *o) {
    (void)o;
    return dlsym(RTLD_DEFAULT, "cblas_sbgemm");
}

static void run_sbgemm(const Operands *o, void *state, float *c) {
    const Shape *s = o->s;
    SbgemmFn sbgemm = (SbgemmFn)state;
    sbgemm(CblasRowMajor, cblas_trans(s->ta), cblas_trans(s->tb), s->m, s->n, s->k, 1.0f, o->a16,
           s->lda, o->b16, s->ldb, s->beta, c, s->ldc);
}

// ---- BLIS: row-major is row stride ld, column stride 1 ---------------------------------------

static void run_blis(const Operands *o, void *state, float *c) {
    const Shape *s = o->s;
    float one = 1.0f, beta = s->beta;
    (void)state;
    bli_sgemm(s->ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
              s->tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, s->m, s->n, s->k, &one, o->a, s->lda, 1,
              o->b, s->ldb, 1, &beta, c, s->ldc, 1);
}

// ---- oneDNN ---------------------------------------------------------------------------------

static dnnl_engine_t engine;
static dnnl_stream_t stream;

static void run_dnnl_sgemm(const Operands *o, void *state, float *c) {
    const Shape *s = o->s;
    (void)state;
    DNNL_CHECK(dnnl_sgemm(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->m, s->n, s->k, 1.0f, o->a,
                          s->lda, o->b, s->ldb, s->beta, c, s->ldc));
}

// A matmul primitive; with packed_b, B in the layout oneDNN picks (format any), reordered once
// (untimed) into b_packed: what keeping a weight's packed copy for the step would buy.
typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a, b, c;
    bool bf16;
    void *b_packed;
} DnnlMatmul;

// The (rows, cols) matrix at leading dimension ld, transposed (stored (cols, rows)) or not.
static dnnl_memory_desc_t dnnl_matrix(int rows, int cols, int ld, int trans, dnnl_data_type_t t) {
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {rows, cols}, strides = {trans ? 1 : ld, trans ? ld : 1};
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&md, 2, dims, t, strides));
    return md;
}

static void note_impl(char *impls, const char *impl) {
    if (strstr(impls, impl)) return;
    size_t len = strlen(impls);
    snprintf(impls + len, 256 - len, "%s%s", len ? ", " : "", impl);
}

// One run of the reorder from (md, data) into (to, out).
static void dnnl_reorder_once(const dnnl_memory_desc_t *md, void *data,
                              const dnnl_memory_desc_t *to, void *out) {
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t reorder;
    dnnl_memory_t from, into;
    DNNL_CHECK(dnnl_reorder_primitive_desc_create(&pd, md, engine, to, engine, NULL));
    DNNL_CHECK(dnnl_primitive_create(&reorder, pd));
    DNNL_CHECK(dnnl_memory_create(&from, md, engine, data));
    DNNL_CHECK(dnnl_memory_create(&into, to, engine, out));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, into}};
    DNNL_CHECK(dnnl_primitive_execute(reorder, stream, 2, args));
    DNNL_CHECK(dnnl_stream_wait(stream));
    dnnl_memory_destroy(from);
    dnnl_memory_destroy(into);
    dnnl_primitive_destroy(reorder);
    dnnl_primitive_desc_destroy(pd);
}

static dnnl_primitive_attr_t dnnl_beta(float beta) {
    dnnl_primitive_attr_t attr;
    DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    if (beta != 0.0f) {
        dnnl_post_ops_t ops;
        DNNL_CHECK(dnnl_post_ops_create(&ops));
        DNNL_CHECK(dnnl_post_ops_append_sum(ops, beta));
        DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));
        DNNL_CHECK(dnnl_post_ops_destroy(ops));
    }
    return attr;
}

static void *prepare_dnnl_matmul(const Operands *o, bool bf16, bool packed_b) {
    const Shape *s = o->s;
    DnnlMatmul *d = calloc(1, sizeof *d);
    dnnl_data_type_t in = bf16 ? dnnl_bf16 : dnnl_f32;
    d->bf16 = bf16;
    d->a = dnnl_matrix(s->m, s->k, s->lda, s->ta, in);
    d->b = dnnl_matrix(s->k, s->n, s->ldb, s->tb, in);
    d->c = dnnl_matrix(s->m, s->n, s->ldc, 0, dnnl_f32);
    dnnl_memory_desc_t b_any;
    dnnl_dims_t b_dims = {s->k, s->n};
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&b_any, 2, b_dims, in, dnnl_format_tag_any));
    dnnl_matmul_desc_t desc;
    DNNL_CHECK(dnnl_matmul_desc_init(&desc, &d->a, packed_b ? &b_any : &d->b, NULL, &d->c));
    dnnl_primitive_attr_t attr = dnnl_beta(s->beta);
    dnnl_primitive_desc_t pd;
    DNNL_CHECK(dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL));
    const char *impl = NULL;
    DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    note_impl(dnnl_impls[bf16], impl);
    if (packed_b) {
        const dnnl_memory_desc_t *packed =
            dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        d->b_packed = malloc(dnnl_memory_desc_get_size(packed));
        dnnl_reorder_once(&d->b, bf16 ? (void *)o->b16 : (void *)o->b, packed, d->b_packed);
        d->b = *packed;
    }
    DNNL_CHECK(dnnl_primitive_create(&d->prim, pd));
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
    DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
    return d;
}
static void *prepare_dnnl_f32(const Operands *o) { return prepare_dnnl_matmul(o, false, false); }
static void *prepare_dnnl_bf16(const Operands *o) { return prepare_dnnl_matmul(o, true, false); }
static void *prepare_dnnl_f32_packed(const Operands *o) {
    return prepare_dnnl_matmul(o, false, true);
}
static void *prepare_dnnl_bf16_packed(const Operands *o) {
    return prepare_dnnl_matmul(o, true, true);
}

// Memory objects wrap the caller's pointers on each call (cheap: no copy), as C moves per thread.
static void run_dnnl_matmul(const Operands *o, void *state, float *c) {
    DnnlMatmul *d = state;
    void *b = d->b_packed ? d->b_packed : d->bf16 ? (void *)o->b16 : (void *)o->b;
    dnnl_memory_t am, bm, cm;
    DNNL_CHECK(dnnl_memory_create(&am, &d->a, engine, d->bf16 ? (void *)o->a16 : (void *)o->a));
    DNNL_CHECK(dnnl_memory_create(&bm, &d->b, engine, b));
    DNNL_CHECK(dnnl_memory_create(&cm, &d->c, engine, c));
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    DNNL_CHECK(dnnl_primitive_execute(d->prim, stream, 3, args));
    DNNL_CHECK(dnnl_stream_wait(stream));
    dnnl_memory_destroy(am);
    dnnl_memory_destroy(bm);
    dnnl_memory_destroy(cm);
}

static void release_dnnl_matmul(void *state) {
    DnnlMatmul *d = state;
    dnnl_primitive_destroy(d->prim);
    free(d->b_packed);
    free(d);
}

// ---- libxsmm: column-major, so row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
// its first operand is op(B), its second op(A). Its 1.17 JIT takes no transposed first operand,
// and in bf16 only a first operand in VNNI pairs (rows p, p+1 of op(B) interleaved) and no
// transposes: those operands are packed once, untimed (what caching a weight's packed copy per
// step would buy; an activation's would be a copy per call). Threads split C's rows into slabs,
// each a JIT kernel of its own size.

typedef struct {
    libxsmm_smmfunction f32[MAX_THREADS];
    libxsmm_bsmmfunction bf16[MAX_THREADS];
    bool is_bf16;
    const void *first, *second;  // op(B) as the kernel reads it; A, or op(A) packed (m, k)
    int ld_second;               // A's leading dimension as the kernel reads it
    bool second_packed;          // row r of op(A) at r * ld_second, else at r (A transposed)
    void *packed[2];
} XsmmGemm;

static void *transposed_copy(const float *x, int rows, int cols, int ld, bool bf16) {
    char *y = malloc((size_t)rows * cols * (bf16 ? 2 : 4));
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            float v = x[(size_t)j * ld + i];
            if (bf16)
                ((uint16_t *)y)[(size_t)i * cols + j] = bf16_round(v);
            else
                ((float *)y)[(size_t)i * cols + j] = v;
        }
    return y;
}

// op(B) (k, n) as VNNI pairs: element (p, j) at (p / 2) 2n + 2j + p % 2.
static uint16_t *vnni_copy(const Shape *s, const float *b) {
    uint16_t *y = malloc((size_t)s->k * s->n * 2);
    for (int p = 0; p < s->k; p++)
        for (int j = 0; j < s->n; j++)
            y[(size_t)(p / 2) * 2 * s->n + 2 * j + p % 2] =
                bf16_round((float)element(b, s->ldb, s->tb, p, j));
    return y;
}

// The operands as the kernels read them, packed where they must be; returns the flags.
static int xsmm_operands(XsmmGemm *x, const Operands *o, libxsmm_blasint *ld_first) {
    const Shape *s = o->s;
    x->ld_second = s->lda;
    x->second = x->is_bf16 ? (const void *)o->a16 : (const void *)o->a;
    x->second_packed = !s->ta;
    *ld_first = s->ldb;
    if (x->is_bf16) {
        x->first = x->packed[0] = vnni_copy(s, o->b);
        *ld_first = s->n;
        if (s->ta) {
            x->second = x->packed[1] = transposed_copy(o->a, s->m, s->k, s->lda, true);
            x->ld_second = s->k;
            x->second_packed = true;
        }
        return LIBXSMM_GEMM_FLAG_VNNI_A;
    }
    x->first = o->b;
    if (s->tb) {
        x->first = x->packed[0] = transposed_copy(o->b, s->k, s->n, s->ldb, false);
        *ld_first = s->n;
    }
    return s->ta ? LIBXSMM_GEMM_FLAG_TRANS_B : 0;
}

static void release_xsmm(void *state) {
    XsmmGemm *x = state;
    free(x->packed[0]);
    free(x->packed[1]);
    free(x);
}

static void *prepare_xsmm(const Operands *o, bool bf16) {
    const Shape *s = o->s;
    int slabs = s->par ? 1 : n_threads;
    XsmmGemm *x = calloc(1, sizeof *x);
    x->is_bf16 = bf16;
    libxsmm_blasint lda, ldb, ldc = s->ldc;
    int flags = xsmm_operands(x, o, &lda);
    ldb = x->ld_second;
    float alpha = 1.0f, beta = s->beta;
    for (int t = 0; t < slabs; t++) {
        int rows = (int)((long)s->m * (t + 1) / slabs) - (int)((long)s->m * t / slabs);
        if (bf16)
            x->bf16[t] = libxsmm_bsmmdispatch(s->n, rows, s->k, &lda, &ldb, &ldc, &alpha, &beta,
                                              &flags, NULL);
        else
            x->f32[t] = libxsmm_smmdispatch(s->n, rows, s->k, &lda, &ldb, &ldc, &alpha, &beta,
                                            &flags, NULL);
        if (bf16 ? !x->bf16[t] : !x->f32[t]) {
            release_xsmm(x);
            return NULL;
        }
    }
    return x;
}
static void *prepare_xsmm_f32(const Operands *o) { return prepare_xsmm(o, false); }
static void *prepare_xsmm_bf16(const Operands *o) { return prepare_xsmm(o, true); }

static void run_xsmm(const Operands *o, void *state, float *c) {
    const Shape *s = o->s;
    const XsmmGemm *x = state;
    int slabs = s->par ? 1 : n_threads;
#pragma omp parallel for num_threads(slabs) schedule(static, 1)
    for (int t = 0; t < slabs; t++) {
        size_t r0 = (size_t)((long)s->m * t / slabs);
        size_t second = x->second_packed ? r0 * x->ld_second : r0;  // row r0 of op(A)
        if (x->is_bf16)
            x->bf16[t](x->first, (const libxsmm_bfloat16 *)x->second + second, c + r0 * s->ldc);
        else
            x->f32[t](x->first, (const float *)x->second + second, c + r0 * s->ldc);
    }
}

static const Library LIBRARIES[] = {
    {"OpenBLAS sgemm", false, stateless, run_sgemm, release_nothing},
    {"OpenBLAS sbgemm", true, prepare_sbgemm, run_sbgemm, release_nothing},
    {"BLIS sgemm", false, stateless, run_blis, release_nothing},
    {"oneDNN sgemm", false, stateless, run_dnnl_sgemm, release_nothing},
    {"oneDNN matmul f32", false, prepare_dnnl_f32, run_dnnl_matmul, release_dnnl_matmul},
    {"oneDNN matmul bf16", true, prepare_dnnl_bf16, run_dnnl_matmul, release_dnnl_matmul},
    {"oneDNN matmul f32 (B packed)", false, prepare_dnnl_f32_packed, run_dnnl_matmul,
     release_dnnl_matmul},
    {"oneDNN matmul bf16 (B packed)", true, prepare_dnnl_bf16_packed, run_dnnl_matmul,
     release_dnnl_matmul},
    {"libxsmm f32 (B^T packed)", false, prepare_xsmm_f32, run_xsmm, release_xsmm},
    {"libxsmm bf16 (packed)", true, prepare_xsmm_bf16, run_xsmm, release_xsmm},
};
#define N_LIBS (int)(sizeof LIBRARIES / sizeof LIBRARIES[0])

// ---- operands, reference, check --------------------------------------------------------------

static float *random_floats(size_t n, unsigned *seed) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)rand_r(seed) / RAND_MAX * 2.0f - 1.0f;
    return x;
}

// Threads only for large arrays: a parallel region costs more than rounding a small one.
static void round_bf16(uint16_t *y, const float *x, size_t n) {
#pragma omp parallel for simd if (n > 65536)
    for (size_t i = 0; i < n; i++) y[i] = bf16_round(x[i]);
}

static uint16_t *to_bf16(const float *x, size_t n) {
    uint16_t *y = malloc(n * sizeof *y);
    round_bf16(y, x, n);
    return y;
}

static Operands operands_make(const Shape *s) {
    Operands o = {.s = s};
    unsigned seed = 1234;
    o.a_len = (size_t)(s->ta ? s->k : s->m) * s->lda;
    o.b_len = (size_t)(s->tb ? s->n : s->k) * s->ldb;
    o.c_len = (size_t)s->m * s->ldc;
    o.a = random_floats(o.a_len, &seed);
    o.b = random_floats(o.b_len, &seed);
    o.c = random_floats(o.c_len * n_threads, &seed);
    o.a16 = to_bf16(o.a, o.a_len);
    o.b16 = to_bf16(o.b, o.b_len);
    return o;
}

static void operands_free(Operands *o) {
    free(o->a);
    free(o->b);
    free(o->c);
    free(o->a16);
    free(o->b16);
}

// ref (m, n) = op(A) op(B) + beta C0 in double, op(B) copied row-major first for a unit-stride
// inner loop.
static double *reference(const Operands *o, const float *c0) {
    const Shape *s = o->s;
    double *bt = malloc((size_t)s->k * s->n * sizeof *bt);
    double *ref = malloc((size_t)s->m * s->n * sizeof *ref);
    for (int p = 0; p < s->k; p++)
        for (int j = 0; j < s->n; j++)
            bt[(size_t)p * s->n + j] = element(o->b, s->ldb, s->tb, p, j);
#pragma omp parallel for
    for (int i = 0; i < s->m; i++) {
        double *r = ref + (size_t)i * s->n;
        for (int j = 0; j < s->n; j++) r[j] = s->beta * c0[(size_t)i * s->ldc + j];
        for (int p = 0; p < s->k; p++) {
            double aip = element(o->a, s->lda, s->ta, i, p);
            const double *bp = bt + (size_t)p * s->n;
            for (int j = 0; j < s->n; j++) r[j] += aip * bp[j];
        }
    }
    free(bt);
    return ref;
}

// max |C - ref| / max |ref| of one call on a fresh copy of C0.
static double check(const Library *lib, void *state, const Operands *o, const float *c0,
                    const double *ref) {
    const Shape *s = o->s;
    float *c = malloc(o->c_len * sizeof *c);
    memcpy(c, c0, o->c_len * sizeof *c);
    lib->run(o, state, c);
    double err = 0.0, scale = 0.0;
    for (int i = 0; i < s->m; i++)
        for (int j = 0; j < s->n; j++) {
            double r = ref[(size_t)i * s->n + j];
            err = fmax(err, fabs(c[(size_t)i * s->ldc + j] - r));
            scale = fmax(scale, fabs(r));
        }
    free(c);
    return err / scale;
}

// ---- timing -----------------------------------------------------------------------------------

// `calls` calls; an in_parallel shape runs them on every thread at once, each on its own C.
static double time_calls(const Library *lib, void *state, const Operands *o, int calls) {
    double t0 = now_seconds();
    if (o->s->par) {
#pragma omp parallel num_threads(n_threads)
        {
            float *c = o->c + (size_t)omp_get_thread_num() * o->c_len;
            for (int i = 0; i < calls; i++) lib->run(o, state, c);
        }
        return (now_seconds() - t0) / calls / n_threads;
    }
    for (int i = 0; i < calls; i++) lib->run(o, state, o->c);
    return (now_seconds() - t0) / calls;
}

static int compare_doubles(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

#define ROUNDS 21

// seconds[l], least[l]: each runnable library's median and least time per call (0 where it
// cannot run).
static void time_shape(const Operands *o, void *const *states, double *seconds, double *least) {
    int calls[N_LIBS];
    double samples[N_LIBS][ROUNDS];
    for (int l = 0; l < N_LIBS; l++) {
        if (!states[l]) continue;
        time_calls(&LIBRARIES[l], states[l], o, 2);
        double t = time_calls(&LIBRARIES[l], states[l], o, 3);
        calls[l] = (int)ceil(2e-3 / (t * (o->s->par ? n_threads : 1)));
    }
    for (int r = 0; r < ROUNDS; r++)
        for (int l = 0; l < N_LIBS; l++)
            if (states[l]) samples[l][r] = time_calls(&LIBRARIES[l], states[l], o, calls[l]);
    for (int l = 0; l < N_LIBS; l++) {
        seconds[l] = least[l] = 0.0;
        if (!states[l]) continue;
        qsort(samples[l], ROUNDS, sizeof(double), compare_doubles);
        seconds[l] = samples[l][ROUNDS / 2];
        least[l] = samples[l][0];
    }
}

// Seconds to round the m k + k n floats a call reads to bf16 (what a bf16 call on fp32 tensors
// would add if nothing were converted once and reused).
static double time_conversion(const Operands *o) {
    size_t n = (size_t)o->s->m * o->s->k + (size_t)o->s->k * o->s->n;
    float *x = malloc(n * sizeof *x);
    uint16_t *y = malloc(n * sizeof *y);
    memset(x, 0, n * sizeof *x);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_seconds();
        round_bf16(y, x, n);
        best = fmin(best, now_seconds() - t0);
    }
    free(x);
    free(y);
    return best;
}

// ---- the table --------------------------------------------------------------------------------

static int read_shapes(Shape *shapes) {
    int n = 0;
    Shape s;
    while (scanf("%63s %d %d %d %d %d %d %d %d %f %d %lf", s.label, &s.ta, &s.tb, &s.m, &s.n,
                 &s.k, &s.lda, &s.ldb, &s.ldc, &s.beta, &s.par, &s.count) == 12) {
        if (n == MAX_SHAPES) die("too many shapes");
        shapes[n++] = s;
    }
    return n;
}

typedef struct {
    double seconds, conversion, worst_error;  // step-weighted
    double serial_seconds;                    // of the GEMMs outside OpenMP regions
    double least_seconds;                     // of the least rounds: load only slows a call
    int shapes;                               // that it ran
    bool wrong;
} Totals;

// Step-weighted seconds of the fastest right library per shape, f32 and bf16.
static double best_per_shape[2];

static void print_header(void) {
    printf("| caller | tA tB | m n k | beta | calls/step |");
    for (int l = 0; l < N_LIBS; l++) printf(" %s |", LIBRARIES[l].name);
    printf(" max rel error f32 / bf16 |\n|---|---|---|---|---|");
    for (int l = 0; l <= N_LIBS; l++) printf("---|");
    printf("\n");
}

// One shape's row of GFLOP/s; adds its step-weighted seconds into totals.
static void bench_shape(const Shape *s, Totals *totals) {
    Operands o = operands_make(s);
    float *c0 = malloc(o.c_len * sizeof *c0);
    memcpy(c0, o.c, o.c_len * sizeof *c0);
    double *ref = reference(&o, c0);
    void *states[N_LIBS];
    double seconds[N_LIBS], least[N_LIBS], err[N_LIBS], worst[2] = {0, 0};
    for (int l = 0; l < N_LIBS; l++) {
        states[l] = LIBRARIES[l].prepare(&o);
        err[l] = states[l] ? check(&LIBRARIES[l], states[l], &o, c0, ref) : 0.0;
        worst[LIBRARIES[l].bf16] = fmax(worst[LIBRARIES[l].bf16], err[l]);
    }
    time_shape(&o, states, seconds, least);
    double flops = 2.0 * s->m * s->n * s->k, conversion = time_conversion(&o);
    printf("| %s%s | %c %c | %d %d %d | %g | %g |", s->label, s->par ? " (in OpenMP)" : "",
           s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->m, s->n, s->k, s->beta, s->count);
    double best[2] = {1e30, 1e30};
    for (int l = 0; l < N_LIBS; l++) {
        const Library *lib = &LIBRARIES[l];
        bool wrong = err[l] > (lib->bf16 ? 1e-2 : 1e-5);
        if (states[l] && !wrong) best[lib->bf16] = fmin(best[lib->bf16], seconds[l]);
        if (states[l]) {
            totals[l].shapes++;
            printf(" %.1f%s |", flops / seconds[l] * 1e-9, wrong ? " WRONG" : "");
            totals[l].seconds += s->count * seconds[l];
            totals[l].least_seconds += s->count * least[l];
            totals[l].conversion += lib->bf16 ? s->count * conversion : 0.0;
            if (!s->par) totals[l].serial_seconds += s->count * seconds[l];
            totals[l].worst_error = fmax(totals[l].worst_error, err[l]);
            totals[l].wrong |= wrong;
            lib->release(states[l]);
        } else {
            printf(" n/a |");
        }
    }
    for (int bf16 = 0; bf16 < 2; bf16++) best_per_shape[bf16] += s->count * best[bf16];
    printf(" %.1e / %.1e |\n", worst[0], worst[1]);
    free(ref);
    free(c0);
    operands_free(&o);
}

// A step-weighted total in ms, or n/a with the shapes the library ran.
static void print_total(const Totals *t, double seconds, int n_shapes) {
    if (t->shapes == n_shapes)
        printf(" %.2f |", seconds * 1e3);
    else
        printf(" n/a (ran %d of %d) |", t->shapes, n_shapes);
}

static void print_totals(const Totals *totals, int n_shapes) {
    const double base = totals[0].seconds;
    printf("\n| per step | ");
    for (int l = 0; l < N_LIBS; l++) printf("%s | ", LIBRARIES[l].name);
    printf("\n|---|");
    for (int l = 0; l < N_LIBS; l++) printf("---|");
    printf("\n| GEMM time (ms) |");
    for (int l = 0; l < N_LIBS; l++) print_total(&totals[l], totals[l].seconds, n_shapes);
    printf("\n| of which outside OpenMP regions (ms) |");
    for (int l = 0; l < N_LIBS; l++) print_total(&totals[l], totals[l].serial_seconds, n_shapes);
    printf("\n| time / OpenBLAS sgemm |");
    for (int l = 0; l < N_LIBS; l++)
        if (totals[l].shapes == n_shapes)
            printf(" %.3f |", totals[l].seconds / base);
        else
            printf(" n/a |");
    printf("\n| GEMM time from each GEMM's least round (ms) |");
    for (int l = 0; l < N_LIBS; l++) print_total(&totals[l], totals[l].least_seconds, n_shapes);
    printf("\n| least-round time / OpenBLAS sgemm's |");
    for (int l = 0; l < N_LIBS; l++)
        if (totals[l].shapes == n_shapes)
            printf(" %.3f |", totals[l].least_seconds / totals[0].least_seconds);
        else
            printf(" n/a |");
    printf("\n| + rounding A and B to bf16 at every call (ms) |");
    for (int l = 0; l < N_LIBS; l++)
        if (LIBRARIES[l].bf16 && totals[l].shapes == n_shapes)
            printf(" %.2f |", totals[l].conversion * 1e3);
        else
            printf(" - |");
    printf("\n| max rel error |");
    for (int l = 0; l < N_LIBS; l++)
        printf(" %.1e%s |", totals[l].worst_error, totals[l].wrong ? " WRONG" : "");
    printf("\n\nfastest right library per shape, step-weighted: f32 %.2f ms (%.3f of OpenBLAS "
           "sgemm), bf16 %.2f ms (%.3f)\n",
           best_per_shape[0] * 1e3, best_per_shape[0] / base, best_per_shape[1] * 1e3,
           best_per_shape[1] / base);
}

// What ran: the OpenBLAS core, BLIS's configuration, oneDNN's matmul implementations (its
// dnnl_sgemm names none), libxsmm's code-generation target.
static void print_kernels(void) {
    const dnnl_version_t *v = dnnl_version();
    Dl_info blas = {0};
    dladdr((void *)cblas_sgemm, &blas);  // BLIS exports a cblas_sgemm too: whose ran
    printf("\ncblas_sgemm from %s\n", blas.dli_fname);
    printf("kernels: OpenBLAS %s core (%s); BLIS %s %s configuration; oneDNN %d.%d.%d matmul "
           "f32 [%s], bf16 [%s]; libxsmm %s target %s\n",
           openblas_get_corename(), openblas_get_config(), bli_info_get_version_str(),
           bli_arch_string(bli_arch_query_id()), v->major, v->minor, v->patch, dnnl_impls[0],
           dnnl_impls[1], LIBXSMM_VERSION, libxsmm_get_target_arch());
}

int main(int argc, char **argv) {
    if (argc != 2 || (n_threads = atoi(argv[1])) < 1 || n_threads > MAX_THREADS) {
        fprintf(stderr, "usage: bench_gemm THREADS < shapes\n");
        return 2;
    }
    static Shape shapes[MAX_SHAPES];
    int n = read_shapes(shapes);
    omp_set_num_threads(n_threads);
    openblas_set_num_threads(n_threads);
    bli_thread_set_num_threads(n_threads);
    libxsmm_init();
    DNNL_CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    Totals totals[N_LIBS] = {0};
    printf("## %d thread%s: GFLOP/s (2mnk over the median time per call)\n\n", n_threads,
           n_threads > 1 ? "s" : "");
    print_header();
    for (int i = 0; i < n; i++) bench_shape(&shapes[i], totals);
    print_totals(totals, n);
    print_kernels();
    bool wrong = false;
    for (int l = 0; l < N_LIBS; l++) wrong |= totals[l].wrong;
    return wrong ? 1 : 0;
}
