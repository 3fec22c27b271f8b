// device_probe (kernels/device.h): a device's row measured through its backend's own ops, so
// that the rates are the ones a training step's ops reach. A step's ops read what earlier ops
// wrote megabytes ago, so a probe runs its op over several copies of its operands in turn, as
// many as fill more than the caches (COLD_BYTES), and never finds them cached from its own last
// call. Each measurement is the best of as many runs as its share of the time allows, after
// one warm-up run (threads, library plans).
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/errors.h"
#include "kernels/device.h"

enum { MAX_COPIES = 16 };

// Bytes of operands a probe cycles through: more than a server cpu's L2 and its share of L3,
// or a GPU's L2 (50 MB on an H100).
static size_t cold_bytes(const KernelOps *k) { return k->host_memory ? 64u << 20 : 256u << 20; }

// How many copies of `bytes` of operands exceed the caches (at most MAX_COPIES).
static int copies_for(const KernelOps *k, size_t bytes) {
    size_t n = cold_bytes(k) / (bytes ? bytes : 1) + 1;
    return n < MAX_COPIES ? (int)n : MAX_COPIES;
}

// Device memory for a probe, zeroed (finite operands: 0.0 in every dtype).
static void *probe_alloc(const KernelOps *k, size_t bytes) {
    void *p = k->alloc(bytes ? bytes : 1);
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

// ---- GEMMs -----------------------------------------------------------------------------------

typedef struct {
    float *c, *w, *dy32, *dw;  // c, dy32 (m, n) fp32; w, dw (n, n) fp32
    void *x, *dy, *w_cast;     // x, dy (m, n) and w_cast (n, n) in ab
} LinearOperands;

typedef struct {
    LinearOperands at[MAX_COPIES];
    int copies, m, n;
    Dtype ab;
} LinearProbe;

// A square Linear's training GEMMs as models/linear.c runs them: the output x w^T, the input's
// gradient dy w and the weight's dy^T x (added into dw); under bf16 the weight is cast before
// each of the first two and dy before the second.
static void run_linear(const KernelOps *k, void *ctx) {
    LinearProbe *g = ctx;
    size_t w_elems = (size_t)g->n * g->n, dy_elems = (size_t)g->m * g->n;
    bool cast = g->ab == DTYPE_BF16;
    for (int i = 0; i < g->copies; i++) {
        LinearOperands *o = &g->at[i];
        const void *w = cast ? o->w_cast : o->w;
        if (cast) k->to_bf16(o->w_cast, o->w, w_elems);
        k->matmul(o->c, o->x, w, g->ab, g->m, g->n, g->n, false, true, 0.0f);
        if (cast) k->to_bf16(o->dy, o->dy32, dy_elems), k->to_bf16(o->w_cast, o->w, w_elems);
        k->matmul(o->c, o->dy, w, g->ab, g->m, g->n, g->n, false, false, 0.0f);
        k->matmul(o->dw, o->dy, o->x, g->ab, g->n, g->n, g->m, true, false, 1.0f);
    }
}

// FLOP/s of a (m, n) x (n, n) Linear's forward and backward (6 m n n FLOPs each copy).
static double probe_linear(const KernelOps *k, Dtype ab, int m, int n, double seconds) {
    size_t size = dtype_size(ab), act = (size_t)m * n, w = (size_t)n * n;
    LinearProbe g = {.m = m, .n = n, .ab = ab};
    g.copies = copies_for(k, act * (8 + 2 * size) + w * (8 + size));
    for (int i = 0; i < g.copies; i++)
        g.at[i] = (LinearOperands){.c = probe_alloc(k, act * 4), .w = probe_alloc(k, w * 4),
                                   .dy32 = probe_alloc(k, act * 4), .dw = probe_alloc(k, w * 4),
                                   .x = probe_alloc(k, act * size),
                                   .dy = probe_alloc(k, act * size),
                                   .w_cast = probe_alloc(k, w * size)};
    double flops = 6.0 * m * n * n * g.copies / best_seconds(k, run_linear, &g, seconds);
    for (int i = 0; i < g.copies; i++) {
        LinearOperands *o = &g.at[i];
        void *all[] = {o->c, o->w, o->dy32, o->dw, o->x, o->dy, o->w_cast};
        for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) k->free(all[j]);
    }
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

// A peak: one (n, n, n) GEMM again and again, its operands cached. A cpu idle a moment ago can
// take a few tenths of a second of load to reach its clocks (up to 3x slower before: the host's
// power management): the GEMM repeats in spans of `seconds` until a span is no more than 10%
// faster than the one before (at most MAX_RAMP spans), which also readies the device for the
// probes after it.
enum { MAX_RAMP = 12 };
double device_probe_gemm(const KernelOps *k, Dtype ab, int n, double seconds) {
    size_t elems = (size_t)n * n;
    SquareGemm g = {probe_alloc(k, elems * 4), probe_alloc(k, elems * dtype_size(ab)),
                    probe_alloc(k, elems * dtype_size(ab)), ab, n};
    double flops = 0;
    for (int span = 0; span < MAX_RAMP; span++) {
        double before = flops;
        flops = 2.0 * n * n * n / best_seconds(k, run_square, &g, seconds);
        if (flops < before) flops = before;
        if (flops <= 1.1 * before) break;
    }
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

// A float8 GEMM's FLOP/s on (n, n) tensorwise e4m3 operands (its casts are elementwise work).
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

// ---- attention -------------------------------------------------------------------------------

typedef struct {
    float *q, *k, *v, *out, *lse, *dq, *dk, *dv, *dout;
    void *workspace;
} AttentionOperands;

typedef struct {
    AttnShape s;
    AttentionOperands at[MAX_COPIES];
    int copies;
} AttentionProbe;

static void run_attention(const KernelOps *k, void *ctx) {
    AttentionProbe *p = ctx;
    for (int i = 0; i < p->copies; i++) {
        AttentionOperands *a = &p->at[i];
        k->attention_forward(a->out, a->lse, a->q, a->k, a->v, &p->s, a->workspace);
        k->attention_backward(a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->out, a->lse,
                              &p->s, a->workspace);
    }
}

// Causal self-attention of one sequence of T rows: 12 head_dim FLOPs per query-key pair seen
// (forward's two products, backward's four), T (T + 1) / 2 pairs per head.
static double probe_attention(const KernelOps *k, int heads, int T, int head_dim, double seconds) {
    AttentionProbe p = {.s = {.B = 1, .Tq = T, .Tk = T, .n_heads = heads, .n_kv_heads = heads,
                              .head_dim = head_dim, .mask = ATTN_CAUSAL}};
    size_t rows = (size_t)T * heads * head_dim * sizeof(float), ws = k->attention_workspace_bytes(&p.s);
    p.copies = copies_for(k, 8 * rows);
    for (int i = 0; i < p.copies; i++) {
        AttentionOperands *a = &p.at[i];
        float **tensors[] = {&a->q, &a->k, &a->v, &a->out, &a->dq, &a->dk, &a->dv, &a->dout};
        for (size_t j = 0; j < sizeof tensors / sizeof tensors[0]; j++)
            *tensors[j] = probe_alloc(k, rows);
        a->lse = probe_alloc(k, (size_t)heads * T * sizeof(float));
        a->workspace = ws ? probe_alloc(k, ws) : NULL;
    }
    double pairs = (double)heads * T * (T + 1) / 2;
    double flops = 12.0 * head_dim * pairs * p.copies / best_seconds(k, run_attention, &p, seconds);
    for (int i = 0; i < p.copies; i++) {
        AttentionOperands *a = &p.at[i];
        float *tensors[] = {a->q, a->k, a->v, a->out, a->dq, a->dk, a->dv, a->dout, a->lse};
        for (size_t j = 0; j < sizeof tensors / sizeof tensors[0]; j++) k->free(tensors[j]);
        if (a->workspace) k->free(a->workspace);
    }
    return flops;
}

// ---- elementwise ops and issue cost ----------------------------------------------------------

typedef struct {
    float *x, *y, *z, *u, *rstd;
} MemoryOperands;

typedef struct {
    MemoryOperands at[MAX_COPIES];
    float *weight;
    int copies, rows, dim;
} MemoryProbe;

// A step's elementwise mix: a norm (reads and writes each element), the SwiGLU (reads two,
// writes one, an exponential each), a residual add (reads two, writes one) and an AdamW update
// (reads four, writes three).
static void run_memory(const KernelOps *k, void *ctx) {
    MemoryProbe *m = ctx;
    size_t n = (size_t)m->rows * m->dim;
    for (int i = 0; i < m->copies; i++) {
        MemoryOperands *o = &m->at[i];
        k->rmsnorm_forward(o->z, DTYPE_FP32, o->rstd, o->x, m->weight, m->rows, m->dim, 1e-5f);
        k->swiglu_forward(o->z, DTYPE_FP32, o->x, o->y, n);
        k->add(o->y, o->x, n);
        k->adamw_update(o->z, o->x, o->y, o->u, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
    }
}

// Bytes/s of run_memory's mix on (rows, dim): 15 reads and writes of 4 bytes per element.
static double probe_memory(const KernelOps *k, int rows, int dim, double seconds) {
    MemoryProbe m = {.rows = rows, .dim = dim, .weight = probe_alloc(k, (size_t)dim * 4)};
    size_t elems = (size_t)rows * dim, bytes = elems * sizeof(float);
    m.copies = copies_for(k, 4 * bytes);
    for (int i = 0; i < m.copies; i++)
        m.at[i] = (MemoryOperands){probe_alloc(k, bytes), probe_alloc(k, bytes),
                                   probe_alloc(k, bytes), probe_alloc(k, bytes),
                                   probe_alloc(k, (size_t)rows * 4)};
    double moved = 4.0 * elems * (2 + 3 + 3 + 7) * m.copies;
    double rate = moved / best_seconds(k, run_memory, &m, seconds);
    for (int i = 0; i < m.copies; i++) {
        MemoryOperands *o = &m.at[i];
        k->free(o->x), k->free(o->y), k->free(o->z), k->free(o->u), k->free(o->rstd);
    }
    k->free(m.weight);
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
