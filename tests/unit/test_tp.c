// Tensor parallelism (MPI; also a plain unit test on 1 rank): the llama3 TP plan with sequence
// parallel over every rank of the job, against the 1-rank model on the same batch. The loss
// must match within 1e-6 relative and every local grad the same slice of the 1-rank grad
// within 1e-5 (relative to the largest 1-rank grad of that parameter), with and without loss
// parallel and activation checkpointing; the tp init is the 1-rank init's slices exactly, the
// grad norm helper gives the 1-rank norm, the tp group's bytes are the documented volume, and
// the activation arena's sizing pass counts a tp step exactly. A MoE layer's grads laid out
// under ep x tp (and FSDP) sum over tp and give the 1-rank norm: an expert weight sharded over
// ep is no tp replica.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/token_batch.h"
#include "models/llama3/llama3.h"
#include "parallel/ep/ep.h"
#include "parallel/grads.h"
#include "parallel/tp.h"

#include "moe_support.h"

#define ROWS_B 2
#define SEQ_T 16
#define SEED 7

static CommGroup *world;

typedef struct {
    LlamaArgs args;
    Model m;
    Tp tp;
    Arena params, grads, acts;
    double loss;
    uint64_t tp_bytes;  // the tp group's bytes over forward, backward and the grad sum
} Run;

static int tokens[ROWS_B * SEQ_T], targets[ROWS_B * SEQ_T], pos[SEQ_T];

// The same batch on every rank (a tp group shares its data-parallel rank's batch).
static void make_batch(int vocab) {
    for (int i = 0; i < ROWS_B * SEQ_T; i++) {
        tokens[i] = (int)((i * 7919u + 13u) % (unsigned)vocab);
        targets[i] = (int)((i * 104729u + 5u) % (unsigned)vocab);
    }
    for (int t = 0; t < SEQ_T; t++) pos[t] = t;
}

// Builds, (for tp) parallelizes, allocates and initialises flavor, then runs one forward and
// backward and, for tp, the step's replicated-grad sum. chunk: the head's loss_chunk_rows.
static void run(Run *r, const char *flavor, bool tp, bool loss_parallel, bool ac, int chunk) {
    const KernelOps *k = kernels_backend("cpu");
    assert_true(llama3_flavor(flavor, &r->args));
    r->args.max_seq_len = SEQ_T;
    r->args.loss_chunk_rows = chunk;
    decoder_build(&r->m, &r->args, ac);
    if (tp) {
        tp_init(&r->tp, world, kernels_backend("cpu"), loss_parallel);
        decoder_parallelize_tp(&r->m, &r->tp);
    }
    model_allocate(&r->m, model_activation_bytes(&r->m, k, ROWS_B, SEQ_T), &r->params, &r->grads,
                   &r->acts, NULL);
    params_initialize(&r->m.params, SEED);
    make_batch(r->args.vocab_size);
    TokenBatch batch = {.tokens = tokens, .targets = targets, .pos = pos};
    StepCtx s = {.k = k, .act = &r->acts, .B = ROWS_B, .T = SEQ_T, .input = &batch,
                 .loss_scale = 1.0f};
    uint64_t before = comm_bytes(world);
    ArenaBytes planned = r->acts.peak;
    r->acts.peak = (ArenaBytes){0};
    r->loss = model_forward_backward(&r->m, &s);
    if (tp) grads_reduce_replicated(&r->m.params, r->tp.group);
    r->tp_bytes = comm_bytes(world) - before;
    // the sizing pass counted the tp step exactly, dtype by dtype
    assert_memory_equal(&r->acts.peak, &planned, sizeof planned);
}

static void unrun(Run *r) {
    arena_free(&r->params);
    arena_free(&r->grads);
    arena_free(&r->acts);
    decoder_free(&r->m);
}

// The largest |local - reference slice| over p, relative to the reference's largest |value|
// (of data when grads is false).
// Whether p's placement over the tp group (of n ranks) is Shard(dim), or Replicate for
// TP_REPLICATE; on one rank there is none (a group of one is no placement).
static bool placed_on_tp(const Param *p, int dim, int n) {
    const Placement *pl = param_placement_on(p, MESH_TP);
    if (n == 1) return pl == NULL;
    if (!pl) return false;
    return dim == TP_REPLICATE ? pl->kind == PLACE_REPLICATE
                               : pl->kind == PLACE_SHARD && pl->dim == dim;
}

static double slice_error(const Param *p, const Param *ref, bool grads) {
    const float *x = grads ? p->grad : p->data, *y = grads ? ref->grad : ref->data;
    ParamBox b = param_box(p, false);
    double err = 0, scale = 0;
    for (size_t i = 0; i < ref->numel; i++) scale = fmax(scale, fabs(y[i]));
    for (size_t i = 0; i < p->numel; i++)
        err = fmax(err, fabs(x[i] - y[param_global_index(p, &b, i)]));
    return scale > 0 ? err / scale : err;
}

// The worst slice_error over every parameter and rank (so every rank asserts the same value).
static double worst_error(Run *tp, Run *ref, bool grads) {
    double worst = 0;
    for (int i = 0; i < tp->m.params.count; i++) {
        Param *p = &tp->m.params.items[i];
        Param *q = params_find(&ref->m.params, p->name);
        assert_non_null(q);
        double e = slice_error(p, q, grads);
        if (e > 1e-5) print_message("rank %d: %s error %.3g\n", comm_rank(world), p->name, e);
        worst = fmax(worst, e);
    }
    return comm_all_reduce_double(world, worst, COMM_MAX);
}

// Bytes the tp group's operations take in one microbatch's forward and backward plus the
// step's replicated-grad sum, in comm.h's accounting (each operation's local input): every
// gather of rows (rows x D) and reduce-scatter of all rows (BT x D) once per seam (embedding,
// 2 per layer forward and again backward, 3 more under checkpointing's re-run forward, the
// head), the loss statistics (3 BT floats) or the gathered logits (BT x V/tp; twice when a
// chunked head recomputes them in backward), the norms' grads (replicated over a group of
// more than one rank: on one rank they have no placement and nothing to sum).
static uint64_t tp_volume(const LlamaArgs *a, int tp, bool loss_parallel, bool ac) {
    uint64_t BT = ROWS_B * SEQ_T, rows = BT / tp, D = a->dim, L = a->n_layers;
    uint64_t seams = 2 + 4 * L + (ac ? 2 * L : 0);
    uint64_t gathers = a->loss_chunk_rows > 0 && (uint64_t)a->loss_chunk_rows < BT ? 2 : 1;
    uint64_t loss = loss_parallel ? 3 * BT : gathers * BT * a->vocab_size / tp;
    uint64_t replicated = tp > 1 ? (2 * L + 1) * D : 0;
    return 4 * (seams * (BT + rows) * D + loss + replicated);
}

static void check_case(const char *flavor, bool loss_parallel, bool ac, int chunk) {
    Run ref, tp;
    run(&ref, flavor, false, false, false, 0);
    run(&tp, flavor, true, loss_parallel, ac, chunk);
    double loss_err = fabs(tp.loss - ref.loss) / fabs(ref.loss);
    assert_true(comm_all_reduce_double(world, loss_err, COMM_MAX) <= 1e-6);
    assert_true(worst_error(&tp, &ref, true) <= 1e-5);
    assert_int_equal(ref.tp_bytes, 0);
    assert_int_equal(tp.tp_bytes, tp_volume(&tp.args, comm_size(world), loss_parallel, ac));
    unrun(&ref);
    unrun(&tp);
}

static void test_small(void **state) {
    (void)state;
    check_case("small", true, false, 0);
}

static void test_small_no_loss_parallel(void **state) {
    (void)state;
    check_case("small", false, false, 0);
}

static void test_small_checkpointed(void **state) {
    (void)state;
    check_case("small", true, true, 0);
    check_case("small", false, true, 0);
}

// The head in chunks of 7 rows (logits recomputed in backward), with and without loss parallel.
static void test_small_chunked_head(void **state) {
    (void)state;
    check_case("small", true, false, 7);
    check_case("small", false, false, 7);
}

static void test_debugmodel(void **state) {
    (void)state;
    check_case("debugmodel", true, false, 0);
    check_case("debugmodel", false, true, 0);
}

// A shard's initial values are the 1-rank values of its slice, bit for bit; the shards' local
// shapes are the plan's; the grad norm over the shards is the 1-rank norm.
static void test_init_shapes_and_norm(void **state) {
    (void)state;
    Run ref, tp;
    run(&ref, "small", false, false, false, 0);
    run(&tp, "small", true, true, false, 0);
    assert_true(worst_error(&tp, &ref, false) == 0);
    int n = comm_size(world);
    Param *wq = params_find(&tp.m.params, "layers.1.attention.wq.weight");
    Param *w2 = params_find(&tp.m.params, "layers.1.feed_forward.w2.weight");
    Param *emb = params_find(&tp.m.params, "tok_embeddings.weight");
    Param *norm = params_find(&tp.m.params, "layers.1.ffn_norm.weight");
    assert_true(wq->shape[0] * n == wq->global_shape[0] && wq->shape[1] == wq->global_shape[1]);
    assert_true(w2->shape[1] * n == w2->global_shape[1] && placed_on_tp(w2, 1, n));
    assert_true(emb->shape[0] * n == emb->global_shape[0] && placed_on_tp(emb, 0, n));
    assert_true(placed_on_tp(norm, TP_REPLICATE, n) &&
                norm->numel == (size_t)norm->global_shape[0]);
    const KernelOps *k = kernels_backend("cpu");
    double want = k->sum_squares(ref.m.params.grad, ref.m.params.numel);
    double got = grads_sum_squares(k, &tp.m.params, NULL, tp.tp.group, NULL);
    assert_true(fabs(got - want) / want <= 1e-5);
    unrun(&ref);
    unrun(&tp);
}

// ---- a MoE layer's gradient under ep x tp ---------------------------------------------------

// Layouts (world, dp_shard, tp, ep): the sparse region dp_shard x tp cut into ep x efsdp, ep
// within tp, equal to it, or across dp_shard.
static const struct { int world, dp_shard, tp, ep; } EP_TP[] = {
    {2, 1, 2, 2}, {4, 2, 2, 2}, {4, 2, 2, 4}, {4, 1, 4, 2}};

// The step's whole gradient of parameter i's element `global`: the same on every layout.
static float whole_grad(int i, size_t global) {
    return (float)((global * 2654435761u + (size_t)i * 40503u) % 2001) / 1000.0f - 1.0f;
}

// A MoE layer's parameters (router, routed and shared experts) laid out as the trainer lays
// them on mesh: the decoder's plan replicates them all over tp with partial grads
// (models/decoder/parallelize.c), expert parallel shards the routed experts over ep (rank:
// the sparse index % ep), FSDP the dense ones over fsdp and the experts over efsdp.
static void moe_place(MoeBare *b, const Mesh *mesh) {
    const MeshLayout *l = &mesh->layout;
    Tp tp;
    tp_plan(&tp, mesh->coord[MESH_TP], l->size[MESH_TP], true);
    Param *params[MOE_MAX_PARAMS];
    int n = moe_layer_params(&b->m, params);
    for (int i = 0; i < n; i++) tp_shard(&tp, &b->t, params[i], TP_REPLICATE);
    int sparse = mesh_sparse_index(l, mesh->coord);
    ep_place(&b->t, l->ep, sparse % l->ep);
    for (int i = 0; i < b->t.count; i++) {
        Param *p = &b->t.items[i];
        Placement dense = {.kind = PLACE_SHARD_PADDED, .group = MESH_GROUP_FSDP,
                           .size = l->size[MESH_DP_SHARD], .rank = comm_rank(mesh->fsdp)};
        Placement expert = {.kind = PLACE_SHARD_PADDED, .group = MESH_GROUP_EFSDP,
                            .size = mesh_sparse_size(l) / l->ep, .rank = sparse / l->ep};
        params_place(&b->t, p, p->expert ? expert : dense);
    }
}

// Each element of this rank's shards as the backward and FSDP's reduce-scatter leave it: a
// routed expert's whole (every token routed to it came through the ep group), a dense
// parameter's this tp rank's share (its rows' under sequence parallel), the shares summing to
// the whole. *want (laid out as the shards, padding 0): the whole gradient's elements.
static float *moe_shard_grads(const ParamTable *t, int tp_rank, int tp, float **want) {
    float *g = calloc(t->shard_numel + 1, sizeof(float));
    *want = calloc(t->shard_numel + 1, sizeof(float));
    float share = (float)(tp_rank + 1) / (float)(tp * (tp + 1) / 2);
    for (int i = 0; i < t->count; i++) {
        const Param *p = &t->items[i];
        ParamBox box = param_box(p, true);
        for (size_t j = 0; j < box_numel(&box); j++) {
            float whole = whole_grad(i, param_global_index(p, &box, j));
            (*want)[p->shard_offset + j] = whole;
            g[p->shard_offset + j] = p->expert ? whole : whole * share;
        }
    }
    return g;
}

// On every layout the world allows, the tp sum of the replicated grads leaves each shard the
// whole gradient's, and the global norm (grads_sum_squares over fsdp and tp) counts each
// element of the 1-rank layer's gradient once: an expert weight is no tp replica (ep took tp's
// ranks), so it is neither summed over tp nor divided by its size.
static void test_moe_grad_norm_under_ep(void **state) {
    (void)state;
    const KernelOps *k = kernels_backend("cpu");
    MoeBare whole = {.args = {.dim = 4, .hidden = 3, .shared_hidden = 2,
                              .router = {.n_experts = 8, .top_k = 2,
                                         .score_func = MOE_SCORE_SOFTMAX, .route_scale = 1}}};
    moe_bare_init(&whole);
    double want = 0;
    for (int i = 0; i < whole.t.count; i++)
        for (size_t j = 0; j < whole.t.items[i].numel; j++)
            want += (double)whole_grad(i, j) * whole_grad(i, j);
    int checked = 0;
    for (size_t c = 0; c < sizeof EP_TP / sizeof EP_TP[0]; c++) {
        if (EP_TP[c].world != comm_size(world)) continue;
        MeshLayout layout;
        char err[256];
        int degrees[MESH_NDIMS] = {1, 1, EP_TP[c].dp_shard, 1, EP_TP[c].tp};
        assert_true(mesh_plan(&layout, degrees, EP_TP[c].world, err, sizeof err));
        assert_true(mesh_plan_experts(&layout, EP_TP[c].ep, err, sizeof err));
        Mesh mesh;
        mesh_build(&mesh, &layout);
        MoeBare b = {.args = whole.args};
        moe_bare_init(&b);
        moe_place(&b, &mesh);
        float *want_shard;
        b.t.shard_grad = moe_shard_grads(&b.t, mesh.coord[MESH_TP], EP_TP[c].tp, &want_shard);
        CommGroup *tp = mesh.group[MESH_TP];
        grads_reduce_replicated(&b.t, tp);
        for (size_t j = 0; j < b.t.shard_numel; j++)
            if (fabsf(b.t.shard_grad[j] - want_shard[j]) > 1e-6f)
                fail_msg("dp_shard %d x tp %d, ep %d: rank %d's shard grad[%zu] %g, whole %g",
                         EP_TP[c].dp_shard, EP_TP[c].tp, EP_TP[c].ep, comm_rank(world), j,
                         b.t.shard_grad[j], want_shard[j]);
        double got = grads_sum_squares(k, &b.t, mesh.fsdp, tp, NULL);
        if (fabs(got - want) > 1e-6 * want)
            fail_msg("dp_shard %d x tp %d, ep %d: squared grad norm %.9g, 1-rank %.9g",
                     EP_TP[c].dp_shard, EP_TP[c].tp, EP_TP[c].ep, got, want);
        free(b.t.shard_grad), free(want_shard);
        moe_bare_free(&b);
        checked++;
    }
    assert_true(checked > 0 || comm_size(world) == 1);
    moe_bare_free(&whole);
}

static void test_divisibility(void **state) {
    (void)state;
    LlamaArgs a;
    char err[256];
    assert_true(llama3_flavor("small", &a));
    assert_null(decoder_tp_check(&a, 4, 2, 16, err, sizeof err));
    const char *want = "parallelism.tensor_parallel_degree 8 does not divide model n_kv_heads (4)";
    assert_string_equal(decoder_tp_check(&a, 8, 2, 16, err, sizeof err), want);
    assert_non_null(strstr(decoder_tp_check(&a, 4, 1, 6, err, sizeof err), "(6)"));
    a.vocab_size = 2050;
    assert_non_null(strstr(decoder_tp_check(&a, 4, 2, 16, err, sizeof err), "vocab_size (2050)"));
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    world = comm_world();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_divisibility),
        cmocka_unit_test(test_init_shapes_and_norm),
        cmocka_unit_test(test_moe_grad_norm_under_ep),
        cmocka_unit_test(test_small),
        cmocka_unit_test(test_small_no_loss_parallel),
        cmocka_unit_test(test_small_checkpointed),
        cmocka_unit_test(test_small_chunked_head),
        cmocka_unit_test(test_debugmodel),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    comm_finalize();
    return failed;
}
