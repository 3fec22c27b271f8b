#include "parallel/tp.h"

#include "core/errors.h"

static const Tp *tp_of(const TpHooks *h) { return (const Tp *)h; }

static void tp_gather(const TpHooks *h, const void *x, void *full, size_t n, Dtype t) {
    if (t == DTYPE_FP32) {
        comm_all_gather(tp_of(h)->group, x, full, n);
        return;
    }
    CHECK(t == DTYPE_BF16);
    CommHandle gather = comm_all_gather_bf16_start(tp_of(h)->group, x, full, n);
    comm_wait(&gather);
}

// An all-gather gives rank-major blocks (size, rows, cols); each row of the result is the
// rows of every block side by side.
static void tp_gather_columns(const TpHooks *h, const float *x, float *full, float *scratch,
                              int rows, int cols) {
    const Tp *tp = tp_of(h);
    size_t row_bytes = (size_t)cols * sizeof(float);
    comm_all_gather(tp->group, x, scratch, (size_t)rows * cols);
    for (int k = 0; k < tp->size; k++)
        tp->k->copy_rows(full + (size_t)k * cols, tp->size * row_bytes,
                         scratch + (size_t)k * rows * cols, row_bytes, row_bytes, rows);
}

static void tp_reduce_scatter(const TpHooks *h, const float *partial, float *y, size_t n) {
    comm_reduce_scatter(tp_of(h)->group, partial, y, n, COMM_SUM);
}

static void tp_all_reduce_max(const TpHooks *h, float *buf, size_t n) {
    comm_all_reduce(tp_of(h)->group, buf, n, COMM_MAX);
}

static void tp_all_reduce_sum(const TpHooks *h, float *buf, size_t n) {
    comm_all_reduce(tp_of(h)->group, buf, n, COMM_SUM);
}

void tp_init(Tp *tp, CommGroup *group, const KernelOps *k, bool loss_parallel) {
    tp_plan(tp, comm_rank(group), comm_size(group), loss_parallel);
    tp->group = group;
    tp->k = k;
}

void tp_plan(Tp *tp, int rank, int size, bool loss_parallel) {
    *tp = (Tp){.rank = rank, .size = size};
    tp->hooks = (TpHooks){.size = tp->size, .rank = tp->rank, .loss_parallel = loss_parallel,
                          .gather = tp_gather, .gather_columns = tp_gather_columns,
                          .reduce_scatter = tp_reduce_scatter,
                          .all_reduce_max = tp_all_reduce_max,
                          .all_reduce_sum = tp_all_reduce_sum};
}

static Placement placement(const Tp *tp, int dim) {
    bool replicate = dim == TP_REPLICATE || dim == TP_REDUNDANT;
    return (Placement){.kind = replicate ? PLACE_REPLICATE : PLACE_SHARD,
                       .dim = replicate ? TP_REPLICATE : dim, .group = MESH_TP, .size = tp->size,
                       .rank = tp->rank, .grad_partial = dim == TP_REPLICATE};
}

void tp_shard(const Tp *tp, ParamTable *t, Param *p, int dim) {
    params_place(t, p, placement(tp, dim));
}

void tp_shard_blocked(const Tp *tp, ParamTable *t, Param *p, int dim, int n_blocks,
                      const int64_t *blocks) {
    CHECK(dim >= 0 && n_blocks > 0 && n_blocks <= PARAM_MAX_BLOCKS);
    Placement pl = placement(tp, dim);
    pl.n_blocks = n_blocks;
    for (int k = 0; k < n_blocks; k++) pl.blocks[k] = blocks[k];
    params_place(t, p, pl);
}

