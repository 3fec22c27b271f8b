// Decoder construction: the parameter table (torchtitan's names, shapes and init) and
// the block list embed, layers.0 .. layers.{n-1}, head.
#include <math.h>
#include <stdlib.h>

#include "core/errors.h"
#include "models/lora.h"
#include "models/decoder/blocks.h"
#include "models/moe/balance.h"

typedef struct {
    DecoderArgs args;
    DecoderEmbed embed;
    DecoderLayer *layers;
    DecoderHead head;
    float *rope_cos, *rope_sin;  // (max_seq_len, head_dim/2), one allocation from rope_cos
    const KernelOps *rope_memory;  // whose memory holds them after placing; NULL: host
    MoeLayer *moe;               // each MoE layer's (main layers', then the MTP modules'), or NULL
    DecoderMtp *mtp;             // (mtp_layers) the multi-token prediction modules
    MoeBalance balance;          // their expert load and biases (Model.moe)
    const KernelOps *moe_memory; // the backend holding balance's scratch; NULL: not placed
} Decoder;

// Llama 3.1's frequency scaling (Meta's apply_scaling): long wavelengths are slowed by
// scale_factor, short ones kept, and the band between interpolated smoothly.
static double rope_scaled_freq(const DecoderArgs *a, double freq) {
    double low_wavelen = a->rope_original_max_pos / a->rope_low_freq_factor;
    double high_wavelen = a->rope_original_max_pos / a->rope_high_freq_factor;
    double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) return freq;
    if (wavelen > low_wavelen) return freq / a->rope_scaling_factor;
    double smooth = (a->rope_original_max_pos / wavelen - a->rope_low_freq_factor) /
                    (a->rope_high_freq_factor - a->rope_low_freq_factor);
    return (1 - smooth) * freq / a->rope_scaling_factor + smooth * freq;
}

// YaRN's frequency i of `half` (torchtitan's _yarn_inv_freq, truncated cutoffs): the band of
// dimensions between the ones rotating beta_fast and beta_slow times over original_seq_len
// positions is a linear ramp from the kept frequency to the one divided by the factor.
static double rope_yarn_freq(const DecoderArgs *a, double freq, int i, int half) {
    const YarnArgs *y = &a->yarn;
    int dim = 2 * half;
    double log_base = 2 * log(a->rope_theta);
    double low = floor(dim * log(y->original_seq_len / (y->beta_fast * 2 * M_PI)) / log_base);
    double high = ceil(dim * log(y->original_seq_len / (y->beta_slow * 2 * M_PI)) / log_base);
    low = fmax(low, 0), high = fmin(high, dim - 1);
    if (low == high) high += 0.001;
    double ramp = fmin(fmax((i - low) / (high - low), 0), 1);
    return freq / y->factor * ramp + freq * (1 - ramp);
}

// torchtitan's precompute_freqs_cis, as cos/sin tables; computed in double so the tables are
// correctly rounded whatever the position.
static void rope_tables(Decoder *l) {
    const DecoderArgs *a = &l->args;
    int half = decoder_rope_dim(a) / 2;
    l->rope_cos = xmalloc(2 * (size_t)a->max_seq_len * half * sizeof(float));
    l->rope_sin = l->rope_cos + (size_t)a->max_seq_len * half;
    for (int i = 0; i < half; i++) {
        double freq = 1.0 / pow(a->rope_theta, 2.0 * i / (2 * half));
        if (a->rope_scaling) freq = rope_scaled_freq(a, freq);
        if (a->yarn.factor > 1) freq = rope_yarn_freq(a, freq, i, half);
        for (int t = 0; t < a->max_seq_len; t++) {
            l->rope_cos[(size_t)t * half + i] = (float)cos(t * freq);
            l->rope_sin[(size_t)t * half + i] = (float)sin(t * freq);
        }
    }
}

// The weight (out, in) of the Linear named prefix + module ("layers.3." + "attention.wq"; ""
// for the model's own), module.weight, and its LoRA adapters where a->lora targets it.
static Param *add_matrix(ParamTable *t, const DecoderArgs *a, ParamInit init, double std,
                         int64_t out, int64_t in, const char *prefix, const char *module) {
    return lora_add_linear(t, a->lora, init, std, out, in, prefix, module);
}

static Param *add_vector(ParamTable *t, int64_t n, const char *prefix, const char *name) {
    return &t->items[params_add(t, INIT_ONES, 0, 1, &n, "%s%s", prefix, name)];
}

// The distributions of layer i's weights (DecoderInit, decoder.h, says whose): `in` for wq, wk,
// wv, w1.
typedef struct {
    ParamInit kind;
    double in, wo, w2, w3;
    MoeInit moe;
} LayerInit;

static LayerInit layer_init(const DecoderArgs *a, int i) {
    if (a->init == DECODER_INIT_QWEN3) {
        // torchtitan 0.3.0 models/qwen3/__init__.py: _build_qwen3_layers gives every linear
        // _LINEAR_INIT; _build_qwen3_moe_layers gives wo _residual_output_init(n_layers) and
        // the experts _moe_experts_init(n_layers) (w2_EDF scaled), the router _LINEAR_INIT.
        double out = decoder_has_moe(a) ? 0.02 / sqrt(2.0 * a->n_layers) : 0.02;
        return (LayerInit){
            .kind = INIT_NORMAL, .in = 0.02, .wo = out, .w2 = 0.02, .w3 = 0.02,
            .moe = {.kind = INIT_NORMAL, .gate = 0.02, .w1 = 0.02, .w2 = out, .w3 = 0.02}};
    }
    // torchtitan's llama3: _depth_init(layer_id) on wo, w2, w3 (and, as its MoE layers had
    // it, the router and the experts' w2, w3).
    double out = 0.02 / sqrt(2.0 * (a->depth_init ? i + 1 : a->n_layers));
    return (LayerInit){
        .kind = INIT_TRUNC_NORMAL, .in = 0.02, .wo = out, .w2 = out, .w3 = out,
        .moe = {.kind = INIT_TRUNC_NORMAL, .gate = out, .w1 = 0.02, .w2 = out, .w3 = out}};
}

// MLA's weights (torchtitan's deepseek_v3 Attention: wq or wq_a, q_norm, wq_b; wkv_a,
// kv_norm, wkv_b), each projection at the layer's `in` std.
static void add_mla(DecoderLayer *L, ParamTable *t, const LayerInit *init) {
    const DecoderArgs *a = L->args;
    const char *P = L->prefix;
    const MlaArgs *m = &a->mla;
    MlaWeights *w = &L->mla;
    int64_t q = (int64_t)a->n_heads * decoder_head_dim(a);
    int64_t kv = (int64_t)a->n_heads * (m->qk_nope_head_dim + m->v_head_dim);
    ParamInit k = init->kind;
    w->on = true;
    if (m->q_lora_rank) {
        w->wq_a = add_matrix(t, a, k, init->in, m->q_lora_rank, a->dim, P, "attention.wq_a");
        w->q_norm = add_vector(t, m->q_lora_rank, P, "attention.q_norm.weight");
        w->wq_b = add_matrix(t, a, k, init->in, q, m->q_lora_rank, P, "attention.wq_b");
        w->linear.wq_a = linear_of(w->wq_a);
        w->linear.wq_b = linear_of(w->wq_b);
    } else {
        w->wq = add_matrix(t, a, k, init->in, q, a->dim, P, "attention.wq");
        w->linear.wq = linear_of(w->wq);
    }
    w->wkv_a = add_matrix(t, a, k, init->in, m->kv_lora_rank + m->qk_rope_head_dim, a->dim,
                          P, "attention.wkv_a");
    w->kv_norm = add_vector(t, m->kv_lora_rank, P, "attention.kv_norm.weight");
    w->wkv_b = add_matrix(t, a, k, init->in, kv, m->kv_lora_rank, P, "attention.wkv_b");
    w->linear.wkv_a = linear_of(w->wkv_a);
    w->linear.wkv_b = linear_of(w->wkv_b);
}

// Grouped-query attention's weights (wq, wk, wv; q_norm and k_norm with QK-norm).
static void add_gqa(DecoderLayer *L, ParamTable *t, const LayerInit *init) {
    const DecoderArgs *a = L->args;
    const char *P = L->prefix;
    int hd = decoder_head_dim(a);
    ParamInit k = init->kind;
    L->wq = add_matrix(t, a, k, init->in, (int64_t)a->n_heads * hd, a->dim,
                       P, "attention.wq");
    L->wk = add_matrix(t, a, k, init->in, (int64_t)a->n_kv_heads * hd, a->dim,
                       P, "attention.wk");
    L->wv = add_matrix(t, a, k, init->in, (int64_t)a->n_kv_heads * hd, a->dim,
                       P, "attention.wv");
    L->linear.wq = linear_of(L->wq);
    L->linear.wk = linear_of(L->wk);
    L->linear.wv = linear_of(L->wv);
}

// The parameters of a layer: attention_norm, the attention's, wo, QK-norm's, ffn_norm, the
// FFN's (moe: the MoE layer's).
static int layer_param_count(const DecoderArgs *a, bool moe) {
    int attention = 3;
    if (decoder_has_mla(a)) attention = a->mla.q_lora_rank ? 6 : 4;
    int ffn = moe ? moe_param_count(&a->moe) : 3;
    return 1 + attention + 1 + (a->qk_norm ? 2 : 0) + 1 + ffn;
}

// Whether the MTP modules' layers are MoE layers: they are copies of the last layer.
static bool mtp_is_moe(const DecoderArgs *a) { return decoder_layer_is_moe(a, a->n_layers - 1); }

// The layer L, named by prefix ("layers.3."), initialised as layer init_layer (an MTP module's
// as the last layer), its MoE layer (moe: the model's MoE layers' row `moe_index`, else none).
static void add_layer(Decoder *l, DecoderLayer *L, ParamTable *t, const char *prefix,
                      int init_layer, MoeLayer *moe, int moe_index) {
    const DecoderArgs *a = &l->args;
    int H = decoder_hidden_dim(a);
    LayerInit init = layer_init(a, init_layer);
    ParamInit k = init.kind;
    *L = (DecoderLayer){.args = a, .layer_id = init_layer, .rope_cos = l->rope_cos,
                        .rope_sin = l->rope_sin};
    snprintf(L->prefix, sizeof L->prefix, "%s", prefix);
    const char *P = L->prefix;
    L->attention_norm = add_vector(t, a->dim, P, "attention_norm.weight");
    if (decoder_has_mla(a))
        add_mla(L, t, &init);
    else
        add_gqa(L, t, &init);
    int64_t heads_out = (int64_t)a->n_heads * (decoder_has_mla(a) ? a->mla.v_head_dim
                                                                   : decoder_head_dim(a));
    L->wo = add_matrix(t, a, k, init.wo, a->dim, heads_out, P, "attention.wo");
    if (a->qk_norm) {
        int hd = decoder_head_dim(a);
        L->q_norm = add_vector(t, hd, P, "attention.q_norm.weight");
        L->k_norm = add_vector(t, hd, P, "attention.k_norm.weight");
    }
    L->ffn_norm = add_vector(t, a->dim, P, "ffn_norm.weight");
    if (moe) {
        L->moe = moe;
        moe_layer_init(moe, &a->moe, moe_index, t, P, &init.moe, a->lora);
        l->balance.bias[moe_index] = moe->expert_bias;
    } else {
        L->w1 = add_matrix(t, a, k, init.in, H, a->dim, P, "feed_forward.w1");
        L->w2 = add_matrix(t, a, k, init.w2, a->dim, H, P, "feed_forward.w2");
        L->w3 = add_matrix(t, a, k, init.w3, H, a->dim, P, "feed_forward.w3");
        L->linear.w1 = linear_of(L->w1);
        L->linear.w2 = linear_of(L->w2);
        L->linear.w3 = linear_of(L->w3);
    }
    L->linear.wo = linear_of(L->wo);
}

// Main layer i; the MoE layers' rows of the expert load come first, the MTP modules' after.
static void add_main_layer(Decoder *l, ParamTable *t, int i) {
    char prefix[24];
    snprintf(prefix, sizeof prefix, "layers.%d.", i);
    int moe_index = i - l->args.n_dense_layers;
    bool moe = decoder_layer_is_moe(&l->args, i);
    add_layer(l, &l->layers[i], t, prefix, i, moe ? &l->moe[moe_index] : NULL, moe_index);
}

// MTP module j (torchtitan's mtp_layers.j: enorm, hnorm, eh_proj, its layer, mtp_norm): the
// norms ones, eh_proj nn.Linear's default (uniform within 1 / sqrt(2 dim)), the layer a copy
// of the last layer's.
static void add_mtp(Decoder *l, ParamTable *t, int j) {
    const DecoderArgs *a = &l->args;
    DecoderMtp *m = &l->mtp[j];
    char prefix[24];
    snprintf(prefix, sizeof prefix, "mtp_layers.%d.", j);
    m->enorm = add_vector(t, a->dim, prefix, "enorm.weight");
    m->hnorm = add_vector(t, a->dim, prefix, "hnorm.weight");
    m->eh_proj = add_matrix(t, a, INIT_KAIMING_UNIFORM, 0, a->dim, 2 * (int64_t)a->dim, prefix,
                            "eh_proj");
    m->eh_linear = linear_of(m->eh_proj);
    int moe_index = a->n_layers - a->n_dense_layers + j;
    add_layer(l, &m->layer, t, prefix, a->n_layers - 1, mtp_is_moe(a) ? &l->moe[moe_index] : NULL,
              moe_index);
    m->mtp_norm = add_vector(t, a->dim, prefix, "mtp_norm.weight");
    m->block = (Block){.ops = &DECODER_LAYER_OPS, .self = &m->layer};
}

// tok_embeddings.weight: llama3's N(0, 1), qwen3's N(0, 0.02) (_EMBEDDING_INIT; a tied
// flavor's _EMBEDDING_SKIP_INIT leaves the shared matrix to lm_head's _LINEAR_INIT, also 0.02).
static Param *add_embedding(ParamTable *t, const DecoderArgs *a) {
    int64_t shape[2] = {a->vocab_size, a->dim};
    double std = a->init == DECODER_INIT_QWEN3 ? 0.02 : 1.0;
    return &t->items[params_add(t, INIT_NORMAL, std, 2, shape, "tok_embeddings.weight")];
}

// An untied output.weight: llama3's N(0, 1 / sqrt(dim)) truncated at 3 std, qwen3's
// _LINEAR_INIT N(0, 0.02).
static Param *add_output(ParamTable *t, const DecoderArgs *a) {
    if (a->init == DECODER_INIT_QWEN3)
        return add_matrix(t, a, INIT_NORMAL, 0.02, a->vocab_size, a->dim, "", "output");
    double std = 1 / sqrt((double)a->dim);
    Param *p = add_matrix(t, a, INIT_TRUNC_NORMAL, std, a->vocab_size, a->dim, "", "output");
    p->init_cutoff = 3 * std;
    return p;
}

// The blocks' Linears, in the order of the parameters, into Model.linears.
static void add_layer_linears(Model *m, DecoderLayer *L) {
    Linear *own[DECODER_LAYER_LINEARS];
    for (int j = 0, n = decoder_layer_linears(L, own); j < n; j++) model_linear_add(m, own[j], NULL);
    Linear *moe[MOE_MAX_LINEARS];
    for (int j = 0, n = L->moe ? moe_layer_linears(L->moe, moe) : 0; j < n; j++)
        model_linear_add(m, moe[j], NULL);
}

static void add_linears(Model *m, Decoder *l) {
    for (int i = 0; i < l->args.n_layers; i++) add_layer_linears(m, &l->layers[i]);
    model_linear_add(m, &l->head.linear, "output");  // tied or not, torchtitan's module
    for (int j = 0; j < l->args.mtp_layers; j++) {
        model_linear_add(m, &l->mtp[j].eh_linear, NULL);
        add_layer_linears(m, &l->mtp[j].layer);
    }
}

// torchtitan's get_num_flop_per_token, block by block: 6 FLOPs per weight per token (2 forward,
// 4 backward) over all but the embedding table and its copy (a routed expert's weights count
// top_k / E of theirs: the active ones), plus in each layer 6 * heads * (qk + v) * seq_len for the
// attention scores (q and k's head width qk) and values (v's: 12 * heads * head_dim * seq_len
// where they are one width), counted as if not causal, as torchtitan and PaLM do. The blocks'
// shares sum to the whole model's 6N + 6 L H (qk + v) T (exactly: integers far below 2^53), so
// a pipeline stage's FLOPs are the sum over its blocks. The causal mask's kernels do half of the
// attention's, MLA's values padded to qk.
static void count_flops(Model *m, const DecoderArgs *a, int seq_len, const Param *embed) {
    int qk = decoder_head_dim(a), v = decoder_has_mla(a) ? a->mla.v_head_dim : qk;
    double attention = 6.0 * a->n_heads * (qk + v) * seq_len;
    double attention_done = 6.0 * a->n_heads * (2 * qk) * seq_len / 2;
    m->block_flops = xcalloc((size_t)m->n_blocks, sizeof(BlockFlops));
    int param = 0;
    for (int b = 0; b < m->n_blocks; b++) {
        double weights = 0;
        for (int j = 0; j < m->blocks[b].n_params; j++, param++) {
            const Param *p = &m->params.items[param];
            double active = p->expert ? (double)a->moe.router.top_k / a->moe.router.n_experts : 1;
            if (p != embed && !p->copy && !p->buffer) weights += (double)p->numel * active;
        }
        // the head's MTP modules' attention, and their uses of the output projection, are
        // done, not counted by torchtitan's MFU
        bool layer = b > 0 && b + 1 < m->n_blocks, head = b + 1 == m->n_blocks;
        double reused = head ? 6.0 * a->mtp_layers * a->vocab_size * a->dim : 0;
        BlockFlops *f = &m->block_flops[b];
        *f = (BlockFlops){.gemm = 6 * weights, .gemm_done = 6 * weights + reused,
                          .attention = layer ? attention : 0,
                          .attention_done = layer  ? attention_done
                                            : head ? a->mtp_layers * attention_done
                                                   : 0};
        m->flops_per_token += f->gemm + f->attention;
    }
}

// The MoE balance's scratch lives in the backend's memory.
static void place_moe(Decoder *l, const KernelOps *k) {
    if (!l->moe || l->moe_memory) return;
    moe_balance_place(&l->balance, k);
    l->moe_memory = k;
}

// The RoPE tables are read by every layer's kernels, so they move to the backend's memory.
static void place_buffers(Model *m, const KernelOps *k) {
    Decoder *l = m->self;
    place_moe(l, k);
    if (k->host_memory || l->rope_memory) return;
    size_t n = (size_t)(l->rope_sin - l->rope_cos) * 2, bytes = n * sizeof(float);
    float *placed = k->alloc(bytes);
    if (!placed) die_user("cannot allocate the RoPE tables (%zu bytes) in device memory", bytes);
    k->upload(placed, l->rope_cos, bytes);
    free(l->rope_cos);
    l->rope_cos = placed;
    l->rope_sin = placed + n / 2;
    l->rope_memory = k;
    for (int i = 0; i < l->args.n_layers; i++) {
        l->layers[i].rope_cos = l->rope_cos;
        l->layers[i].rope_sin = l->rope_sin;
    }
    for (int j = 0; j < l->args.mtp_layers; j++) {
        l->mtp[j].layer.rope_cos = l->rope_cos;
        l->mtp[j].layer.rope_sin = l->rope_sin;
    }
}

void decoder_build(Model *m, const DecoderArgs *args, bool activation_checkpoint) {
    Decoder *l = xcalloc(1, sizeof(Decoder));
    l->args = *args;
    const DecoderArgs *a = &l->args;
    rope_tables(l);
    l->layers = xcalloc((size_t)a->n_layers, sizeof(DecoderLayer));
    *m = (Model){.dim = a->dim, .n_blocks = a->n_layers + 2, .self = l,
                 .place_buffers = place_buffers};
    ParamTable *t = &m->params;
    int K = a->mtp_layers;
    bool mtp_moe = K && mtp_is_moe(a);
    if (decoder_has_moe(a)) {
        int moe_layers = a->n_layers - a->n_dense_layers + (mtp_moe ? K : 0);
        l->moe = xcalloc((size_t)moe_layers, sizeof(MoeLayer));
        moe_balance_init(&l->balance, moe_layers, a->moe.router.n_experts,
                         a->moe.load_balance_coeff, a->moe.aux_loss_alpha > 0);
        m->moe = &l->balance;
    }
    l->mtp = K ? xcalloc((size_t)K, sizeof(DecoderMtp)) : NULL;
    int head_params = (a->tie_word_embeddings ? 1 : 2) + (K ? 1 : 0) +
                      K * (4 + layer_param_count(a, mtp_moe));
    int n_params = 1 + head_params;
    for (int i = 0; i < a->n_layers; i++)
        n_params += layer_param_count(a, decoder_layer_is_moe(a, i));
    params_init(t, a->lora ? 3 * n_params : n_params);  // at most two adapters per weight

    // Each block's parameters are those the table gained while it was added.
    m->blocks = xcalloc((size_t)m->n_blocks, sizeof(Block));
    l->embed = (DecoderEmbed){.args = a};
    l->embed.tok_embeddings = add_embedding(t, a);
    m->blocks[0] = (Block){.ops = &DECODER_EMBED_OPS, .self = &l->embed, .n_params = t->count};
    for (int i = 0; i < a->n_layers; i++) {
        int first = t->count;
        add_main_layer(l, t, i);
        m->blocks[i + 1] = (Block){.ops = &DECODER_LAYER_OPS, .self = &l->layers[i],
                                   .checkpointed = activation_checkpoint,
                                   .n_params = t->count - first};
    }
    int first = t->count;
    l->head = (DecoderHead){.args = a, .mtp = l->mtp};
    l->head.norm = add_vector(t, a->dim, "", "norm.weight");
    l->head.output = a->tie_word_embeddings ? l->embed.tok_embeddings : add_output(t, a);
    if (a->tie_word_embeddings)  // the output Linear's adapters are the head's
        lora_add_adapters(t, a->lora, "output", a->vocab_size, a->dim);
    l->head.linear = linear_of(l->head.output);
    if (K) l->head.embed = &t->items[params_add_copy(t, (int)(l->embed.tok_embeddings - t->items))];
    for (int j = 0; j < K; j++) add_mtp(l, t, j);
    m->blocks[m->n_blocks - 1] = (Block){.ops = &DECODER_HEAD_OPS, .self = &l->head,
                                         .n_params = t->count - first};
    add_linears(m, l);
    count_flops(m, a, a->max_seq_len, l->embed.tok_embeddings);
    model_slots_init(&m->slots, m);
}

void decoder_free(Model *m) {
    Decoder *l = m->self;
    model_buffer_free(l->rope_cos, l->rope_memory);
    for (int i = 0; l->moe && i < l->balance.n_layers; i++) moe_layer_free(&l->moe[i]);
    if (l->moe) moe_balance_free(&l->balance, l->moe_memory);
    free(l->moe);
    free(l->mtp);
    free(l->layers);
    free(l);
    model_free_parts(m);
}
