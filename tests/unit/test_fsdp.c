// FSDP / HSDP against the 1-rank model (an MPI program; on 1 rank a plain unit test).
//
//   mpirun -np N test_fsdp [dp_replicate]    (dp_shard = N / dp_replicate)
//
// Every rank computes the 1-rank reference (the "small" llama3 on a fixed batch of B rows),
// then trains the same batch with FSDP, each dp rank on its B / dp rows, and checks: the
// gathered initial parameters equal the reference bit for bit; after forward/backward and
// fsdp_finish_step the shard grads equal the reference grads' rows (of the full-batch mean
// loss), so do the loss and the grad norm, for every reshard mode, with and without activation
// checkpointing and with two microbatches of gradient accumulation; the bytes each group
// counted equal fsdp_estimate's volume. With mixed precision, the bf16 all-gather gives the
// 1-rank step on bf16-rounded weights (to fp32 rounding) for half the bytes, and a bf16
// reduce-scatter the same grads within bf16 rounding. An uneven placement (3 ranks: padded
// rows) is checked on any rank count by planning for virtual ranks: each rank's boxes put
// together are the 1-rank tensors. With experts, each layer's feed-forward w1 and w3 play
// routed experts (Param.expert) sharded over another group of the same ranks in reverse order
// (as efsdp orders ranks its own way), w2 between them staying dense: the unit's two parts are
// packed, gathered and reduce-scattered apart and must give the same values.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "data/token_batch.h"
#include "models/llama3/llama3.h"
#include "optim/optim.h"
#include "parallel/fsdp.h"
#include "parallel/grads.h"
#include "parallel/mesh.h"

enum { B = 24, T = 8 };  // B divides into 1..4 dp ranks of two microbatches
static const uint64_t SEED = 1234;
static const double TOLERANCE = 1e-5;
static const double BF16_TOLERANCE = 1e-2;  // grads summed in bf16 (8 significant bits)

static int world_rank, failures;

#define EXPECT(cond, ...)                                                                      \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "rank %d: %s:%d: ", world_rank, __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

typedef struct {
    LlamaArgs args;
    Model m;
} Net;

static void net_build(Net *n, bool activation_checkpoint) {
    CHECK(llama3_flavor("small", &n->args));
    n->args.max_seq_len = T;
    decoder_build(&n->m, &n->args, activation_checkpoint);
}

static void net_free(Net *n) {
    decoder_free(&n->m);
}

typedef struct {
    int tokens[B * T], targets[B * T], pos[T];
    float *params, *grad;  // (numel) the 1-rank values
    size_t numel;
    double loss, grad_norm;
} Reference;

static void batch_make(Reference *r, int vocab) {
    for (int i = 0; i < B * T; i++) {
        r->tokens[i] = (int)((i * 7919u + 13) % (unsigned)vocab);
        r->targets[i] = (int)((i * 104729u + 5) % (unsigned)vocab);
    }
    for (int t = 0; t < T; t++) r->pos[t] = t;
}

// round_weights: the step runs on the weights rounded to bf16 (what a bf16 all-gather hands
// the model); r->params are the fp32 masters either way.
static void reference_compute(Reference *r, bool round_weights) {
    const KernelOps *k = kernels_backend("cpu");
    Net n;
    net_build(&n, false);
    batch_make(r, n.args.vocab_size);
    Arena params, grads, acts;
    model_allocate(&n.m, model_activation_bytes(&n.m, k, B, T), &params, &grads, &acts, NULL);
    params_initialize(&n.m.params, SEED);
    size_t numel = n.m.params.numel;
    r->params = xmalloc(numel * sizeof(float));
    memcpy(r->params, n.m.params.data, numel * sizeof(float));
    if (round_weights) {
        uint16_t *rounded = xmalloc(numel * sizeof(uint16_t));
        k->to_bf16(rounded, n.m.params.data, numel);
        k->from_bf16(n.m.params.data, rounded, numel);
        free(rounded);
    }
    TokenBatch batch = {.tokens = r->tokens, .targets = r->targets, .pos = r->pos};
    StepCtx s = {.k = k, .act = &acts, .B = B, .T = T, .input = &batch, .loss_scale = 1};
    r->loss = model_forward_backward(&n.m, &s);
    r->numel = numel;
    r->grad = xmalloc(r->numel * sizeof(float));
    memcpy(r->grad, n.m.params.grad, r->numel * sizeof(float));
    r->grad_norm = sqrt(k->sum_squares(r->grad, r->numel));
    arena_free(&params);
    arena_free(&grads);
    arena_free(&acts);
    net_free(&n);
}

static bool close_to(double got, double want, double tolerance) {
    return fabs(got - want) <= tolerance * fabs(want);
}

typedef struct {
    FsdpReshard reshard;
    bool activation_checkpoint;
    int microbatches;
    bool validate_first;  // a forward-only pass before the step (train/loop.c's validation)
    const char *name;
    bool bf16_params, bf16_reduce;  // FsdpConfig.precision: param, reduce bf16
    bool experts;  // w1, w3 as experts over efsdp (the fsdp ranks reversed)
    bool frozen;   // the embedding and attention weights frozen (Param.frozen, LoRA's base)
} Case;

static CommGroup *efsdp;  // the fsdp group's ranks in reverse order


// The embedding (a unit of its own: it then sends no gradient at all) and every attention
// weight, between trained parameters of their units.
static void mark_frozen(ParamTable *t) {
    for (int j = 0; j < t->count; j++)
        t->items[j].frozen = strstr(t->items[j].name, "tok_embeddings") ||
                             strstr(t->items[j].name, "attention.w");
}

static void mark_experts(ParamTable *t) {
    for (int j = 0; j < t->count; j++)
        t->items[j].expert = strstr(t->items[j].name, "feed_forward.w1") ||
                             strstr(t->items[j].name, "feed_forward.w3");
}

typedef struct {
    Net net;
    Fsdp f;
    Arena params, grads, comm, acts;
    TokenBatch input;  // the microbatch step_ctx hands the model
} Sharded;

static void sharded_build(Sharded *sh, const Mesh *mesh, const Case *c, int rows) {
    const KernelOps *k = kernels_backend("cpu");
    net_build(&sh->net, c->activation_checkpoint);
    if (c->experts) mark_experts(&sh->net.m.params);
    if (c->frozen) mark_frozen(&sh->net.m.params);
    int replicate = mesh->layout.size[MESH_DP_REPLICATE];
    FsdpConfig config = {.size = comm_size(mesh->fsdp), .rank = comm_rank(mesh->fsdp),
                         .replicate_size = replicate,
                         .replicate_rank = mesh->coord[MESH_DP_REPLICATE], .reshard = c->reshard,
                         .precision = {.param = c->bf16_params ? DTYPE_BF16 : DTYPE_FP32,
                                       .reduce = c->bf16_reduce ? DTYPE_BF16 : DTYPE_FP32},
                         .k = k};
    if (c->experts) {
        config.expert_size = comm_size(efsdp);
        config.expert_rank = comm_rank(efsdp);
    }
    fsdp_plan(&sh->f, &sh->net.m.params, sh->net.m.blocks, sh->net.m.n_blocks, &config);
    arena_init_sizing(&sh->params, "params");
    arena_init_sizing(&sh->grads, "grads");
    arena_init_sizing(&sh->comm, "comm");
    fsdp_allocate(&sh->f, &sh->params, &sh->grads, &sh->comm);
    arena_commit(&sh->params, NULL);
    arena_commit(&sh->grads, NULL);
    arena_commit(&sh->comm, NULL);
    fsdp_allocate(&sh->f, &sh->params, &sh->grads, &sh->comm);
    sh->net.m.hooks = fsdp_attach(&sh->f, mesh->fsdp, c->experts ? efsdp : NULL,
                                  replicate > 1 ? mesh->group[MESH_DP_REPLICATE] : NULL);
    arena_init_sizing(&sh->acts, "activations");
    arena_reserve(&sh->acts, model_activation_bytes(&sh->net.m, k, rows / c->microbatches, T));
    arena_commit(&sh->acts, NULL);
}

static void sharded_free(Sharded *sh) {
    fsdp_free(&sh->f);
    arena_free(&sh->params);
    arena_free(&sh->grads);
    arena_free(&sh->comm);
    arena_free(&sh->acts);
    net_free(&sh->net);
}

// This rank's shard grads against the reference grads' rows; padding must be exactly zero.
// The floats of p's shard box (its rows: FSDP shards dim 0) and where they start in p's
// 1-rank tensor.
static size_t box_of(const Param *p, size_t *first) {
    ParamBox b = param_box(p, true);
    *first = (size_t)box_start(&b, 0) * (p->numel / (size_t)p->shape[0]);
    return box_numel(&b);
}

// A frozen parameter has no shard grad (FSDP's leave it out).
static void check_grads(const Fsdp *f, const Reference *r, const char *name, double tolerance) {
    for (int j = 0; j < f->params->count; j++) {
        const Param *p = &f->params->items[j];
        if (p->frozen) {
            EXPECT(p->shard_grad_offset == SIZE_MAX, "%s: frozen %s has a gradient", name,
                   p->name);
            continue;
        }
        size_t first, n = box_of(p, &first);
        const float *want = r->grad + p->offset + first;
        const float *got = f->params->shard_grad + p->shard_grad_offset;
        double err = 0, scale = 0;
        for (size_t i = 0; i < n; i++) {
            err = fmax(err, fabs((double)got[i] - want[i]));
            scale = fmax(scale, fabs((double)want[i]));
        }
        EXPECT(err <= tolerance * scale, "%s: %s grad max error %g of %g", name, p->name, err,
               scale);
        for (size_t i = n; i < p->shard_numel; i++)
            EXPECT(got[i] == 0, "%s: %s padding grad %g", name, p->name, got[i]);
    }
}

static uint64_t volume_bytes(const FsdpVolume *v) {
    return v->all_gather_forward + v->all_gather_backward + v->reduce_scatter;
}

static void check_volume(const Fsdp *f, const Mesh *mesh, const Case *c, uint64_t fsdp_before,
                         uint64_t efsdp_before, uint64_t replicate_before) {
    FsdpEstimate e = fsdp_estimate(f);
    uint64_t want = (uint64_t)c->microbatches * volume_bytes(&e.fsdp);
    uint64_t got = comm_bytes(mesh->fsdp) - fsdp_before;
    EXPECT(got == want, "%s: fsdp group sent %llu bytes, plan %llu", c->name,
           (unsigned long long)got, (unsigned long long)want);
    want = (uint64_t)c->microbatches * volume_bytes(&e.efsdp);
    got = comm_bytes(efsdp) - efsdp_before;
    EXPECT(got == want, "%s: efsdp group sent %llu bytes, plan %llu", c->name,
           (unsigned long long)got, (unsigned long long)want);
    got = comm_bytes(mesh->group[MESH_DP_REPLICATE]) - replicate_before;
    EXPECT(got == e.replicate_all_reduce, "%s: dp_replicate sent %llu bytes, plan %llu", c->name,
           (unsigned long long)got, (unsigned long long)e.replicate_all_reduce);
}

static StepCtx step_ctx(Sharded *sh, const Reference *r, int first_row, int rows, float scale) {
    arena_release(&sh->acts, 0);
    TokenBatch whole = {.tokens = r->tokens, .targets = r->targets, .pos = r->pos};
    sh->input = token_batch_rows(&whole, first_row, T, T);
    return (StepCtx){.k = sh->f.config.k, .act = &sh->acts, .B = rows, .T = T,
                     .input = &sh->input, .loss_scale = scale};
}

static void forward_only(Sharded *sh, const Mesh *mesh, const Reference *r, int rows) {
    StepCtx s = step_ctx(sh, r, mesh_dp_rank(mesh) * rows, rows, 1);
    model_forward(&sh->net.m, &s);
}

// One step on this dp rank's rows; returns the dp-mean loss.
static double sharded_step(Sharded *sh, const Mesh *mesh, const Reference *r, const Case *c,
                           int rows) {
    int mb_rows = rows / c->microbatches, first = mesh_dp_rank(mesh) * rows;
    memset(sh->f.grad, 0, sh->f.grad_shard_numel * sizeof(float));
    double loss = 0;
    for (int mb = 0; mb < c->microbatches; mb++) {
        StepCtx s = step_ctx(sh, r, first + mb * mb_rows, mb_rows, 1.0f / c->microbatches);
        loss += model_forward_backward(&sh->net.m, &s) / c->microbatches;
    }
    fsdp_finish_step(&sh->f);
    return comm_all_reduce_double(mesh->dp, loss, COMM_AVG);
}

// r: the 1-rank reference, rounded: the same on bf16-rounded weights.
static void check_case(const Reference *r, const Reference *rounded, const Mesh *mesh,
                       const Case *c) {
    int rows = B / mesh_dp_size(&mesh->layout);
    Sharded sh;
    sharded_build(&sh, mesh, c, rows);
    params_initialize(&sh.net.m.params, SEED);
    float *full = xmalloc(r->numel * sizeof(float));
    fsdp_gather_full(&sh.f, full);
    EXPECT(memcmp(full, r->params, r->numel * sizeof(float)) == 0,
           "%s: gathered initial params differ from the 1-rank ones", c->name);

    if (c->validate_first) forward_only(&sh, mesh, r, rows);
    uint64_t fsdp_before = comm_bytes(mesh->fsdp), efsdp_before = comm_bytes(efsdp);
    uint64_t replicate_before = comm_bytes(mesh->group[MESH_DP_REPLICATE]);
    double loss = sharded_step(&sh, mesh, r, c, rows);
    // Units a forward-only pass left gathered are not gathered again.
    if (!c->validate_first)
        check_volume(&sh.f, mesh, c, fsdp_before, efsdp_before, replicate_before);
    const Reference *want = c->bf16_params ? rounded : r;
    double tolerance = c->bf16_reduce ? BF16_TOLERANCE : TOLERANCE;
    EXPECT(close_to(loss, want->loss, TOLERANCE), "%s: loss %.9g, 1-rank %.9g", c->name, loss,
           want->loss);
    check_grads(&sh.f, want, c->name, tolerance);
    const KernelOps *k = kernels_backend("cpu");
    double norm = sqrt(grads_sum_squares(k, &sh.net.m.params, mesh->fsdp, NULL, NULL));
    double want_norm = want->grad_norm, trained_numel = 0;
    if (c->frozen) {  // the norm of the trained parameters' gradients
        double sum = 0;
        for (int j = 0; j < sh.net.m.params.count; j++) {
            const Param *p = &sh.net.m.params.items[j];
            if (p->frozen) continue;
            trained_numel += (double)p->shard_numel;
            for (size_t i = 0; i < p->numel; i++)
                sum += (double)want->grad[p->offset + i] * want->grad[p->offset + i];
        }
        want_norm = sqrt(sum);
    }
    EXPECT(close_to(norm, want_norm, tolerance), "%s: grad norm %.9g, 1-rank %.9g", c->name,
           norm, want_norm);
    grad_clip_to_norm(k, sh.f.grad, sh.f.grad_shard_numel, norm, norm / 2);
    double clipped = sqrt(grads_sum_squares(k, &sh.net.m.params, mesh->fsdp, NULL, NULL));
    EXPECT(close_to(clipped, norm / 2, TOLERANCE), "%s: clipped norm %.9g, want %.9g", c->name,
           clipped, norm / 2);
    FsdpEstimate e = fsdp_estimate(&sh.f);
    uint64_t gathered = e.fsdp.all_gather_forward + e.efsdp.all_gather_forward;
    EXPECT(gathered == sh.f.numel * (c->bf16_params ? 2 : 4),
           "%s: all-gathers of %llu bytes for %zu elements", c->name,
           (unsigned long long)gathered, sh.f.numel);
    EXPECT((e.efsdp.reduce_scatter > 0) == c->experts, "%s: efsdp's share", c->name);
    uint64_t scattered = e.fsdp.reduce_scatter + e.efsdp.reduce_scatter;
    EXPECT(!c->frozen || scattered == (uint64_t)trained_numel * (uint64_t)sh.f.config.size *
                                          (c->bf16_reduce ? 2 : 4),
           "%s: reduce-scatters of %llu bytes for the %.0f trained elements", c->name,
           (unsigned long long)scattered, trained_numel);
    if (world_rank == 0)
        printf("ok %s: loss %.6f, grad norm %.6f; per rank: %zu of %zu params, MiB params %.2f "
               "grads %.2f comm %.2f\n", c->name, loss, norm, sh.f.numel, r->numel,
               e.param_bytes / 1048576.0, e.grad_bytes / 1048576.0, e.comm_bytes / 1048576.0);
    free(full);
    sharded_free(&sh);
}

// Every virtual rank of a 3-rank group fills its padded shard alone; their boxes put together
// are the 1-rank values, and the padding, on the last rank only, is zero.
static void check_uneven_placement(const Reference *r) {
    enum { N = 3 };
    for (int k = 0; k < N; k++) {
        Net n;
        net_build(&n, false);
        FsdpConfig config = {.size = N, .rank = k, .replicate_size = 1,
                             .k = kernels_backend("cpu")};
        Fsdp f;
        fsdp_plan(&f, &n.m.params, n.m.blocks, n.m.n_blocks, &config);
        Arena params, grads, comm;
        arena_init_sizing(&params, "params");
        arena_init_sizing(&grads, "grads");
        arena_init_sizing(&comm, "comm");
        fsdp_allocate(&f, &params, &grads, &comm);
        arena_commit(&params, NULL);
        arena_commit(&grads, NULL);
        arena_commit(&comm, NULL);
        fsdp_allocate(&f, &params, &grads, &comm);
        params_initialize(&n.m.params, SEED);
        bool padded = false;
        for (int j = 0; j < n.m.params.count; j++) {
            const Param *p = &n.m.params.items[j];
            const float *shard = n.m.params.shard_data + p->shard_offset;
            size_t first, count = box_of(p, &first);
            EXPECT(p->shard_numel == (size_t)(p->shape[0] + N - 1) / N * (p->numel / p->shape[0]),
                   "%s: shard floats", p->name);
            EXPECT(memcmp(shard, r->params + p->offset + first, count * sizeof(float)) == 0,
                   "rank %d of %d: %s differs", k, N, p->name);
            for (size_t i = count; i < p->shard_numel; i++)
                EXPECT(shard[i] == 0, "%s: padding not zero", p->name);
            padded |= count < p->shard_numel;
        }
        EXPECT(padded == (k == N - 1), "rank %d of %d: padding on the last rank only", k, N);
        fsdp_free(&f);
        arena_free(&params);
        arena_free(&grads);
        arena_free(&comm);
        net_free(&n);
    }
}

static void check_reshard_names(void) {
    EXPECT(fsdp_reshard_parse("default") == FSDP_RESHARD_DEFAULT &&
           fsdp_reshard_parse("always") == FSDP_RESHARD_ALWAYS &&
           fsdp_reshard_parse("never") == FSDP_RESHARD_NEVER,
           "parallelism.fsdp_reshard_after_forward names");
}

static void mesh_from_args(Mesh *mesh, int argc, char **argv) {
    int replicate = argc > 1 ? atoi(argv[1]) : 1;
    int degrees[MESH_NDIMS] = {1, replicate, -1, 1, 1};
    MeshLayout layout;
    char err[256];
    if (!mesh_plan(&layout, degrees, comm_size(comm_world()), err, sizeof err))
        die_user("%s", err);
    mesh_build(mesh, &layout);
}

int main(int argc, char **argv) {
    check_reshard_names();
    comm_init(&argc, &argv);
    world_rank = comm_rank(comm_world());
    Mesh mesh;
    mesh_from_args(&mesh, argc, argv);
    efsdp = comm_split(mesh.fsdp, 0, -comm_rank(mesh.fsdp), "efsdp");
    Reference r, rounded;
    reference_compute(&r, false);
    reference_compute(&rounded, true);
    check_uneven_placement(&r);
    const Case cases[] = {
        {FSDP_RESHARD_DEFAULT, false, 1, false, "default", false, false, false, false},
        {FSDP_RESHARD_ALWAYS, false, 1, false, "always", false, false, false, false},
        {FSDP_RESHARD_NEVER, false, 1, false, "never", false, false, false, false},
        {FSDP_RESHARD_DEFAULT, true, 1, false, "default+ac", false, false, false, false},
        {FSDP_RESHARD_ALWAYS, true, 1, false, "always+ac", false, false, false, false},
        {FSDP_RESHARD_NEVER, true, 1, false, "never+ac", false, false, false, false},
        {FSDP_RESHARD_ALWAYS, true, 2, false, "always+ac, 2 microbatches", false, false, false,
         false},
        {FSDP_RESHARD_DEFAULT, true, 1, true, "default+ac after a forward-only pass", false, false,
         false, false},
        {FSDP_RESHARD_NEVER, false, 1, true, "never after a forward-only pass", false, false,
         false, false},
        {FSDP_RESHARD_DEFAULT, false, 1, false, "default, bf16 params", true, false, false, false},
        {FSDP_RESHARD_ALWAYS, true, 2, false, "always+ac, 2 microbatches, bf16 params and reduce",
         true, true, false, false},
        {FSDP_RESHARD_DEFAULT, false, 1, false, "experts apart", false, false, true, false},
        {FSDP_RESHARD_ALWAYS, true, 2, false, "experts apart, always+ac, 2 microbatches",
         false, false, true, false},
        {FSDP_RESHARD_ALWAYS, false, 1, false, "experts apart, bf16 params and reduce", true,
         true, true, false},
        {FSDP_RESHARD_DEFAULT, false, 1, false, "frozen", false, false, false, true},
        {FSDP_RESHARD_ALWAYS, true, 2, false, "frozen, experts apart, always+ac, 2 microbatches, "
         "bf16 reduce", false, true, true, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&r, &rounded, &mesh, &cases[i]);
    int total = (int)comm_all_reduce_double(comm_world(), failures, COMM_SUM);
    if (world_rank == 0)
        printf("%s: %d ranks (dp_replicate %d x dp_shard %d), %d failures\n",
               total ? "FAIL" : "PASS", mesh.layout.world_size,
               mesh.layout.size[MESH_DP_REPLICATE], mesh.layout.size[MESH_DP_SHARD], total);
    free(r.params), free(r.grad), free(rounded.params), free(rounded.grad);
    comm_finalize();
    return total ? 1 : 0;
}
