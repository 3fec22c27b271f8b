// Grouped-query attention. Plain causal attention of a block against itself, with bf16 compute
// (KernelInit.precision bf16), runs cuDNN's fused flash attention through the backend graph API:
// q, k, v (and out, dout) are cast to bf16 copies in the workspace, one execution plan per
// shape and direction runs, built the first time the shape is seen and cached, and the results
// are cast back (backward adding them into dq, dk, dv). fp32 compute, offsets, Tq != Tk, the
// other masks and shapes cuDNN declines run the kernels of attention_fallback.cu.
//
// The graphs are the composite ones cudnn-frontend (CompositeSDPANode, CompositeSDPABackward-
// Node) lowers SDPA to for this cuDNN: matmul, pointwise, reduction and reshape operations that
// cuDNN's attention engines recognise and fuse. cuDNN 9.19's dedicated SDPA_FWD / SDPA_BWD
// operations cannot take the causal mask (their score-modifier subgraph arrives in 9.21) and its
// SDPA_BWD offers no Hopper engine; the frontend itself uses them only from 9.21 on.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/device.cuh"

typedef cudnnBackendDescriptor_t Desc;

// The graphs' tensors that the variant pack binds; virtual tensors count up from UID_VIRTUAL.
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_DQ, UID_DK, UID_DV,
    UID_SCALE, UID_NEG_INF, UID_ONE,  // by-value scalars
    UID_SOFTMAX_SUM, UID_DQ_ACCUM,    // backward's fp32 workspace tensors
    UID_VIRTUAL = 100,
};

// ---- graph building --------------------------------------------------------------------------

#define GRAPH_MAX_DESCS 128
#define GRAPH_MAX_OPS 32
#define GRAPH_MAX_CONFIGS 8

// A graph under construction. The first failing call is kept in status and makes every later
// one a no-op, so a graph cuDNN cannot build is detected once, at the end, and freed whole.
typedef struct {
    Desc descs[GRAPH_MAX_DESCS];  // every descriptor created, the plan's included
    int n_descs;
    Desc ops[GRAPH_MAX_OPS];  // in topological order
    int n_ops;
    int64_t next_uid;
    cudnnStatus_t status;
    Desc plan;
    int64_t plan_workspace;  // bytes of cuDNN's own workspace
} AttnGraph;

static bool graph_ok(const AttnGraph *g) { return g->status == CUDNN_STATUS_SUCCESS; }

static Desc graph_create(AttnGraph *g, cudnnBackendDescriptorType_t type) {
    Desc d = NULL;
    if (!graph_ok(g)) return NULL;
    CHECK(g->n_descs < GRAPH_MAX_DESCS);
    g->status = cudnnBackendCreateDescriptor(type, &d);
    if (graph_ok(g)) g->descs[g->n_descs++] = d;
    return d;
}

static void graph_set(AttnGraph *g, Desc d, cudnnBackendAttributeName_t name,
                      cudnnBackendAttributeType_t type, int64_t count, const void *values) {
    if (graph_ok(g)) g->status = cudnnBackendSetAttribute(d, name, type, count, values);
}

static void graph_link(AttnGraph *g, Desc d, cudnnBackendAttributeName_t name, Desc value) {
    graph_set(g, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}

static void graph_finalize(AttnGraph *g, Desc d) {
    if (graph_ok(g)) g->status = cudnnBackendFinalize(d);
}

static void graph_destroy(AttnGraph *g) {
    while (g->n_descs > 0) cudnnBackendDestroyDescriptor(g->descs[--g->n_descs]);
    g->n_ops = 0, g->plan = NULL;
}

// Logical dims and strides of a 4-d tensor.
typedef struct {
    int64_t dim[4], stride[4];
} Layout;

static Layout layout_make(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1,
                          int64_t s2, int64_t s3) {
    Layout l = {{d0, d1, d2, d3}, {s0, s1, s2, s3}};
    return l;
}

static Layout layout_packed(int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    return layout_make(d0, d1, d2, d3, d1 * d2 * d3, d2 * d3, d3, 1);
}

// Our (B, T, heads, D) memory as cuDNN's [B, heads, T, D].
static Layout layout_bshd(int64_t B, int64_t T, int64_t heads, int64_t D) {
    return layout_make(B, heads, T, D, T * heads * D, D, heads * D, 1);
}

// The same memory read with its last two dims swapped (K^T, V^T, P^T, dS^T).
static Layout layout_transpose(Layout l) {
    return layout_make(l.dim[0], l.dim[1], l.dim[3], l.dim[2], l.stride[0], l.stride[1],
                       l.stride[3], l.stride[2]);
}

static Desc graph_tensor(AttnGraph *g, int64_t uid, cudnnDataType_t type, Layout l,
                         bool is_virtual, bool by_value) {
    int64_t alignment = 16;
    Desc t = graph_create(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    graph_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    graph_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    graph_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, l.dim);
    graph_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, l.stride);
    graph_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    graph_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    graph_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    graph_finalize(g, t);
    return t;
}

static Desc graph_input(AttnGraph *g, int64_t uid, cudnnDataType_t type, Layout l) {
    return graph_tensor(g, uid, type, l, false, false);
}

// An fp32 scalar passed by value: the variant pack points at host memory holding it.
static Desc graph_scalar(AttnGraph *g, int64_t uid) {
    return graph_tensor(g, uid, CUDNN_DATA_FLOAT, layout_make(1, 1, 1, 1, 1, 1, 1, 1), false,
                        true);
}

static Desc graph_virtual(AttnGraph *g, cudnnDataType_t type, Layout l) {
    return graph_tensor(g, g->next_uid++, type, l, true, false);
}

static void graph_add_op(AttnGraph *g, Desc op) {
    graph_finalize(g, op);
    if (!graph_ok(g)) return;
    CHECK(g->n_ops < GRAPH_MAX_OPS);
    g->ops[g->n_ops++] = op;
}

// y = mode(x[, b[, t]]) elementwise in precision prec; axis: GEN_INDEX's dimension, else -1.
static void graph_pointwise_full(AttnGraph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                 int64_t axis, Desc x, Desc b, Desc t, Desc y) {
    Desc pw = graph_create(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    graph_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    graph_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) graph_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    graph_finalize(g, pw);
    Desc op = graph_create(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    graph_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    graph_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) graph_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) graph_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    graph_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    graph_add_op(g, op);
}

// y = mode(x[, b]) in fp32.
static void graph_pointwise(AttnGraph *g, cudnnPointwiseMode_t mode, Desc x, Desc b, Desc y) {
    graph_pointwise_full(g, mode, CUDNN_DATA_FLOAT, -1, x, b, NULL, y);
}

// c = a b over the last two dims, batched (and broadcast, for GQA's heads) over the first two.
static void graph_matmul(AttnGraph *g, Desc a, Desc b, Desc c) {
    cudnnDataType_t fp32 = CUDNN_DATA_FLOAT;
    Desc mm = graph_create(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    graph_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &fp32);
    graph_finalize(g, mm);
    Desc op = graph_create(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    graph_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    graph_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    graph_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    graph_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    graph_add_op(g, op);
}

// y = x reduced with mode over the dims where y has extent 1 (or a smaller, dividing extent).
static void graph_reduce(AttnGraph *g, cudnnReduceTensorOp_t mode, Desc x, Desc y) {
    cudnnDataType_t fp32 = CUDNN_DATA_FLOAT;
    Desc r = graph_create(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    graph_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    graph_set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &fp32);
    graph_finalize(g, r);
    Desc op = graph_create(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    graph_link(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    graph_link(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    graph_link(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    graph_add_op(g, op);
}

// y: x's elements under y's dims and strides (here: a transpose).
static void graph_reshape(AttnGraph *g, Desc x, Desc y) {
    Desc op = graph_create(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    graph_link(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    graph_link(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    graph_add_op(g, op);
}

// ---- the attention graphs --------------------------------------------------------------------

typedef struct {
    Layout q, kv, scores, rows;  // (B,H,T,D) in our layout, (B,KV,T,D), (B,H,T,T), (B,H,T,1)
} AttnLayouts;

static AttnLayouts attn_layouts(AttnShape s) {
    AttnLayouts l;
    l.q = layout_bshd(s.B, s.Tq, s.n_heads, s.head_dim);
    l.kv = layout_bshd(s.B, s.Tq, s.n_kv_heads, s.head_dim);
    l.scores = layout_packed(s.B, s.n_heads, s.Tq, s.Tq);
    l.rows = layout_packed(s.B, s.n_heads, s.Tq, 1);
    return l;
}

// Scores of keys after the query (column > row) become -inf: cudnn-frontend's top-left causal
// mask before cuDNN 9.21 (GEN_INDEX rows and columns, row >= col, select).
static Desc graph_causal_mask(AttnGraph *g, Desc s, Desc neg_inf, Layout scores) {
    Desc row = graph_virtual(g, CUDNN_DATA_INT32, scores);
    Desc col = graph_virtual(g, CUDNN_DATA_INT32, scores);
    Desc keep = graph_virtual(g, CUDNN_DATA_BOOLEAN, scores);
    Desc masked = graph_virtual(g, CUDNN_DATA_FLOAT, scores);
    graph_pointwise_full(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2, s, NULL, NULL, row);
    graph_pointwise_full(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3, s, NULL, NULL, col);
    graph_pointwise_full(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
    graph_pointwise_full(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, neg_inf, keep,
                         masked);
    return masked;
}

// P = softmax(s) row by row, as bf16 for the second matmul; stats = max + log(sum exp(s - max)),
// the natural-log log-sum-exp of the scaled scores: exactly our lse.
static Desc graph_softmax(AttnGraph *g, Desc s, Desc stats, AttnLayouts l) {
    Desc max = graph_virtual(g, CUDNN_DATA_FLOAT, l.rows);
    Desc centred = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    Desc e = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    Desc sum = graph_virtual(g, CUDNN_DATA_FLOAT, l.rows);
    Desc log_sum = graph_virtual(g, CUDNN_DATA_FLOAT, l.rows);
    Desc p = graph_virtual(g, CUDNN_DATA_BFLOAT16, l.scores);
    graph_reduce(g, CUDNN_REDUCE_TENSOR_MAX, s, max);
    graph_pointwise(g, CUDNN_POINTWISE_SUB, s, max, centred);
    graph_pointwise(g, CUDNN_POINTWISE_EXP, centred, NULL, e);
    graph_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    graph_pointwise(g, CUDNN_POINTWISE_LOG, sum, NULL, log_sum);
    graph_pointwise(g, CUDNN_POINTWISE_ADD, max, log_sum, stats);
    graph_pointwise(g, CUDNN_POINTWISE_DIV, e, sum, p);
    return p;
}

// o = softmax(causal(scale q k^T)) v, stats = its log-sum-exp.
static void graph_forward(AttnGraph *g, AttnShape s) {
    AttnLayouts l = attn_layouts(s);
    Desc q = graph_input(g, UID_Q, CUDNN_DATA_BFLOAT16, l.q);
    Desc kt = graph_input(g, UID_K, CUDNN_DATA_BFLOAT16, layout_transpose(l.kv));
    Desc v = graph_input(g, UID_V, CUDNN_DATA_BFLOAT16, l.kv);
    Desc o = graph_input(g, UID_O, CUDNN_DATA_BFLOAT16, l.q);
    Desc stats = graph_input(g, UID_STATS, CUDNN_DATA_FLOAT, l.rows);
    Desc scale = graph_scalar(g, UID_SCALE), neg_inf = graph_scalar(g, UID_NEG_INF);
    Desc qk = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    Desc scaled = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    graph_matmul(g, q, kt, qk);
    graph_pointwise(g, CUDNN_POINTWISE_MUL, qk, scale, scaled);
    Desc p = graph_softmax(g, graph_causal_mask(g, scaled, neg_inf, l.scores), stats, l);
    graph_matmul(g, p, v, o);
}

// c (B, KV, rows, D) = a b, a having all H query heads: with GQA the product is formed per
// query head and summed over each kv head's group.
static void graph_group_matmul(AttnGraph *g, Desc a, Desc b, Desc c, AttnShape s) {
    if (s.n_heads == s.n_kv_heads) {
        graph_matmul(g, a, b, c);
        return;
    }
    Layout full = layout_packed(s.B, s.n_heads, s.Tq, s.head_dim);
    Desc per_head = graph_virtual(g, CUDNN_DATA_BFLOAT16, full);
    graph_matmul(g, a, b, per_head);
    graph_reduce(g, CUDNN_REDUCE_TENSOR_ADD, per_head, c);
}

// The probabilities recomputed from the saved stats: P = exp(causal(scale q k^T - stats)), fp32.
static Desc graph_probs(AttnGraph *g, Desc q, Desc kt, Desc stats, Desc scale, Desc neg_inf,
                        AttnLayouts l) {
    Desc qk = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    Desc scaled = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    Desc centred = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    Desc p = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    graph_matmul(g, q, kt, qk);
    graph_pointwise(g, CUDNN_POINTWISE_MUL, qk, scale, scaled);
    graph_pointwise(g, CUDNN_POINTWISE_SUB, scaled, stats, centred);
    graph_pointwise(g, CUDNN_POINTWISE_EXP, graph_causal_mask(g, centred, neg_inf, l.scores),
                    NULL, p);
    return p;
}

// softmax_sum (fp32 workspace tensor) = D_i = rowsum(dO o O), times one where cudnn-frontend's
// graph multiplies by the dropout scale (the pattern cuDNN's backward engines recognise).
static void graph_softmax_sum(AttnGraph *g, Desc dout, Desc o, Desc one, Desc softmax_sum,
                              AttnShape s, AttnLayouts l) {
    int64_t H = s.n_heads, T = s.Tq, D = s.head_dim;
    // cudnn-frontend's layout for this virtual product; only its dims matter.
    Desc prod = graph_virtual(g, CUDNN_DATA_FLOAT,
                              layout_make(s.B, H, T, D, H * T * D, T * D, H * D, 1));
    Desc sum = graph_virtual(g, CUDNN_DATA_FLOAT, l.rows);
    graph_pointwise(g, CUDNN_POINTWISE_MUL, dout, o, prod);
    graph_reduce(g, CUDNN_REDUCE_TENSOR_ADD, prod, sum);
    graph_pointwise(g, CUDNN_POINTWISE_MUL, sum, one, softmax_sum);
}

// dS = P o (dO V^T - D) * scale, fp32.
static Desc graph_dscores(AttnGraph *g, Desc dout, Desc vt, Desc softmax_sum, Desc p,
                          Desc scale, AttnLayouts l) {
    Desc dp = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    Desc centred = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    Desc weighted = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    Desc ds = graph_virtual(g, CUDNN_DATA_FLOAT, l.scores);
    graph_matmul(g, dout, vt, dp);
    graph_pointwise(g, CUDNN_POINTWISE_SUB, dp, softmax_sum, centred);
    graph_pointwise(g, CUDNN_POINTWISE_MUL, centred, p, weighted);
    graph_pointwise(g, CUDNN_POINTWISE_MUL, weighted, scale, ds);
    return ds;
}

// dV = P^T dO, dK = dS^T Q (both summed over GQA groups), dQ = dS K through an fp32
// accumulator that cuDNN converts to bf16.
static void graph_backward(AttnGraph *g, AttnShape s) {
    AttnLayouts l = attn_layouts(s);
    Layout scores_t = layout_transpose(l.scores);
    Desc q = graph_input(g, UID_Q, CUDNN_DATA_BFLOAT16, l.q);
    Desc kt = graph_input(g, UID_K, CUDNN_DATA_BFLOAT16, layout_transpose(l.kv));
    Desc vt = graph_input(g, UID_V, CUDNN_DATA_BFLOAT16, layout_transpose(l.kv));
    Desc o = graph_input(g, UID_O, CUDNN_DATA_BFLOAT16, l.q);
    Desc dout = graph_input(g, UID_DO, CUDNN_DATA_BFLOAT16, l.q);
    Desc stats = graph_input(g, UID_STATS, CUDNN_DATA_FLOAT, l.rows);
    Desc dq = graph_input(g, UID_DQ, CUDNN_DATA_BFLOAT16, l.q);
    Desc dk = graph_input(g, UID_DK, CUDNN_DATA_BFLOAT16, l.kv);
    Desc dv = graph_input(g, UID_DV, CUDNN_DATA_BFLOAT16, l.kv);
    Desc scale = graph_scalar(g, UID_SCALE), neg_inf = graph_scalar(g, UID_NEG_INF);
    Desc one = graph_scalar(g, UID_ONE);
    Desc softmax_sum = graph_input(g, UID_SOFTMAX_SUM, CUDNN_DATA_FLOAT, l.rows);
    Desc dq_accum = graph_input(g, UID_DQ_ACCUM, CUDNN_DATA_FLOAT,
                                layout_packed(s.B, s.n_heads, s.Tq, s.head_dim));
    graph_softmax_sum(g, dout, o, one, softmax_sum, s, l);
    Desc p = graph_probs(g, q, kt, stats, scale, neg_inf, l);
    Desc pt = graph_virtual(g, CUDNN_DATA_BFLOAT16, scores_t);
    graph_reshape(g, p, pt);
    graph_group_matmul(g, pt, dout, dv, s);
    Desc ds = graph_dscores(g, dout, vt, softmax_sum, p, scale, l);
    Desc dst = graph_virtual(g, CUDNN_DATA_BFLOAT16, scores_t);
    graph_reshape(g, ds, dst);
    graph_group_matmul(g, dst, q, dk, s);
    Desc k = graph_virtual(g, CUDNN_DATA_FLOAT, l.kv);
    graph_reshape(g, kt, k);
    graph_matmul(g, ds, k, dq_accum);
    graph_pointwise(g, CUDNN_POINTWISE_IDENTITY, dq_accum, NULL, dq);
}

// ---- plans -----------------------------------------------------------------------------------

// The heuristics' first configs (at most GRAPH_MAX_CONFIGS) into configs; returns how many.
static int64_t graph_configs(AttnGraph *g, Desc heur, Desc *configs) {
    int64_t available = 0, n = 0;
    if (graph_ok(g))
        g->status = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available, NULL);
    if (available > GRAPH_MAX_CONFIGS) available = GRAPH_MAX_CONFIGS;
    for (int64_t i = 0; i < available; i++)
        configs[i] = graph_create(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (graph_ok(g) && available > 0)
        g->status = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, available, &n,
                                             configs);
    return graph_ok(g) ? n : 0;
}

// An execution plan for config; a config that does not finalize is no failure of the graph.
static void graph_try_plan(AttnGraph *g, cudnnHandle_t handle, Desc config) {
    Desc plan = NULL;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
        CUDNN_STATUS_SUCCESS)
        return;
    bool ok = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
                                       1, &handle) == CUDNN_STATUS_SUCCESS &&
              cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                       &config) == CUDNN_STATUS_SUCCESS &&
              cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS &&
              cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, NULL,
                                       &g->plan_workspace) == CUDNN_STATUS_SUCCESS;
    if (!ok) {
        cudnnBackendDestroyDescriptor(plan);
        return;
    }
    CHECK(g->n_descs < GRAPH_MAX_DESCS);
    g->descs[g->n_descs++] = plan;
    g->plan = plan;
}

// The operation graph, cuDNN's heuristics (mode A) and the first of their engine configs whose
// execution plan finalizes; NOT_SUPPORTED when none does.
static void graph_plan(AttnGraph *g, cudnnHandle_t handle) {
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    Desc configs[GRAPH_MAX_CONFIGS];
    Desc graph = graph_create(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops,
              g->ops);
    graph_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    graph_finalize(g, graph);
    Desc heur = graph_create(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    graph_link(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    graph_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    graph_finalize(g, heur);
    int64_t n = graph_configs(g, heur, configs);
    for (int64_t i = 0; i < n && !g->plan; i++) graph_try_plan(g, handle, configs[i]);
    if (graph_ok(g) && !g->plan) g->status = CUDNN_STATUS_NOT_SUPPORTED;
}

#define ATTN_MAX_PLANS 32

typedef struct {
    AttnShape shape;
    bool backward;
    bool usable;       // false: cuDNN declined the shape and the fallback kernels run it
    float scalars[3];  // the by-value inputs UID_SCALE, UID_NEG_INF, UID_ONE
    AttnGraph graph;   // the plan and every descriptor it was built from, kept with it
} AttnPlan;

static AttnPlan attn_plans[ATTN_MAX_PLANS];
static int attn_n_plans;

static bool attn_plan_build(AttnPlan *p) {
    AttnGraph *g = &p->graph;
    AttnShape s = p->shape;
    memset(g, 0, sizeof *g);
    g->next_uid = UID_VIRTUAL;
    if (p->backward)
        graph_backward(g, s);
    else
        graph_forward(g, s);
    graph_plan(g, cuda_cudnn());
    if (graph_ok(g)) return true;
    char why[512];
    cudnnGetLastErrorString(why, sizeof why);
    log_warn("attention: cuDNN has no fused %s plan for B=%d T=%d heads=%d kv_heads=%d "
             "head_dim=%d (%s: %s); the fp32 kernels run it",
             p->backward ? "backward" : "forward", s.B, s.Tq, s.n_heads, s.n_kv_heads, s.head_dim,
             cudnnGetErrorString(g->status), why);
    graph_destroy(g);
    return false;
}

// The graphs are the composite ones cudnn-frontend lowers to from cuDNN 9.16 on; older
// runtimes need its workarounds (and 9.10.0/9.10.1 are broken), so they run the fallback.
#define ATTN_CUDNN_MIN_VERSION 91600

// The graphs are plain causal attention of a block against itself (top-left aligned); offsets,
// Tq != Tk and the other masks run the fallback. Within that, cuDNN's documented limits for
// bf16 flash attention; shapes outside go to the fallback without asking. A head_dim of 8k also
// keeps every row of our layout 16-byte aligned. The backward of a single token (s_q = s_kv =
// 1) is one cudnn-frontend refuses to run.
static bool attn_cudnn_may_run(AttnShape s, bool backward) {
    return s.mask == ATTN_CAUSAL && s.q_start == s.kv_start && s.Tq == s.Tk &&
           cudnnGetVersion() >= ATTN_CUDNN_MIN_VERSION && s.head_dim % 8 == 0 &&
           s.head_dim <= 256 && s.n_heads % s.n_kv_heads == 0 && (!backward || s.Tq > 1);
}

static bool attn_shape_equal(AttnShape a, AttnShape b) {
    return a.B == b.B && a.Tq == b.Tq && a.n_heads == b.n_heads && a.n_kv_heads == b.n_kv_heads &&
           a.head_dim == b.head_dim;
}

// The cached plan for the shape and direction, built the first time it is asked for; NULL when
// the fallback kernels run it.
static AttnPlan *attn_plan(AttnShape s, bool backward) {
    static bool warned_full;
    if (!cuda_bf16_compute() || !attn_cudnn_may_run(s, backward)) return NULL;
    for (int i = 0; i < attn_n_plans; i++) {
        AttnPlan *p = &attn_plans[i];
        if (p->backward == backward && attn_shape_equal(p->shape, s)) return p->usable ? p : NULL;
    }
    if (attn_n_plans == ATTN_MAX_PLANS) {
        if (!warned_full) log_warn("attention: more than %d shapes; new ones run the fp32 kernels",
                                   ATTN_MAX_PLANS);
        warned_full = true;
        return NULL;
    }
    AttnPlan *p = &attn_plans[attn_n_plans++];
    p->shape = s, p->backward = backward;
    p->scalars[0] = 1.0f / sqrtf((float)s.head_dim), p->scalars[1] = -INFINITY;
    p->scalars[2] = 1.0f;
    p->usable = attn_plan_build(p);
    return p->usable ? p : NULL;
}

// ---- running a plan --------------------------------------------------------------------------

#define ATTN_ALIGN 256

// Where a plan's buffers lie in the workspace: bf16 copies of our (B, T, heads, D) tensors, the
// backward graph's fp32 tensors, then cuDNN's own workspace.
typedef struct {
    uint16_t *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *softmax_sum, *dq_accum;
    void *plan;
} AttnBuffers;

static void *attn_take(char *base, size_t *at, size_t bytes) {
    void *p = base ? base + *at : NULL;
    *at += (bytes + ATTN_ALIGN - 1) / ATTN_ALIGN * ATTN_ALIGN;
    return p;
}

// Lays the buffers out from workspace and returns the bytes they need. A NULL workspace only
// counts, so that sizing and use share this one layout.
static size_t attn_buffers(AttnBuffers *w, void *workspace, const AttnPlan *p) {
    AttnShape s = p->shape;
    size_t nq = (size_t)s.B * s.Tq * s.n_heads * s.head_dim;
    size_t nkv = (size_t)s.B * s.Tq * s.n_kv_heads * s.head_dim, at = 0;
    // The caller's arena aligns to less than the 256 bytes cuDNN's kernels prefer: start at the
    // next boundary, the slack counted in the size.
    uintptr_t start = ((uintptr_t)workspace + ATTN_ALIGN - 1) & ~(uintptr_t)(ATTN_ALIGN - 1);
    char *base = workspace ? (char *)start : NULL;
    memset(w, 0, sizeof *w);
    w->q = (uint16_t *)attn_take(base, &at, nq * sizeof(uint16_t));
    w->k = (uint16_t *)attn_take(base, &at, nkv * sizeof(uint16_t));
    w->v = (uint16_t *)attn_take(base, &at, nkv * sizeof(uint16_t));
    w->o = (uint16_t *)attn_take(base, &at, nq * sizeof(uint16_t));
    if (p->backward) {
        w->dout = (uint16_t *)attn_take(base, &at, nq * sizeof(uint16_t));
        w->dq = (uint16_t *)attn_take(base, &at, nq * sizeof(uint16_t));
        w->dk = (uint16_t *)attn_take(base, &at, nkv * sizeof(uint16_t));
        w->dv = (uint16_t *)attn_take(base, &at, nkv * sizeof(uint16_t));
        w->softmax_sum = (float *)attn_take(base, &at, (size_t)s.B * s.n_heads * s.Tq * 4);
        w->dq_accum = (float *)attn_take(base, &at, nq * sizeof(float));
    }
    w->plan = attn_take(base, &at, (size_t)p->graph.plan_workspace);
    return at + ATTN_ALIGN;
}

static void attn_execute(AttnPlan *p, const int64_t *uids, void **pointers, int n,
                         void *workspace) {
    Desc pack = NULL;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
    CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                         CUDNN_TYPE_INT64, n, uids));
    CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                         CUDNN_TYPE_VOID_PTR, n, pointers));
    CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                         CUDNN_TYPE_VOID_PTR, 1, &workspace));
    CUDNN_CHECK(cudnnBackendFinalize(pack));
    CUDNN_CHECK(cudnnBackendExecute(cuda_cudnn(), p->graph.plan, pack));
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
}

// dst (n) += float(src): cuDNN's bf16 gradients added into ours.
static __global__ void attn_add_bf16(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] += __uint_as_float((uint32_t)src[i] << 16);
}

static void attn_accumulate(float *dst, const uint16_t *src, size_t n) {
    attn_add_bf16<<<cuda_grid(n), CUDA_THREADS, 0, cuda_stream()>>>(dst, src, n);
    CUDA_LAUNCH_CHECK();
}

// ---- the ops ---------------------------------------------------------------------------------

size_t cuda_attention_workspace_bytes(const AttnShape *shape) {
    size_t bytes = attn_fallback_workspace_bytes(*shape);
    // Sized for cuDNN whenever the sizes allow it, whatever the mask (kernels.h).
    AttnShape sizes = *shape;
    sizes.mask = ATTN_CAUSAL, sizes.q_start = sizes.kv_start = 0;
    sizes.q_doc = sizes.kv_doc = NULL;
    AttnBuffers w;
    for (int backward = 0; backward < 2; backward++) {
        AttnPlan *p = attn_plan(sizes, backward);
        size_t need = p ? attn_buffers(&w, NULL, p) : 0;
        bytes = need > bytes ? need : bytes;
    }
    return bytes;
}

void cuda_attention_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, const AttnShape *shape, void *workspace) {
    AttnShape s = *shape;
    AttnPlan *p = attn_plan(s, false);
    if (!p) {
        attn_fallback_forward(out, lse, q, k, v, s);
        return;
    }
    AttnBuffers w;
    attn_buffers(&w, workspace, p);
    size_t nq = (size_t)s.B * s.Tq * s.n_heads * s.head_dim;
    size_t nkv = (size_t)s.B * s.Tk * s.n_kv_heads * s.head_dim;
    cuda_to_bf16(w.q, q, nq);
    cuda_to_bf16(w.k, k, nkv);
    cuda_to_bf16(w.v, v, nkv);
    int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    void *pointers[] = {w.q, w.k, w.v, w.o, lse, &p->scalars[0], &p->scalars[1]};
    attn_execute(p, uids, pointers, 7, w.plan);
    cuda_from_bf16(out, w.o, nq);
}

void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, const float *out, const float *lse,
                             const AttnShape *shape, void *workspace) {
    AttnShape s = *shape;
    AttnPlan *p = attn_plan(s, true);
    if (!p) {
        attn_fallback_backward(dq, dk, dv, dout, q, k, v, out, lse, s, workspace);
        return;
    }
    AttnBuffers w;
    attn_buffers(&w, workspace, p);
    size_t nq = (size_t)s.B * s.Tq * s.n_heads * s.head_dim;
    size_t nkv = (size_t)s.B * s.Tk * s.n_kv_heads * s.head_dim;
    cuda_to_bf16(w.q, q, nq);
    cuda_to_bf16(w.k, k, nkv);
    cuda_to_bf16(w.v, v, nkv);
    cuda_to_bf16(w.o, out, nq);
    cuda_to_bf16(w.dout, dout, nq);
    // cuDNN before 9.6 required a zeroed dQ accumulator (cudnn-frontend cleared it); from 9.6
    // the engine does, and clearing it again is harmless.
    CUDA_CHECK(cudaMemsetAsync(w.dq_accum, 0, nq * sizeof(float), cuda_stream()));
    int64_t uids[] = {UID_Q,       UID_K,   UID_V,           UID_O,       UID_DO,
                      UID_STATS,   UID_DQ,  UID_DK,          UID_DV,      UID_SCALE,
                      UID_NEG_INF, UID_ONE, UID_SOFTMAX_SUM, UID_DQ_ACCUM};
    void *pointers[] = {w.q,         w.k,           w.v,           w.o,           w.dout,
                        (void *)lse, w.dq,          w.dk,          w.dv,          &p->scalars[0],
                        &p->scalars[1], &p->scalars[2], w.softmax_sum, w.dq_accum};
    attn_execute(p, uids, pointers, 14, w.plan);
    attn_accumulate(dq, w.dq, nq);
    attn_accumulate(dk, w.dk, nkv);
    attn_accumulate(dv, w.dv, nkv);
}
