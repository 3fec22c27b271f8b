// Each direction of a Linear (forward, input gradient, weight gradient) dispatches on the
// layer's precision; a plain weight's rows and a stacked one's expert groups (offsets) take the
// same path, so a precision serves both.
#include "models/linear.h"

#include "core/errors.h"

LinearPrecision linear_precision_for(const char *fqn) {
    (void)fqn;  // one precision for every layer so far
    return LINEAR_BACKEND;
}

Linear linear_of(const Param *weight) {
    return (Linear){weight, linear_precision_for(weight->name)};
}

static int out_dim(const Linear *l) { return (int)l->weight->shape[l->weight->ndim - 2]; }
static int in_dim(const Linear *l) { return (int)l->weight->shape[l->weight->ndim - 1]; }
// The experts a stacked weight holds (this rank's, under expert parallel).
static int experts(const Linear *l) {
    CHECK(l->weight->ndim == 3);
    return (int)l->weight->shape[0];
}

// Bytes of s->act one call on up to `rows` rows carves: the backend's GEMMs need none.
static size_t scratch_bytes(const Linear *l, int rows) {
    (void)rows;
    switch (l->precision) {
    case LINEAR_BACKEND:
        break;
    }
    return 0;
}

void linear_reserve(const StepCtx *s, const Linear *const *linears, int n, int rows) {
    size_t most = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = scratch_bytes(linears[i], rows);
        if (bytes > most) most = bytes;
    }
    size_t mark = arena_mark(s->act);  // counted in the arena's peak, then given back
    arena_alloc(s->act, most);
    arena_release(s->act, mark);
}

// offsets: NULL for a plain weight, else the expert groups of the rows (rows = offsets[E]).
static void forward(const Linear *l, const StepCtx *s, float *y, const float *x, int rows,
                    const int *offsets, float beta) {
    const float *w = l->weight->data;
    int out = out_dim(l), in = in_dim(l);
    switch (l->precision) {
    case LINEAR_BACKEND:
        if (offsets)
            s->k->grouped_matmul(y, x, w, offsets, experts(l), out, in, false, true, beta);
        else
            s->k->matmul(y, x, w, rows, out, in, false, true, beta);
        break;
    }
}

static void backward_input(const Linear *l, const StepCtx *s, float *dx, const float *dy,
                           int rows, const int *offsets, float beta) {
    const float *w = l->weight->data;
    int out = out_dim(l), in = in_dim(l);
    switch (l->precision) {
    case LINEAR_BACKEND:
        if (offsets)
            s->k->grouped_matmul(dx, dy, w, offsets, experts(l), in, out, false, false, beta);
        else
            s->k->matmul(dx, dy, w, rows, in, out, false, false, beta);
        break;
    }
}

static void backward_weight(const Linear *l, const StepCtx *s, const float *dy, const float *x,
                            int rows, const int *offsets) {
    float *dw = l->weight->grad;
    int out = out_dim(l), in = in_dim(l);
    switch (l->precision) {
    case LINEAR_BACKEND:
        if (offsets)
            s->k->grouped_matmul(dw, dy, x, offsets, experts(l), in, out, true, false, 1);
        else
            s->k->matmul(dw, dy, x, out, in, rows, true, false, 1);
        break;
    }
}

void linear_forward(const Linear *l, const StepCtx *s, float *y, const float *x, int rows,
                    float beta) {
    forward(l, s, y, x, rows, NULL, beta);
}

void linear_backward_input(const Linear *l, const StepCtx *s, float *dx, const float *dy,
                           int rows, float beta) {
    backward_input(l, s, dx, dy, rows, NULL, beta);
}

void linear_backward_weight(const Linear *l, const StepCtx *s, const float *dy, const float *x,
                            int rows) {
    backward_weight(l, s, dy, x, rows, NULL);
}

void linear_grouped_forward(const Linear *l, const StepCtx *s, float *y, const float *x,
                            const int *offsets, float beta) {
    forward(l, s, y, x, offsets[experts(l)], offsets, beta);
}

void linear_grouped_backward_input(const Linear *l, const StepCtx *s, float *dx, const float *dy,
                                   const int *offsets, float beta) {
    backward_input(l, s, dx, dy, offsets[experts(l)], offsets, beta);
}

void linear_grouped_backward_weight(const Linear *l, const StepCtx *s, const float *dy,
                                    const float *x, const int *offsets) {
    backward_weight(l, s, dy, x, offsets[experts(l)], offsets);
}
