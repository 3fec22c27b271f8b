// FLUX construction: the parameter table (torchtitan's fully-qualified names, shapes and
// init_weights) and the block list embed, double_blocks.*, single_blocks.*, head.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/errors.h"
#include "models/flux/layers.h"

typedef struct {
    FluxArgs args;
    FluxEmbed embed;
    FluxDouble *doubles;         // (depth)
    FluxSingle *singles;         // (depth_single_blocks)
    FluxHead head;
    FluxRope rope;               // the tables every block reads, and this rank's share
    void *rope_data;             // their one allocation: cos, sin (Tj, hd/2), pos (Tj)
    const KernelOps *rope_memory;  // whose memory holds them after placing; NULL: host
} Flux;

// EmbedND (torchtitan's rope over each position axis): token t's ids are (0, 0, 0) for text
// and (0, row, column) of the patch grid for image tokens; its pair j of axis i turns by
// id_i theta^(-2j / axes_dim[i]), the axes' pairs side by side. Computed in double, rounded.
static void rope_tables(Flux *f) {
    const FluxArgs *a = &f->args;
    int half = flux_head_dim(a) / 2, L = a->txt_len, grid_w = a->latent_width / FLUX_PATCH;
    int Tj = L + flux_img_tokens(a);
    size_t n = (size_t)Tj * half;
    float *cos_t = xmalloc(2 * n * sizeof(float) + (size_t)Tj * sizeof(int));
    float *sin_t = cos_t + n;
    int *pos = (int *)(sin_t + n);
    for (int t = 0; t < Tj; t++) {
        int img = t - L, row = img < 0 ? 0 : img / grid_w, col = img < 0 ? 0 : img % grid_w;
        int ids[FLUX_AXES] = {0, row, col};
        int pair = 0;
        for (int i = 0; i < FLUX_AXES; i++)
            for (int j = 0; j < a->axes_dim[i] / 2; j++, pair++) {
                double angle = ids[i] * pow(a->theta, -2.0 * j / a->axes_dim[i]);
                cos_t[(size_t)t * half + pair] = (float)cos(angle);
                sin_t[(size_t)t * half + pair] = (float)sin(angle);
            }
        pos[t] = t;
    }
    f->rope_data = cos_t;
    f->rope = (FluxRope){cos_t, sin_t, pos, .first = 0, .count = Tj, .shares = 1};
}

static size_t rope_bytes(const FluxArgs *a) {
    size_t Tj = (size_t)a->txt_len + flux_img_tokens(a);
    return Tj * (size_t)flux_head_dim(a) * sizeof(float) + Tj * sizeof(int);
}

// The tables are read by every block's kernels, so they move to the backend's memory.
static void place_buffers(Model *m, const KernelOps *k) {
    Flux *f = m->self;
    if (k->host_memory || f->rope_memory) return;
    size_t bytes = rope_bytes(&f->args);
    char *placed = k->alloc(bytes);
    if (!placed) die_user("cannot allocate the RoPE tables (%zu bytes) in device memory", bytes);
    k->upload(placed, f->rope_data, bytes);
    free(f->rope_data);
    f->rope_data = placed;
    f->rope_memory = k;
    size_t n = (size_t)(f->rope.sin - f->rope.cos);
    int *pos = (int *)((float *)placed + 2 * n);
    f->rope.cos = (float *)placed;
    f->rope.sin = (float *)placed + n;
    f->rope.pos = pos + f->rope.first;
}

void flux_parallelize_cp(Model *m, int rank, int size) {
    Flux *f = m->self;
    int Tj = f->rope.count;
    CHECK(f->rope.shares == 1 && !f->rope_memory && Tj % (2 * size) == 0);
    f->rope.shares = size;
    f->rope.count = Tj / size;
    f->rope.first = rank * f->rope.count;
    f->rope.pos += f->rope.first;  // pos[t] = t: the share's positions start at its first
}

// ---- parameters ----------------------------------------------------------------------------

// torchtitan's Linear.Config param_init: weight by init (std for the normal one), bias zeros.
static void add_linear(Model *m, FluxLinear *l, ParamInit init, double std, int64_t out,
                       int64_t in, bool bias, const char *fmt, ...) {
    char module[PARAM_NAME_MAX];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(module, sizeof module, fmt, ap);
    va_end(ap);
    CHECK(len > 0 && len < PARAM_NAME_MAX);
    ParamTable *t = &m->params;
    int64_t shape[2] = {out, in};
    l->linear = linear_of(&t->items[params_add(t, init, std, 2, shape, "%s.weight", module)]);
    l->bias = bias ? &t->items[params_add(t, INIT_ZEROS, 0, 1, &out, "%s.bias", module)] : NULL;
    model_linear_add(m, &l->linear, module);
}

static Param *add_norm(Model *m, int64_t n, const char *fmt, const char *prefix) {
    return &m->params.items[params_add(&m->params, INIT_ONES, 0, 1, &n, fmt, prefix)];
}

static void add_embedder(Model *m, FluxMlpEmbedder *e, int64_t in, int64_t D, const char *name) {
    add_linear(m, &e->in_layer, INIT_NORMAL, 0.02, D, in, true, "%s.in_layer", name);
    add_linear(m, &e->out_layer, INIT_NORMAL, 0.02, D, D, true, "%s.out_layer", name);
}

static void add_embed(Model *m, Flux *f) {
    const FluxArgs *a = &f->args;
    FluxEmbed *e = &f->embed;
    int64_t D = a->hidden_size;
    e->args = a;
    e->share = &f->rope;
    add_linear(m, &e->img_in, INIT_XAVIER_UNIFORM, 0, D, a->in_channels, true, "img_in");
    add_embedder(m, &e->time_in, FLUX_TIME_DIM, D, "time_in");
    add_embedder(m, &e->vector_in, a->vec_in_dim, D, "vector_in");
    if (a->guidance_embed) add_embedder(m, &e->guidance_in, FLUX_TIME_DIM, D, "guidance_in");
    add_linear(m, &e->txt_in, INIT_XAVIER_UNIFORM, 0, D, a->context_in_dim, true, "txt_in");
}

// double_blocks.i.{img,txt}_{mod,attn,mlp}: modulation zero-initialised (every block starts
// as the identity, as in DiT's adaLN-Zero), the rest Xavier-uniform.
static void add_stream(Model *m, const FluxArgs *a, FluxStream *s, const char *prefix) {
    int64_t D = a->hidden_size, M = flux_mlp_hidden(a);
    add_linear(m, &s->mod, INIT_ZEROS, 0, 6 * D, D, true, "%s_mod.lin", prefix);
    add_linear(m, &s->qkv, INIT_XAVIER_UNIFORM, 0, 3 * D, D, a->qkv_bias, "%s_attn.qkv", prefix);
    s->q_norm = add_norm(m, flux_head_dim(a), "%s_attn.norm.query_norm.weight", prefix);
    s->k_norm = add_norm(m, flux_head_dim(a), "%s_attn.norm.key_norm.weight", prefix);
    add_linear(m, &s->proj, INIT_XAVIER_UNIFORM, 0, D, D, true, "%s_attn.proj", prefix);
    add_linear(m, &s->mlp_in, INIT_XAVIER_UNIFORM, 0, M, D, true, "%s_mlp.0", prefix);
    add_linear(m, &s->mlp_out, INIT_XAVIER_UNIFORM, 0, D, M, true, "%s_mlp.2", prefix);
}

static void add_double(Model *m, Flux *f, int i) {
    FluxDouble *b = &f->doubles[i];
    char prefix[2][32];
    snprintf(prefix[0], sizeof prefix[0], "double_blocks.%d.img", i);
    snprintf(prefix[1], sizeof prefix[1], "double_blocks.%d.txt", i);
    *b = (FluxDouble){.args = &f->args, .rope = &f->rope};
    add_stream(m, &f->args, &b->img, prefix[0]);
    add_stream(m, &f->args, &b->txt, prefix[1]);
}

static void add_single(Model *m, Flux *f, int i) {
    const FluxArgs *a = &f->args;
    FluxSingle *b = &f->singles[i];
    int64_t D = a->hidden_size, M = flux_mlp_hidden(a);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "single_blocks.%d", i);
    *b = (FluxSingle){.args = a, .rope = &f->rope};
    add_linear(m, &b->linear1, INIT_XAVIER_UNIFORM, 0, 3 * D + M, D, true, "%s.linear1", prefix);
    add_linear(m, &b->linear2, INIT_XAVIER_UNIFORM, 0, D, D + M, true, "%s.linear2", prefix);
    b->q_norm = add_norm(m, flux_head_dim(a), "%s.norm.query_norm.weight", prefix);
    b->k_norm = add_norm(m, flux_head_dim(a), "%s.norm.key_norm.weight", prefix);
    add_linear(m, &b->mod, INIT_ZEROS, 0, 3 * D, D, true, "%s.modulation.lin", prefix);
}

static void add_head(Model *m, Flux *f) {
    const FluxArgs *a = &f->args;
    int64_t D = a->hidden_size;
    f->head.args = a;
    f->head.share = &f->rope;
    add_linear(m, &f->head.linear, INIT_ZEROS, 0, a->out_channels, D, true, "final_layer.linear");
    add_linear(m, &f->head.adaln, INIT_ZEROS, 0, 2 * D, D, true,
               "final_layer.adaLN_modulation.1");
}

// ---- FLOPs ---------------------------------------------------------------------------------

// 6 FLOPs per weight per row it multiplies (2 forward, 4 backward), rows per sample.
static double linear_flops(const FluxLinear *l, double rows) {
    size_t n = l->linear.weight->numel + (l->bias ? l->bias->numel : 0);
    return 6.0 * (double)n * rows;
}

// Each block's training FLOPs per row of the hidden state (S per sample): its linears on the
// rows they see (the modulations and embedders once per sample) and, as torchtitan's
// get_nparams_and_flops, 12 D Tj^2 per sample for the joint attention's two products (no mask:
// its kernels do all of them).
static void count_flops(Model *m, const Flux *f) {
    const FluxArgs *a = &f->args;
    double L = a->txt_len, N = flux_img_tokens(a), Tj = L + N, S = flux_seq_len(a);
    double attention = 12.0 * a->hidden_size * Tj * Tj;
    m->block_flops = xcalloc((size_t)m->n_blocks, sizeof(BlockFlops));
    BlockFlops *flops = m->block_flops;
    const FluxEmbed *e = &f->embed;
    flops[0].gemm = linear_flops(&e->img_in, N) + linear_flops(&e->txt_in, L);
    const FluxLinear *embedders[] = {&e->time_in.in_layer, &e->time_in.out_layer,
                                     &e->vector_in.in_layer, &e->vector_in.out_layer,
                                     &e->guidance_in.in_layer, &e->guidance_in.out_layer};
    for (int i = 0; i < (a->guidance_embed ? 6 : 4); i++)
        flops[0].gemm += linear_flops(embedders[i], 1);
    for (int i = 0; i < a->depth; i++) {
        const FluxStream *st[2] = {&f->doubles[i].txt, &f->doubles[i].img};
        BlockFlops *fl = &flops[1 + i];
        fl->attention = attention;
        for (int j = 0; j < 2; j++) {
            double rows = j ? N : L;
            fl->gemm += linear_flops(&st[j]->mod, 1) + linear_flops(&st[j]->qkv, rows) +
                   linear_flops(&st[j]->proj, rows) + linear_flops(&st[j]->mlp_in, rows) +
                   linear_flops(&st[j]->mlp_out, rows);
        }
    }
    for (int i = 0; i < a->depth_single_blocks; i++) {
        const FluxSingle *b = &f->singles[i];
        flops[1 + a->depth + i] = (BlockFlops){
            .gemm = linear_flops(&b->mod, 1) + linear_flops(&b->linear1, Tj) +
                    linear_flops(&b->linear2, Tj),
            .attention = attention};
    }
    flops[m->n_blocks - 1].gemm =
        linear_flops(&f->head.linear, N) + linear_flops(&f->head.adaln, 1);
    for (int b = 0; b < m->n_blocks; b++) {
        flops[b].gemm /= S, flops[b].attention /= S;
        flops[b].gemm_done = flops[b].gemm, flops[b].attention_done = flops[b].attention;
        m->flops_per_token += flops[b].gemm + flops[b].attention;
    }
}

// ---- build ---------------------------------------------------------------------------------

// Block i's parameters: those added since the table had `before`.
static Block block_of(const BlockOps *ops, void *self, bool checkpointed, const Model *m,
                      int before) {
    return (Block){.ops = ops, .self = self, .checkpointed = checkpointed,
                   .n_params = m->params.count - before};
}

void flux_build(Model *m, const FluxArgs *args, bool activation_checkpoint) {
    char err[256];
    CHECK(!flux_args_check(args, err, sizeof err));
    Flux *f = xcalloc(1, sizeof(Flux));
    f->args = *args;
    const FluxArgs *a = &f->args;
    rope_tables(f);
    f->doubles = xcalloc((size_t)a->depth, sizeof(FluxDouble));
    f->singles = xcalloc((size_t)a->depth_single_blocks, sizeof(FluxSingle));
    *m = (Model){.dim = a->hidden_size, .n_blocks = a->depth + a->depth_single_blocks + 2,
                 .self = f, .place_buffers = place_buffers};
    params_init(&m->params, 16 + 24 * a->depth + 8 * a->depth_single_blocks + 4);
    m->blocks = xcalloc((size_t)m->n_blocks, sizeof(Block));
    int before = 0;
    add_embed(m, f);
    m->blocks[0] = block_of(&FLUX_EMBED_OPS, &f->embed, false, m, before);
    for (int i = 0; i < a->depth; i++) {
        before = m->params.count;
        add_double(m, f, i);
        m->blocks[1 + i] = block_of(&FLUX_DOUBLE_OPS, &f->doubles[i], activation_checkpoint, m,
                                    before);
    }
    for (int i = 0; i < a->depth_single_blocks; i++) {
        before = m->params.count;
        add_single(m, f, i);
        m->blocks[1 + a->depth + i] =
            block_of(&FLUX_SINGLE_OPS, &f->singles[i], activation_checkpoint, m, before);
    }
    before = m->params.count;
    add_head(m, f);
    m->blocks[m->n_blocks - 1] = block_of(&FLUX_HEAD_OPS, &f->head, false, m, before);
    count_flops(m, f);
    model_slots_init(&m->slots, m);
}

void flux_free(Model *m) {
    Flux *f = m->self;
    model_buffer_free(f->rope_data, f->rope_memory);
    free(f->doubles);
    free(f->singles);
    free(f);
    model_free_parts(m);
}
