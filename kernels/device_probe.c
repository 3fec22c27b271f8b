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
static size_t cold_bytes(const KernelOps *k) { return k->host_memory ? 32u << 20 : 256u << 20; }

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

// Seconds of the best of as many calls of run(ctx) as `seconds` holds (at least one).
typedef void (*ProbeRun)(const KernelOps *k, void *ctx);
static double best_seconds(const KernelOps *k, ProbeRun run, void *ctx, double seconds) {
    run(k, ctx);  // warm
    k->synchronize();
    double began = now(), best = 1e30;
    for (int i = 0; i < 1 || now() - began < seconds; i++) {
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
    float *y, *dx, *w, *dy32, *dw;  // y (m, out), dx (m, in), w and dw (out, in), dy32 (m, out)
    void *x, *dy, *w_cast;          // x (m, in), dy (m, out), w_cast (out, in) in ab
} LinearOperands;

typedef struct {
    LinearOperands at[MAX_COPIES];
    int copies, m, in, out;
    Dtype ab;
} LinearProbe;

// A Linear's training GEMMs as models/linear.c runs them: the output x w^T, the input's
// gradient dy w and the weight's dy^T x (added into dw); under bf16 the weight is cast before
// each of the first two and dy before the second.
static void run_linear(const KernelOps *k, void *ctx) {
    LinearProbe *g = ctx;
    size_t w_elems = (size_t)g->out * g->in, dy_elems = (size_t)g->m * g->out;
    bool cast = g->ab == DTYPE_BF16;
    for (int i = 0; i < g->copies; i++) {
        LinearOperands *o = &g->at[i];
        const void *w = cast ? o->w_cast : o->w;
        if (cast) k->to_bf16(o->w_cast, o->w, w_elems);
        k->matmul(o->y, o->x, w, g->ab, g->m, g->out, g->in, false, true, 0.0f);
        if (cast) k->to_bf16(o->dy, o->dy32, dy_elems), k->to_bf16(o->w_cast, o->w, w_elems);
        k->matmul(o->dx, o->dy, w, g->ab, g->m, g->in, g->out, false, false, 0.0f);
        k->matmul(o->dw, o->dy, o->x, g->ab, g->out, g->in, g->m, true, false, 1.0f);
    }
}

// FLOP/s of a Linear (m, in) -> (m, out) forward and backward (6 m in out FLOPs each copy).
static double probe_linear(const KernelOps *k, Dtype ab, int m, int in, int out,
                           double seconds) {
    size_t size = dtype_size(ab), x = (size_t)m * in, y = (size_t)m * out, w = (size_t)out * in;
    LinearProbe g = {.m = m, .in = in, .out = out, .ab = ab};
    g.copies = copies_for(k, x * (4 + size) + y * (8 + size) + w * (8 + size));
    for (int i = 0; i < g.copies; i++)
        g.at[i] = (LinearOperands){.y = probe_alloc(k, y * 4), .dx = probe_alloc(k, x * 4),
                                   .w = probe_alloc(k, w * 4), .dy32 = probe_alloc(k, y * 4),
                                   .dw = probe_alloc(k, w * 4), .x = probe_alloc(k, x * size),
                                   .dy = probe_alloc(k, y * size),
                                   .w_cast = probe_alloc(k, w * size)};
    double flops = 6.0 * m * in * out * g.copies / best_seconds(k, run_linear, &g, seconds);
    for (int i = 0; i < g.copies; i++) {
        LinearOperands *o = &g.at[i];
        void *all[] = {o->y, o->dx, o->w, o->dy32, o->dw, o->x, o->dy, o->w_cast};
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
// power management): after a warm-up of a quarter of `seconds`, the GEMM repeats in spans of
// `seconds` until a span is no more than 10% faster than the one before (at most MAX_RAMP
// spans), which also readies the device for the probes after it.
enum { MAX_RAMP = 12 };
double device_probe_gemm(const KernelOps *k, Dtype ab, int n, double seconds) {
    size_t elems = (size_t)n * n;
    SquareGemm g = {probe_alloc(k, elems * 4), probe_alloc(k, elems * dtype_size(ab)),
                    probe_alloc(k, elems * dtype_size(ab)), ab, n};
    double flops = 2.0 * n * n * n / best_seconds(k, run_square, &g, seconds / 4);
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
    float *c;
    uint8_t *a, *b;
} Float8Operands;

typedef struct {
    Float8Operands at[MAX_COPIES];
    float *scale_inv;
    void *workspace;
    int copies, m, in, out;
} Float8Probe;

// A float8 Linear's three GEMMs, each c = a b^T on K-contiguous tensorwise e4m3 operands as
// models/linear.c runs them: the output (m, out) over in, the input's gradient (m, in) over
// out, the weight's (out, in) over m, added into.
static void run_float8(const KernelOps *k, void *ctx) {
    Float8Probe *g = ctx;
    const int shapes[3][3] = {{g->m, g->out, g->in}, {g->m, g->in, g->out}, {g->out, g->in, g->m}};
    for (int c = 0; c < g->copies; c++)
        for (int i = 0; i < 3; i++) {
            Float8Operands *o = &g->at[c];
            k->matmul_float8(o->c, o->a, g->scale_inv, FLOAT8_E4M3FN, o->b, g->scale_inv,
                             FLOAT8_E4M3FN, shapes[i][0], shapes[i][1], shapes[i][2], false,
                             i == 2 ? 1.0f : 0.0f, g->workspace);
        }
}

static size_t larger(size_t a, size_t b) { return a > b ? a : b; }

// FLOP/s of a float8 Linear (m, in) -> (m, out), forward and backward: 6 m in out FLOPs (its
// casts are probe_cast's).
static double probe_float8(const KernelOps *k, int m, int in, int out, double seconds) {
    size_t x = (size_t)m * in, y = (size_t)m * out, w = (size_t)out * in;
    size_t ws = larger(larger(k->matmul_float8_workspace_bytes(m, out, in),
                              k->matmul_float8_workspace_bytes(m, in, out)),
                       k->matmul_float8_workspace_bytes(out, in, m));
    size_t c = larger(larger(x, y), w) * 4, a = larger(y, w), b = larger(w, x);
    Float8Probe g = {.scale_inv = probe_alloc(k, sizeof(float)),
                     .workspace = ws ? probe_alloc(k, ws) : NULL, .m = m, .in = in, .out = out};
    g.copies = copies_for(k, c + a + b);
    for (int i = 0; i < g.copies; i++)
        g.at[i] = (Float8Operands){probe_alloc(k, c), probe_alloc(k, a), probe_alloc(k, b)};
    const float one = 1.0f;
    k->upload(g.scale_inv, &one, sizeof one);
    double flops = 6.0 * m * in * out * g.copies / best_seconds(k, run_float8, &g, seconds);
    for (int i = 0; i < g.copies; i++) k->free(g.at[i].c), k->free(g.at[i].a), k->free(g.at[i].b);
    k->free(g.scale_inv);
    if (g.workspace) k->free(g.workspace);
    return flops;
}

typedef struct {
    float *x, *amax, *scale_inv;  // x (rows, cols); amax and scale_inv (cols): one per row of a
    uint8_t *bytes;               // transposed rowwise cast's bytes (cols, rows)
} CastOperands;

typedef struct {
    CastOperands at[MAX_COPIES];
    int copies, rows, cols;
} CastProbe;

// An operand's float8 casts as a step's: tensorwise (one amax, then the quantize), and rowwise
// transposed with power-of-two scales (an amax per column, then the quantize into (cols, rows)).
static void run_cast(const KernelOps *k, void *ctx) {
    CastProbe *c = ctx;
    const Float8Cast casts[] = {{FLOAT8_E4M3FN, false, false, false},
                                {FLOAT8_E4M3FN, true, true, true}};
    for (int i = 0; i < c->copies; i++)
        for (int j = 0; j < 2; j++) {
            CastOperands *o = &c->at[i];
            k->float8_amax(o->amax, o->x, c->rows, c->cols, &casts[j]);
            k->float8_quantize(o->bytes, o->scale_inv, o->amax, o->x, c->rows, c->cols, &casts[j]);
        }
}

// Bytes/s of float8's casts on (rows, cols): 9 bytes an element each (read for the amax, read
// again and written as a byte by the quantize).
static double probe_cast(const KernelOps *k, int rows, int cols, double seconds) {
    CastProbe c = {.rows = rows, .cols = cols};
    size_t elems = (size_t)rows * cols;
    c.copies = copies_for(k, 5 * elems);
    for (int i = 0; i < c.copies; i++)
        c.at[i] = (CastOperands){probe_alloc(k, elems * 4), probe_alloc(k, (size_t)cols * 4),
                                 probe_alloc(k, (size_t)cols * 4), probe_alloc(k, elems)};
    double rate = 2 * 9.0 * (double)elems * c.copies / best_seconds(k, run_cast, &c, seconds);
    for (int i = 0; i < c.copies; i++) {
        CastOperands *o = &c.at[i];
        k->free(o->x), k->free(o->amax), k->free(o->scale_inv), k->free(o->bytes);
    }
    return rate;
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
static double probe_attention(const KernelOps *k, Dtype compute, int heads, int T, int head_dim,
                              double seconds) {
    AttentionProbe p = {.s = {.B = 1, .Tq = T, .Tk = T, .n_heads = heads, .n_kv_heads = heads,
                              .head_dim = head_dim, .mask = ATTN_CAUSAL, .compute = compute}};
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

// ---- elementwise ops, the optimizer and issue cost -------------------------------------------

typedef struct {
    float *h, *dh, *normed, *dnormed, *rstd;  // (rows, dim), rstd (rows)
    float *gate, *up, *act, *dgate, *dup;    // (rows, FFN_WIDTH dim)
} LayerOperands;

typedef struct {
    LayerOperands at[MAX_COPIES];
    float *weight, *dweight;  // (dim)
    int copies, rows, dim;
} LayerProbe;

// Llama's FFN is about three times the model's width (8/3 x 1.3 rounded up in the 8B).
enum { FFN_WIDTH = 3 };

// A decoder layer's elementwise ops in their proportions: the norm forward and backward and a
// residual add on the hidden state, the SwiGLU forward and backward on the FFN's width.
static void run_layer(const KernelOps *k, void *ctx) {
    LayerProbe *m = ctx;
    size_t hidden = (size_t)m->rows * m->dim, ffn = FFN_WIDTH * hidden;
    for (int i = 0; i < m->copies; i++) {
        LayerOperands *o = &m->at[i];
        k->rmsnorm_forward(o->normed, DTYPE_FP32, o->rstd, o->h, m->weight, m->rows, m->dim, 1e-5f);
        k->swiglu_forward(o->act, DTYPE_FP32, o->gate, o->up, ffn);
        k->add(o->dh, o->dnormed, hidden);
        k->swiglu_backward(o->dgate, o->dup, NULL, DTYPE_FP32, o->act, o->gate, o->up, ffn);
        k->rmsnorm_backward(o->dh, m->dweight, o->dnormed, o->h, m->weight, o->rstd, m->rows,
                            m->dim);
    }
}

// Bytes/s of run_layer on (rows, dim): the norm's 8 bytes an element forward and 16 backward
// (its gradient added into), the add's 12, the SwiGLU's 12 forward and 28 backward.
static double probe_elementwise(const KernelOps *k, int rows, int dim, double seconds) {
    LayerProbe m = {.rows = rows, .dim = dim, .weight = probe_alloc(k, (size_t)dim * 4),
                    .dweight = probe_alloc(k, (size_t)dim * 4)};
    size_t hidden = (size_t)rows * dim * sizeof(float), ffn = FFN_WIDTH * hidden;
    m.copies = copies_for(k, 4 * hidden + 5 * ffn);
    for (int i = 0; i < m.copies; i++)
        m.at[i] = (LayerOperands){probe_alloc(k, hidden), probe_alloc(k, hidden),
                                  probe_alloc(k, hidden), probe_alloc(k, hidden),
                                  probe_alloc(k, (size_t)rows * 4), probe_alloc(k, ffn),
                                  probe_alloc(k, ffn),    probe_alloc(k, ffn),
                                  probe_alloc(k, ffn),    probe_alloc(k, ffn)};
    double moved = (double)rows * dim * (8 + 16 + 12 + FFN_WIDTH * (12 + 28)) * m.copies;
    double rate = moved / best_seconds(k, run_layer, &m, seconds);
    for (int i = 0; i < m.copies; i++) {
        LayerOperands *o = &m.at[i];
        float *all[] = {o->h, o->dh, o->normed, o->dnormed, o->rstd,
                        o->gate, o->up, o->act, o->dgate, o->dup};
        for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) k->free(all[j]);
    }
    k->free(m.weight), k->free(m.dweight);
    return rate;
}

typedef struct {
    float *param, *grad, *m, *v;
    size_t n;
} OptimizerProbe;

static void run_optimizer(const KernelOps *k, void *ctx) {
    OptimizerProbe *o = ctx;
    k->adamw_update(o->param, o->grad, o->m, o->v, o->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
}

// Bytes/s of AdamW over n parameters beyond the caches: 28 bytes each.
static double probe_optimizer(const KernelOps *k, size_t n, double seconds) {
    size_t bytes = n * sizeof(float);
    OptimizerProbe o = {probe_alloc(k, bytes), probe_alloc(k, bytes), probe_alloc(k, bytes),
                        probe_alloc(k, bytes), n};
    double rate = 28.0 * (double)n / best_seconds(k, run_optimizer, &o, seconds);
    k->free(o.param), k->free(o.grad), k->free(o.m), k->free(o.v);
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
    double share = seconds / (shape->float8 ? 7 : 5);
    GemmPrecision p = gemm_precision_of(shape->compute);
    int rows = at_most(shape->rows, gpu ? 16384 : 1024), dim = at_most(shape->dim, gpu ? 8192 : 1024);
    d.peak[p] = k->peak_flops(false);
    d.gemm[p] = probe_linear(k, shape->compute, rows, dim, FFN_WIDTH * dim, share);
    if (shape->float8) {
        d.gemm[GEMM_FLOAT8] = probe_float8(k, rows, dim, FFN_WIDTH * dim, share);
        d.cast = probe_cast(k, rows, dim, share);
    }
    int T = at_most(shape->seq_len, gpu ? 8192 : 512);
    d.attention = probe_attention(k, shape->compute, gpu ? 32 : 4, T, shape->head_dim, share);
    d.memory = probe_elementwise(k, rows, dim, share);
    d.optimizer = probe_optimizer(k, cold_bytes(k) / 16, share);  // 4 tensors beyond the caches
    d.op = probe_op(k, share);
    d.link_node = d.memory;
    return d;
}
