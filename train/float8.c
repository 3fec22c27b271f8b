// float8 training in the trainer (model.converters: [float8], the float8.* keys): which Linears
// convert and the checks torchao would make on them, FSDP's float8 all-gather, and the log line
// that names them. The numerics are models/linear's and kernels'; this is the wiring.
#include <string.h>

#include "train/train.h"

// float8.moe_fqns_prototype asks for the experts' grouped GEMMs in float8: refused by name
// when it converts none (torchao asserts on experts' dims that are not multiples of 16).
static void check_float8_experts(const Trainer *t) {
    const Config *c = &t->cfg;
    if (c->float8.moe_fqns_prototype.count == 0) return;
    const ModelLinear *stacked = NULL;
    bool named = false;
    for (int i = 0; i < t->model.n_linears; i++) {
        const ModelLinear *e = &t->model.linears[i];
        if (e->linear->weight->ndim != 3) continue;
        if (e->linear->precision != LINEAR_BACKEND) return;
        stacked = stacked ? stacked : e;
        named = named || linear_moe_fqns_match(e->module, &c->float8);
    }
    char origin[512], value[512];
    CHECK(config_key_origin(c, "float8.moe_fqns_prototype", origin, sizeof origin));
    CHECK(config_value_text(c, "float8.moe_fqns_prototype", value, sizeof value));
    if (!stacked)
        die_user("%s: float8.moe_fqns_prototype does nothing: model %s %s has no MoE layers",
                 origin, c->model.name, c->model.flavor);
    const Param *w = stacked->linear->weight;
    if (named)
        die_user("%s: float8.moe_fqns_prototype: the routed experts' (%lld, %lld) weights need "
                 "both dims multiples of 16 for float8 grouped GEMMs", origin,
                 (long long)w->global_shape[1], (long long)w->global_shape[2]);
    int module = (int)(strrchr(stacked->module, '.') - stacked->module);
    die_user("%s: float8.moe_fqns_prototype = %s names no routed experts' module (%.*s)", origin,
             value, module, stacked->module);
}

// cuBLASLt's float8 GEMMs reduce over multiples of 16, the weight gradient's over the
// microbatch's tokens (the grouped GEMMs pad each expert's tokens themselves).
static void check_float8_tokens(const Trainer *t) {
    if (strcmp(t->cfg.training.device, "cuda") != 0) return;
    const Split *splits[] = {&t->train, &t->val};
    for (int i = 0; i < 2; i++) {
        int tokens = splits[i]->B * splits[i]->step_T;
        if (splits[i]->B > 0 && tokens % 16 != 0)
            die_user("float8 on training.device cuda needs a multiple of 16 tokens per "
                     "microbatch and rank, not %s's %d x %d", i ? "validation" : "training",
                     splits[i]->B, splits[i]->step_T);
    }
}

// The recipe the metrics name (t->float8_recipe): the Linears', or the experts' own when only
// they run float8; NULL when no Linear does.
static void set_float8_recipe(Trainer *t) {
    const Float8Section *f = &t->cfg.float8;
    char none[8];
    int dense = model_linears_describe(&t->model, LINEARS_FLOAT8, none, sizeof none);
    if (!dense && !model_linears_describe(&t->model, LINEARS_FLOAT8_EXPERTS, none, sizeof none))
        return;
    t->float8_recipe = !dense ? "rowwise" : f->recipe_name ? f->recipe_name : "tensorwise";
    if (dense) check_float8_tokens(t);
}

// float8.enable_fsdp_float8_all_gather (torchao's WeightWithDynamicFloat8CastTensor): FSDP
// gathers the weights of the tensorwise float8 Linears as float8 (Param.gather_float8).
// torchtitan ignores the key without FSDP; here it would do nothing, so it is refused.
static void mark_float8_gather(Trainer *t) {
    if (!t->fsdp_on) {
        char origin[512];
        CHECK(config_key_origin(&t->cfg, "float8.enable_fsdp_float8_all_gather", origin,
                                sizeof origin));
        die_user("%s: float8.enable_fsdp_float8_all_gather does nothing without FSDP (an fsdp "
                 "group of dp_shard %d x cp %d ranks)", origin,
                 t->mesh.layout.size[MESH_DP_SHARD], t->mesh.layout.size[MESH_CP]);
    }
    for (int i = 0; i < t->model.n_linears; i++) {
        const Linear *l = t->model.linears[i].linear;
        if (l->precision == LINEAR_FLOAT8_TENSORWISE)
            params_find(&t->model.params, l->weight->name)->gather_float8 = true;
    }
}

// torchtitan's float8 converter (model.converters: [float8]): after the build, before the
// parallelisms, each Linear's precision by its module name and shape, and, as torchao's
// conversion does, the float8 all-gather of FSDP's weights when asked for.
void trainer_convert_float8(Trainer *t) {
    model_convert_float8(&t->model, &t->cfg.float8);
    check_float8_experts(t);
    set_float8_recipe(t);
    if (t->cfg.float8.enable_fsdp_float8_all_gather) mark_float8_gather(t);
}

// Which Linears run float8 and which keep the backend's precision, by module; the experts'
// clause when any run float8.
void trainer_log_float8(const Trainer *t) {
    const Float8Section *f = &t->cfg.float8;
    char on[2048], experts[2048], off[2048];
    int n_on = model_linears_describe(&t->model, LINEARS_FLOAT8, on, sizeof on);
    int n_experts = model_linears_describe(&t->model, LINEARS_FLOAT8_EXPERTS, experts,
                                           sizeof experts);
    int n_off = model_linears_describe(&t->model, LINEARS_BACKEND, off, sizeof off);
    const char *recipe = !n_on ? "no" : f->recipe_name ? f->recipe_name : "tensorwise";
    if (!n_experts)
        log_info("float8: %s recipe on %d linears (%s); %d at the backend's precision (%s)",
                 recipe, n_on, on, n_off, off);
    else
        log_info("float8: %s recipe on %d linears (%s); rowwise grouped GEMMs on %d expert "
                 "weights (%s); %d at the backend's precision (%s)",
                 recipe, n_on, on, n_experts, experts, n_off, off);
}
