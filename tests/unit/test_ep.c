// Expert parallel (MPI; also a plain unit test on 1 rank): the sparse mesh's ep and efsdp
// groups against hand-written membership tables for every layout the world size allows, the
// ExpertHooks' dispatch and combine of tagged rows over the ep group, the checks, placements
// and memory bound of parallel/ep, checkpoints of expert weights resharded between the
// world's layout and one rank's, and a MoE layer (models/moe) with its experts split over the
// world against the whole layer.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/train_state.h"
#include "parallel/ep/ep.h"
#include "parallel/mesh.h"

#include "moe_support.h"

static CommGroup *world;

typedef struct {
    int world_size;
    int degrees[MESH_NDIMS];  // pp, dp_replicate, dp_shard, cp, tp
    int ep;
    // The groups as world ranks in group-rank order, '|' between groups ("" : no group).
    const char *ep_groups, *efsdp_groups;
} LayoutCase;

// The members of rank's group in groups ("01|23"), as world ranks in group-rank order.
static int expected_members(const char *groups, int rank, int *members) {
    for (const char *g = groups; *g;) {
        int n = 0;
        bool mine = false;
        for (; *g && *g != '|'; g++) {
            members[n] = *g - '0';
            mine = mine || members[n] == rank;
            n++;
        }
        if (mine) return n;
        if (*g == '|') g++;
    }
    return 0;
}

static void check_group(CommGroup *g, const char *groups, const char *what) {
    int want[8], n = expected_members(groups, comm_rank(world), want);
    if (n == 0) {
        assert_null(g);
        return;
    }
    assert_non_null(g);
    assert_int_equal(comm_size(g), n);
    float me = (float)comm_rank(world), got[8];
    comm_all_gather(g, &me, got, 1);
    for (int i = 0; i < n; i++) {
        if ((int)got[i] != want[i])
            fail_msg("%s group of rank %d: member %d is rank %d, expected %d", what,
                     comm_rank(world), i, (int)got[i], want[i]);
    }
}

// ep is the sparse region (dp_shard, cp, tp flattened, tp fastest) unflattened as (efsdp, ep)
// with ep fastest: it takes tp's ranks first, as torchtitan's. (Each layout builds ten groups
// of the 64 a process may have.)
static const LayoutCase LAYOUTS[] = {
    {1, {1, 1, 1, 1, 1}, 1, "", ""},
    {2, {1, 1, 2, 1, 1}, 2, "01", "0|1"},
    {2, {1, 1, 1, 1, 2}, 2, "01", "0|1"},
    {2, {1, 2, 1, 1, 1}, 1, "", ""},
    {4, {1, 1, 4, 1, 1}, 2, "01|23", "02|13"},
    {4, {1, 1, 2, 1, 2}, 2, "01|23", "02|13"},
    {4, {1, 1, 2, 1, 2}, 4, "0123", "0|1|2|3"},
    {4, {1, 1, 1, 2, 2}, 2, "01|23", "02|13"},
    {4, {1, 2, 2, 1, 1}, 2, "01|23", "0|1|2|3"},
    {4, {2, 1, 2, 1, 1}, 2, "01|23", "0|1|2|3"},
};

static void test_mesh_groups(void **state) {
    (void)state;
    int checked = 0;
    for (size_t i = 0; i < sizeof LAYOUTS / sizeof LAYOUTS[0]; i++) {
        const LayoutCase *c = &LAYOUTS[i];
        if (c->world_size != comm_size(world)) continue;
        MeshLayout layout;
        char err[256];
        assert_true(mesh_plan(&layout, c->degrees, c->world_size, err, sizeof err));
        assert_true(mesh_plan_experts(&layout, c->ep, err, sizeof err));
        Mesh m;
        mesh_build(&m, &layout);
        check_group(m.ep, c->ep_groups, "ep");
        check_group(m.efsdp, c->efsdp_groups, "efsdp");
        checked++;
    }
    assert_true(checked > 0 || comm_size(world) > 4);
}

static void test_plan_refuses_non_divisors(void **state) {
    (void)state;
    MeshLayout layout;
    char err[256];
    int degrees[MESH_NDIMS] = {1, 1, 3, 1, 2};
    assert_true(mesh_plan(&layout, degrees, 6, err, sizeof err));
    assert_true(mesh_plan_experts(&layout, 3, err, sizeof err));
    assert_int_equal(layout.ep, 3);
    assert_false(mesh_plan_experts(&layout, 4, err, sizeof err));
    assert_string_equal(err, "parallelism.expert_parallel_degree = 4 must divide dp_shard 3 x "
                             "cp 1 x tp 2 = 6: the experts are sharded over ep and FSDP-sharded "
                             "over the rest");
}

enum { E = 8, DIM = 3 };

// How many rows rank r routes to expert e: uneven, none for some pairs.
static int routed(int r, int e) { return (3 * r + 5 * e) % 4; }

// Row j of rank r's slots for expert e, tagged so that wherever it lands it says where it
// came from.
static void tag_row(float *row, int r, int e, int j) {
    row[0] = (float)r, row[1] = (float)e, row[2] = (float)j;
}

// Every rank sorts its rows by global expert, dispatches them through the hooks and checks
// that it holds, from each rank in rank order, that rank's rows of its own experts in expert
// order; then the combine sends them back and each rank must get its own rows in place.
static void test_dispatch_and_combine(void **state) {
    (void)state;
    CommGroup *group = comm_split(world, 0, comm_rank(world), "ep");
    Ep ep;
    ep_init(&ep, group);
    int size = ep.size, me = ep.rank, local = E / size;
    int counts[E], recv_counts[E], send_rows[8] = {0}, recv_rows[8] = {0}, n_send = 0;
    for (int e = 0; e < E; e++) {
        counts[e] = routed(me, e);
        send_rows[e / local] += counts[e];
        n_send += counts[e];
    }
    uint64_t before = comm_bytes(group);
    ep.hooks.exchange_counts(&ep.hooks, counts, recv_counts, E);
    int n_recv = 0;
    for (int src = 0; src < size; src++) {
        for (int i = 0; i < local; i++) {
            assert_int_equal(recv_counts[src * local + i], routed(src, me * local + i));
            recv_rows[src] += recv_counts[src * local + i];
        }
        n_recv += recv_rows[src];
    }
    float *src = calloc((size_t)(n_send + 1) * DIM, sizeof(float));
    float *dst = calloc((size_t)(n_recv + 1) * DIM, sizeof(float));
    float *back = calloc((size_t)(n_send + 1) * DIM, sizeof(float));
    int at = 0;
    for (int e = 0; e < E; e++)
        for (int j = 0; j < counts[e]; j++) tag_row(src + (size_t)at++ * DIM, me, e, j);
    ep.hooks.all_to_all(&ep.hooks, dst, recv_rows, src, send_rows, DIM);
    at = 0;
    for (int r = 0; r < size; r++)
        for (int i = 0; i < local; i++)
            for (int j = 0; j < routed(r, me * local + i); j++, at++) {
                float want[DIM];
                tag_row(want, r, me * local + i, j);
                assert_memory_equal(dst + (size_t)at * DIM, want, sizeof want);
            }
    ep.hooks.all_to_all(&ep.hooks, back, send_rows, dst, recv_rows, DIM);
    // comm_bytes: the counts (E ints) and each all-to-all's whole send buffer
    assert_int_equal(comm_bytes(group) - before,
                     sizeof(int) * E + sizeof(float) * DIM * (uint64_t)(n_send + n_recv));
    assert_memory_equal(back, src, (size_t)n_send * DIM * sizeof(float));
    free(src), free(dst), free(back);
    ep_free(&ep);
}

static int add_expert(ParamTable *t, int64_t n_experts, const char *name) {
    int64_t shape[3] = {n_experts, 4, 2};
    int i = params_add(t, INIT_NORMAL, 0.02, 3, shape, "%s", name);
    t->items[i].expert = true;
    return i;
}

static void test_check_and_place(void **state) {
    (void)state;
    ParamTable t;
    char err[256];
    params_init(&t, 4);
    int64_t dense[2] = {8, 4};
    params_add(&t, INIT_NORMAL, 0.02, 2, dense, "layers.0.moe.router.gate.weight");
    assert_true(ep_check(&t, 1, err, sizeof err));
    assert_false(ep_check(&t, 2, err, sizeof err));
    assert_string_equal(err, "parallelism.expert_parallel_degree = 2: the model has no routed "
                             "experts to shard");
    int w1 = add_expert(&t, 8, "layers.0.moe.experts.w1");
    assert_true(ep_check(&t, 4, err, sizeof err));
    assert_false(ep_check(&t, 3, err, sizeof err));
    assert_string_equal(err, "parallelism.expert_parallel_degree = 3 must divide the model's 8 "
                             "experts (layers.0.moe.experts.w1)");
    ep_place(&t, 4, 3);
    const Param *p = &t.items[w1];
    ParamBox box = param_box(p, false);
    assert_int_equal(box_start(&box, 0), 6);
    assert_int_equal(box.count[0], 2);
    assert_int_equal(box.count[1], 4);
    assert_int_equal(p->numel, 2 * 4 * 2);
    assert_null(param_placement_on(&t.items[0], MESH_GROUP_EP));
    assert_int_equal(t.items[0].numel, 8 * 4);
    params_free(&t);
}

// The worst routing for rank 0, counted expert by expert: each source sends it all its tokens
// for min(k, E / ep) of its experts, at most `capacity` slots to each (0: no cap).
static int64_t worst_recv(int ep, int rows, int k, int n_experts, int capacity) {
    int local = n_experts / ep;
    int64_t per_expert = rows;
    if (capacity > 0 && capacity < per_expert) per_expert = capacity;
    int64_t per_source = 0;
    for (int e = 0; e < local; e++) per_source += per_expert;
    int64_t by_tokens = (int64_t)rows * (k < local ? k : local);
    return (int64_t)ep * (per_source < by_tokens ? per_source : by_tokens);
}

static void test_recv_bound(void **state) {
    (void)state;
    assert_int_equal(ep_recv_rows_bound(4, 16, 2, 8, 0), 4 * 16 * 2);
    assert_int_equal(ep_recv_rows_bound(8, 16, 2, 8, 0), 8 * 16 * 1);
    assert_int_equal(ep_recv_rows_bound(1, 16, 2, 8, 0), 16 * 2);
    // capacity ceil(1.0 * 16 * 2 / 8) = 4 slots per expert and source: 4 * 2 local experts
    assert_int_equal(ep_recv_rows_bound(4, 16, 2, 8, 1.0), 4 * 8);
    assert_int_equal(ep_recv_rows_bound(4, 16, 2, 8, 1.0), worst_recv(4, 16, 2, 8, 4));
    assert_int_equal(ep_recv_rows_bound(2, 16, 6, 8, 0), worst_recv(2, 16, 6, 8, 0));
    assert_int_equal(ep_recv_rows_bound(2, 16, 6, 8, 8.0), worst_recv(2, 16, 6, 8, 96));
    // 2 ranks, 16 rows, k 2 of 8 experts, dim 4: a forward sends 32 slots and the 8 counts,
    // then 32 (balanced) or up to 64 rows back; the backward the same rows.
    EpEstimate e = ep_estimate(2, 16, 2, 8, 4, 0, false);
    assert_int_equal(e.recv_rows_bound, 64);
    assert_int_equal(e.expected_bytes, 4 * 8 + 2 * (32 + 32) * 16);
    assert_int_equal(e.bound_bytes, 4 * 8 + 2 * (32 + 64) * 16);
    e = ep_estimate(2, 16, 2, 8, 4, 0, true);  // activation checkpointing: two forwards
    assert_int_equal(e.bound_bytes, 2 * 4 * 8 + 3 * (32 + 64) * 16);
}

enum { N_STACK = 6 };  // experts: ep 2 x efsdp 2 pads their 3 per ep rank to 2 + 1
static const uint64_t SEED = 77;

// A router's dense (5, 4) weight as FSDP places it over a dp_shard group of fsdp ranks, and a
// (6, 3, 2) expert stack Shard(0) over ep, then FSDP's padded shard over efsdp = fsdp / ep;
// rank is this rank's index in the sparse region. shard_data filled from SEED when fill.
static void moe_table(ParamTable *t, int fsdp, int ep, int rank, bool fill) {
    params_init(t, 2);
    int64_t dense[2] = {5, 4}, stack[3] = {N_STACK, 3, 2};
    params_add(t, INIT_NORMAL, 0.02, 2, dense, "layers.0.moe.router.gate.weight");
    params_add(t, INIT_NORMAL, 0.02, 3, stack, "layers.0.moe.experts.w1");
    t->items[1].expert = true;
    ep_place(t, ep, rank % ep);
    params_place(t, &t->items[0], (Placement){.kind = PLACE_SHARD_PADDED, .group = MESH_GROUP_FSDP,
                                              .size = fsdp, .rank = rank});
    params_place(t, &t->items[1], (Placement){.kind = PLACE_SHARD_PADDED,
                                              .group = MESH_GROUP_EFSDP, .size = fsdp / ep,
                                              .rank = rank / ep});
    t->shard_data = calloc(t->shard_numel + 1, sizeof(float));
    if (fill) params_initialize(t, SEED);
}

static void table_free(ParamTable *t) {
    free(t->shard_data);
    params_free(t);
}

// Saved by the world (ep = 2 when it has 2 or 4 ranks), loaded by one rank as whole tensors;
// saved by one rank, loaded into every rank's shards: the values are the initial ones.
static void test_checkpoint_reshard(void **state) {
    (void)state;
    int n = comm_size(world), rank = comm_rank(world), ep = n % 2 == 0 ? 2 : 1;
    char dir[64] = "/tmp/titan-test-ep.XXXXXX", sharded_path[96], whole_path[96];
    if (rank == 0) assert_non_null(mkdtemp(dir));
    comm_broadcast(world, dir, sizeof dir, 0);
    snprintf(sharded_path, sizeof sharded_path, "%s/sharded.h5", dir);
    snprintf(whole_path, sizeof whole_path, "%s/whole.h5", dir);
    ParamTable sharded, whole, want_whole, loaded;
    moe_table(&sharded, n, ep, rank, true);
    if (n == 2 || n == 4) {  // the experts each rank holds: ep rank (rank % 2), then efsdp's
        static const int64_t start[2][4] = {{0, 3}, {0, 3, 2, 5}};
        static const int64_t count[2][4] = {{3, 3}, {2, 2, 1, 1}};
        ParamBox b = param_box(&sharded.items[1], true);
        assert_int_equal(box_start(&b, 0), start[n / 4][rank]);
        assert_int_equal(b.count[0], count[n / 4][rank]);
    }
    train_state_save(sharded_path, &sharded, NULL, (TrainProgress){0}, SEED, "", NULL, 0,
                     MPI_COMM_WORLD);
    moe_table(&whole, 1, 1, 0, false);
    moe_table(&want_whole, 1, 1, 0, true);
    train_state_load(sharded_path, &whole, NULL, NULL);
    assert_memory_equal(whole.shard_data, want_whole.shard_data,
                        whole.shard_numel * sizeof(float));
    if (rank == 0)
        train_state_save(whole_path, &want_whole, NULL, (TrainProgress){0}, SEED, "", NULL, 0,
                         MPI_COMM_SELF);
    comm_barrier(world);
    moe_table(&loaded, n, ep, rank, false);
    train_state_load(whole_path, &loaded, NULL, NULL);
    assert_memory_equal(loaded.shard_data, sharded.shard_data,
                        sharded.shard_numel * sizeof(float));
    comm_barrier(world);
    if (rank == 0) {
        unlink(sharded_path), unlink(whole_path);
        rmdir(dir);
    }
    table_free(&sharded), table_free(&whole), table_free(&want_whole), table_free(&loaded);
}

// ---- a MoE layer under expert parallel ---------------------------------------------------

enum { MOE_SEQS = 2, MOE_SEQ_LEN = 6, MOE_ROWS = MOE_SEQS * MOE_SEQ_LEN, MOE_DIM = 6,
       MOE_HIDDEN = 5 };

typedef MoeBare EpLayer;

static StepCtx ep_layer_step(EpLayer *L, const Ep *ep) {
    return (StepCtx){.k = kernels_backend("cpu"), .act = &L->act, .B = MOE_SEQS,
                     .T = MOE_SEQ_LEN, .loss_scale = 1, .ep = ep ? &ep->hooks : NULL};
}

// E experts, top 2 of softmax scores (moe_bare_init's weights: routing far from ties); under
// ep only this rank's E / ep experts (ep_place), their weights copied from whole's.
static void ep_layer_make(EpLayer *L, const Ep *ep, const EpLayer *whole) {
    memset(L, 0, sizeof *L);
    L->args = (MoeArgs){.dim = MOE_DIM, .hidden = MOE_HIDDEN,
                        .router = {.n_experts = E, .top_k = 2, .score_func = MOE_SCORE_SOFTMAX,
                                   .route_scale = 1}};
    moe_bare_init(L);
    if (ep) ep_place(&L->t, ep->size, ep->rank);
    moe_bare_allocate(L);
    if (!whole) params_initialize(&L->t, 11);
    for (int i = 0; whole && i < L->t.count; i++) {
        Param *p = &L->t.items[i];
        size_t at = p->expert ? (size_t)ep->rank * p->numel : 0;
        memcpy(p->data, whole->t.items[i].data + at, p->numel * sizeof(float));
    }
    moe_bare_commit_act(L, ep_layer_step(L, ep), MOE_ROWS);
}

// y = the layer on x, dx and the weights' grads (zeroed first) of sum(y * r).
static void ep_layer_run(EpLayer *L, const Ep *ep, const float *x, const float *r, float *y,
                         float *dx) {
    StepCtx s = ep_layer_step(L, ep);
    MoeSaved sv;
    memset(y, 0, MOE_ROWS * MOE_DIM * sizeof(float));
    memset(dx, 0, MOE_ROWS * MOE_DIM * sizeof(float));
    for (int i = 0; i < L->t.count; i++)
        memset(L->t.items[i].grad, 0, L->t.items[i].numel * sizeof(float));
    moe_forward(&L->m, &s, &sv, x, y, MOE_ROWS);
    moe_backward(&L->m, &s, &sv, x, r, dx, MOE_ROWS);
    arena_release(&L->act, 0);
}

static void assert_near(const float *got, const float *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (fabsf(got[i] - want[i]) > 1e-5f * (1 + fabsf(want[i])))
            fail_msg("rank %d, %s[%zu]: %g, expected %g", comm_rank(world), what, i, got[i],
                     want[i]);
}

// Every rank routes its own tokens through a MoE layer whose E experts are split over the
// world (2 local experts each on 4 ranks, fed by all 4): y and dx equal the whole layer's on
// the same tokens, the router's grads too, and the experts' grads the whole layer's summed
// over every rank's tokens. The rows arrive (source rank, local expert) and the grouped GEMMs
// take them (local expert, source rank): a slip there moves rows between experts.
static void test_moe_layer_under_ep(void **state) {
    (void)state;
    CommGroup *group = comm_split(world, 0, comm_rank(world), "ep");
    Ep ep;
    ep_init(&ep, group);
    EpLayer whole, split;
    ep_layer_make(&whole, NULL, NULL);
    ep_layer_make(&split, &ep, &whole);
    float x[MOE_ROWS * MOE_DIM], r[MOE_ROWS * MOE_DIM], y[MOE_ROWS * MOE_DIM],
        dx[MOE_ROWS * MOE_DIM], want_y[MOE_ROWS * MOE_DIM], want_dx[MOE_ROWS * MOE_DIM];
    uint64_t seed = 7 + (uint64_t)ep.rank;
    for (int i = 0; i < MOE_ROWS * MOE_DIM; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 11) / (double)(1ull << 53) * 2 - 1);
        r[i] = (float)(seed >> 40 & 0xff) / 128 - 1;
    }
    ep_layer_run(&whole, NULL, x, r, want_y, want_dx);
    ep_layer_run(&split, &ep, x, r, y, dx);
    assert_near(y, want_y, MOE_ROWS * MOE_DIM, "y");
    assert_near(dx, want_dx, MOE_ROWS * MOE_DIM, "dx");
    for (int i = 0; i < whole.t.count; i++) {
        Param *w = &whole.t.items[i], *p = &split.t.items[i];
        if (w->expert) comm_all_reduce(world, w->grad, w->numel, COMM_SUM);
        size_t at = w->expert ? (size_t)ep.rank * p->numel : 0;
        assert_near(p->grad, w->grad + at, p->numel, p->name);
    }
    moe_bare_free(&whole), moe_bare_free(&split);
    ep_free(&ep);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    world = comm_world();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mesh_groups),
        cmocka_unit_test(test_plan_refuses_non_divisors),
        cmocka_unit_test(test_dispatch_and_combine),
        cmocka_unit_test(test_check_and_place),
        cmocka_unit_test(test_recv_bound),
        cmocka_unit_test(test_checkpoint_reshard),
        cmocka_unit_test(test_moe_layer_under_ep),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    comm_finalize();
    return failed;
}
