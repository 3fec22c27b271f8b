#include "parallel/grads.h"

typedef struct {
    float *grad;
    size_t n;
} GradPiece;

static GradPiece grad_piece(const ParamTable *t, const Fsdp *f, int i) {
    if (!f) return (GradPiece){t->items[i].grad, t->items[i].numel};
    const FsdpShard *s = &f->shards[i];
    return (GradPiece){f->grad + s->shard_offset, (size_t)s->shard_rows * s->row_numel};
}

size_t grads_replicated_floats(const ParamTable *t, const Fsdp *f) {
    size_t n = 0;
    for (int i = 0; i < t->count; i++)
        if (t->items[i].tp.dim == TP_REPLICATE) n += grad_piece(t, f, i).n;
    return n;
}

void grads_reduce_replicated(const ParamTable *t, const Fsdp *f, const Tp *tp) {
    if (!tp) return;
    for (int i = 0; i < t->count; i++) {
        if (t->items[i].tp.dim != TP_REPLICATE) continue;
        GradPiece g = grad_piece(t, f, i);
        comm_all_reduce(tp->group, g.grad, g.n, COMM_SUM);
    }
}

double grads_sum_squares(const KernelOps *k, const ParamTable *t, const Fsdp *f, const Tp *tp) {
    double local = 0;
    for (int i = 0; i < t->count; i++) {
        GradPiece g = grad_piece(t, f, i);
        local += (tp ? tp_norm_weight(&t->items[i]) : 1.0) * k->sum_squares(g.grad, g.n);
    }
    if (f) local = comm_all_reduce_double(f->group, local, COMM_SUM);
    if (tp) local = comm_all_reduce_double(tp->group, local, COMM_SUM);
    return local;
}
