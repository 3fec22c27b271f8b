#include "core/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "core/errors.h"
#include "core/files.h"

typedef struct {
    const char *section;
    const char *key;
    size_t offset;  // of the field inside Config
    ConfigType type;
    int64_t min, max;     // INT: accepted range, at most what the trainer's C type holds
    bool minus_one_ok;    // INT: -1 is a sentinel ("derive it", "all of it")
    double lo, hi;        // FLOAT: accepted range
    bool lo_open, hi_open;  // FLOAT: the bound itself is excluded
    bool (*valid)(const char *text);  // STRING: the values torchtitan accepts...
    const char *expects;              // ...in words
    const char *def;             // default, written as on the command line; NULL = null
    const char *const *choices;  // ENUM: allowed values, NULL-terminated
    bool nullable;               // torchtitan types it `X | None`
    const char *help;
} KeySpec;

// The _Generic term makes a table line whose ConfigType disagrees with the field's C type fail
// to compile, so offset arithmetic can never write a double into an int64_t. Numbers must name
// their range, so no integer can outgrow the int the trainer keeps it in.
#define FIELD(sec, name, ctype)                 \
    #sec, #name,                                \
        offsetof(Config, sec.name) +            \
            0 * sizeof(char[_Generic(((Config *)0)->sec.name, ctype: 1)])
#define K_BOOL(sec, name) FIELD(sec, name, bool), CONFIG_BOOL
#define K_INT(sec, name, min_v, max_v) \
    FIELD(sec, name, int64_t), CONFIG_INT, .min = min_v, .max = max_v
#define K_FLOAT(sec, name, lo_v, hi_v) \
    FIELD(sec, name, double), CONFIG_FLOAT, .lo = lo_v, .hi = hi_v
#define K_STR(sec, name) FIELD(sec, name, char *), CONFIG_STRING
#define K_ENUM(sec, name) FIELD(sec, name, char *), CONFIG_ENUM
#define K_LIST(sec, name) FIELD(sec, name, StringList), CONFIG_STRING_LIST

#define WINDOW_MAX (INT32_MAX - 1)  // the loader reads seq_len + 1 tokens into an int count
#define LOOP_MAX (INT32_MAX - 1)    // `for (int step = 1; step <= steps; step++)` must end
#define TRACE_BUF_MAX (1 << 20)     // flight recorder entries (56 bytes each): 56 MiB per rank

static bool is_positive_int(const char *t);

// torchtitan's selective AC: every nth block, or "op" (per operator).
static bool ac_option_valid(const char *t) { return !strcmp(t, "op") || is_positive_int(t); }

// A numeric IPv4 or IPv6 address: a name would need a resolver, and could mean several.
static bool ip_address_valid(const char *t) {
    unsigned char address[16];
    return inet_pton(AF_INET, t, address) == 1 || inet_pton(AF_INET6, t, address) == 1;
}

static const char *const OPTIMIZERS[] = {"Adam", "AdamW", NULL};
static const char *const OPTIMIZER_IMPLS[] = {"for-loop", "foreach", "fused", NULL};
static const char *const DECAY_TYPES[] = {"linear", "sqrt", "cosine", NULL};
static const char *const TRAIN_DTYPES[] = {"bfloat16", "float32", NULL};
static const char *const REDUCE_DTYPES[] = {"float32", "bfloat16", NULL};
static const char *const DEVICES[] = {"cpu", "cuda", NULL};
static const char *const EXPORT_DTYPES[] = {"float16", "bfloat16", "float32", NULL};
static const char *const RESHARD_POLICIES[] = {"default", "always", "never", NULL};
static const char *const PP_SCHEDULES[] = {"1F1B",          "GPipe",
                                           "Interleaved1F1B", "LoopedBFS",
                                           "InterleavedZeroBubble", "ZBVZeroBubble",
                                           "DualPipeV",     NULL};
static const char *const CP_ROTATE_METHODS[] = {"allgather", "alltoall", NULL};
static const char *const ASYNC_MODES[] = {"disabled", "async", "async_with_pinned_mem", NULL};
const char *const AC_MODES[] = {"none", "selective", "full", NULL};
static const char *const FLOAT8_RECIPES[] = {"tensorwise", "rowwise", "rowwise_with_gw_hp", NULL};

// Every key, grouped by section in printing order. Defaults are torchtitan's except where the
// help says otherwise.
static const KeySpec KEYS[] = {
    {K_STR(job, config_file), .def = NULL, .nullable = true,
     .help = "YAML file the config was read from"},
    {K_STR(job, dump_folder), .def = "./outputs", .help = "Folder to dump job outputs"},
    {K_STR(job, description), .def = "default job", .help = "Description of the job"},
    {K_BOOL(job, print_config), .def = "false", .help = "Print the resolved config at start"},
    {K_STR(job, save_config_file), .def = NULL, .nullable = true,
     .help = "Path to save the resolved config into"},

    {K_BOOL(profiling, enable_profiling), .def = "false", .help = "Whether to profile"},
    {K_STR(profiling, save_traces_folder), .def = "profile_traces",
     .help = "Trace files location"},
    {K_INT(profiling, profile_freq, 1, INT32_MAX), .def = "10",
     .help = "How often to collect profile traces, in iterations"},
    {K_INT(profiling, profiler_active, 1, INT32_MAX), .def = "1",
     .help = "Steps the profiler is active for"},
    {K_INT(profiling, profiler_warmup, 0, INT32_MAX), .def = "3",
     .help = "Warmup steps before the active step in each profiling cycle"},
    {K_BOOL(profiling, enable_memory_snapshot), .def = "false",
     .help = "Whether to dump memory snapshots"},
    {K_STR(profiling, save_memory_snapshot_folder), .def = "memory_snapshot",
     .help = "Memory snapshot files location"},

    {K_INT(metrics, log_freq, 1, INT32_MAX), .def = "10",
     .help = "How often to log metrics, in iterations"},
    {K_BOOL(metrics, enable_tensorboard), .def = "false",
     .help = "Whether to log metrics to TensorBoard"},
    {K_BOOL(metrics, disable_color_printing), .def = "false",
     .help = "Whether to disable color printing in logs"},
    {K_STR(metrics, save_tb_folder), .def = "tb", .help = "Folder to dump TensorBoard states"},
    {K_BOOL(metrics, save_for_all_ranks), .def = "false",
     .help = "Save metrics for all ranks instead of rank 0 only"},
    {K_BOOL(metrics, enable_wandb), .def = "false",
     .help = "Whether to log metrics to Weights & Biases"},
    {K_FLOAT(metrics, peak_flops, 0, INFINITY), .def = "0.0",
     .help = "titan: peak FLOP/s per device for MFU; 0 = the device's known peak, else no MFU"},

    {K_STR(model, name), .def = "llama3", .help = "Which model to train"},
    {K_STR(model, flavor), .def = "debugmodel", .help = "Which model config to train"},
    {K_STR(model, tokenizer_path), .def = NULL, .nullable = true,
     .help = "Tokenizer file (tiktoken, tokenizer.json, GPT-2 folder, or bytes); sets the vocab"},
    {K_LIST(model, converters), .def = "",
     .help = "Converters to apply to the model, e.g. float8"},
    {K_BOOL(model, print_after_conversion), .def = "false",
     .help = "Print the model after converters are applied"},
    {K_BOOL(model, tie_word_embeddings), .def = "false",
     .help = "titan: share the embedding matrix with the output projection"},
    {K_BOOL(model, rope_scaling), .def = "false",
     .help = "titan: Llama 3.1 RoPE frequency scaling (factor 8, original context 8192)"},
    {K_FLOAT(model, moe_load_balance_coeff, 0, INFINITY), .lo_open = true, .def = "1e-3",
     .nullable = true,
     .help = "MoE: expert-bias step per optimizer step (aux-loss-free load balancing, DeepSeek "
             "V3); null = off"},
    {K_FLOAT(model, moe_aux_loss_alpha, 0, INFINITY), .def = "0.0",
     .help = "MoE: weight of the sequence-wise balance loss (DeepSeek V3) added to the "
             "objective; 0 = none"},
    {K_FLOAT(model, moe_capacity_factor, 0, INFINITY), .lo_open = true, .def = NULL,
     .nullable = true,
     .help = "MoE: an expert takes at most ceil(factor * tokens * top_k / experts) of a "
             "microbatch's routed tokens, dropping the rest; null = none dropped"},

    {K_ENUM(optimizer, name), .def = "AdamW", .choices = OPTIMIZERS, .help = "Optimizer to use"},
    {K_FLOAT(optimizer, lr, 0, INFINITY), .def = "8e-4", .help = "Learning rate to use"},
    {K_FLOAT(optimizer, beta1, 0, 1), .hi_open = true, .def = "0.9",
     .help = "Adam first-moment decay"},
    {K_FLOAT(optimizer, beta2, 0, 1), .hi_open = true, .def = "0.95",
     .help = "Adam second-moment decay"},
    {K_FLOAT(optimizer, eps, 0, INFINITY), .def = "1e-8", .help = "Epsilon value to use"},
    {K_FLOAT(optimizer, weight_decay, 0, INFINITY), .def = "0.1", .help = "Weight decay to use"},
    {K_ENUM(optimizer, implementation), .def = "fused", .choices = OPTIMIZER_IMPLS,
     .help = "PyTorch's optimizer implementation; titan has one, so every value runs it"},
    {K_BOOL(optimizer, early_step_in_backward), .def = "false",
     .help = "Apply the optimizer step inside backward"},

    {K_INT(lr_scheduler, warmup_steps, 0, INT32_MAX), .def = "200", .help = "Steps for lr warmup"},
    {K_FLOAT(lr_scheduler, decay_ratio, 0, 1), .def = NULL, .nullable = true,
     .help = "Fraction of steps spent decaying (WSD); null = decay right after warmup"},
    {K_ENUM(lr_scheduler, decay_type), .def = "linear", .choices = DECAY_TYPES,
     .help = "Learning rate decay curve"},
    {K_FLOAT(lr_scheduler, min_lr_factor, 0, 1), .def = "0.0",
     .help = "The lr never decays below optimizer.lr * min_lr_factor"},

    {K_STR(training, dataset), .def = "c4_test", .help = "Dataset to use"},
    {K_STR(training, dataset_path), .def = NULL, .nullable = true,
     .help = "Path to the dataset in the file system"},
    {K_INT(training, local_batch_size, 1, INT32_MAX), .def = "8", .help = "Per-device batch size"},
    {K_INT(training, global_batch_size, 1, INT32_MAX), .minus_one_ok = true, .def = "-1",
     .help = "Global batch size; -1 = local_batch_size x data-parallel degree"},
    {K_INT(training, seq_len, 1, WINDOW_MAX), .def = "2048", .help = "Sequence length"},
    {K_FLOAT(training, max_norm, 0, INFINITY), .lo_open = true, .def = "1.0",
     .help = "Max norm for gradient clipping"},
    {K_INT(training, steps, 0, LOOP_MAX), .def = "10000", .help = "How many train steps to run"},
    {K_BOOL(training, enable_cpu_offload), .def = "false",
     .help = "Offload params, grads and optimizer states to host memory"},
    {K_ENUM(training, dtype), .def = "float32", .choices = TRAIN_DTYPES,
     .help = "Dtype of params, grads and optimizer states"},
    {K_ENUM(training, mixed_precision_param), .def = "bfloat16", .choices = TRAIN_DTYPES,
     .help = "Compute dtype under mixed precision: GEMMs run in it (fp32 accumulation; cuda's "
             "attention too, cpu's stays fp32) and FSDP all-gathers the weights in it"},
    {K_ENUM(training, device), .def = "cpu", .choices = DEVICES,
     .help = "titan: the kernels backend, cpu or cuda (a `make CUDA=1` build on a GPU machine; "
             "one GPU per rank)"},
    {K_ENUM(training, mixed_precision_reduce), .def = "float32", .choices = REDUCE_DTYPES,
     .help = "Dtype of FSDP's gradient reduce-scatter"},
    {K_BOOL(training, compile), .def = "false", .help = "Whether to compile the model"},
    {K_INT(training, gc_freq, 1, INT32_MAX), .def = "50",
     .help = "torchtitan's Python GC interval; titan has no GC and ignores it"},
    {K_INT(training, seed, INT64_MIN + 1, INT64_MAX), .def = "0",
     .help = "Base RNG seed (torchtitan: None; titan: 0, so runs repeat by default)"},
    {K_BOOL(training, deterministic), .def = "false",
     .help = "Use deterministic algorithms wherever possible"},
    {K_BOOL(training, document_masking), .def = "false",
     .help = "Attention stays within each document of a packed window (a document ends at the "
             "tokenizer's end-of-text token; torchtitan's block_causal mask)"},
    {K_FLOAT(training, ema_decay, 0, 1), .hi_open = true, .def = "0.0",
     .help = "titan: keep an exponential moving average of the weights, ema = decay ema + "
             "(1 - decay) w after each optimizer step, sharded and checkpointed as the "
             "optimizer state (generate and convert read it with --ema); 0 = off"},
    {K_FLOAT(training, classifier_free_guidance_prob, 0, 1), .def = "0.0",
     .help = "FLUX: each example's T5 and CLIP encodings are each replaced by the empty "
             "prompt's with this chance (classifier-free guidance dropout)"},

    {K_INT(parallelism, data_parallel_replicate_degree, 1, INT32_MAX), .def = "1",
     .help = "Data-parallel degree with replicated weights (DDP/HSDP); 1 = off"},
    {K_BOOL(parallelism, enable_compiled_autograd), .def = "false",
     .help = "Compile the backward"},
    {K_INT(parallelism, data_parallel_shard_degree, 1, INT32_MAX), .minus_one_ok = true,
     .def = "-1",
     .help = "Data-parallel degree with sharded weights (FSDP); -1 = leftover ranks"},
    {K_ENUM(parallelism, fsdp_reshard_after_forward), .def = "default",
     .choices = RESHARD_POLICIES, .help = "When FSDP frees gathered params after forward"},
    {K_INT(parallelism, tensor_parallel_degree, 1, INT32_MAX), .def = "1",
     .help = "Tensor parallel degree; 1 = off"},
    {K_BOOL(parallelism, disable_loss_parallel), .def = "false",
     .help = "Do not compute the loss on vocab-sharded logits under TP"},
    {K_BOOL(parallelism, enable_async_tensor_parallel), .def = "false",
     .help = "Overlap TP collectives with compute"},
    {K_INT(parallelism, pipeline_parallel_degree, 1, INT32_MAX), .def = "1",
     .help = "Pipeline parallel degree (ranks, not stages); 1 = off"},
    {K_INT(parallelism, pipeline_parallel_first_stage_less_layers, 0, INT32_MAX), .def = "1",
     .help = "Layers fewer on the first stage, which also holds the embedding"},
    {K_INT(parallelism, pipeline_parallel_last_stage_less_layers, 0, INT32_MAX), .def = "1",
     .help = "Layers fewer on the last stage, which also holds the output"},
    {K_INT(parallelism, pipeline_parallel_layers_per_stage, 1, INT32_MAX),
     .def = NULL, .nullable = true,
     .help = "Layers per (virtual) stage; null = inferred from the schedule"},
    {K_ENUM(parallelism, pipeline_parallel_schedule), .def = "1F1B", .choices = PP_SCHEDULES,
     .help = "Pipeline schedule"},
    {K_STR(parallelism, pipeline_parallel_schedule_csv), .def = "", .nullable = true,
     .help = "CSV file with a custom pipeline schedule"},
    {K_INT(parallelism, pipeline_parallel_microbatch_size, 1, INT32_MAX), .def = "1",
     .help = "Size of each pipeline microbatch"},
    {K_INT(parallelism, context_parallel_degree, 1, INT32_MAX), .def = "1",
     .help = "Context parallel degree; 1 = off"},
    {K_ENUM(parallelism, context_parallel_rotate_method), .def = "allgather",
     .choices = CP_ROTATE_METHODS, .help = "How context parallel exchanges K/V shards"},
    {K_INT(parallelism, expert_parallel_degree, 1, INT32_MAX), .def = "1",
     .help = "Expert parallel degree; 1 = off"},
    {K_INT(parallelism, expert_tensor_parallel_degree, 1, INT32_MAX), .def = "1",
     .help = "Tensor parallel degree on routed experts; 1 = off"},

    {K_BOOL(checkpoint, enable), .def = "false", .help = "Whether to enable checkpoints"},
    {K_STR(checkpoint, folder), .def = "checkpoint",
     .help = "Checkpoints go to {job.dump_folder}/{folder}"},
    {K_INT(checkpoint, interval, 1, INT32_MAX), .def = "500",
     .help = "Checkpointing interval in steps"},
    {K_STR(checkpoint, initial_load_path), .def = NULL, .nullable = true,
     .help = "Checkpoint to start from when the run's own folder is empty"},
    {K_BOOL(checkpoint, initial_load_model_only), .def = "true",
     .help = "Load only the model from initial_load_path"},
    {K_BOOL(checkpoint, initial_load_in_hf), .def = "false",
     .help = "initial_load_path holds Hugging Face safetensors"},
    {K_BOOL(checkpoint, last_save_model_only), .def = "true",
     .help = "Save only the model at the end of training"},
    {K_BOOL(checkpoint, last_save_in_hf), .def = "false",
     .help = "Save the last checkpoint as Hugging Face safetensors"},
    {K_ENUM(checkpoint, export_dtype), .def = "float32", .choices = EXPORT_DTYPES,
     .help = "Dtype of the last, model-only save"},
    {K_ENUM(checkpoint, async_mode), .def = "disabled", .choices = ASYNC_MODES,
     .help = "Write checkpoints in the background"},
    {K_INT(checkpoint, keep_latest_k, 0, INT32_MAX), .def = "10",
     .help = "Keep only the latest k checkpoints; 0 = keep all"},
    {K_INT(checkpoint, load_step, -1, INT32_MAX), .def = "-1",
     .help = "Step to load; -1 = the latest"},
    {K_LIST(checkpoint, exclude_from_loading), .def = "",
     .help = "State not to load, e.g. optimizer,lr_scheduler,dataloader"},
    {K_BOOL(checkpoint, enable_first_step_checkpoint), .def = "false",
     .help = "Save right after the first step"},
    {K_BOOL(checkpoint, create_seed_checkpoint), .def = "false",
     .help = "Initialize the model on one rank, save it and exit"},
    {K_BOOL(checkpoint, load_only), .def = "false", .help = "Load checkpoints, never save"},

    {K_ENUM(activation_checkpoint, mode), .def = "selective", .choices = AC_MODES,
     .help = "Activation checkpointing: none, selective (per selective_ac_option) or full"},
    {K_STR(activation_checkpoint, selective_ac_option), .def = "2", .valid = ac_option_valid,
     .expects = "op or an integer in [1, 2147483647]",
     .help = "Selective AC: an integer n (every nth block) or 'op'"},

    {K_BOOL(float8, enable_fsdp_float8_all_gather), .def = "false",
     .help = "FSDP all-gathers weights in float8 (tensorwise)"},
    {K_BOOL(float8, precompute_float8_dynamic_scale_for_fsdp), .def = "false",
     .help = "Compute all float8 weight scales in one reduction per step"},
    {K_ENUM(float8, recipe_name), .def = NULL, .choices = FLOAT8_RECIPES, .nullable = true,
     .help = "Float8 scaling recipe; null = tensorwise"},
    {K_LIST(float8, filter_fqns), .def = "",
     .help = "Linears not to convert to float8: any whose module name contains an entry; "
             "auto_filter_small_kn adds torchao's size thresholds"},
    {K_BOOL(float8, emulate), .def = "false",
     .help = "Emulate float8 GEMMs (the cpu backend always does)"},
    {K_LIST(float8, moe_fqns_prototype), .def = "",
     .help = "MoE modules whose routed experts' grouped GEMMs run float8 (rowwise): any whose "
             "module name contains an entry, e.g. experts"},

    {K_INT(comm, init_timeout_seconds, 1, INT32_MAX), .def = "300",
     .help = "Collective timeout during setup and the first step"},
    {K_INT(comm, train_timeout_seconds, 1, INT32_MAX), .def = "100",
     .help = "Collective timeout after the first step"},
    {K_INT(comm, trace_buf_size, 0, TRACE_BUF_MAX), .def = "20000",
     .help = "Flight recorder ring buffer entries; 0 = off"},
    {K_STR(comm, save_traces_folder), .def = "comm_traces",
     .help = "Flight recorder trace files location"},
    {K_BOOL(comm, enable_debug_server), .def = "false",
     .help = "An HTTP server on every rank: status, flight recorder, stacks, config, metrics"},
    {K_INT(comm, debug_server_port, 1, 65535), .def = "25999",
     .help = "The debug server's port on rank 0; rank r listens on this + r"},
    {K_STR(comm, debug_server_host), .def = "127.0.0.1", .valid = ip_address_valid,
     .expects = "a numeric IPv4 or IPv6 address",
     .help = "The address the debug servers listen on (0.0.0.0: every interface)"},

    {K_BOOL(validation, enable), .def = "false", .help = "Run validation"},
    {K_STR(validation, dataset), .def = "c4_validation", .help = "Dataset to use"},
    {K_STR(validation, dataset_path), .def = NULL, .nullable = true,
     .help = "Path to the validation dataset"},
    {K_INT(validation, local_batch_size, 1, INT32_MAX), .def = "8",
     .help = "Batch size for validation"},
    {K_INT(validation, seq_len, 1, WINDOW_MAX), .def = "2048",
     .help = "Sequence length for validation"},
    {K_INT(validation, freq, 1, INT32_MAX), .def = "10", .help = "Validate every freq steps"},
    {K_INT(validation, steps, 1, INT32_MAX), .minus_one_ok = true, .def = "-1",
     .help = "Validation steps; -1 = the whole set"},
};
#define KEY_COUNT (sizeof KEYS / sizeof KEYS[0])

#define NAME_MAX_LEN 128  // no known name is this long, so longer input is simply unknown
#define PATH_SHOWN_MAX 512  // a config path as messages and origins show it
#define ORIGIN_MAX_LEN (PATH_SHOWN_MAX + 48)  // "PATH:LINE:COL" or "--section.key"

// ---- field access -------------------------------------------------------------------------

static void *field_of(Config *c, const KeySpec *s) { return (char *)c + s->offset; }

static const void *field_of_const(const Config *c, const KeySpec *s) {
    return (const char *)c + s->offset;
}

static char *dup_range(const char *s, size_t n) {
    char *d = xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static void string_set(char **dst, const char *value) {
    free(*dst);
    *dst = value ? dup_range(value, strlen(value)) : NULL;
}

static void origin_set(Config *c, const KeySpec *s, const char *origin) {
    string_set(&c->origin[s - KEYS], origin);
}

static void list_clear(StringList *l) {
    for (int i = 0; i < l->count; i++) free(l->items[i]);
    free(l->items);
    l->count = 0;
    l->items = NULL;
}

static void list_push(StringList *l, const char *s, size_t n) {
    char **items = realloc(l->items, (size_t)(l->count + 1) * sizeof *items);
    CHECK(items != NULL);
    l->items = items;
    l->items[l->count++] = dup_range(s, n);
}

// "a, b,,c" -> [a, b, c]: torchtitan's comma-separated form of a list on the command line.
static void list_split(StringList *l, const char *text) {
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        if (b > a) list_push(l, a, (size_t)(b - a));
        p = *end ? end + 1 : end;
    }
}

// ---- scalar text ---------------------------------------------------------------------------

static bool is_null_word(const char *t) {
    return t[0] == '\0' || !strcmp(t, "~") || !strcasecmp(t, "null");
}

static bool parse_bool(const char *t, bool *out) {
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    for (size_t i = 0; i < 3; i++) {
        if (!strcasecmp(t, yes[i]) || !strcasecmp(t, no[i])) {
            *out = !strcasecmp(t, yes[i]);
            return true;
        }
    }
    return false;
}

// Length of the UTF-8 sequence at p and its code point; 0 when p holds no valid one (overlong
// forms, surrogates and code points past U+10FFFF are invalid, as for libyaml's reader).
static size_t utf8_decode(const unsigned char *p, uint32_t *cp) {
    static const uint32_t min_of_len[] = {0, 0, 0x80, 0x800, 0x10000};
    size_t len = p[0] < 0x80 ? 1 : (p[0] >> 5) == 6 ? 2 : (p[0] >> 4) == 14 ? 3
                 : (p[0] >> 3) == 30 ? 4 : 0;
    if (len == 0) return 0;
    *cp = len == 1 ? p[0] : p[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        *cp = (*cp << 6) | (p[i] & 0x3f);
    }
    bool valid = *cp >= min_of_len[len] && *cp <= 0x10ffff && (*cp < 0xd800 || *cp > 0xdfff);
    return valid ? len : 0;
}

// Text from the command line: a config file, printed as YAML, can hold only UTF-8.
static bool utf8_valid(const char *t) {
    uint32_t cp;
    for (const unsigned char *p = (const unsigned char *)t; *p;) {
        size_t len = utf8_decode(p, &cp);
        if (len == 0) return false;
        p += len;
    }
    return true;
}

typedef enum { INT_OK, INT_MALFORMED, INT_OUT_OF_RANGE } IntParse;

// Beyond int64, and the null sentinel itself, are out of every key's range: no value a user
// writes can read as null.
static IntParse parse_int(const char *t, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (end == t || *end != '\0') return INT_MALFORMED;
    if (errno == ERANGE || v == CONFIG_INT_UNSET) return INT_OUT_OF_RANGE;
    *out = (int64_t)v;
    return INT_OK;
}

static bool is_positive_int(const char *t) {
    int64_t v;
    return parse_int(t, &v) == INT_OK && v >= 1 && v <= INT32_MAX;
}

// Non-finite values are refused: NAN is how a nullable float says null.
static bool parse_float(const char *t, double *out) {
    char *end;
    double v = strtod(t, &end);
    if (end == t || *end != '\0' || !isfinite(v)) return false;
    *out = v;
    return true;
}

static bool int_in_range(const KeySpec *s, int64_t v) {
    return (s->minus_one_ok && v == -1) || (v >= s->min && v <= s->max);
}

static bool float_in_range(const KeySpec *s, double v) {
    return (s->lo_open ? v > s->lo : v >= s->lo) && (s->hi_open ? v < s->hi : v <= s->hi);
}

static bool enum_allows(const KeySpec *s, const char *t) {
    for (const char *const *v = s->choices; *v; v++)
        if (!strcmp(*v, t)) return true;
    return false;
}

// What a key accepts, in words; with_range adds a number's range ("an integer in [1, 8]").
static void type_describe(const KeySpec *s, bool with_range, char *buf, size_t n) {
    static const char *const words[] = {"true or false", "an integer", "a number",
                                        "a string", NULL, "a list of strings"};
    size_t used = 0;
    if (s->type == CONFIG_INT && with_range)
        snprintf(buf, n, "%san integer in [%" PRId64 ", %" PRId64 "]",
                 s->minus_one_ok ? "-1 or " : "", s->min, s->max);
    else if (s->type == CONFIG_FLOAT && with_range && isinf(s->hi))
        snprintf(buf, n, "a number %s %g", s->lo_open ? ">" : ">=", s->lo);
    else if (s->type == CONFIG_FLOAT && with_range)
        snprintf(buf, n, "a number in %c%g, %g%c", s->lo_open ? '(' : '[', s->lo, s->hi,
                 s->hi_open ? ')' : ']');
    else if (s->type == CONFIG_STRING && s->expects)
        snprintf(buf, n, "%s", s->expects);
    else if (s->type != CONFIG_ENUM)
        snprintf(buf, n, "%s", words[s->type]);
    else
        for (const char *const *v = s->choices; *v && used < n; v++)
            used += (size_t)snprintf(buf + used, n - used, "%s %s",
                                     v == s->choices ? "one of" : ",", *v);
}

static bool set_null(Config *c, const KeySpec *s, char *why, size_t n) {
    if (!s->nullable) {
        snprintf(why, n, "cannot be null");
        return false;
    }
    void *f = field_of(c, s);
    if (s->type == CONFIG_INT) *(int64_t *)f = CONFIG_INT_UNSET;
    if (s->type == CONFIG_FLOAT) *(double *)f = NAN;
    if (s->type == CONFIG_STRING || s->type == CONFIG_ENUM) string_set(f, NULL);
    return true;
}

// A number's text into its field when it parses and lies in the key's range; *range_error
// says a well-formed number fell outside it.
static bool number_set(void *f, const KeySpec *s, const char *text, bool *range_error) {
    if (s->type == CONFIG_INT) {
        int64_t v;
        IntParse r = parse_int(text, &v);
        *range_error = r == INT_OUT_OF_RANGE || (r == INT_OK && !int_in_range(s, v));
        if (r == INT_OK && !*range_error) *(int64_t *)f = v;
        return r == INT_OK && !*range_error;
    }
    double v;
    bool parsed = parse_float(text, &v);
    *range_error = parsed && !float_in_range(s, v);
    if (parsed && !*range_error) *(double *)f = v;
    return parsed && !*range_error;
}

// Sets one key from its text form (a YAML scalar or a command-line value). On failure the
// field is untouched and why says what was expected.
static bool value_set(Config *c, const KeySpec *s, const char *text, bool is_null, char *why,
                      size_t n) {
    if (is_null) return set_null(c, s, why, n);
    char quoted[160];
    if (!utf8_valid(text)) {
        snprintf(why, n, "expects UTF-8 text, got %s", error_quote(quoted, sizeof quoted, text));
        return false;
    }
    void *f = field_of(c, s);
    bool ok = true, range_error = false;
    switch (s->type) {
    case CONFIG_BOOL: ok = parse_bool(text, f); break;
    case CONFIG_INT:
    case CONFIG_FLOAT: ok = number_set(f, s, text, &range_error); break;
    case CONFIG_ENUM:
    case CONFIG_STRING:
        ok = s->type == CONFIG_ENUM ? enum_allows(s, text) : !s->valid || s->valid(text);
        if (ok) string_set(f, text);
        break;
    case CONFIG_STRING_LIST:
        list_clear(f);
        list_split(f, text);
        break;
    }
    if (!ok) {
        char expected[256];
        type_describe(s, range_error, expected, sizeof expected);
        snprintf(why, n, "expects %s, got %s", expected, error_quote(quoted, sizeof quoted, text));
    }
    return ok;
}

// Shortest text that reads back as exactly v, so printed configs round-trip bit for bit.
static void format_double(double v, char *buf, size_t n) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".e")) strncat(buf, ".0", n - strlen(buf) - 1);
}

// Plain text of a value, as messages show it and as the support table spells it.
static void value_format(const Config *c, const KeySpec *s, char *buf, size_t n) {
    const void *f = field_of_const(c, s);
    switch (s->type) {
    case CONFIG_BOOL: snprintf(buf, n, "%s", *(const bool *)f ? "true" : "false"); break;
    case CONFIG_INT:
        if (*(const int64_t *)f == CONFIG_INT_UNSET) snprintf(buf, n, "null");
        else snprintf(buf, n, "%" PRId64, *(const int64_t *)f);
        break;
    case CONFIG_FLOAT:
        if (isnan(*(const double *)f)) snprintf(buf, n, "null");
        else format_double(*(const double *)f, buf, n);
        break;
    case CONFIG_STRING:
    case CONFIG_ENUM: snprintf(buf, n, "%s", *(char *const *)f ? *(char *const *)f : "null"); break;
    case CONFIG_STRING_LIST: {
        const StringList *l = f;
        size_t used = (size_t)snprintf(buf, n, "[");
        for (int i = 0; i < l->count && used < n; i++)
            used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", l->items[i]);
        if (used < n) snprintf(buf + used, n - used, "]");
        break;
    }
    }
}

// ---- lookup and suggestions ----------------------------------------------------------------

static const KeySpec *spec_find(const char *section, size_t section_len, const char *key) {
    for (size_t i = 0; i < KEY_COUNT; i++)
        if (strlen(KEYS[i].section) == section_len &&
            !strncmp(KEYS[i].section, section, section_len) && !strcmp(KEYS[i].key, key))
            return &KEYS[i];
    return NULL;
}

static const KeySpec *spec_find_full(const char *name) {
    const char *dot = strchr(name, '.');
    return dot ? spec_find(name, (size_t)(dot - name), dot + 1) : NULL;
}

// Index of the section's first key, or -1 for an unknown section.
static int section_index(const char *name) {
    for (size_t i = 0; i < KEY_COUNT; i++)
        if (!strcmp(KEYS[i].section, name)) return (int)i;
    return -1;
}

static bool section_starts_at(size_t i) {
    return i == 0 || strcmp(KEYS[i].section, KEYS[i - 1].section) != 0;
}

// Levenshtein distance; names longer than NAME_MAX_LEN are never close to anything.
static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), row[NAME_MAX_LEN + 1];
    if (la > NAME_MAX_LEN || lb > NAME_MAX_LEN) return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static bool close_enough(size_t distance, const char *word) {
    return distance <= 2 + strlen(word) / 4;
}

// The known "section.key" nearest to a misspelt one; a key that exists verbatim in another
// section (training.lr -> optimizer.lr) counts as two edits away.
static const KeySpec *closest_key(const char *full) {
    const char *dot = strchr(full, '.');
    const KeySpec *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < KEY_COUNT; i++) {
        char name[2 * NAME_MAX_LEN];
        snprintf(name, sizeof name, "%s.%s", KEYS[i].section, KEYS[i].key);
        size_t d = edit_distance(full, name);
        if (dot && !strcmp(dot + 1, KEYS[i].key) && d > 2) d = 2;
        if (d < best_d) best = &KEYS[i], best_d = d;
    }
    return close_enough(best_d, full) ? best : NULL;
}

static const char *closest_section(const char *name) {
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < KEY_COUNT; i++) {
        if (!section_starts_at(i)) continue;
        size_t d = edit_distance(name, KEYS[i].section);
        if (d < best_d) best = KEYS[i].section, best_d = d;
    }
    return close_enough(best_d, name) ? best : NULL;
}

// " (did you mean 'PREFIXsection.key'?)" or "" when nothing is close.
static void suggest_key(const char *full, const char *prefix, char *buf, size_t n) {
    const KeySpec *s = closest_key(full);
    if (s) snprintf(buf, n, " (did you mean '%s%s.%s'?)", prefix, s->section, s->key);
    else buf[0] = '\0';
}

// ---- YAML files ----------------------------------------------------------------------------

typedef struct {
    Config *cfg;
    const char *path;  // escaped for messages
    yaml_document_t *doc;
    bool section_seen[KEY_COUNT];
    bool key_seen[KEY_COUNT];
    char *err;
    size_t errlen;
} FileParse;

__attribute__((format(printf, 3, 4))) static bool file_error(FileParse *p, yaml_mark_t m,
                                                              const char *fmt, ...) {
    int used = snprintf(p->err, p->errlen, "%s:%zu:%zu: ", p->path, m.line + 1, m.column + 1);
    if (used >= 0 && (size_t)used < p->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + used, p->errlen - (size_t)used, fmt, ap);
        va_end(ap);
    }
    return false;
}

static const char *node_text(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static bool node_is_null(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           is_null_word(node_text(n));
}

static bool node_to_list(FileParse *p, const yaml_node_t *seq, StringList *out, char *why,
                         size_t n) {
    for (yaml_node_item_t *it = seq->data.sequence.items.start; it < seq->data.sequence.items.top;
         it++) {
        const yaml_node_t *item = yaml_document_get_node(p->doc, *it);
        if (item->type != YAML_SCALAR_NODE) {
            snprintf(why, n, "expects a list of strings, got a nested %s",
                     item->type == YAML_MAPPING_NODE ? "mapping" : "list");
            return false;
        }
        list_push(out, node_text(item), item->data.scalar.length);
    }
    return true;
}

static bool node_apply(FileParse *p, const KeySpec *s, const yaml_node_t *v, char *why,
                       size_t n) {
    if (v->type == YAML_SCALAR_NODE) return value_set(p->cfg, s, node_text(v), node_is_null(v), why, n);
    if (v->type == YAML_SEQUENCE_NODE && s->type == CONFIG_STRING_LIST) {
        StringList items = {0, NULL};
        if (!node_to_list(p, v, &items, why, n)) {
            list_clear(&items);
            return false;
        }
        list_clear(field_of(p->cfg, s));
        *(StringList *)field_of(p->cfg, s) = items;
        return true;
    }
    char expected[256];
    type_describe(s, false, expected, sizeof expected);
    snprintf(why, n, "expects %s, got a %s", expected,
             v->type == YAML_MAPPING_NODE ? "mapping" : "list");
    return false;
}

static bool section_apply(FileParse *p, const char *section, const yaml_node_t *map) {
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *k = yaml_document_get_node(p->doc, pr->key);
        const yaml_node_t *v = yaml_document_get_node(p->doc, pr->value);
        if (k->type != YAML_SCALAR_NODE)
            return file_error(p, k->start_mark, "keys of section '%s' must be names", section);
        char full[2 * NAME_MAX_LEN + 2], hint[3 * NAME_MAX_LEN], quoted[160];
        snprintf(full, sizeof full, "%s.%s", section, node_text(k));
        const KeySpec *s = spec_find(section, strlen(section), node_text(k));
        if (!s) {
            suggest_key(full, "", hint, sizeof hint);
            return file_error(p, k->start_mark, "unknown key %s%s",
                              error_quote(quoted, sizeof quoted, full), hint);
        }
        if (p->key_seen[s - KEYS]) return file_error(p, k->start_mark, "duplicate key '%s'", full);
        p->key_seen[s - KEYS] = true;
        char why[512];
        if (!node_apply(p, s, v, why, sizeof why))
            return file_error(p, v->start_mark, "%s %s", full, why);
        char origin[ORIGIN_MAX_LEN];
        snprintf(origin, sizeof origin, "%s:%zu:%zu", p->path, v->start_mark.line + 1,
                 v->start_mark.column + 1);
        origin_set(p->cfg, s, origin);
    }
    return true;
}

static bool document_apply(FileParse *p) {
    const yaml_node_t *root = yaml_document_get_root_node(p->doc);
    if (!root) return true;  // an empty file keeps every value
    if (root->type != YAML_MAPPING_NODE)
        return file_error(p, root->start_mark, "top level must be a mapping of sections");
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *k = yaml_document_get_node(p->doc, pr->key);
        const yaml_node_t *v = yaml_document_get_node(p->doc, pr->value);
        if (k->type != YAML_SCALAR_NODE)
            return file_error(p, k->start_mark, "section names must be plain names");
        const char *name = node_text(k);
        int idx = section_index(name);
        if (idx < 0) {
            const char *near = closest_section(name);
            char hint[NAME_MAX_LEN + 32] = "", quoted[160];
            if (near) snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
            return file_error(p, k->start_mark, "unknown section %s%s",
                              error_quote(quoted, sizeof quoted, name), hint);
        }
        if (p->section_seen[idx]) return file_error(p, k->start_mark, "duplicate section '%s'", name);
        p->section_seen[idx] = true;
        if (node_is_null(v)) continue;  // a section whose keys are all commented out
        if (v->type != YAML_MAPPING_NODE)
            return file_error(p, v->start_mark, "section '%s' must be a mapping of keys", name);
        if (!section_apply(p, name, v)) return false;
    }
    return true;
}

// libyaml's own problem text; its marks are 0-based.
static bool parser_error(FileParse *p, const yaml_parser_t *y) {
    if (y->error == YAML_READER_ERROR) {
        snprintf(p->err, p->errlen, "%s: %s (at byte %zu)", p->path, y->problem,
                 y->problem_offset);
        return false;
    }
    if (!y->problem) return file_error(p, y->problem_mark, "cannot parse YAML");
    if (!y->context) return file_error(p, y->problem_mark, "%s", y->problem);
    return file_error(p, y->problem_mark, "%s (%s at %zu:%zu)", y->problem, y->context,
                      y->context_mark.line + 1, y->context_mark.column + 1);
}

// A second document would silently be ignored, so it is an error.
static bool single_document(FileParse *p, yaml_parser_t *y) {
    yaml_document_t extra;
    if (!yaml_parser_load(y, &extra)) return parser_error(p, y);
    const yaml_node_t *root = yaml_document_get_root_node(&extra);
    bool ok = !root || file_error(p, root->start_mark, "only one YAML document is allowed");
    yaml_document_delete(&extra);
    return ok;
}

// Walks the text's events without building it, refusing it at the first collection deeper
// than CONFIG_MAX_DEPTH: libyaml builds a deep document in time quadratic in its depth.
static bool depth_check(FileParse *p, const char *text, size_t len) {
    yaml_parser_t y;
    CHECK(yaml_parser_initialize(&y));
    yaml_parser_set_input_string(&y, (const unsigned char *)text, len);
    bool ok = true, done = false;
    for (int depth = 0; ok && !done;) {
        yaml_event_t e;
        if (!yaml_parser_parse(&y, &e)) {
            ok = parser_error(p, &y);
            break;
        }
        bool opens = e.type == YAML_MAPPING_START_EVENT || e.type == YAML_SEQUENCE_START_EVENT;
        bool closes = e.type == YAML_MAPPING_END_EVENT || e.type == YAML_SEQUENCE_END_EVENT;
        depth += opens ? 1 : closes ? -1 : 0;
        if (depth > CONFIG_MAX_DEPTH)
            ok = file_error(p, e.start_mark,
                            "nested more than %d levels deep (a config is sections of keys, "
                            "whose values may be lists)", CONFIG_MAX_DEPTH);
        done = e.type == YAML_STREAM_END_EVENT;
        yaml_event_delete(&e);
    }
    yaml_parser_delete(&y);
    return ok;
}

bool config_parse_text(Config *c, const char *name, const char *text, size_t len, char *err,
                       size_t errlen) {
    char shown[PATH_SHOWN_MAX];
    error_escape(shown, sizeof shown, name);
    if (len > CONFIG_MAX_BYTES)
        return error_set(err, errlen, "%s: larger than the %d bytes a config may have", shown,
                         CONFIG_MAX_BYTES);
    yaml_document_t doc;
    FileParse p = {.cfg = c, .path = shown, .doc = &doc, .err = err, .errlen = errlen};
    if (!depth_check(&p, text, len)) return false;
    yaml_parser_t y;
    CHECK(yaml_parser_initialize(&y));
    yaml_parser_set_input_string(&y, (const unsigned char *)text, len);
    bool ok = yaml_parser_load(&y, &doc);
    if (!ok) {
        parser_error(&p, &y);
    } else {
        ok = document_apply(&p) && single_document(&p, &y);
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&y);
    return ok;
}

// Reading stops one byte past the size limit, which config_parse_text then refuses.
bool config_parse_file(Config *c, const char *path, char *err, size_t errlen) {
    char *text, shown[PATH_SHOWN_MAX];
    size_t len;
    FileReadResult r = file_read_all(path, CONFIG_MAX_BYTES + 1, &text, &len);
    if (r != FILE_READ_OK)
        return error_set(err, errlen, "%s: cannot %s config file: %s",
                         error_escape(shown, sizeof shown, path),
                         r == FILE_OPEN_FAILED ? "open" : "read", strerror(errno));
    bool ok = config_parse_text(c, path, text, len, err, errlen);
    free(text);
    return ok;
}

// ---- command line --------------------------------------------------------------------------

static bool is_option(const char *arg) { return arg && !strncmp(arg, "--", 2); }

static bool is_config_flag(const char *name) {
    return !strcmp(name, "config") || !strcmp(name, "job.config_file");
}

// "--name=value" or "--name": copies name, points *value at the inline value or NULL.
static void option_split(const char *arg, char *name, size_t n, const char **value) {
    const char *eq = strchr(arg + 2, '=');
    size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    snprintf(name, n, "%.*s", (int)len, arg + 2);
    *value = eq ? eq + 1 : NULL;
}

// The last --config / --job.config_file wins, as a later override would.
static bool args_find_config(int argc, char **argv, const char **path, char *err, size_t n) {
    for (int i = 1; i < argc; i++) {
        char name[NAME_MAX_LEN];
        const char *value;
        if (!is_option(argv[i])) continue;
        option_split(argv[i], name, sizeof name, &value);
        if (!is_config_flag(name)) continue;
        if (!value && (i + 1 >= argc || is_option(argv[i + 1]))) {
            snprintf(err, n, "--%s: expects a path", name);
            return false;
        }
        *path = value ? value : argv[i + 1];
    }
    return true;
}

// The value of option argv[*i] given as the next argument, which it then consumes. A BOOL
// takes the next argument only when it reads as true/false, so a bare flag means true.
static const char *option_next_value(const KeySpec *s, int argc, char **argv, int *i) {
    const char *next = *i + 1 < argc ? argv[*i + 1] : NULL;
    bool unused;
    bool takes = next && (s->type == CONFIG_BOOL ? parse_bool(next, &unused) : !is_option(next));
    if (takes) {
        (*i)++;
        return next;
    }
    return s->type == CONFIG_BOOL ? "true" : NULL;
}

static bool args_apply_overrides(Config *c, int argc, char **argv, char *err, size_t n) {
    for (int i = 1; i < argc; i++) {
        if (!is_option(argv[i])) {
            char quoted[160];
            return error_set(err, n, "unexpected argument %s",
                             error_quote(quoted, sizeof quoted, argv[i]));
        }
        char name[NAME_MAX_LEN], hint[3 * NAME_MAX_LEN], why[512], option[NAME_MAX_LEN + 2];
        const char *inline_v, *value;
        option_split(argv[i], name, sizeof name, &inline_v);
        if (is_config_flag(name)) {
            i += inline_v ? 0 : 1;  // args_find_config checked the path is there
            continue;
        }
        const KeySpec *s = spec_find_full(name);
        snprintf(option, sizeof option, "--%s", name);
        if (!s) {
            char quoted[2 * NAME_MAX_LEN];
            suggest_key(name, "--", hint, sizeof hint);
            return error_set(err, n, "unknown option %s%s",
                             error_quote(quoted, sizeof quoted, option), hint);
        }
        value = inline_v ? inline_v : option_next_value(s, argc, argv, &i);
        if (!value) {
            snprintf(err, n, "--%s: expects a value", name);
            return false;
        }
        if (!value_set(c, s, value, value[0] && is_null_word(value), why, sizeof why))
            return error_set(err, n, "%s: %s", option, why);
        origin_set(c, s, option);
    }
    return true;
}

bool config_parse_args(Config *c, int argc, char **argv, char *err, size_t errlen) {
    const char *path = NULL;
    if (!args_find_config(argc, argv, &path, err, errlen)) return false;
    if (path) {
        if (!config_parse_file(c, path, err, errlen)) return false;
        string_set(&c->job.config_file, path);
        origin_set(c, spec_find_full("job.config_file"), "--config");
    }
    return args_apply_overrides(c, argc, argv, err, errlen);
}

// ---- checks --------------------------------------------------------------------------------

// Keys of which this build implements only the listed values (as value_format spells them);
// any other value asks for a feature not written yet. Delete a line when its feature lands.
// (model.name is the model registry's to check: models/registry.h.)
typedef struct {
    const char *name;
    const char *accepted[3];
} Implemented;

static const Implemented IMPLEMENTED[] = {
    {"model.converters", {"[]", "[float8]"}},
    {"optimizer.name", {"AdamW"}},
    {"optimizer.early_step_in_backward", {"false"}},
    {"training.enable_cpu_offload", {"false"}},
    {"training.dtype", {"float32"}},
    {"training.compile", {"false"}},
    {"parallelism.enable_compiled_autograd", {"false"}},
    {"parallelism.enable_async_tensor_parallel", {"false"}},
    {"parallelism.expert_tensor_parallel_degree", {"1"}},
    {"checkpoint.async_mode", {"disabled", "async"}},
    {"checkpoint.load_only", {"false"}},
    {"metrics.enable_wandb", {"false"}},
};

static const KeySpec *spec_must_find(const char *name) {
    const KeySpec *s = spec_find_full(name);
    if (!s) die_internal(__FILE__, __LINE__, "check table names unknown key '%s'", name);
    return s;
}

// A value as messages show it: strings quoted, control characters escaped.
static void value_show(const Config *c, const KeySpec *s, char *buf, size_t n) {
    char text[512];
    value_format(c, s, text, sizeof text);
    bool quote = (s->type == CONFIG_STRING || s->type == CONFIG_ENUM) &&
                 *(char *const *)field_of_const(c, s);
    if (quote) error_quote(buf, n, text);
    else error_escape(buf, n, text);
}

static void origin_of(const Config *c, const KeySpec *s, char *buf, size_t n) {
    const char *o = c->origin ? c->origin[s - KEYS] : NULL;
    snprintf(buf, n, "%s", o ? o : "default");
}

// "section.key = value (origin)", for a message about how several keys relate.
static const char *setting_describe(const Config *c, const char *name, char *buf, size_t n) {
    const KeySpec *s = spec_must_find(name);
    char value[256], origin[ORIGIN_MAX_LEN];
    value_show(c, s, value, sizeof value);
    origin_of(c, s, origin, sizeof origin);
    snprintf(buf, n, "%s = %s (%s)", name, value, origin);
    return buf;
}

// "origin: section.key = value WHAT", the message about one key's value.
static bool setting_error(const Config *c, const char *name, const char *what, char *err,
                          size_t n) {
    const KeySpec *s = spec_must_find(name);
    char value[256], origin[ORIGIN_MAX_LEN];
    value_show(c, s, value, sizeof value);
    origin_of(c, s, origin, sizeof origin);
    return error_set(err, n, "%s: %s = %s %s", origin, name, value, what);
}

// The trainer indexes a microbatch's tokens (rows of every activation) with an int.
static bool tokens_fit(const Config *c, const char *section, int64_t batch, int64_t len,
                       char *err, size_t n) {
    if (batch * len <= INT32_MAX) return true;  // both are at most INT32_MAX: no overflow
    char b[128], t[128], a[1024], d[1024];
    snprintf(b, sizeof b, "%s.local_batch_size", section);
    snprintf(t, sizeof t, "%s.seq_len", section);
    return error_set(err, n, "%s x %s = %" PRId64 " tokens per microbatch, more than %d",
                     setting_describe(c, b, a, sizeof a), setting_describe(c, t, d, sizeof d),
                     batch * len, INT32_MAX);
}

// The mesh multiplies its degrees in an int (data_parallel_shard_degree -1 is derived).
static bool degrees_fit(const Config *c, char *err, size_t n) {
    static const char *const names[] = {
        "parallelism.pipeline_parallel_degree", "parallelism.data_parallel_replicate_degree",
        "parallelism.data_parallel_shard_degree", "parallelism.context_parallel_degree",
        "parallelism.tensor_parallel_degree"};
    int64_t ranks = 1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int64_t v = *(const int64_t *)field_of_const(c, spec_must_find(names[i]));
        ranks *= v > 0 ? v : 1;  // each at most INT32_MAX and ranks at most INT32_MAX here
        if (ranks <= INT32_MAX) continue;
        char line[4096] = "", one[1024];
        for (size_t j = 0; j <= i; j++) {
            if (*(const int64_t *)field_of_const(c, spec_must_find(names[j])) <= 1) continue;
            size_t used = strlen(line);
            snprintf(line + used, sizeof line - used, "%s%s", used ? " x " : "",
                     setting_describe(c, names[j], one, sizeof one));
        }
        return error_set(err, n, "%s is more than %d ranks", line, INT32_MAX);
    }
    return true;
}

// Relations between keys that no single range expresses.
static bool relations_check(const Config *c, char *err, size_t n) {
    const TrainingSection *t = &c->training;
    char a[1024], b[1024];
    if (t->global_batch_size != -1 && t->global_batch_size % t->local_batch_size != 0)
        return error_set(err, n, "%s must be -1 or a multiple of %s",
                         setting_describe(c, "training.global_batch_size", a, sizeof a),
                         setting_describe(c, "training.local_batch_size", b, sizeof b));
    if (c->checkpoint.keep_latest_k == 1)  // torchtitan's reason: the newest may be being written
        return setting_error(c, "checkpoint.keep_latest_k", "must be 0 (keep all) or at least 2",
                             err, n);
    const CheckpointSection *ck = &c->checkpoint;
    if (ck->last_save_in_hf && !ck->last_save_model_only)  // as torchtitan: weights only
        return error_set(err, n, "%s needs checkpoint.last_save_model_only (a Hugging Face "
                         "checkpoint holds the model only)",
                         setting_describe(c, "checkpoint.last_save_in_hf", a, sizeof a));
    if (strcmp(ck->export_dtype, "float32") != 0 && !ck->last_save_in_hf)
        return error_set(err, n, "%s applies to the Hugging Face export (checkpoint."
                         "last_save_in_hf); titan's HDF5 checkpoints are float32",
                         setting_describe(c, "checkpoint.export_dtype", a, sizeof a));
    const ProfilingSection *pr = &c->profiling;
    if (pr->enable_profiling && pr->profile_freq < pr->profiler_warmup + pr->profiler_active)
        return error_set(err, n, "%s must be at least profiling.profiler_warmup + "
                         "profiling.profiler_active = %lld (torchtitan's profiler schedule)",
                         setting_describe(c, "profiling.profile_freq", a, sizeof a),
                         (long long)(pr->profiler_warmup + pr->profiler_active));
    const ValidationSection *v = &c->validation;
    return tokens_fit(c, "training", t->local_batch_size, t->seq_len, err, n) &&
           tokens_fit(c, "validation", v->local_batch_size, v->seq_len, err, n) &&
           degrees_fit(c, err, n);
}

static bool implemented_check(const Config *c, char *err, size_t n) {
    for (size_t i = 0; i < sizeof IMPLEMENTED / sizeof IMPLEMENTED[0]; i++) {
        const Implemented *r = &IMPLEMENTED[i];
        char text[512];
        value_format(c, spec_must_find(r->name), text, sizeof text);
        bool ok = false;
        for (size_t j = 0; j < 3 && r->accepted[j]; j++) ok = ok || !strcmp(text, r->accepted[j]);
        if (!ok) return setting_error(c, r->name, "is not implemented yet", err, n);
    }
    return true;
}

bool config_converts(const Config *c, const char *converter) {
    for (int i = 0; i < c->model.converters.count; i++)
        if (!strcmp(c->model.converters.items[i], converter)) return true;
    return false;
}

// Without the float8 converter every float8.* key must keep its default: it would do nothing.
static bool float8_keys_unused(const Config *c, char *err, size_t n) {
    Config d;
    config_defaults(&d);
    const KeySpec *changed = NULL;
    for (size_t i = 0; i < KEY_COUNT && !changed; i++) {
        char mine[512], def[512];
        if (strcmp(KEYS[i].section, "float8") != 0) continue;
        value_format(c, &KEYS[i], mine, sizeof mine);
        value_format(&d, &KEYS[i], def, sizeof def);
        if (strcmp(mine, def) != 0) changed = &KEYS[i];
    }
    config_free(&d);
    if (!changed) return true;
    char name[NAME_MAX_LEN + 16];
    snprintf(name, sizeof name, "float8.%s", changed->key);
    return setting_error(c, name, "does nothing: model.converters has no float8", err, n);
}

// The float8 converter (models/linear.h) as torchtitan's Float8LinearConverter configures it,
// less what is not written yet, refused by name rather than ignored.
static bool float8_check(const Config *c, char *err, size_t n) {
    if (!config_converts(c, "float8")) return float8_keys_unused(c, err, n);
    const Float8Section *f = &c->float8;
    char a[1024], b[1024];
    // torchao gathers float8 weights for its tensorwise recipe only (torchtitan asserts it);
    // the precomputed scales serve that all-gather and nothing else.
    if (f->enable_fsdp_float8_all_gather && f->recipe_name && strcmp(f->recipe_name, "tensorwise"))
        return error_set(err, n, "%s needs the tensorwise recipe, not %s",
                         setting_describe(c, "float8.enable_fsdp_float8_all_gather", a, sizeof a),
                         setting_describe(c, "float8.recipe_name", b, sizeof b));
    if (f->precompute_float8_dynamic_scale_for_fsdp && !f->enable_fsdp_float8_all_gather)
        return setting_error(c, "float8.precompute_float8_dynamic_scale_for_fsdp",
                             "does nothing without float8.enable_fsdp_float8_all_gather (the "
                             "scales it precomputes are the float8 all-gather's)", err, n);
    if (f->emulate && !strcmp(c->training.device, "cuda"))
        return setting_error(c, "float8.emulate",
                             "is not implemented on training.device cuda (its float8 GEMMs are "
                             "cuBLASLt's; the cpu backend emulates them)", err, n);
    if (c->parallelism.tensor_parallel_degree > 1)
        return error_set(err, n, "%s with %s is not implemented yet (tensor-parallel float8 "
                         "needs the amaxes reduced over the tp group)",
                         setting_describe(c, "model.converters", a, sizeof a),
                         setting_describe(c, "parallelism.tensor_parallel_degree", b, sizeof b));
    bool auto_filter = false;
    for (int i = 0; i < f->filter_fqns.count; i++)
        auto_filter = auto_filter || !strcmp(f->filter_fqns.items[i], "auto_filter_small_kn");
    if (auto_filter && f->recipe_name && !strcmp(f->recipe_name, "rowwise_with_gw_hp"))
        return error_set(err, n, "%s has auto_filter_small_kn, for which torchao has no "
                         "thresholds with %s",
                         setting_describe(c, "float8.filter_fqns", a, sizeof a),
                         setting_describe(c, "float8.recipe_name", b, sizeof b));
    return true;
}

bool config_check_supported(const Config *c, char *err, size_t errlen) {
    return relations_check(c, err, errlen) && implemented_check(c, err, errlen) &&
           float8_check(c, err, errlen);
}

// ---- defaults, printing, lifetime ----------------------------------------------------------

void config_defaults(Config *c) {
    memset(c, 0, sizeof *c);
    c->origin = xcalloc(KEY_COUNT, sizeof *c->origin);
    for (size_t i = 0; i < KEY_COUNT; i++) {
        const KeySpec *s = &KEYS[i];
        char why[512];
        if (!value_set(c, s, s->def ? s->def : "", s->def == NULL, why, sizeof why))
            die_internal(__FILE__, __LINE__, "default of %s.%s %s", s->section, s->key, why);
    }
}

// YAML holds raw only printable code points, and reads NEL, LS and PS as line breaks.
static bool yaml_printable(uint32_t cp) {
    return cp == '\t' || (cp >= 0x20 && cp <= 0x7e) || (cp >= 0xa0 && cp <= 0xd7ff && cp) ||
           (cp >= 0xe000 && cp <= 0xfffd && cp != 0xfeff) || cp >= 0x10000;
}

// A double-quoted YAML scalar: the one string form that needs no case analysis to read back.
static void yaml_quote(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        uint32_t cp;
        size_t len = utf8_decode(p, &cp);
        if (len == 0) {  // not UTF-8: set in code, not read (the command line refuses it)
            fprintf(f, "\\x%02x", *p++);
            continue;
        }
        if (cp == '"' || cp == '\\') fprintf(f, "\\%c", (char)cp);
        else if (cp == '\n') fputs("\\n", f);
        else if (!yaml_printable(cp) || cp == 0x2028 || cp == 0x2029) fprintf(f, "\\u%04x", cp);
        else fwrite(p, 1, len, f);
        p += len;
    }
    fputc('"', f);
}

static void value_print_yaml(FILE *f, const Config *c, const KeySpec *s) {
    const void *v = field_of_const(c, s);
    if (s->type == CONFIG_STRING || s->type == CONFIG_ENUM) {
        if (*(char *const *)v) yaml_quote(f, *(char *const *)v);
        else fputs("null", f);
    } else if (s->type == CONFIG_STRING_LIST) {
        const StringList *l = v;
        fputc('[', f);
        for (int i = 0; i < l->count; i++) {
            if (i) fputs(", ", f);
            yaml_quote(f, l->items[i]);
        }
        fputc(']', f);
    } else {
        char text[64];
        value_format(c, s, text, sizeof text);
        fputs(text, f);
    }
}

void config_print_yaml(const Config *c, FILE *f) {
    for (size_t i = 0; i < KEY_COUNT; i++) {
        const KeySpec *s = &KEYS[i];
        if (section_starts_at(i)) fprintf(f, "%s%s:\n", i ? "\n" : "", s->section);
        fprintf(f, "  %s: ", s->key);
        value_print_yaml(f, c, s);
        fprintf(f, "  # %s\n", s->help);
    }
}

char *config_to_yaml(const Config *c) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    config_print_yaml(c, f);
    CHECK(fclose(f) == 0);
    return text;
}

void config_free(Config *c) {
    for (size_t i = 0; i < KEY_COUNT; i++) {
        void *f = field_of(c, &KEYS[i]);
        if (KEYS[i].type == CONFIG_STRING || KEYS[i].type == CONFIG_ENUM) string_set(f, NULL);
        if (KEYS[i].type == CONFIG_STRING_LIST) list_clear(f);
        if (c->origin) string_set(&c->origin[i], NULL);
    }
    free(c->origin);
    c->origin = NULL;
}

// The first line where a and b differ, for a message.
static void line_first_difference(const char *a, const char *b, char *buf, size_t n) {
    size_t start = 0, i = 0;
    for (; a[i] && a[i] == b[i]; i++)
        if (a[i] == '\n') start = i + 1;
    char line[256];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(a + start, "\n"), a + start);
    error_quote(buf, n, line);
}

bool config_roundtrip_check(const Config *c, char *err, size_t errlen) {
    char *text = config_to_yaml(c), why[1024];
    Config back;
    config_defaults(&back);
    bool ok = config_parse_text(&back, "<printed config>", text, strlen(text), why, sizeof why);
    if (!ok) {
        error_set(err, errlen, "the printed config does not parse: %s", why);
    } else {
        char *again = config_to_yaml(&back), line[300];
        ok = !strcmp(text, again);
        if (!ok) {
            line_first_difference(text, again, line, sizeof line);
            error_set(err, errlen, "the printed config reads back differently, at line %s", line);
        }
        free(again);
    }
    config_free(&back);
    free(text);
    return ok;
}

// A key's default for --help-config: strings quoted, so that an empty one shows.
static void default_describe(const KeySpec *s, char *buf, size_t n) {
    bool text = s->type == CONFIG_STRING || s->type == CONFIG_ENUM;
    if (!s->def) snprintf(buf, n, "null");
    else if (s->type == CONFIG_STRING_LIST) snprintf(buf, n, "[%s]", s->def);
    else if (text) error_quote(buf, n, s->def);
    else snprintf(buf, n, "%s", s->def);
}

void config_print_help(FILE *f) {
    fputs("titan's config keys, named as torchtitan names them. Set them in the YAML file given "
          "to --config\n(a `section:` line, then `  key: value` lines) or on the command line "
          "(`--section.key value`\nor `--section.key=value`; a bare boolean flag means true). "
          "The command line wins.\n",
          f);
    for (size_t i = 0; i < KEY_COUNT; i++) {
        const KeySpec *s = &KEYS[i];
        char expects[256], def[128];
        type_describe(s, true, expects, sizeof expects);
        default_describe(s, def, sizeof def);
        if (section_starts_at(i)) fprintf(f, "\n%s:\n", s->section);
        fprintf(f, "  --%s.%s: %s%s; default %s\n      %s\n", s->section, s->key, expects,
                s->nullable ? " or null" : "", def, s->help);
    }
}

bool config_key_origin(const Config *c, const char *name, char *buf, size_t n) {
    const KeySpec *s = spec_find_full(name);
    if (s) origin_of(c, s, buf, n);
    return s != NULL;
}

bool config_value_text(const Config *c, const char *name, char *buf, size_t n) {
    const KeySpec *s = spec_find_full(name);
    if (s) value_format(c, s, buf, n);
    return s != NULL;
}

size_t config_key_count(void) { return KEY_COUNT; }

ConfigKeyInfo config_key_info(size_t i) {
    CHECK(i < KEY_COUNT);
    const KeySpec *s = &KEYS[i];
    bool is_int = s->type == CONFIG_INT;
    return (ConfigKeyInfo){.section = s->section, .key = s->key, .type = s->type,
                           .choices = s->choices, .lo = is_int ? (double)s->min : s->lo,
                           .hi = is_int ? (double)s->max : s->hi};
}

void config_load_or_die(Config *c, int argc, char **argv) {
    char err[1024];
    config_defaults(c);
    if (!config_parse_args(c, argc, argv, err, sizeof err) ||
        !config_check_supported(c, err, sizeof err))
        die_user("%s", err);
}
