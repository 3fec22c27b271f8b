#include "models/model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/profiler.h"

void model_linear_add(Model *m, Linear *l, const char *module) {
    m->linears = realloc(m->linears, ((size_t)m->n_linears + 1) * sizeof(ModelLinear));
    CHECK(m->linears);
    ModelLinear *e = &m->linears[m->n_linears++];
    e->linear = l;
    const char *name = module ? module : l->weight->name;
    size_t n = strlen(name), suffix = strlen(".weight");
    if (!module && n > suffix && !strcmp(name + n - suffix, ".weight")) n -= suffix;
    CHECK(n < sizeof e->module);
    memcpy(e->module, name, n);
    e->module[n] = '\0';
}

void model_convert_float8(Model *m, const Float8Section *float8) {
    for (int i = 0; i < m->n_linears; i++) {
        ModelLinear *e = &m->linears[i];
        e->linear->precision = linear_precision_for(e->module, e->linear->weight, float8);
    }
}

// "layers.N.rest" -> N and rest; anything else -> -1 and the whole name.
static int module_layer(const char *module, const char **rest) {
    int layer = -1, used = 0;
    if (sscanf(module, "layers.%d.%n", &layer, &used) == 1 && used > 0) {
        *rest = module + used;
        return layer;
    }
    *rest = module;
    return -1;
}

static bool module_matches(const ModelLinear *e, LinearSet set) {
    if (set == LINEARS_LORA) return e->linear->lora_a != NULL;
    if (e->linear->precision == LINEAR_BACKEND) return set == LINEARS_BACKEND;
    return set == (e->linear->weight->ndim == 3 ? LINEARS_FLOAT8_EXPERTS : LINEARS_FLOAT8);
}

// printf into buf (n bytes) after its first `used`; returns the new length, at most n - 1.
__attribute__((format(printf, 4, 5))) static size_t append(char *buf, size_t n, size_t used,
                                                           const char *fmt, ...) {
    if (used + 1 >= n) return used;
    va_list ap;
    va_start(ap, fmt);
    int wrote = vsnprintf(buf + used, n - used, fmt, ap);
    va_end(ap);
    size_t end = used + (wrote > 0 ? (size_t)wrote : 0);
    return end < n ? end : n - 1;
}

// The layers whose linear `rest` matches, as ranges: "0-2,5".
static size_t append_layers(const Model *m, LinearSet set, const char *rest, char *buf, size_t n,
                            size_t used) {
    int start = -1, prev = -2;
    bool first = true;
    for (int i = 0; i <= m->n_linears; i++) {
        const char *r = "";
        int layer = -1;
        if (i < m->n_linears && module_matches(&m->linears[i], set))
            layer = module_layer(m->linears[i].module, &r);
        bool member = layer >= 0 && !strcmp(r, rest);
        if (i < m->n_linears && !member) continue;
        if (member && layer == prev + 1) {
            prev = layer;
            continue;
        }
        if (start >= 0) {
            used = start == prev ? append(buf, n, used, "%s%d", first ? "" : ",", start)
                                 : append(buf, n, used, "%s%d-%d", first ? "" : ",", start, prev);
            first = false;
        }
        start = prev = layer;
    }
    return used;
}

int model_linears_describe(const Model *m, LinearSet set, char *buf, size_t n) {
    size_t used = 0;
    int count = 0;
    buf[0] = '\0';
    for (int i = 0; i < m->n_linears; i++) {
        const ModelLinear *e = &m->linears[i];
        if (!module_matches(e, set)) continue;
        count++;
        const char *rest, *r;
        int layer = module_layer(e->module, &rest);
        bool named = false;  // with the same name in an earlier layer: listed there
        for (int j = 0; j < i && layer >= 0 && !named; j++)
            named = module_matches(&m->linears[j], set) &&
                    module_layer(m->linears[j].module, &r) >= 0 && !strcmp(r, rest);
        if (named) continue;
        used = append(buf, n, used, "%s", used ? ", " : "");
        if (layer < 0) {
            used = append(buf, n, used, "%s", e->module);
            continue;
        }
        used = append(buf, n, used, "layers.");
        used = append_layers(m, set, rest, buf, n, used);
        used = append(buf, n, used, ".%s", rest);
    }
    if (!count) snprintf(buf, n, "none");
    return count;
}

void model_slots_init(ModelSlots *a, const Model *m) {
    // One allocation for every block's slot, each rounded up to keep pointers aligned.
    size_t *offset = xcalloc((size_t)m->n_blocks + 1, sizeof(size_t));
    for (int i = 0; i < m->n_blocks; i++) {
        size_t n = m->blocks[i].ops->saved_bytes;
        offset[i + 1] = offset[i] + (n + sizeof(void *) - 1) / sizeof(void *) * sizeof(void *);
    }
    char *all = xcalloc(offset[m->n_blocks] + 1, 1);
    a->saved = xcalloc((size_t)m->n_blocks, sizeof(void *));
    for (int i = 0; i < m->n_blocks; i++) a->saved[i] = all + offset[i];
    free(offset);
    a->hidden = xcalloc((size_t)m->n_blocks + 1, sizeof(float *));
    a->grad = xcalloc((size_t)m->n_blocks + 1, sizeof(float *));
}

void model_slots_free(ModelSlots *a) {
    if (a->saved) free(a->saved[0]);
    free(a->saved);
    free(a->hidden);
    free(a->grad);
    *a = (ModelSlots){0};
}

// "embed", "transformer.3", "head": block i's kind, numbered among the model's blocks of its
// kind when there are several. A profiled step's trace names the block calls so.
static void block_label(const Model *m, int i, char *buf, size_t n) {
    const char *kind = m->blocks[i].ops->kind;
    int before = 0, all = 0;
    for (int j = 0; j < m->n_blocks; j++) {
        bool same = strcmp(m->blocks[j].ops->kind, kind) == 0;
        all += same;
        before += same && j < i;
    }
    if (all == 1) snprintf(buf, n, "%s", kind);
    else snprintf(buf, n, "%s.%d", kind, before);
}

static void trace_block(const Model *m, int i, BlockPhase phase, double start) {
    static const char *const PHASES[] = {"forward", "recompute", "backward", "backward_input",
                                         "backward_weight"};  // BlockPhase's order
    char label[48];
    block_label(m, i, label, sizeof label);
    profiler_block(label, PHASES[phase], i, start);
}

// Block i's call for this phase, between the hooks: out is its output (forward, recompute) or
// its input gradient (backward phases). A profiled step records the call, hooks included.
static void run_block(Model *m, StepCtx *s, ModelSlots *a, int i, BlockPhase phase, float *out) {
    Block *b = &m->blocks[i];
    bool traced = !step_sizing(s) && profiler_recording();
    double start = traced ? profiler_now() : 0;
    bool hooked = m->hooks && !step_sizing(s);
    if (hooked) m->hooks->before(m->hooks, i, phase);
    s->recompute = phase == BLOCK_RECOMPUTE;
    if (phase == BLOCK_FORWARD || phase == BLOCK_RECOMPUTE)
        b->ops->forward(b, s, a->saved[i], a->hidden[i], out);
    else
        b->ops->backward(b, s, a->saved[i], phase, a->hidden[i], a->grad[i + 1], out);
    if (hooked) m->hooks->after(m->hooks, i, phase);
    if (traced) trace_block(m, i, phase, start);
}

float *model_forward_blocks(Model *m, StepCtx *s, ModelSlots *a, int first, int last,
                            const float *x) {
    CHECK(0 <= first && first < last && last <= m->n_blocks);
    s->tp = m->tp;
    s->tp_whole_rows = m->tp_whole_rows;
    s->attn = m->attn;
    s->ep = m->ep;
    s->act_dtype = m->precision.param;
    size_t width = (size_t)step_rows(s) * m->dim;
    a->hidden[first] = (float *)x;
    for (int i = first; i < last; i++) {
        float *y = i + 1 < m->n_blocks ? arena_floats(s->act, width) : NULL;
        a->hidden[i + 1] = y;
        // A checkpointed block keeps only its output: what it saved is released at once and
        // recomputed in backward (activation checkpointing, Chen et al. 2016). The others keep
        // theirs, so they hold no mark (core/arena.h).
        bool drop = m->blocks[i].checkpointed;
        size_t mark = drop ? arena_mark(s->act) : 0;
        run_block(m, s, a, i, BLOCK_FORWARD, y);
        if (drop) arena_release(s->act, mark);
    }
    return a->hidden[last];
}

// Block i's gradients: its trained parameters', one after another in ParamTable.grad from
// *offset (a frozen one takes none).
static size_t block_grads(const Model *m, int i, size_t *offset) {
    int first = 0;
    for (int j = 0; j < i; j++) first += m->blocks[j].n_params;
    const Param *p = &m->params.items[first];
    size_t numel = 0;
    *offset = 0;
    for (int j = 0; j < m->blocks[i].n_params; j++) {
        if (p[j].frozen) continue;
        if (numel == 0) *offset = p[j].shard_grad_offset;
        CHECK(p[j].shard_grad_offset == *offset + numel);
        numel += p[j].numel;
    }
    return numel;
}

// Block i's backward under StepCtx.grads_hold_sum: the earlier sum of its grads set aside in
// the activation arena (released with the block's mark), its grads zeroed for this microbatch's.
// Returns the sum; *grads, *numel: the block's grads.
static float *set_grads_aside(Model *m, StepCtx *s, int i, float **grads, size_t *numel) {
    size_t offset;
    *numel = block_grads(m, i, &offset);
    if (*numel == 0) return NULL;
    float *sum = arena_floats(s->act, *numel);
    if (step_sizing(s)) return sum;
    *grads = m->params.grad + offset;
    s->k->copy(sum, *grads, *numel * sizeof(float));
    s->k->zero(*grads, *numel * sizeof(float));
    return sum;
}

// The weight part: every block of the range from what its input part kept.
static void backward_weights(Model *m, StepCtx *s, ModelSlots *a, int first, int last) {
    for (int i = last - 1; i >= first; i--) run_block(m, s, a, i, BLOCK_BACKWARD_WEIGHT, NULL);
}

float *model_backward_blocks(Model *m, StepCtx *s, ModelSlots *a, int first, int last,
                             BlockPhase phase, const float *dy) {
    CHECK(0 <= first && first < last && last <= m->n_blocks);
    CHECK(phase == BLOCK_BACKWARD || phase == BLOCK_BACKWARD_INPUT ||
          phase == BLOCK_BACKWARD_WEIGHT);
    if (phase == BLOCK_BACKWARD_WEIGHT) {
        backward_weights(m, s, a, first, last);
        return NULL;
    }
    size_t width = (size_t)step_rows(s) * m->dim;
    // The whole backward passes the gradient between blocks through two buffers in turn and
    // gives back each block's scratch; the input part keeps all of it for the weight part.
    bool split = phase == BLOCK_BACKWARD_INPUT;
    CHECK(!(split && s->grads_hold_sum));  // a pipeline's microbatches accumulate in its grads
    float *turns[2] = {NULL, NULL};
    if (!split) {
        turns[0] = arena_floats(s->act, width);
        turns[1] = arena_floats(s->act, width);
    }
    a->grad[last] = (float *)dy;
    for (int i = last - 1; i >= first; i--) {
        Block *b = &m->blocks[i];
        size_t mark = split ? 0 : arena_mark(s->act);
        float *dx = i == 0 ? NULL : split ? arena_floats(s->act, width) : turns[(last - i) % 2];
        if (b->checkpointed) {
            float *y_again = i + 1 < m->n_blocks ? arena_floats(s->act, width) : NULL;
            run_block(m, s, a, i, BLOCK_RECOMPUTE, y_again);
        }
        if (dx && !step_sizing(s)) s->k->zero(dx, width * sizeof(float));
        a->grad[i] = dx;
        float *grads = NULL, *earlier = NULL;
        size_t numel = 0;
        if (s->grads_hold_sum) earlier = set_grads_aside(m, s, i, &grads, &numel);
        run_block(m, s, a, i, phase, dx);
        if (earlier && !step_sizing(s)) s->k->add(grads, earlier, numel);
        if (!split) arena_release(s->act, mark);
    }
    return a->grad[first];
}

double model_forward(Model *m, StepCtx *s) {
    model_forward_blocks(m, s, &m->slots, 0, m->n_blocks, NULL);
    return s->loss;
}

double model_forward_backward(Model *m, StepCtx *s) {
    model_forward_blocks(m, s, &m->slots, 0, m->n_blocks, NULL);
    model_backward_blocks(m, s, &m->slots, 0, m->n_blocks, BLOCK_BACKWARD, NULL);
    return s->loss;
}
ArenaBytes model_activation_bytes(Model *m, const KernelOps *k, int B, int T) {
    Arena sizing;
    arena_init_sizing(&sizing, "activations");
    StepCtx s = {.k = k, .act = &sizing, .B = B, .T = T, .tp = m->tp,
                 .tp_whole_rows = m->tp_whole_rows, .attn = m->attn,
                 .ep = m->ep, .act_dtype = m->precision.param,
                 .grads_hold_sum = m->accumulates_grads};
    model_forward_backward(m, &s);
    return sizing.peak;
}

void model_size(Model *m, ArenaBytes activation_bytes, Arena *params, Arena *grads, Arena *acts) {
    arena_init_sizing(params, "params");
    arena_init_sizing(grads, "grads");
    arena_init_sizing(acts, "activations");
    params_allocate(&m->params, params, grads);
    arena_reserve(acts, activation_bytes);
}

void model_allocate(Model *m, ArenaBytes activation_bytes, Arena *params, Arena *grads,
                    Arena *acts, const ArenaMemory *memory) {
    model_size(m, activation_bytes, params, grads, acts);
    arena_commit(params, memory);
    arena_commit(grads, memory);
    arena_commit(acts, memory);
    params_allocate(&m->params, params, grads);
}

// Block i (1..n_blocks-2) is the transformer's i-th counted from 1, torchtitan's count in
// _apply_ac_to_transformer_block (incremented before its modulo test).
void model_set_checkpointing(Model *m, const char *mode, const char *selective_option) {
    bool selective = !strcmp(mode, "selective"), op = !strcmp(selective_option, "op");
    int every = !strcmp(mode, "full") ? 1 : selective && !op ? atoi(selective_option) : 0;
    for (int i = 1; i + 1 < m->n_blocks; i++) {
        m->blocks[i].checkpointed = every > 0 && i % every == 0;
        m->blocks[i].recompute_cheap = selective && op;
    }
}

void model_place_buffers(Model *m, const KernelOps *k) {
    if (m->place_buffers) m->place_buffers(m, k);
}

void model_buffer_free(void *data, const KernelOps *memory) {
    if (memory) memory->free(data);
    else free(data);
}

void model_free_parts(Model *m) {
    free(m->blocks);
    free(m->block_flops);
    model_slots_free(&m->slots);
    free(m->linears);
    params_free(&m->params);
}
