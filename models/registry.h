// The model registry: torchtitan's TrainSpec in C. `model.name` picks a ModelSpec, a table of
// what the architecture knows of itself (flavors, build, tensor-parallel plan and checks, the
// checkpoint attributes that describe it, Hugging Face import/export, incremental decoding),
// so that the trainer, checkpoints, `--estimate`, `generate` and `convert` call through it and
// name no architecture.
//
// An architecture's args (torchtitan's per-flavor model_args) are its own struct; ModelArgs
// holds any of them by value, as a union tagged with the spec that filled it, so callers keep,
// copy and pass them without allocating or knowing the type. Only that spec reads the union
// (for the decoder's architectures, llama3 and qwen3, with models/decoder/decoder_spec.h's
// functions, which read the DecoderArgs their members begin with).
// The few numbers outside models/ needs (layers, width, vocabulary, RoPE length, tied
// embeddings) come out through spec->shape, and the run's settings go in through
// spec->update_from_config: one getter and one setter instead of fields mirrored in two
// structs. Adding an architecture is its member in the union, its spec's declaration below and
// its line in the registry's table (registry.c). core/config.c accepts any model.name; the
// trainer looks it up here as soon as the config is read. A step's inputs and its loss are the
// architecture's too: StepCtx.input has the type its blocks read (the decoder's, a TokenBatch),
// and its head computes its objective into StepCtx.loss (protocols/block.h).
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/config.h"
#include "models/deepseek_v3/deepseek_v3.h"
#include "models/flux/flux.h"
#include "models/llama3/llama3.h"
#include "models/qwen3/qwen3.h"
#include "models/model.h"

typedef struct ModelSpec ModelSpec;
typedef struct Tp Tp;  // parallel/tp.h

typedef struct {
    const ModelSpec *spec;  // the architecture that filled `as`
    // LoRA's adapters for the build to add (model.converters: [lora], models/lora.h); NULL:
    // none. Only for a spec whose build adds them (ModelSpec.lora).
    const LoraSection *lora;
    union {
        LlamaArgs llama3;
        Qwen3Args qwen3;
        DeepseekV3Args deepseek_v3;
        FluxArgs flux;
    } as;
} ModelArgs;

// What code outside models/ reads of any architecture's args.
typedef struct {
    int n_layers;              // transformer blocks: the model is embed, n_layers blocks, head
    int dim;                   // width of the hidden states between blocks
    int kv_dim;                // width of a token's keys (and of its values) in attention
    int head_dim;              // width of one attention head
    int vocab_size;
    int max_seq_len;           // positions the model is built for (its RoPE tables)
    bool tie_word_embeddings;  // the head's output weight is the embedding's
    const MoeArgs *moe;        // the blocks' MoE layers (into the args; the first dense_layers
                               // blocks have a dense FFN); NULL: dense
    int dense_layers;
    int mtp_layers;            // multi-token prediction modules in the head (DeepSeek-V3's)
} ModelShape;

// A model's own training inputs (docs/design.md "Models": StepCtx inputs and the loss belong to the
// model), for an architecture that does not read token batches. A spec without one (NULL) is
// fed by the trainer's token pipeline (data/loader.h: text, JSONL, token shards, the TokenBatch
// the decoders read). The state is the architecture's; the trainer holds it as void *.
typedef struct {
    // Why this data cannot feed the run the config describes (one line naming the key: a
    // layout whose batches it cannot split, a setting it does not read), or NULL.
    const char *(*check)(const Config *c, char *err, size_t len);
    // Opens training.dataset_path (die_user on bad input) for data-parallel rank dp_rank of
    // dp_size, microbatches of rows examples per rank; the data's shapes go into a (the model
    // must match the data it is trained on).
    void *(*open)(const Config *c, ModelArgs *a, int dp_rank, int dp_size, int rows);
    // Carves the step's input tensors from arena (the backend's memory): called on the sizing
    // arena, then on the committed one, as core/arena.h's two passes.
    void (*carve)(void *data, Arena *arena);
    // The next microbatch read, drawn and handed to backend k: what StepCtx.input points to.
    const void *(*next)(void *data, const KernelOps *k);
    // out (input_bytes) = the examples [first, first + rows) of input (next's): a pipeline
    // microbatch's StepCtx.input, views into the same tensors.
    size_t input_bytes;
    bool images;  // an example is an image: the step line reports images/s, not tokens/s
    void (*input_rows)(const void *data, const void *input, int first, int rows, void *out);
    // The rows of one example's hidden state on each of cp context-parallel ranks (StepCtx.T;
    // the model's whole sequence when cp is 1); die_user naming the key when cp cannot split it.
    int (*example_rows)(const ModelArgs *a, int cp);
    // Examples consumed by all ranks together: the whole state a checkpoint saves.
    int64_t (*position)(const void *data);
    void (*set_position)(void *data, int64_t position);
    void (*close)(void *data);
} ModelData;

// The most attributes an architecture describes itself with in a checkpoint.
#define MODEL_MAX_ATTRS 48

struct ModelSpec {
    const char *name;  // model.name
    // Fills a with the named flavor; false if the architecture has none of that name.
    bool (*flavor)(const char *flavor, ModelArgs *a);
    const char *(*flavor_names)(void);  // "debugmodel, small, ..." for error messages
    ModelShape (*shape)(const ModelArgs *a);
    // torchtitan's update_from_config: the run's settings over the flavor's: vocab_size (the
    // tokenizer's; 0 keeps the args'), max_seq_len (the longest sequence the run feeds), and
    // the model.* keys the architecture reads (NULL: keep the args' own, e.g. a checkpoint's).
    void (*update_from_config)(ModelArgs *a, const ModelSection *config, int vocab_size,
                               int max_seq_len);

    // The parameter table and block list, as the architecture's build (e.g. decoder_build).
    void (*build)(Model *m, const ModelArgs *a, bool activation_checkpoint);
    // Whether build adds LoRA's adapters where ModelArgs.lora targets its Linears, and how
    // they export as PEFT's adapter (convert --to peft; whole tensors).
    bool lora;
    void (*save_peft)(const char *dir, const ModelArgs *a, const ParamTable *params,
                      const LoraSection *lora);
    void (*free)(Model *m);  // what build allocated (not the arenas)

    // Tensor parallel: why the model cannot run on tp ranks with microbatches of B x T (one
    // line in err, returned), or NULL; the plan applied to a built, unallocated model; and the
    // bytes one rank hands its tp group per microbatch in blocks [first_block, last_block),
    // recomputed_layers of whose layers run forward twice (full activation checkpointing).
    const char *(*tp_check)(const ModelArgs *a, int tp, int B, int T, char *err, size_t len);
    void (*parallelize_tp)(Model *m, const Tp *tp);
    uint64_t (*tp_bytes_per_microbatch)(const ModelArgs *a, int tp, int B, int T,
                                        int recomputed_layers, bool loss_parallel,
                                        int first_block, int last_block);

    // Context parallel: the architecture's own cut of each example over the size ranks of the
    // cp group, this rank's `rank`, after build and before placing buffers (NULL: the trainer
    // cuts the token batches' columns, parallel/cp/layout.h's head-tail chunks).
    void (*parallelize_cp)(Model *m, int rank, int size);

    // Checkpoints: the architecture as "model.*" attributes (at most MODEL_MAX_ATTRS; returns
    // the count), and back (max_seq_len left to update_from_config).
    int (*describe)(const ModelArgs *a, CkptAttr *out);
    void (*args_from_checkpoint)(const char *path, ModelArgs *a);

    // Hugging Face: the args in dir/config.json (false and the one-line reason in err when
    // the file is not this architecture's or not readable), the safetensors weights into
    // whole-tensor host tables (built from a) and out again (weights and config.json in dir).
    bool (*try_args_from_hf)(const char *dir, ModelArgs *a, char *err, size_t len);
    // config.json's model_types for this architecture ({"llama", NULL}), NULL-terminated
    const char *const *hf_model_types;
    void (*load_hf)(const char *path, const ModelArgs *a, ParamTable *params);
    void (*save_hf)(const char *dir, const ModelArgs *a, const ParamTable *params,
                    HfExport how);

    // llama2.c's legacy .bin, which names no architecture (NULL: this one cannot be one): the
    // args in its header, and its weights into a model built from them and allocated.
    void (*args_from_llama2c)(const char *path, ModelArgs *a);
    void (*load_llama2c)(const char *path, Model *m);

    // Incremental decoding (generate): a cache of up to max_ctx positions of the built model
    // m in the memory of the kernels backend k, the next-token logits (vocab, in k's memory,
    // valid until the next call) of token at position pos with positions [0, pos) cached, and
    // the cache's end.
    void *(*kv_cache_new)(const Model *m, int max_ctx, const KernelOps *k);
    const float *(*decode_step)(const Model *m, void *cache, const KernelOps *k, int token,
                                int pos);
    void (*kv_cache_free)(void *cache);

    // The training data it reads itself (NULL: token batches, see ModelData).
    const ModelData *data;
    // (`titan generate` of an architecture that decodes no tokens, FLUX's image sampler, is
    // infer/'s to find: infer/generate.c's table, so that models/ stays below infer/.)
};

// Each architecture's spec, defined in its folder (models/llama3/spec.c, ...).
extern const ModelSpec LLAMA3_SPEC, QWEN3_SPEC, DEEPSEEK_V3_SPEC, FLUX_SPEC;

// The architecture named name (model.name), or NULL.
const ModelSpec *model_spec_find(const char *name);
// The same, or die_user (exit 2): "<where>: model.name = '<name>' is not implemented yet".
const ModelSpec *model_spec_require(const char *name, const char *where);
// The architecture of a titan checkpoint: the model.name of the config it stores (the
// defaults' where that does not parse: a file from another version); die_user naming the file
// when none is registered under it. trained (NULL: not wanted) gets that config, to
// config_free.
const ModelSpec *model_spec_of_checkpoint(const char *path, Config *trained);
// The architecture whose reader takes the Hugging Face folder dir (its args in *a): the one
// of config.json's model_type, die_user with its reason when it refuses the folder; else (no
// or an unknown model_type, an unreadable file) the first reader that takes it, die_user with
// each one's (distinct) reason when none does.
const ModelSpec *model_spec_of_hf(const char *dir, ModelArgs *a);
// die_user when spec has no Hugging Face format (its load_hf is NULL): "<what>: model <name>
// has no Hugging Face format in titan".
void model_spec_require_hf(const ModelSpec *spec, const char *what);
// The architecture that reads llama2.c files (its args_from_llama2c is set).
const ModelSpec *model_spec_llama2c(void);

static inline ModelShape model_shape(const ModelArgs *a) { return a->spec->shape(a); }

// ---- for an architecture's spec (its spec.c) -----------------------------------------------

// a's member for spec, which spec's reader is about to fill (a zeroed, a->spec set), and the
// member filled by it, for everything else (checked: the args are spec's).
void *model_args_fill(ModelArgs *a, const ModelSpec *spec);
const void *model_args_of(const ModelArgs *a, const ModelSpec *spec);

// The slots that only hand a's member to the architecture's own function of the same name
// (arch_flavor(name, LlamaArgs *), ...), defined once for every spec.c: MODEL_SPEC_READERS
// defines its static flavor and args_from_checkpoint, MODEL_SPEC_HF its try_args_from_hf,
// load_hf and save_hf, for its ModelSpec SPEC.
#define MODEL_SPEC_READERS(arch, SPEC)                                                         \
    static bool flavor(const char *name, ModelArgs *a) {                                       \
        return arch##_flavor(name, model_args_fill(a, &SPEC));                                 \
    }                                                                                          \
    static void args_from_checkpoint(const char *path, ModelArgs *a) {                         \
        arch##_args_from_checkpoint(path, model_args_fill(a, &SPEC));                          \
    }

#define MODEL_SPEC_HF(arch, SPEC)                                                              \
    static bool try_args_from_hf(const char *dir, ModelArgs *a, char *err, size_t len) {       \
        return arch##_try_args_from_hf(dir, model_args_fill(a, &SPEC), err, len);              \
    }                                                                                          \
    static void load_hf(const char *path, const ModelArgs *a, ParamTable *params) {            \
        arch##_load_hf(path, model_args_of(a, &SPEC), params);                                 \
    }                                                                                          \
    static void save_hf(const char *dir, const ModelArgs *a, const ParamTable *params,         \
                        HfExport how) {                                                        \
        arch##_save_hf(dir, model_args_of(a, &SPEC), params, how);                             \
    }
