#include "core/config.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "core/errors.h"

typedef enum { CFG_BOOL, CFG_INT, CFG_FLOAT, CFG_STRING, CFG_ENUM, CFG_STRING_LIST } KeyType;

typedef struct {
    const char *section;
    const char *key;
    size_t offset;  // of the field inside Config
    KeyType type;
    const char *def;             // default, written as on the command line; NULL = null
    const char *const *choices;  // ENUM: allowed values, NULL-terminated
    bool nullable;               // torchtitan types it `X | None`
    const char *help;
} KeySpec;

// The _Generic term makes a table line whose KeyType disagrees with the field's C type fail to
// compile, so offset arithmetic can never write a double into an int64_t.
#define FIELD(sec, name, ctype)                 \
    #sec, #name,                                \
        offsetof(Config, sec.name) +            \
            0 * sizeof(char[_Generic(((Config *)0)->sec.name, ctype: 1)])
#define K_BOOL(sec, name) FIELD(sec, name, bool), CFG_BOOL
#define K_INT(sec, name) FIELD(sec, name, int64_t), CFG_INT
#define K_FLOAT(sec, name) FIELD(sec, name, double), CFG_FLOAT
#define K_STR(sec, name) FIELD(sec, name, char *), CFG_STRING
#define K_ENUM(sec, name) FIELD(sec, name, char *), CFG_ENUM
#define K_LIST(sec, name) FIELD(sec, name, StringList), CFG_STRING_LIST

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
static const char *const AC_MODES[] = {"none", "selective", "full", NULL};
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
    {K_INT(profiling, profile_freq), .def = "10",
     .help = "How often to collect profile traces, in iterations"},
    {K_INT(profiling, profiler_active), .def = "1", .help = "Steps the profiler is active for"},
    {K_INT(profiling, profiler_warmup), .def = "3",
     .help = "Warmup steps before the active step in each profiling cycle"},
    {K_BOOL(profiling, enable_memory_snapshot), .def = "false",
     .help = "Whether to dump memory snapshots"},
    {K_STR(profiling, save_memory_snapshot_folder), .def = "memory_snapshot",
     .help = "Memory snapshot files location"},

    {K_INT(metrics, log_freq), .def = "10", .help = "How often to log metrics, in iterations"},
    {K_BOOL(metrics, enable_tensorboard), .def = "false",
     .help = "Whether to log metrics to TensorBoard"},
    {K_BOOL(metrics, disable_color_printing), .def = "false",
     .help = "Whether to disable color printing in logs"},
    {K_STR(metrics, save_tb_folder), .def = "tb", .help = "Folder to dump TensorBoard states"},
    {K_BOOL(metrics, save_for_all_ranks), .def = "false",
     .help = "Save metrics for all ranks instead of rank 0 only"},
    {K_BOOL(metrics, enable_wandb), .def = "false",
     .help = "Whether to log metrics to Weights & Biases"},
    {K_FLOAT(metrics, peak_flops), .def = "0.0",
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

    {K_ENUM(optimizer, name), .def = "AdamW", .choices = OPTIMIZERS, .help = "Optimizer to use"},
    {K_FLOAT(optimizer, lr), .def = "8e-4", .help = "Learning rate to use"},
    {K_FLOAT(optimizer, beta1), .def = "0.9", .help = "Adam first-moment decay"},
    {K_FLOAT(optimizer, beta2), .def = "0.95", .help = "Adam second-moment decay"},
    {K_FLOAT(optimizer, eps), .def = "1e-8", .help = "Epsilon value to use"},
    {K_FLOAT(optimizer, weight_decay), .def = "0.1", .help = "Weight decay to use"},
    {K_ENUM(optimizer, implementation), .def = "fused", .choices = OPTIMIZER_IMPLS,
     .help = "PyTorch's optimizer implementation; titan has one, so every value runs it"},
    {K_BOOL(optimizer, early_step_in_backward), .def = "false",
     .help = "Apply the optimizer step inside backward"},

    {K_INT(lr_scheduler, warmup_steps), .def = "200", .help = "Steps for lr warmup"},
    {K_FLOAT(lr_scheduler, decay_ratio), .def = NULL, .nullable = true,
     .help = "Fraction of steps spent decaying (WSD); null = decay right after warmup"},
    {K_ENUM(lr_scheduler, decay_type), .def = "linear", .choices = DECAY_TYPES,
     .help = "Learning rate decay curve"},
    {K_FLOAT(lr_scheduler, min_lr_factor), .def = "0.0",
     .help = "The lr never decays below optimizer.lr * min_lr_factor"},

    {K_STR(training, dataset), .def = "c4_test", .help = "Dataset to use"},
    {K_STR(training, dataset_path), .def = NULL, .nullable = true,
     .help = "Path to the dataset in the file system"},
    {K_INT(training, local_batch_size), .def = "8", .help = "Per-device batch size"},
    {K_INT(training, global_batch_size), .def = "-1",
     .help = "Global batch size; -1 = local_batch_size x data-parallel degree"},
    {K_INT(training, seq_len), .def = "2048", .help = "Sequence length"},
    {K_FLOAT(training, max_norm), .def = "1.0", .help = "Max norm for gradient clipping"},
    {K_INT(training, steps), .def = "10000", .help = "How many train steps to run"},
    {K_BOOL(training, enable_cpu_offload), .def = "false",
     .help = "Offload params, grads and optimizer states to host memory"},
    {K_ENUM(training, dtype), .def = "float32", .choices = TRAIN_DTYPES,
     .help = "Dtype of params, grads and optimizer states"},
    {K_ENUM(training, mixed_precision_param), .def = "bfloat16", .choices = TRAIN_DTYPES,
     .help = "Compute dtype under mixed precision: cuda runs GEMMs and attention in it (fp32 "
             "accumulation) and FSDP all-gathers the weights in it; the cpu backend computes "
             "fp32"},
    {K_ENUM(training, device), .def = "cpu", .choices = DEVICES,
     .help = "titan: the kernels backend, cpu or cuda (a `make CUDA=1` build on a GPU machine; "
             "one GPU per rank)"},
    {K_ENUM(training, mixed_precision_reduce), .def = "float32", .choices = REDUCE_DTYPES,
     .help = "Dtype of FSDP's gradient reduce-scatter (cuda; the cpu backend reduces fp32)"},
    {K_BOOL(training, compile), .def = "false", .help = "Whether to compile the model"},
    {K_INT(training, gc_freq), .def = "50",
     .help = "torchtitan's Python GC interval; titan has no GC and ignores it"},
    {K_INT(training, seed), .def = "0",
     .help = "Base RNG seed (torchtitan: None; titan: 0, so runs repeat by default)"},
    {K_BOOL(training, deterministic), .def = "false",
     .help = "Use deterministic algorithms wherever possible"},

    {K_INT(parallelism, data_parallel_replicate_degree), .def = "1",
     .help = "Data-parallel degree with replicated weights (DDP/HSDP); 1 = off"},
    {K_BOOL(parallelism, enable_compiled_autograd), .def = "false",
     .help = "Compile the backward"},
    {K_INT(parallelism, data_parallel_shard_degree), .def = "-1",
     .help = "Data-parallel degree with sharded weights (FSDP); -1 = leftover ranks"},
    {K_ENUM(parallelism, fsdp_reshard_after_forward), .def = "default",
     .choices = RESHARD_POLICIES, .help = "When FSDP frees gathered params after forward"},
    {K_INT(parallelism, tensor_parallel_degree), .def = "1",
     .help = "Tensor parallel degree; 1 = off"},
    {K_BOOL(parallelism, disable_loss_parallel), .def = "false",
     .help = "Do not compute the loss on vocab-sharded logits under TP"},
    {K_BOOL(parallelism, enable_async_tensor_parallel), .def = "false",
     .help = "Overlap TP collectives with compute"},
    {K_INT(parallelism, pipeline_parallel_degree), .def = "1",
     .help = "Pipeline parallel degree (ranks, not stages); 1 = off"},
    {K_INT(parallelism, pipeline_parallel_first_stage_less_layers), .def = "1",
     .help = "Layers fewer on the first stage, which also holds the embedding"},
    {K_INT(parallelism, pipeline_parallel_last_stage_less_layers), .def = "1",
     .help = "Layers fewer on the last stage, which also holds the output"},
    {K_INT(parallelism, pipeline_parallel_layers_per_stage), .def = NULL, .nullable = true,
     .help = "Layers per (virtual) stage; null = inferred from the schedule"},
    {K_ENUM(parallelism, pipeline_parallel_schedule), .def = "1F1B", .choices = PP_SCHEDULES,
     .help = "Pipeline schedule"},
    {K_STR(parallelism, pipeline_parallel_schedule_csv), .def = "", .nullable = true,
     .help = "CSV file with a custom pipeline schedule"},
    {K_INT(parallelism, pipeline_parallel_microbatch_size), .def = "1",
     .help = "Size of each pipeline microbatch"},
    {K_INT(parallelism, context_parallel_degree), .def = "1",
     .help = "Context parallel degree; 1 = off"},
    {K_ENUM(parallelism, context_parallel_rotate_method), .def = "allgather",
     .choices = CP_ROTATE_METHODS, .help = "How context parallel exchanges K/V shards"},
    {K_INT(parallelism, expert_parallel_degree), .def = "1",
     .help = "Expert parallel degree; 1 = off"},
    {K_INT(parallelism, expert_tensor_parallel_degree), .def = "1",
     .help = "Tensor parallel degree on routed experts; 1 = off"},

    {K_BOOL(checkpoint, enable), .def = "false", .help = "Whether to enable checkpoints"},
    {K_STR(checkpoint, folder), .def = "checkpoint",
     .help = "Checkpoints go to {job.dump_folder}/{folder}"},
    {K_INT(checkpoint, interval), .def = "500", .help = "Checkpointing interval in steps"},
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
    {K_INT(checkpoint, keep_latest_k), .def = "10",
     .help = "Keep only the latest k checkpoints; 0 = keep all"},
    {K_INT(checkpoint, load_step), .def = "-1", .help = "Step to load; -1 = the latest"},
    {K_LIST(checkpoint, exclude_from_loading), .def = "",
     .help = "State not to load, e.g. optimizer,lr_scheduler,dataloader"},
    {K_BOOL(checkpoint, enable_first_step_checkpoint), .def = "false",
     .help = "Save right after the first step"},
    {K_BOOL(checkpoint, create_seed_checkpoint), .def = "false",
     .help = "Initialize the model on one rank, save it and exit"},
    {K_BOOL(checkpoint, load_only), .def = "false", .help = "Load checkpoints, never save"},

    {K_ENUM(activation_checkpoint, mode), .def = "none", .choices = AC_MODES,
     .help = "Activation checkpointing (torchtitan defaults to selective; titan to none)"},
    {K_STR(activation_checkpoint, selective_ac_option), .def = "2",
     .help = "Selective AC: an integer n (every nth block) or 'op'"},

    {K_BOOL(float8, enable_fsdp_float8_all_gather), .def = "false",
     .help = "FSDP all-gathers weights in float8"},
    {K_BOOL(float8, precompute_float8_dynamic_scale_for_fsdp), .def = "false",
     .help = "Compute all float8 weight scales in one reduction per step"},
    {K_BOOL(float8, force_recompute_fp8_weight_in_bwd), .def = "false",
     .help = "Recompute float8 weights in backward instead of saving them"},
    {K_ENUM(float8, recipe_name), .def = NULL, .choices = FLOAT8_RECIPES, .nullable = true,
     .help = "Float8 scaling recipe"},
    {K_LIST(float8, filter_fqns), .def = "", .help = "Modules not to convert to float8"},
    {K_BOOL(float8, emulate), .def = "false",
     .help = "Emulate float8 GEMMs instead of using fp8 hardware"},
    {K_LIST(float8, moe_fqns_prototype), .def = "",
     .help = "MoE modules to train with float8 rowwise"},

    {K_INT(comm, init_timeout_seconds), .def = "300",
     .help = "Collective timeout during setup and the first step"},
    {K_INT(comm, train_timeout_seconds), .def = "100",
     .help = "Collective timeout after the first step"},
    {K_INT(comm, trace_buf_size), .def = "20000",
     .help = "Flight recorder ring buffer entries; 0 = off"},
    {K_STR(comm, save_traces_folder), .def = "comm_traces",
     .help = "Flight recorder trace files location"},

    {K_BOOL(validation, enable), .def = "false", .help = "Run validation"},
    {K_STR(validation, dataset), .def = "c4_validation", .help = "Dataset to use"},
    {K_STR(validation, dataset_path), .def = NULL, .nullable = true,
     .help = "Path to the validation dataset"},
    {K_INT(validation, local_batch_size), .def = "8", .help = "Batch size for validation"},
    {K_INT(validation, seq_len), .def = "2048", .help = "Sequence length for validation"},
    {K_INT(validation, freq), .def = "10", .help = "Validate every freq steps"},
    {K_INT(validation, steps), .def = "-1", .help = "Validation steps; -1 = the whole set"},
};
#define KEY_COUNT (sizeof KEYS / sizeof KEYS[0])

#define NAME_MAX_LEN 128  // no known name is this long, so longer input is simply unknown

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

static bool parse_int(const char *t, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (end == t || *end != '\0' || errno == ERANGE) return false;
    *out = (int64_t)v;
    return true;
}

// Non-finite values are refused: NAN is how a nullable float says null.
static bool parse_float(const char *t, double *out) {
    char *end;
    double v = strtod(t, &end);
    if (end == t || *end != '\0' || !isfinite(v)) return false;
    *out = v;
    return true;
}

static bool enum_allows(const KeySpec *s, const char *t) {
    for (const char *const *v = s->choices; *v; v++)
        if (!strcmp(*v, t)) return true;
    return false;
}

static void type_describe(const KeySpec *s, char *buf, size_t n) {
    static const char *const words[] = {"true or false", "an integer", "a number",
                                        "a string", NULL, "a list of strings"};
    if (s->type != CFG_ENUM) {
        snprintf(buf, n, "%s", words[s->type]);
        return;
    }
    size_t used = (size_t)snprintf(buf, n, "one of");
    for (const char *const *v = s->choices; *v && used < n; v++)
        used += (size_t)snprintf(buf + used, n - used, "%s %s", v == s->choices ? "" : ",", *v);
}

static bool set_null(Config *c, const KeySpec *s, char *why, size_t n) {
    if (!s->nullable) {
        snprintf(why, n, "cannot be null");
        return false;
    }
    void *f = field_of(c, s);
    if (s->type == CFG_INT) *(int64_t *)f = CONFIG_INT_UNSET;
    if (s->type == CFG_FLOAT) *(double *)f = NAN;
    if (s->type == CFG_STRING || s->type == CFG_ENUM) string_set(f, NULL);
    return true;
}

// Sets one key from its text form (a YAML scalar or a command-line value). On failure the
// field is untouched and why says what was expected.
static bool value_set(Config *c, const KeySpec *s, const char *text, bool is_null, char *why,
                      size_t n) {
    if (is_null) return set_null(c, s, why, n);
    void *f = field_of(c, s);
    bool ok = true;
    switch (s->type) {
    case CFG_BOOL: ok = parse_bool(text, f); break;
    case CFG_INT: ok = parse_int(text, f); break;
    case CFG_FLOAT: ok = parse_float(text, f); break;
    case CFG_ENUM:
        ok = enum_allows(s, text);
        if (ok) string_set(f, text);
        break;
    case CFG_STRING: string_set(f, text); break;
    case CFG_STRING_LIST:
        list_clear(f);
        list_split(f, text);
        break;
    }
    if (!ok) {
        char expected[256];
        type_describe(s, expected, sizeof expected);
        snprintf(why, n, "expects %s, got '%s'", expected, text);
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
    case CFG_BOOL: snprintf(buf, n, "%s", *(const bool *)f ? "true" : "false"); break;
    case CFG_INT:
        if (*(const int64_t *)f == CONFIG_INT_UNSET) snprintf(buf, n, "null");
        else snprintf(buf, n, "%" PRId64, *(const int64_t *)f);
        break;
    case CFG_FLOAT:
        if (isnan(*(const double *)f)) snprintf(buf, n, "null");
        else format_double(*(const double *)f, buf, n);
        break;
    case CFG_STRING:
    case CFG_ENUM: snprintf(buf, n, "%s", *(char *const *)f ? *(char *const *)f : "null"); break;
    case CFG_STRING_LIST: {
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
    const char *path;
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
    if (v->type == YAML_SEQUENCE_NODE && s->type == CFG_STRING_LIST) {
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
    type_describe(s, expected, sizeof expected);
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
        char full[2 * NAME_MAX_LEN + 2], hint[3 * NAME_MAX_LEN];
        snprintf(full, sizeof full, "%s.%s", section, node_text(k));
        const KeySpec *s = spec_find(section, strlen(section), node_text(k));
        if (!s) {
            suggest_key(full, "", hint, sizeof hint);
            return file_error(p, k->start_mark, "unknown key '%s'%s", full, hint);
        }
        if (p->key_seen[s - KEYS]) return file_error(p, k->start_mark, "duplicate key '%s'", full);
        p->key_seen[s - KEYS] = true;
        char why[512];
        if (!node_apply(p, s, v, why, sizeof why))
            return file_error(p, v->start_mark, "%s %s", full, why);
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
            char hint[NAME_MAX_LEN + 32] = "";
            if (near) snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
            return file_error(p, k->start_mark, "unknown section '%s'%s", name, hint);
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

bool config_parse_file(Config *c, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open config file: %s", path, strerror(errno));
        return false;
    }
    yaml_parser_t y;
    yaml_document_t doc;
    CHECK(yaml_parser_initialize(&y));
    yaml_parser_set_input_file(&y, f);
    FileParse p = {.cfg = c, .path = path, .doc = &doc, .err = err, .errlen = errlen};
    bool ok = yaml_parser_load(&y, &doc);
    if (!ok) {
        parser_error(&p, &y);
    } else {
        ok = document_apply(&p) && single_document(&p, &y);
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&y);
    fclose(f);
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
    bool takes = next && (s->type == CFG_BOOL ? parse_bool(next, &unused) : !is_option(next));
    if (takes) {
        (*i)++;
        return next;
    }
    return s->type == CFG_BOOL ? "true" : NULL;
}

static bool args_apply_overrides(Config *c, int argc, char **argv, char *err, size_t n) {
    for (int i = 1; i < argc; i++) {
        if (!is_option(argv[i])) {
            snprintf(err, n, "unexpected argument '%s'", argv[i]);
            return false;
        }
        char name[NAME_MAX_LEN], hint[3 * NAME_MAX_LEN], why[512];
        const char *inline_v, *value;
        option_split(argv[i], name, sizeof name, &inline_v);
        if (is_config_flag(name)) {
            i += inline_v ? 0 : 1;  // args_find_config checked the path is there
            continue;
        }
        const KeySpec *s = spec_find_full(name);
        if (!s) {
            suggest_key(name, "--", hint, sizeof hint);
            snprintf(err, n, "unknown option '--%s'%s", name, hint);
            return false;
        }
        value = inline_v ? inline_v : option_next_value(s, argc, argv, &i);
        if (!value) {
            snprintf(err, n, "--%s: expects a value", name);
            return false;
        }
        if (!value_set(c, s, value, value[0] && is_null_word(value), why, sizeof why)) {
            snprintf(err, n, "--%s: %s", name, why);
            return false;
        }
    }
    return true;
}

bool config_parse_args(Config *c, int argc, char **argv, char *err, size_t errlen) {
    const char *path = NULL;
    if (!args_find_config(argc, argv, &path, err, errlen)) return false;
    if (path) {
        if (!config_parse_file(c, path, err, errlen)) return false;
        string_set(&c->job.config_file, path);
    }
    return args_apply_overrides(c, argc, argv, err, errlen);
}

// ---- checks --------------------------------------------------------------------------------

// Numeric ranges outside which a value is always wrong. A null value is not checked.
typedef struct {
    const char *name;
    double lo, hi;
    bool lo_open, hi_open;  // the bound itself is excluded
    bool minus_one_ok;      // -1 is a sentinel ("derive it", "all of it")
} Bound;

#define AT_LEAST(name, lo) {name, lo, INFINITY, false, false, false}
#define ABOVE(name, lo) {name, lo, INFINITY, true, false, false}
#define WITHIN(name, lo, hi) {name, lo, hi, false, false, false}
#define BELOW_ONE(name) {name, 0, 1, false, true, false}
#define SENTINEL_OR_AT_LEAST(name, lo) {name, lo, INFINITY, false, false, true}

static const Bound BOUNDS[] = {
    AT_LEAST("profiling.profile_freq", 1),
    AT_LEAST("profiling.profiler_active", 1),
    AT_LEAST("profiling.profiler_warmup", 0),
    AT_LEAST("metrics.log_freq", 1),
    AT_LEAST("metrics.peak_flops", 0),
    AT_LEAST("optimizer.lr", 0),
    BELOW_ONE("optimizer.beta1"),
    BELOW_ONE("optimizer.beta2"),
    AT_LEAST("optimizer.eps", 0),
    AT_LEAST("optimizer.weight_decay", 0),
    AT_LEAST("lr_scheduler.warmup_steps", 0),
    WITHIN("lr_scheduler.decay_ratio", 0, 1),
    WITHIN("lr_scheduler.min_lr_factor", 0, 1),
    AT_LEAST("training.local_batch_size", 1),
    SENTINEL_OR_AT_LEAST("training.global_batch_size", 1),
    AT_LEAST("training.seq_len", 1),
    ABOVE("training.max_norm", 0),
    AT_LEAST("training.steps", 0),
    AT_LEAST("training.gc_freq", 1),
    AT_LEAST("parallelism.data_parallel_replicate_degree", 1),
    SENTINEL_OR_AT_LEAST("parallelism.data_parallel_shard_degree", 1),
    AT_LEAST("parallelism.tensor_parallel_degree", 1),
    AT_LEAST("parallelism.pipeline_parallel_degree", 1),
    AT_LEAST("parallelism.pipeline_parallel_first_stage_less_layers", 0),
    AT_LEAST("parallelism.pipeline_parallel_last_stage_less_layers", 0),
    AT_LEAST("parallelism.pipeline_parallel_layers_per_stage", 1),
    AT_LEAST("parallelism.pipeline_parallel_microbatch_size", 1),
    AT_LEAST("parallelism.context_parallel_degree", 1),
    AT_LEAST("parallelism.expert_parallel_degree", 1),
    AT_LEAST("parallelism.expert_tensor_parallel_degree", 1),
    AT_LEAST("checkpoint.interval", 1),
    AT_LEAST("checkpoint.keep_latest_k", 0),
    AT_LEAST("checkpoint.load_step", -1),
    AT_LEAST("comm.init_timeout_seconds", 1),
    AT_LEAST("comm.train_timeout_seconds", 1),
    AT_LEAST("comm.trace_buf_size", 0),
    AT_LEAST("validation.local_batch_size", 1),
    AT_LEAST("validation.seq_len", 1),
    AT_LEAST("validation.freq", 1),
    SENTINEL_OR_AT_LEAST("validation.steps", 1),
};

// Keys of which this build implements only the listed values (as value_format spells them);
// any other value asks for a feature not written yet. Delete a line when its feature lands.
typedef struct {
    const char *name;
    const char *accepted[3];
} Implemented;

static const Implemented IMPLEMENTED[] = {
    {"model.name", {"llama3"}},
    {"model.converters", {"[]"}},
    {"optimizer.name", {"AdamW"}},
    {"optimizer.early_step_in_backward", {"false"}},
    {"training.enable_cpu_offload", {"false"}},
    {"training.dtype", {"float32"}},
    {"training.compile", {"false"}},
    {"parallelism.enable_compiled_autograd", {"false"}},
    {"parallelism.enable_async_tensor_parallel", {"false"}},
    {"parallelism.pipeline_parallel_degree", {"1"}},
    {"parallelism.context_parallel_degree", {"1"}},
    {"parallelism.expert_parallel_degree", {"1"}},
    {"parallelism.expert_tensor_parallel_degree", {"1"}},
    {"checkpoint.initial_load_in_hf", {"false"}},
    {"checkpoint.last_save_in_hf", {"false"}},
    {"checkpoint.export_dtype", {"float32"}},
    {"checkpoint.async_mode", {"disabled"}},
    {"checkpoint.initial_load_model_only", {"true"}},
    {"checkpoint.exclude_from_loading", {"[]"}},
    {"checkpoint.load_only", {"false"}},
    {"activation_checkpoint.mode", {"none", "full"}},
    {"float8.enable_fsdp_float8_all_gather", {"false"}},
    {"float8.precompute_float8_dynamic_scale_for_fsdp", {"false"}},
    {"float8.force_recompute_fp8_weight_in_bwd", {"false"}},
    {"float8.recipe_name", {"null"}},
    {"float8.moe_fqns_prototype", {"[]"}},
    {"profiling.enable_profiling", {"false"}},
    {"profiling.enable_memory_snapshot", {"false"}},
    {"metrics.enable_tensorboard", {"false"}},
    {"metrics.enable_wandb", {"false"}},
};

static const KeySpec *spec_must_find(const char *name) {
    const KeySpec *s = spec_find_full(name);
    if (!s) die_internal(__FILE__, __LINE__, "check table names unknown key '%s'", name);
    return s;
}

static bool value_number(const Config *c, const KeySpec *s, double *v) {
    const void *f = field_of_const(c, s);
    if (s->type == CFG_FLOAT) *v = *(const double *)f;
    else if (*(const int64_t *)f == CONFIG_INT_UNSET) *v = NAN;
    else *v = (double)*(const int64_t *)f;
    return !isnan(*v);
}

static bool bound_holds(const Bound *b, double v) {
    if (b->minus_one_ok && v == -1) return true;
    bool lo_ok = b->lo_open ? v > b->lo : v >= b->lo;
    bool hi_ok = b->hi_open ? v < b->hi : v <= b->hi;
    return lo_ok && hi_ok;
}

static bool bounds_check(const Config *c, char *err, size_t n) {
    for (size_t i = 0; i < sizeof BOUNDS / sizeof BOUNDS[0]; i++) {
        const Bound *b = &BOUNDS[i];
        const KeySpec *s = spec_must_find(b->name);
        double v;
        if (!value_number(c, s, &v) || bound_holds(b, v)) continue;
        char text[64];
        value_format(c, s, text, sizeof text);
        if (isinf(b->hi))
            snprintf(err, n, "%s = %s must be %s%s %g", b->name, text,
                     b->minus_one_ok ? "-1 or " : "", b->lo_open ? ">" : ">=", b->lo);
        else
            snprintf(err, n, "%s = %s must be in %c%g, %g%c", b->name, text, b->lo_open ? '(' : '[',
                     b->lo, b->hi, b->hi_open ? ')' : ']');
        return false;
    }
    return true;
}

// Relations between keys that no single range expresses.
static bool relations_check(const Config *c, char *err, size_t n) {
    const TrainingSection *t = &c->training;
    if (t->global_batch_size != -1 && t->global_batch_size % t->local_batch_size != 0) {
        snprintf(err, n,
                 "training.global_batch_size = %" PRId64
                 " must be -1 or a multiple of training.local_batch_size (%" PRId64 ")",
                 t->global_batch_size, t->local_batch_size);
        return false;
    }
    if (c->checkpoint.keep_latest_k == 1) {
        // torchtitan's reason: the newest checkpoint may still be being written.
        snprintf(err, n, "checkpoint.keep_latest_k = 1 must be 0 (keep all) or at least 2");
        return false;
    }
    return true;
}

static bool implemented_check(const Config *c, char *err, size_t n) {
    for (size_t i = 0; i < sizeof IMPLEMENTED / sizeof IMPLEMENTED[0]; i++) {
        const Implemented *r = &IMPLEMENTED[i];
        char text[512];
        value_format(c, spec_must_find(r->name), text, sizeof text);
        bool ok = false;
        for (size_t j = 0; j < 3 && r->accepted[j]; j++) ok = ok || !strcmp(text, r->accepted[j]);
        if (!ok) {
            snprintf(err, n, "%s = %s is not implemented yet", r->name, text);
            return false;
        }
    }
    return true;
}

bool config_check_supported(const Config *c, char *err, size_t errlen) {
    return bounds_check(c, err, errlen) && relations_check(c, err, errlen) &&
           implemented_check(c, err, errlen);
}

// ---- defaults, printing, lifetime ----------------------------------------------------------

void config_defaults(Config *c) {
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < KEY_COUNT; i++) {
        const KeySpec *s = &KEYS[i];
        char why[512];
        if (!value_set(c, s, s->def ? s->def : "", s->def == NULL, why, sizeof why))
            die_internal(__FILE__, __LINE__, "default of %s.%s %s", s->section, s->key, why);
    }
}

// A double-quoted YAML scalar: the one string form that needs no case analysis to read back.
static void yaml_quote(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void value_print_yaml(FILE *f, const Config *c, const KeySpec *s) {
    const void *v = field_of_const(c, s);
    if (s->type == CFG_STRING || s->type == CFG_ENUM) {
        if (*(char *const *)v) yaml_quote(f, *(char *const *)v);
        else fputs("null", f);
    } else if (s->type == CFG_STRING_LIST) {
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
        if (KEYS[i].type == CFG_STRING || KEYS[i].type == CFG_ENUM) string_set(f, NULL);
        if (KEYS[i].type == CFG_STRING_LIST) list_clear(f);
    }
}

void config_load_or_die(Config *c, int argc, char **argv) {
    char err[1024];
    config_defaults(c);
    if (!config_parse_args(c, argc, argv, err, sizeof err) ||
        !config_check_supported(c, err, sizeof err))
        die_user("%s", err);
}
