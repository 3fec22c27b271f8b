// Shared by the unit tests of a bare MoE layer (models/moe) on the cpu backend (header-only;
// include after cmocka.h): test_moe's, test_ep's and test_tp's layer is built, carved and
// freed the same way.
#pragma once

#include "models/moe/moe.h"

typedef struct {
    MoeArgs args;  // set by the caller before moe_bare_init; the layer keeps a pointer to it
    MoeLayer m;
    ParamTable t;
    Arena params, grads, act;
} MoeBare;

// The layer of b->args as layer 0 ("layers.0.moe..."), every weight of std 0.5 (large enough
// that the routing is far from ties and the experts far from linear); nothing allocated yet,
// so that a test may place its parameters first.
static inline void moe_bare_init(MoeBare *b) {
    params_init(&b->t, moe_param_count(&b->args));
    moe_layer_init(&b->m, &b->args, 0, &b->t, "layers.0.",
                   &(MoeInit){INIT_NORMAL, 0.5, 0.5, 0.5, 0.5}, NULL);
}

// Carves the parameters' data and grads (zeroed) from b->params and b->grads, each sized by
// a first pass of the same carving.
static inline void moe_bare_allocate(MoeBare *b) {
    arena_init_sizing(&b->params, "params");
    arena_init_sizing(&b->grads, "grads");
    params_allocate(&b->t, &b->params, &b->grads);
    arena_commit(&b->params, NULL);
    arena_commit(&b->grads, NULL);
    params_allocate(&b->t, &b->params, &b->grads);
}

// Sizes b->act by a forward and backward of `rows` rows on the step s (whose act it sets),
// then commits it.
static inline void moe_bare_commit_act(MoeBare *b, StepCtx s, int rows) {
    arena_init_sizing(&b->act, "act");
    s.act = &b->act;
    MoeSaved sv;
    moe_forward(&b->m, &s, &sv, NULL, NULL, rows);
    moe_backward(&b->m, &s, &sv, NULL, NULL, NULL, rows);
    arena_commit(&b->act, NULL);
}

static inline void moe_bare_free(MoeBare *b) {
    moe_layer_free(&b->m);
    params_free(&b->t);
    arena_free(&b->params);
    arena_free(&b->grads);
    arena_free(&b->act);
}
