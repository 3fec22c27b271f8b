// Configuration: torchtitan's job config, read from YAML and `--section.key value` overrides.
//
// Sections, key names and defaults follow torchtitan's JobConfig so that a torchtitan config
// translates key for key. One table, core/config_keys.def, describes every key (type, range,
// default, allowed values, help); parsing, defaults, overrides, printing, --help-config and typo
// suggestions all walk it, so a new key is one struct field plus one table line. Values are
// checked against their range as they are read, so errors name file:line:col or the flag; each
// key remembers where its value came from, which the later checks name.
//
// Types: BOOL -> bool, INT -> int64_t, FLOAT -> double, STRING and ENUM -> char * (owned),
// STRING_LIST -> StringList. Keys torchtitan types as `X | None` accept YAML null (`null`, `~`):
// a null string is NULL, a null float is NAN (test with isnan), a null int is CONFIG_INT_UNSET.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CONFIG_INT_UNSET INT64_MIN  // a nullable INT key set to null; no user value equals it

// A config larger or more deeply nested than this is refused before it is parsed (libyaml
// takes seconds on a deep one). A config needs three levels, sections of keys whose values may
// be lists; one more lets a nested list be reported as such.
#define CONFIG_MAX_BYTES (1 << 20)
#define CONFIG_MAX_DEPTH 4

typedef struct {
    int count;
    char **items;  // owned
} StringList;

typedef struct {
    char *config_file;       // nullable; set to the file actually read
    char *dump_folder;
    char *description;
    bool print_config;
    char *save_config_file;  // nullable
} JobSection;

typedef struct {
    bool enable_profiling;
    char *save_traces_folder;
    int64_t profile_freq;
    int64_t profiler_active;
    int64_t profiler_warmup;
    bool enable_memory_snapshot;
    char *save_memory_snapshot_folder;
} ProfilingSection;

typedef struct {
    int64_t log_freq;
    bool enable_tensorboard;
    bool disable_color_printing;
    char *save_tb_folder;
    bool save_for_all_ranks;
    bool enable_wandb;
    double peak_flops;  // FLOP/s per device for MFU; 0 = use the device's known peak
} MetricsSection;

typedef struct {
    char *name;
    char *flavor;
    char *tokenizer_path;
    StringList converters;
    bool print_after_conversion;
    bool tie_word_embeddings;
    bool rope_scaling;
    // The MoE layers' settings a user tunes (models/moe), over the flavor's:
    double moe_load_balance_coeff;  // nullable: NAN = no aux-loss-free balancing
    double moe_aux_loss_alpha;      // the sequence-wise balance loss weight; 0 = none
    double moe_capacity_factor;     // nullable: NAN = no token dropped
    int64_t mtp_layers;             // DeepSeek-V3's multi-token prediction modules; 0 = none
    double mtp_loss_weight;         // their mean loss's weight in the objective
} ModelSection;

typedef struct {
    char *name;
    double lr;
    double beta1;
    double beta2;
    double eps;
    double weight_decay;
    char *implementation;
    bool early_step_in_backward;
    // Muon's (optim/muon.c): lr and weight_decay are the fields above, AdamW's too
    char *muon_pattern;
    double momentum;
    bool nesterov;
    int64_t ns_steps;
    char *adjust_lr_fn;
} OptimizerSection;

typedef struct {
    int64_t warmup_steps;
    double decay_ratio;  // nullable: NAN = decay right after warmup (no stable phase)
    char *decay_type;
    double min_lr_factor;
} LrSchedulerSection;

typedef struct {
    char *dataset;
    char *dataset_path;  // nullable
    int64_t local_batch_size;
    int64_t global_batch_size;  // -1 = local_batch_size x data-parallel degree
    int64_t seq_len;
    double max_norm;
    int64_t steps;
    bool enable_cpu_offload;
    char *dtype;
    char *mixed_precision_param;
    char *mixed_precision_reduce;
    char *device;  // titan: the kernels backend, "cpu" or "cuda"
    bool compile;
    int64_t gc_freq;
    int64_t seed;  // torchtitan: None; titan seeds 0 so that runs are reproducible by default
    bool deterministic;
    bool document_masking;
    double ema_decay;  // titan: the weights' exponential moving average; 0 = off
    double classifier_free_guidance_prob;  // FLUX: chance that an example's prompt is dropped
} TrainingSection;

typedef struct {
    int64_t data_parallel_replicate_degree;
    bool enable_compiled_autograd;
    int64_t data_parallel_shard_degree;  // -1 = the ranks left over by the other dims
    char *fsdp_reshard_after_forward;
    int64_t tensor_parallel_degree;
    bool disable_loss_parallel;
    bool enable_async_tensor_parallel;
    int64_t pipeline_parallel_degree;
    int64_t pipeline_parallel_first_stage_less_layers;
    int64_t pipeline_parallel_last_stage_less_layers;
    int64_t pipeline_parallel_layers_per_stage;  // nullable
    char *pipeline_parallel_schedule;
    char *pipeline_parallel_schedule_csv;  // nullable
    int64_t pipeline_parallel_microbatch_size;
    int64_t context_parallel_degree;
    char *context_parallel_rotate_method;
    int64_t expert_parallel_degree;
    int64_t expert_tensor_parallel_degree;
} ParallelismSection;

typedef struct {
    bool enable;
    char *folder;
    int64_t interval;
    char *initial_load_path;  // nullable
    bool initial_load_model_only;
    bool initial_load_in_hf;
    bool last_save_model_only;
    bool last_save_in_hf;
    char *export_dtype;
    char *async_mode;
    int64_t keep_latest_k;
    int64_t load_step;  // -1 = latest
    StringList exclude_from_loading;
    bool enable_first_step_checkpoint;
    bool create_seed_checkpoint;
    bool load_only;
} CheckpointSection;

typedef struct {
    char *mode;                 // one of AC_MODES
    char *selective_ac_option;
} ActivationCheckpointSection;

// activation_checkpoint.mode's values, in order of the memory they keep: none, selective, full.
extern const char *const AC_MODES[4];

// torchtitan v0.2.2's Float8Linear (its quantize.linear.float8), read when model.converters
// has float8, and the MoE experts' float8 grouped GEMMs (v0.2's quantize.grouped_mm.float8.fqns,
// the flat float8 section's moe_fqns_prototype before it).
typedef struct {
    bool enable_fsdp_float8_all_gather;
    bool precompute_float8_dynamic_scale_for_fsdp;
    char *recipe_name;  // nullable: null is torchao's default, tensorwise
    StringList filter_fqns;
    bool emulate;
    StringList moe_fqns_prototype;
} Float8Section;

// torchtitan's LoRAConverter.Config, read when model.converters has lora (models/lora.h).
typedef struct {
    int64_t rank;
    double alpha;
    double dropout;             // PEFT's lora_dropout
    bool quantize_base;         // QLoRA: the adapted weights NF4 (Param.nf4)
    StringList target_modules;  // empty: every Linear
} LoraSection;

typedef struct {
    char *backend;              // auto, nccl or mpi (train/setup.c's select_comm)
    int64_t init_timeout_seconds;
    int64_t train_timeout_seconds;
    int64_t trace_buf_size;
    char *save_traces_folder;
    double dp_replicate_link_latency_ms;  // comm_simulate_link over dp_replicate; 0: off
    double dp_replicate_link_gbps;        // its bandwidth; 0: unlimited
    bool enable_debug_server;   // core/debug_server.h, on every rank
    int64_t debug_server_port;  // rank r listens on this + r
    char *debug_server_host;    // the address every rank's server binds
    bool debug_server_allow_remote;  // a host other than loopback: unauthenticated to all
} CommSection;

// titan's semi-synchronous training over dp_replicate (parallel/semi_sync.h), with the names
// torchtitan's fault_tolerance section gives the same settings where it has them.
typedef struct {
    char *method;                  // none, diloco or streaming_diloco
    int64_t sync_steps;            // H: inner steps between two syncs of each fragment
    int64_t num_fragments;         // streaming DiLoCo's fragments (1 under diloco)
    int64_t fragment_sync_delay;   // inner steps a fragment's all-reduce overlaps
    double fragment_update_alpha;  // the local weights' share at a fragment's sync
    double outer_lr;               // the outer SGD's (torchtitan hard-codes 0.7, 0.9, Nesterov)
    double outer_momentum;
    bool outer_nesterov;
} SemiSyncSection;

typedef struct {
    bool enable;
    char *dataset;
    char *dataset_path;  // nullable
    int64_t local_batch_size;
    int64_t seq_len;
    int64_t freq;
    int64_t steps;  // -1 = the whole validation set
} ValidationSection;

typedef struct {
    JobSection job;
    ProfilingSection profiling;
    MetricsSection metrics;
    ModelSection model;
    OptimizerSection optimizer;
    LrSchedulerSection lr_scheduler;
    TrainingSection training;
    ParallelismSection parallelism;
    CheckpointSection checkpoint;
    ActivationCheckpointSection activation_checkpoint;
    Float8Section float8;
    LoraSection lora;
    CommSection comm;
    ValidationSection validation;
    SemiSyncSection semi_sync;
    char **origin;  // per key of the table, owned: where its value came from; NULL = default
} Config;

typedef enum {
    CONFIG_BOOL,
    CONFIG_INT,
    CONFIG_FLOAT,
    CONFIG_STRING,
    CONFIG_ENUM,
    CONFIG_STRING_LIST
} ConfigType;

// One key of the table, for code that walks every key (tests, tools).
typedef struct {
    const char *section, *key;
    ConfigType type;
    const char *const *choices;  // CONFIG_ENUM: the allowed values, NULL-terminated
    double lo, hi;  // CONFIG_INT, CONFIG_FLOAT: the accepted range (its ends may be open)
} ConfigKeyInfo;

// Overwrites *c with every default (call config_free first if *c held a config).
void config_defaults(Config *c);
// Reads `--config PATH` (or `--job.config_file PATH`) first, then applies `--section.key value`
// and `--section.key=value` overrides in argument order, wherever the file argument stood. A
// bare BOOL flag means true. Any other argument is an error. On error: false, one line in err.
bool config_parse_args(Config *c, int argc, char **argv, char *err, size_t errlen);
// Applies the keys a YAML file sets on top of *c; errors name file:line:col.
bool config_parse_file(Config *c, const char *path, char *err, size_t errlen);
// The same for YAML text in memory (len bytes, no '\0' needed); name stands for the file in
// errors and origins.
bool config_parse_text(Config *c, const char *name, const char *text, size_t len, char *err,
                       size_t errlen);
// Refuses values that are always wrong (ranges, batch arithmetic) and values asking for
// features this build does not implement yet, naming the key.
bool config_check_supported(const Config *c, char *err, size_t errlen);
// True when model.converters names converter ("float8").
bool config_converts(const Config *c, const char *converter);
// defaults + args + checks; die_user with the one-line reason on failure.
void config_load_or_die(Config *c, int argc, char **argv);
// The resolved config as YAML with every key, re-parseable by config_parse_file.
void config_print_yaml(const Config *c, FILE *f);
char *config_to_yaml(const Config *c);  // same text, malloc'd: checkpoints store it
// True when config_to_yaml(c), parsed over the defaults, prints back as the same text; else
// false with the first line that differs (or the parse error) in err.
bool config_roundtrip_check(const Config *c, char *err, size_t errlen);
// Every key with its type, accepted values, default and meaning (`titan --help-config`).
void config_print_help(FILE *f);
// Where key name ("section.key") got its value: "FILE:LINE:COL" of the YAML value,
// "--section.key" on the command line, or "default". False for an unknown name.
bool config_key_origin(const Config *c, const char *name, char *buf, size_t n);
// The value of key name as messages show it (strings unquoted, lists as [a, b], null as
// null). False for an unknown name.
bool config_value_text(const Config *c, const char *name, char *buf, size_t n);
size_t config_key_count(void);
// Of count names, the one nearest to name by edit distance, as the keys' "did you mean"
// chooses; NULL when none is close (titan's own flags use it for --confg).
const char *config_closest_name(const char *name, const char *const *names, size_t count);
ConfigKeyInfo config_key_info(size_t i);  // i < config_key_count()
void config_free(Config *c);
