#include "models/model.h"

#include "core/errors.h"

// hidden[i] is the input of block i (hidden[0] unused: the embedding reads tokens), hidden[i+1]
// its output; the head (last block) has no output.
static void forward_all(Model *m, StepCtx *s) {
    s->tp = m->tp;
    size_t width = (size_t)step_rows(s) * m->dim;
    float **hidden = m->hidden;
    hidden[0] = NULL;
    for (int i = 0; i < m->n_blocks; i++) {
        Block *b = &m->blocks[i];
        float *x = hidden[i];
        float *y = i + 1 < m->n_blocks ? arena_floats(s->act, width) : NULL;
        hidden[i + 1] = y;
        // A checkpointed block keeps only its output: what it saved is released at once and
        // recomputed in backward (activation checkpointing, Chen et al. 2016).
        size_t mark = arena_mark(s->act);
        b->ops->forward(b, s, x, y);
        if (b->checkpointed) arena_release(s->act, mark);
    }
}

double model_forward(Model *m, StepCtx *s) {
    forward_all(m, s);
    return s->loss;
}

double model_forward_backward(Model *m, StepCtx *s) {
    forward_all(m, s);
    float **hidden = m->hidden;
    size_t width = (size_t)step_rows(s) * m->dim;
    float *grad_out = arena_floats(s->act, width), *grad_in = arena_floats(s->act, width);
    for (int i = m->n_blocks - 1; i >= 0; i--) {
        Block *b = &m->blocks[i];
        const float *x = hidden[i];
        const float *dy = i + 1 < m->n_blocks ? grad_out : NULL;
        float *dx = i == 0 ? NULL : grad_in;
        size_t mark = arena_mark(s->act);
        if (b->checkpointed) {
            float *y_again = i + 1 < m->n_blocks ? arena_floats(s->act, width) : NULL;
            b->ops->forward(b, s, x, y_again);
        }
        if (dx && !step_sizing(s)) s->k->zero(dx, width * sizeof(float));
        b->ops->backward(b, s, x, dy, dx);
        arena_release(s->act, mark);
        float *t = grad_out;  // this block's input gradient is the next one's output gradient
        grad_out = grad_in;
        grad_in = t;
    }
    return s->loss;
}

size_t model_activation_bytes(Model *m, const KernelOps *k, int B, int T) {
    Arena sizing;
    arena_init_sizing(&sizing, "activations");
    StepCtx s = {.k = k, .act = &sizing, .B = B, .T = T, .tp = m->tp};
    model_forward_backward(m, &s);
    return sizing.peak;
}

void model_size(Model *m, size_t activation_bytes, Arena *params, Arena *grads, Arena *acts) {
    arena_init_sizing(params, "params");
    arena_init_sizing(grads, "grads");
    arena_init_sizing(acts, "activations");
    params_allocate(&m->params, params, grads);
    acts->peak = activation_bytes;
}

void model_allocate(Model *m, size_t activation_bytes, Arena *params, Arena *grads, Arena *acts,
                    const ArenaMemory *memory) {
    model_size(m, activation_bytes, params, grads, acts);
    arena_commit(params, memory);
    arena_commit(grads, memory);
    arena_commit(acts, memory);
    params_allocate(&m->params, params, grads);
}

void model_place_buffers(Model *m, const KernelOps *k) {
    if (m->place_buffers) m->place_buffers(m, k);
}
