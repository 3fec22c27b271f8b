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

// torchtitan's llama3_configs; "small" is titan's benchmark shape (scripts/bench_cpu.sh),
// "medium" its checkpoint benchmark's: 98.6M parameters, a 1.18 GB training state
// (scripts/bench_checkpoint.sh); "8B_4L" the 8B's layers, four of them, what one GPU holds with
// its whole training state (scripts/bench_gpu.sh). vocab_size 0 keeps Llama 3's 128256 tokens.
static const Flavor FLAVORS[] = {
    {"debugmodel", 256, 6, 16, 0, 2048, 256, 0, 500000},
    {"small", 256, 4, 8, 4, 2048, 256, 0, 500000},
    {"medium", 1024, 8, 16, 8, 2048, 256, 0, 500000},
    {"1B", 2048, 16, 32, 8, 0, 256, 1.5, 500000},  // Llama 3.2 1B's shape: the GPU benchmark
    {"8B", 4096, 32, 32, 8, 0, 1024, 1.3, 500000},
    {"8B_4L", 4096, 4, 32, 8, 0, 1024, 1.3, 500000},
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
    return decoder_flavor_names(names, sizeof names, &FLAVORS[0].name, sizeof FLAVORS[0],
                                N_FLAVORS);
}

void llama3_args_from_checkpoint(const char *path, LlamaArgs *a) {
    *a = DEFAULTS;
    decoder_args_from_checkpoint(path, a);
}
