// DeepSeek-V3's multi-token prediction modules (§2.2; torchtitan's MTPTransformerBlock), run by
// the head after the main loss. Module k (from 1), on this rank's rows:
//
//   prev  = module k - 1's out (the last layer's output for k = 1), zero on the rows past the
//           sequence's end (position T - k and later: no token k ahead)
//   h0    = [enorm(embedding of token t + k), hnorm(prev)] eh_proj^T
//   y     = the transformer block (a copy of the last layer's) on h0
//   out   = mtp_norm(y): module k + 1's prev; its logits, through the shared output
//           projection, predict token t + k + 1 (the head's loss, which norms y itself)
//
// The head looks the embeddings up in its copy of the table and takes their gradients there.
#include "models/decoder/blocks.h"

void mtp_forward(const DecoderMtp *m, StepCtx *s, MtpSaved *sv, const float *prev,
                 const float *embed, int depth) {
    const DecoderArgs *a = m->layer.args;
    const KernelOps *K = s->k;
    Arena *A = s->act;
    int rows = step_rows(s), D = a->dim;
    size_t n = (size_t)rows * D, es = dtype_size(s->act_dtype);
    sv->prev = arena_floats(A, n);
    sv->cat = act_carve(s, 2 * n);
    sv->e_rstd = arena_floats(A, rows);
    sv->h_rstd = arena_floats(A, rows);
    sv->h0 = arena_floats(A, n);
    sv->y = arena_floats(A, n);
    sv->out = arena_floats(A, n);
    sv->out_rstd = arena_floats(A, rows);
    size_t mark = arena_mark(A);  // the norms' outputs before they sit side by side in cat
    void *en = act_carve(s, n), *hn = act_carve(s, n);
    linear_reserve(s, (const Linear *[]){&m->eh_linear}, 1, rows, s->act_dtype);
    if (!step_sizing(s)) {
        copy(s, sv->prev, prev, n);
        zero_tail_rows(s, sv->prev, (size_t)D, step_first_row(s), rows, depth);
        K->rmsnorm_forward(en, s->act_dtype, sv->e_rstd, embed, m->enorm->data, rows, D,
                           a->norm_eps);
        K->rmsnorm_forward(hn, s->act_dtype, sv->h_rstd, sv->prev, m->hnorm->data, rows, D,
                           a->norm_eps);
        K->copy_rows(sv->cat, 2 * D * es, en, D * es, D * es, rows);
        K->copy_rows((char *)sv->cat + D * es, 2 * D * es, hn, D * es, D * es, rows);
        linear_forward(&m->eh_linear, s, sv->h0, act(s, sv->cat), rows, 0);
    }
    arena_release(A, mark);
    m->block.ops->forward((Block *)&m->block, s, &sv->layer, sv->h0, sv->y);
    if (!step_sizing(s))
        K->rmsnorm_forward(sv->out, DTYPE_FP32, sv->out_rstd, sv->y, m->mtp_norm->data, rows, D,
                           a->norm_eps);
}

void mtp_backward(const DecoderMtp *m, StepCtx *s, const MtpSaved *sv, const float *embed,
                  float *dy, const float *dout, float *dembed, float *dprev, int depth) {
    const DecoderArgs *a = m->layer.args;
    const KernelOps *K = s->k;
    Arena *A = s->act;
    int rows = step_rows(s), D = a->dim;
    size_t n = (size_t)rows * D, fl = sizeof(float);
    size_t mark = arena_mark(A);
    float *dh0 = arena_floats(A, n);
    if (!step_sizing(s)) {
        if (dout)
            K->rmsnorm_backward(dy, m->mtp_norm->grad, dout, sv->y, m->mtp_norm->data,
                                sv->out_rstd, rows, D);
        zero(s, dh0, n);
    }
    size_t layer_mark = arena_mark(A);  // the layer's scratch, given back when it is done
    m->block.ops->backward((Block *)&m->block, s, (void *)&sv->layer, BLOCK_BACKWARD, sv->h0, dy,
                           dh0);
    arena_release(A, layer_mark);
    float *dcat = arena_floats(A, 2 * n), *dhalf = arena_floats(A, n);
    void *cast = s->act_dtype != DTYPE_FP32 ? act_carve(s, n) : NULL;
    linear_reserve(s, (const Linear *[]){&m->eh_linear}, 1, rows, s->act_dtype);
    if (!step_sizing(s)) {
        LinearAct dh0_act = act_cast(s, dh0, n, cast);
        linear_backward_input(&m->eh_linear, s, dcat, dh0_act, rows, 0);
        linear_backward_weight(&m->eh_linear, s, dh0_act, act(s, sv->cat), rows);
        // the embedding's half, then prev's (through the mask: dh0 is free again)
        K->copy_rows(dhalf, D * fl, dcat, 2 * D * fl, D * fl, rows);
        K->rmsnorm_backward(dembed, m->enorm->grad, dhalf, embed, m->enorm->data, sv->e_rstd,
                            rows, D);
        K->copy_rows(dhalf, D * fl, dcat + D, 2 * D * fl, D * fl, rows);
        zero(s, dh0, n);
        K->rmsnorm_backward(dh0, m->hnorm->grad, dhalf, sv->prev, m->hnorm->data, sv->h_rstd,
                            rows, D);
        zero_tail_rows(s, dh0, (size_t)D, step_first_row(s), rows, depth);
        K->add(dprev, dh0, n);
    }
    arena_release(A, mark);
}
