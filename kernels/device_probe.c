// device_probe (kernels/device.h): a device's row measured through its backend's own ops, so
// that the rates are the ones a training step's ops reach. Each measurement is the best of as
// many runs as its share of the time allows, after one warm-up run (threads, caches, library
// plans).
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/errors.h"
#include "kernels/device.h"

// Device memory for a probe, zeroed (finite operands: 0.0 in every dtype).
static void *probe_alloc(const KernelOps *k, size_t bytes) {
    void *p = k->alloc(bytes);
    if (!p) die_user("device probe: no room for %zu bytes on %s", bytes, k->name);
    return p;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Seconds of the best of as many calls of run(ctx) as `seconds` holds (at least two).
typedef void (*ProbeRun)(const KernelOps *k, void *ctx);
static double best_seconds(const KernelOps *k, ProbeRun run, void *ctx, double seconds) {
    run(k, ctx);  // warm
    k->synchronize();
    double began = now(), best = 1e30;
    for (int i = 0; i < 2 || now() - began < seconds; i++) {
        double t0 = now();
        run(k, ctx);
        k->synchronize();
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

typedef struct {
    float *c, *x32, *w, *dy32, *dw;  // c (m, n); x32, dy32 (m, n) fp32; w, dw (n, n)
    void *x, *dy, *w_cast;           // x, dy: (m, n) in ab; w_cast (n, n) in ab
    Dtype ab;
    int m, n;
} GemmProbe;

// A square Linear's training GEMMs as models/linear.c runs them: the output x w^T, the input's
// gradient dy w and the weight's dy^T x (added into dw), each of the first two after casting
// the weight to the operand dtype (bf16: a cast per GEMM) and the gradient's after casting dy.
static void run_linear(const KernelOps *k, void *ctx) {
    GemmProbe *g = ctx;
    size_t w_elems = (size_t)g->n * g->n, dy_elems = (size_t)g->m * g->n;
    const void *w = g->ab == DTYPE_BF16 ? g->w_cast : g->w;
    if (g->ab == DTYPE_BF16) k->to_bf16(g->w_cast, g->w, w_elems);
    k->matmul(g->c, g->x, w, g->ab, g->m, g->n, g->n, false, true, 0.0f);
    if (g->ab == DTYPE_BF16) k->to_bf16(g->dy, g->dy32, dy_elems), k->to_bf16(g->w_cast, g->w, w_elems);
    k->matmul(g->c, g->dy, w, g->ab, g->m, g->n, g->n, false, false, 0.0f);
    k->matmul(g->dw, g->dy, g->x, g->ab, g->n, g->n, g->m, true, false, 1.0f);
}

// FLOP/s of a (m, n) x (n, n) Linear's forward and backward (6 m n n FLOPs), the best in
// `seconds`.
static double probe_linear(const KernelOps *k, Dtype ab, int m, int n, double seconds) {
    size_t size = dtype_size(ab), act = (size_t)m * n, w = (size_t)n * n;
    GemmProbe g = {.c = probe_alloc(k, act * 4), .w = probe_alloc(k, w * 4),
                   .dy32 = probe_alloc(k, act * 4), .dw = probe_alloc(k, w * 4),
                   .x = probe_alloc(k, act * size), .dy = probe_alloc(k, act * size),
                   .w_cast = probe_alloc(k, w * size), .ab = ab, .m = m, .n = n};
    double flops = 6.0 * m * n * n / best_seconds(k, run_linear, &g, seconds);
    void *all[] = {g.c, g.w, g.dy32, g.dw, g.x, g.dy, g.w_cast};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) k->free(all[i]);
    return flops;
}

typedef struct {
    float *c;
    void *a, *b;
    Dtype ab;
    int n;
} SquareGemm;

static void run_square(const KernelOps *k, void *ctx) {
    SquareGemm *g = ctx;
    k->matmul(g->c, g->a, g->b, g->ab, g->n, g->n, g->n, false, false, 0.0f);
}

double device_probe_gemm(const KernelOps *k, Dtype ab, int n, double seconds) {
    size_t elems = (size_t)n * n;
    SquareGemm g = {probe_alloc(k, elems * 4), probe_alloc(k, elems * dtype_size(ab)),
                    probe_alloc(k, elems * dtype_size(ab)), ab, n};
    double flops = 2.0 * n * n * n / best_seconds(k, run_square, &g, seconds);
    k->free(g.c), k->free(g.a), k->free(g.b);
    return flops;
}

typedef struct {
    float *c, *scale_inv;
    uint8_t *a, *b;
    void *workspace;
    int n;
} Float8Probe;

static void run_float8(const KernelOps *k, void *ctx) {
    Float8Probe *g = ctx;
    k->matmul_float8(g->c, g->a, g->scale_inv, FLOAT8_E4M3FN, g->b, g->scale_inv, FLOAT8_E4M3FN,
                     g->n, g->n, g->n, false, 0.0f, g->workspace);
}

static double probe_float8(const KernelOps *k, int n, double seconds) {
    size_t elems = (size_t)n * n, ws = k->matmul_float8_workspace_bytes(n, n, n);
    Float8Probe g = {probe_alloc(k, elems * 4), probe_alloc(k, sizeof(float)),
                     probe_alloc(k, elems), probe_alloc(k, elems), ws ? probe_alloc(k, ws) : NULL,
                     n};
    const float one = 1.0f;
    k->upload(g.scale_inv, &one, sizeof one);
    double flops = 2.0 * n * n * n / best_seconds(k, run_float8, &g, seconds);
    k->free(g.c), k->free(g.scale_inv), k->free(g.a), k->free(g.b);
    if (g.workspace) k->free(g.workspace);
    return flops;
}

typedef struct {
    AttnShape s;
    float *q, *k, *v, *out, *lse, *dq, *dk, *dv, *dout;
    void *workspace;
} AttentionProbe;

static void run_attention(const KernelOps *k, void *ctx) {
    AttentionProbe *a = ctx;
    k->attention_forward(a->out, a->lse, a->q, a->k, a->v, &a->s, a->workspace);
    k->attention_backward(a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->out, a->lse, &a->s,
                          a->workspace);
}

// Causal self-attention of one sequence of T rows: 12 head_dim FLOPs per query-key pair seen
// (forward's two products, backward's four), T (T + 1) / 2 pairs per head.
static double probe_attention(const KernelOps *k, int heads, int T, int head_dim, double seconds) {
    AttentionProbe a = {.s = {.B = 1, .Tq = T, .Tk = T, .n_heads = heads, .n_kv_heads = heads,
                              .head_dim = head_dim, .mask = ATTN_CAUSAL}};
    size_t rows = (size_t)T * heads * head_dim * sizeof(float);
    float **tensors[] = {&a.q, &a.k, &a.v, &a.out, &a.dq, &a.dk, &a.dv, &a.dout};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) *tensors[i] = probe_alloc(k, rows);
    a.lse = probe_alloc(k, (size_t)heads * T * sizeof(float));
    size_t ws = k->attention_workspace_bytes(&a.s);
    a.workspace = ws ? probe_alloc(k, ws) : NULL;
    double pairs = (double)heads * T * (T + 1) / 2;
    double flops = 12.0 * head_dim * pairs / best_seconds(k, run_attention, &a, seconds);
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) k->free(*tensors[i]);
    k->free(a.lse);
    if (a.workspace) k->free(a.workspace);
    return flops;
}

typedef struct {
    float *x, *y, *z, *u, *weight, *rstd;
    int rows, dim;
} MemoryProbe;

// A step's elementwise mix: a norm (reads and writes each element), the SwiGLU (reads two,
// writes one, an exponential each), a residual add (reads two, writes one) and an AdamW update
// (reads four, writes three).
static void run_memory(const KernelOps *k, void *ctx) {
    MemoryProbe *m = ctx;
    size_t n = (size_t)m->rows * m->dim;
    k->rmsnorm_forward(m->z, DTYPE_FP32, m->rstd, m->x, m->weight, m->rows, m->dim, 1e-5f);
    k->swiglu_forward(m->z, DTYPE_FP32, m->x, m->y, n);
    k->add(m->y, m->x, n);
    k->adamw_update(m->z, m->x, m->y, m->u, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
}

static double probe_memory(const KernelOps *k, int rows, int dim, double seconds) {
    MemoryProbe m = {.rows = rows, .dim = dim};
    size_t elems = (size_t)rows * dim, bytes = elems * sizeof(float);
    m.x = probe_alloc(k, bytes), m.y = probe_alloc(k, bytes), m.z = probe_alloc(k, bytes);
    m.u = probe_alloc(k, bytes);
    m.weight = probe_alloc(k, (size_t)dim * sizeof(float));
    m.rstd = probe_alloc(k, (size_t)rows * sizeof(float));
    double moved = 4.0 * elems * (2 + 3 + 3 + 7);
    double rate = moved / best_seconds(k, run_memory, &m, seconds);
    k->free(m.x), k->free(m.y), k->free(m.z), k->free(m.u), k->free(m.weight), k->free(m.rstd);
    return rate;
}

typedef struct {
    float *y, *x;
} OpProbe;

enum { ISSUED_OPS = 256 };

static void run_ops(const KernelOps *k, void *ctx) {
    OpProbe *o = ctx;
    for (int i = 0; i < ISSUED_OPS; i++) k->add(o->y, o->x, 64);
}

// Seconds per op of the smallest work: what issuing an op costs beside its work.
static double probe_op(const KernelOps *k, double seconds) {
    OpProbe o = {probe_alloc(k, 256), probe_alloc(k, 256)};
    double op = best_seconds(k, run_ops, &o, seconds) / ISSUED_OPS;
    k->free(o.y), k->free(o.x);
    return op;
}

static int at_most(int n, int cap) { return n < cap ? n : cap; }

DeviceTable device_probe(const KernelOps *k, const ProbeShape *shape, double seconds) {
    static char name[128];
    k->describe(name, sizeof name);
    char *cut = strstr(name, "; ");  // the first part: the library or device
    if (cut) *cut = 0;
    bool gpu = !k->host_memory;
    DeviceTable d = {.name = name, .source = "probed now", .attention_head_dim = shape->head_dim};
    double share = seconds / (shape->float8 ? 5 : 4);
    GemmPrecision p = shape->compute == DTYPE_BF16 ? GEMM_BF16 : GEMM_FP32;
    int rows = at_most(shape->rows, gpu ? 16384 : 1024), dim = at_most(shape->dim, gpu ? 8192 : 1024);
    d.peak[p] = k->peak_flops();
    d.gemm[p] = probe_linear(k, shape->compute, rows, dim, share);
    if (shape->float8) d.gemm[GEMM_FLOAT8] = probe_float8(k, gpu ? 8192 : 512, share);
    int T = at_most(shape->seq_len, gpu ? 8192 : 512);
    d.attention = probe_attention(k, gpu ? 32 : 4, T, shape->head_dim, share);
    d.memory = probe_memory(k, rows, dim, share);
    d.op = probe_op(k, share);
    d.link_node = d.memory;
    return d;
}
