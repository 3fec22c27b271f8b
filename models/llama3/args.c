#include <stdio.h>
#include <string.h>

#include "core/errors.h"
#include "models/llama3/llama3.h"

// torchtitan's TransformerModelArgs defaults (torchtitan/models/llama3/model/args.py).
static const LlamaArgs DEFAULTS = {
    .n_kv_heads = 0, .multiple_of = 256, .ffn_dim_multiplier = 0, .norm_eps = 1e-5,
    .rope_theta = 10000, .rope_scaling = false, .rope_scaling_factor = 8.0,
    .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0, .rope_original_max_pos = 8192,
    .max_seq_len = 131072, .depth_init = true,
};

typedef struct {
    const char *name;
    int dim, n_layers, n_heads, n_kv_heads, vocab_size, multiple_of;
    double ffn_dim_multiplier, rope_theta;
} Flavor;

// torchtitan's llama3_configs; "small" is titan's benchmark shape (scripts/bench_cpu.sh).
// vocab_size 0 keeps Llama 3's 128256 tokens.
static const Flavor FLAVORS[] = {
    {"debugmodel", 256, 6, 16, 0, 2048, 256, 0, 500000},
    {"small", 256, 4, 8, 4, 2048, 256, 0, 500000},
    {"1B", 2048, 16, 32, 8, 0, 256, 1.5, 500000},  // Llama 3.2 1B's shape: the GPU benchmark
    {"8B", 4096, 32, 32, 8, 0, 1024, 1.3, 500000},
    {"70B", 8192, 80, 64, 8, 0, 4096, 1.3, 500000},
    {"405B", 16384, 126, 128, 8, 0, 4096, 1.2, 500000},
};
#define N_FLAVORS (int)(sizeof FLAVORS / sizeof FLAVORS[0])

bool llama3_flavor(const char *name, LlamaArgs *args) {
    for (int i = 0; i < N_FLAVORS; i++) {
        const Flavor *f = &FLAVORS[i];
        if (strcmp(f->name, name) != 0) continue;
        *args = DEFAULTS;
        args->dim = f->dim;
        args->n_layers = f->n_layers;
        args->n_heads = f->n_heads;
        args->n_kv_heads = f->n_kv_heads ? f->n_kv_heads : f->n_heads;
        args->vocab_size = f->vocab_size ? f->vocab_size : 128256;
        args->multiple_of = f->multiple_of;
        args->ffn_dim_multiplier = f->ffn_dim_multiplier;
        args->rope_theta = f->rope_theta;
        return true;
    }
    return false;
}

const char *llama3_flavor_names(void) {
    static char names[128];
    if (!names[0])
        for (int i = 0; i < N_FLAVORS; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     FLAVORS[i].name);
    return names;
}

// torchtitan's FeedForward sizing: 2/3 of 4*dim (SwiGLU keeps the FLOPs of a 4*dim GELU MLP),
// times the optional multiplier, rounded up to multiple_of.
int llama3_hidden_dim(const LlamaArgs *a) {
    if (a->hidden_dim > 0) return a->hidden_dim;
    int hidden = 4 * a->dim;
    hidden = (int)(2 * hidden / 3);
    if (a->ffn_dim_multiplier > 0) hidden = (int)(a->ffn_dim_multiplier * hidden);
    return a->multiple_of * ((hidden + a->multiple_of - 1) / a->multiple_of);
}

int llama3_describe(const LlamaArgs *a, CkptAttr out[LLAMA3_N_ATTRS]) {
    int n = 0;
#define INT_ATTR(key, value) out[n++] = (CkptAttr){.name = "model." key, .type = CKPT_INT, .i = (value)}
#define REAL_ATTR(key, value) out[n++] = (CkptAttr){.name = "model." key, .type = CKPT_DOUBLE, .d = (value)}
    INT_ATTR("dim", a->dim);
    INT_ATTR("n_layers", a->n_layers);
    INT_ATTR("n_heads", a->n_heads);
    INT_ATTR("n_kv_heads", a->n_kv_heads);
    INT_ATTR("vocab_size", a->vocab_size);
    INT_ATTR("hidden_dim", llama3_hidden_dim(a));
    REAL_ATTR("norm_eps", a->norm_eps);
    REAL_ATTR("rope_theta", a->rope_theta);
    INT_ATTR("rope_scaling", a->rope_scaling);
    REAL_ATTR("rope_scaling_factor", a->rope_scaling_factor);
    REAL_ATTR("rope_low_freq_factor", a->rope_low_freq_factor);
    REAL_ATTR("rope_high_freq_factor", a->rope_high_freq_factor);
    INT_ATTR("rope_original_max_pos", a->rope_original_max_pos);
    INT_ATTR("tie_word_embeddings", a->tie_word_embeddings);
#undef INT_ATTR
#undef REAL_ATTR
    return n;
}

// A shape attribute: a checkpoint is user input, so a size outside an int (or below 1) is
// refused naming the attribute rather than truncated.
static int shape_attr(const char *path, const char *attr) {
    return (int)ckpt_read_int_in(path, attr, 1, INT32_MAX);
}

void llama3_args_from_checkpoint(const char *path, LlamaArgs *a) {
    *a = DEFAULTS;
    a->dim = shape_attr(path, "model.dim");
    a->n_layers = shape_attr(path, "model.n_layers");
    a->n_heads = shape_attr(path, "model.n_heads");
    a->n_kv_heads = shape_attr(path, "model.n_kv_heads");
    a->vocab_size = shape_attr(path, "model.vocab_size");
    a->hidden_dim = shape_attr(path, "model.hidden_dim");
    a->norm_eps = ckpt_read_double(path, "model.norm_eps");
    a->rope_theta = ckpt_read_double(path, "model.rope_theta");
    a->rope_scaling = ckpt_read_int_in(path, "model.rope_scaling", 0, 1) != 0;
    a->rope_scaling_factor = ckpt_read_double(path, "model.rope_scaling_factor");
    a->rope_low_freq_factor = ckpt_read_double(path, "model.rope_low_freq_factor");
    a->rope_high_freq_factor = ckpt_read_double(path, "model.rope_high_freq_factor");
    a->rope_original_max_pos = shape_attr(path, "model.rope_original_max_pos");
    a->tie_word_embeddings = ckpt_read_int_in(path, "model.tie_word_embeddings", 0, 1) != 0;
    if (a->dim % a->n_heads != 0 || a->n_heads % a->n_kv_heads != 0)
        die_user("checkpoint %s: model.dim %d, n_heads %d and n_kv_heads %d do not divide "
                 "evenly", path, a->dim, a->n_heads, a->n_kv_heads);
}
