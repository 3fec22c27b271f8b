// The trainer's internal header: the Trainer that main.c wires together (config -> mesh ->
// model -> parallelize -> optimizer -> data -> loop) and what its files give each other:
// setup.c (the setup), data.c (the batches), float8.c (the float8 conversion), loop.c (the
// training loop), checkpoint.c (when to save, what to load), report.c (--estimate and the run
// summary), debug.c (the debug server), pipeline.c and schedule.c (pipeline parallel),
// threads.c (OpenMP threads per rank). Only train/ includes it.
#pragma once

#include "checkpoint/train_state.h"
#include "core/config.h"
#include "core/debug_server.h"
#include "core/errors.h"
#include "core/files.h"
#include "core/metrics.h"
#include "core/preempt.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/token_batch.h"
#include "data/tokenizer.h"
#include "models/lora.h"
#include "models/moe/balance.h"
#include "models/registry.h"
#include "optim/optim.h"
#include "parallel/comm.h"
#include "parallel/cp/cp.h"
#include "parallel/ddp.h"
#include "parallel/ep/ep.h"
#include "parallel/fsdp.h"
#include "parallel/grads.h"
#include "parallel/mesh.h"
#include "parallel/muon_shards.h"
#include "parallel/pp/schedule.h"
#include "parallel/semi_sync.h"
#include "parallel/tp.h"

// One dataset read in batches: the training split or the validation split.
typedef struct {
    const char *path;
    TokenStream stream;
    DataLoader loader;
    int B, T;                // rows and sequence length of its batches
    int step_T;              // the tokens of each sequence this rank holds: T / cp
    int *tokens, *targets;   // (B*T) each, host memory: what the loader writes
    int *local;              // (B*step_T) host scratch: this rank's columns of either (cp > 1)
    int *pos;                // (step_T) the global position of each of them, host memory
    int *step_tokens, *step_targets;  // (B*step_T) each, the backend's copies the step reads
    int *step_pos;           // (step_T) RoPE positions of those tokens, the backend's memory
    int *doc;                // (B*T) document ids of the whole batch (document masking), host
                             // memory; NULL without
    int *doc_ends;           // (B*T) host: whether each token ends a document, for supervised
                             // data's document masking (TOKEN_ENDS_DOCUMENT); NULL: EOS does
    int *step_doc;           // the backend's copy; NULL: no document masking
    // (B*T) host: whether each target counts (a supervised dataset's loss mask, its prompts
    // not), and the backend's copy of this rank's columns; NULL: every target counts
    int *loss_mask, *step_loss_mask;
    double targets_counted;  // this rank's targets that count in the batch read last
    TokenBatch batch;        // the step's inputs: the step_* tensors, as the model reads them
} Split;

// This rank's OpenMP threads and why (threads.c).
typedef struct {
    int threads;           // OpenMP threads each rank of this node runs
    int local_rank;        // this rank's index among its node's ranks
    int local_ranks;       // the ranks on this node
    int node_cores;        // the cpus they may run on together (their affinity masks' union)
    int node_online;       // the cpus this node has online
    const char *env;       // OMP_NUM_THREADS as set, taken as is; NULL: unset, titan's share
} ThreadPlan;

typedef struct AsyncSave AsyncSave;  // checkpoint.c's
typedef struct Pipeline Pipeline;    // pipeline.c's

typedef struct {
    Config cfg;
    ThreadPlan threads;           // OpenMP threads per rank, set before the first parallel region
    const KernelOps *k;           // the kernels backend (training.device)
    MixedPrecisionPolicy precision;  // what it computes in (training.mixed_precision_param:
                                     // bf16 or fp32) and FSDP reduces in; master weights and
                                     // optimizer state stay fp32
    ArenaMemory memory;           // its memory, which every arena below is committed in
    ModelArgs args;               // model.name's architecture, model.flavor's args
    Model model;
    const char *float8_recipe;    // the recipe model.converters' float8 runs; NULL: no Linear
                                  // runs float8
    Mesh mesh;
    Tp tp;                        // used when tp_on
    Cp cp;                        // used when cp_on (context_parallel_degree > 1)
    Ep ep;                        // used when mesh.layout.ep > 1
    Fsdp fsdp;                    // used when fsdp_on (dp_shard x cp > 1; HSDP with dp_replicate)
    bool tp_on, cp_on, fsdp_on;
    bool ddp_on;                  // dp_replicate > 1 on an fsdp group of one: plain DDP
    Pipeline *pipeline;           // pipeline_parallel_degree > 1; NULL: off
    CommGroup *pp_tied;           // the two pp ranks whose stages hold the model's copies
                                  // (Param.copy) and their originals; NULL: none apart
    int estimate_world_size;      // > 0: `--estimate`: plan and size for that many ranks only
    int estimate_pp_rank;         // the pp coordinate it plans (every other coordinate is 0)
    double estimate_device_memory;  // > 0: `--device-memory`: one device's bytes, which its
                                    // verdict divides among the ranks sharing it
    int estimate_ranks_per_device;  // `--ranks-per-device N` (0: 1, or the whole world where
                                    // comm.backend mpi puts every rank on one GPU)
    double estimate_checkpoint_bandwidth;  // > 0: `--checkpoint-bandwidth`, bytes/s
    const char *estimate_device_table;     // `--device-table`: a kept row's name or "probe";
                                           // NULL: cpu's probe, cuda's H100
    bool print_schedule;          // `--print-schedule`: check and print the pipeline schedule only
    int schedule_microbatches;    // `--microbatches N` for it (0: from the batch config)
    Arena param_arena, grad_arena, optim_arena, act_arena, comm_arena;
    Arena input_arena;            // the step's token ids and positions in the backend's memory
    size_t act_bytes_ac[3];       // the activation arena under each of AC_MODES
    AdamW opt;
    MuonDist muon_dist;           // opt.muon.shards when Muon's matrices are cut over ranks
    SemiSync semi_sync;           // used when opt.outer.on (semi_sync.method other than none)
    LrSchedule schedule;
    int lr_origin;                // the step the schedule counts from (exclude_from_loading)
    Tokenizer *tokenizer;         // NULL when the data is pre-tokenized and none is named
    Split train, val;             // val is used when validation.enable
    void *data;                   // the model's own training data (its spec's ModelData), read
                                  // instead of train's token batches; NULL: token batches
    int accum;                    // microbatches per step
    // The step's StepCtx.loss_tokens for a whole batch under a loss mask (the pipeline's
    // microbatches divide it); 0: none (trainer_count_targets).
    double loss_tokens;
    // The training microbatch's seed for LoRA's dropout (StepCtx.dropout_seed; the pipeline's
    // microbatches derive theirs): a function of training.seed, the step and the microbatch,
    // so a resume draws what the run would have.
    uint64_t dropout_seed;
    int doc_eos;                  // training.document_masking: the token that ends a document;
                                  // -1: off
    TrainProgress progress;
    char ckpt_folder[4096];
    double step_seconds;          // the last step's time: what a checkpoint's stall is set against
    AsyncSave *async_save;        // checkpoint.async_mode async: the background save (NULL: off)
    bool finished;                // the newest checkpoint is at training.steps: nothing to train
} Trainer;

// setup.c: everything before the first step (or, under --estimate, up to the arenas' sizes),
// from t->cfg and the flags main.c set.
void trainer_setup(Trainer *t);
// The args of the model the config names (model.name, model.flavor), before the run's
// settings: die_user naming the key that names none.
void trainer_model_args(const Config *c, ModelArgs *args);
// data.c. shape_batches: each split's rows, sequence length and this rank's share of it under
// context parallel (checked); load_tokenizer: model.tokenizer_path's, and the token that ends
// a document under training.document_masking (t->doc_eos).
void trainer_shape_batches(Trainer *t);
void trainer_load_tokenizer(Trainer *t);
// An architecture that reads its own data (its spec's ModelData): checked and opened, which
// sets train's shapes; the token pipeline's keys refused by name for the others.
void trainer_open_model_data(Trainer *t);
// The token splits' files (training, and validation when enabled) opened; then each split's
// inputs carved in the backend's memory (input_arena), or the model's own data's.
void trainer_open_data(Trainer *t);
void trainer_allocate_inputs(Trainer *t);
// The split's next batch handed to the backend (sp->batch); the next training microbatch as
// the model reads it (StepCtx.input).
void trainer_split_next(Trainer *t, Split *sp);
const void *trainer_next_batch(Trainer *t);
// Under a loss mask, before the step's first microbatch: t->loss_tokens = the targets that
// count in the step's batches over the loss group's ranks (read ahead, the loader then put
// back), divided by their number and by t->accum (torchtitan's global_valid_tokens, so that
// the microbatches' and ranks' mean loss is the mean over those targets). A collective over
// the loss group; nothing without a mask.
void trainer_count_targets(Trainer *t);
// The training data's position (examples or windows consumed by all ranks): a checkpoint's
// data-loader state, and back.
int64_t trainer_data_position(const Trainer *t);
void trainer_data_set_position(Trainer *t, int64_t position);
// float8.c: model.converters' float8 after the build (each Linear's precision, t->float8_recipe,
// float8.enable_fsdp_float8_all_gather's weights marked for FSDP, refusing what float8 cannot
// run); the log line naming which Linears run float8.
void trainer_convert_float8(Trainer *t);
void trainer_log_float8(const Trainer *t);
// threads.c: each rank's OpenMP threads, its share of the node's cores unless OMP_NUM_THREADS
// is set (collective over the world; before any OpenMP region); the startup line naming them,
// and a warning where a node's ranks run more threads than it has cores.
void trainer_plan_threads(Trainer *t);
void trainer_log_threads(const Trainer *t);
// loop.c: training.steps steps from t->progress.step, with metrics, validation, checkpoints
// and preemption, then the run's summary.
void trainer_train(Trainer *t);
// checkpoint.c: torchtitan's checkpoint policy over checkpoint/train_state.h.
// When this run's newest checkpoint is at training.steps or beyond, it loads nothing and sets
// t->finished (saying so): the same command run again (a second `make run`, a requeued job that
// had finished) has nothing to train, rather than resuming its model-only last save.
// checkpoint.load_step resumes as asked.
void trainer_load_or_initialize(Trainer *t);
void trainer_maybe_checkpoint(Trainer *t, int step, bool preempted);
// A background save in flight (async_mode async) is waited for; close also ends the writer
// (collective over the world). Both do nothing without one.
void trainer_wait_checkpoint(Trainer *t);
void trainer_close_checkpoint(Trainer *t);
// The host memory an async save's staging takes on this rank (0 when saves are synchronous).
size_t trainer_checkpoint_staging_bytes(const Trainer *t);
void trainer_create_seed_checkpoint(Trainer *t);
// report.c: `titan --estimate`, the memory check before the arenas are allocated, and
// after a run <dump_folder>/run_summary.json and, under context parallel, the K/V traffic line.
// print_estimate: the plans of pp ranks 0 .. n - 1 (n = pipeline_parallel_degree).
void trainer_print_estimate(Trainer *ranks, int n);
void trainer_check_memory(Trainer *t);
// Tokens per device of one step, as torchtitan counts them for tokens/s and MFU: the ranks of a
// tp group, and of a pipeline, share their tokens; a cp rank holds 1/cp of each sequence.
double trainer_tokens_per_device(const Trainer *t);
// The node's ranks that share this rank's device, itself included (k->device_id: the node's
// memory on cpu, its GPU on cuda); collective over the world.
int trainer_ranks_per_device(const KernelOps *k);
void trainer_write_run_summary(Trainer *t);
// One log line at the end of a cp run: K/V transfers, bytes, and the time blocked on them.
void trainer_log_cp_traffic(const Trainer *t, double elapsed);
// debug.c: comm.enable_debug_server's server on every rank (collective over the world;
// nothing when off). loop.c publishes its step, phase and metrics to it.
void trainer_start_debug_server(const Config *c);
// schedule.c: `titan --print-schedule [--microbatches N]`, and the schedule training runs.
void trainer_print_schedule(const Config *c, int microbatches_flag);
void trainer_load_schedule(const Config *c, int microbatches, PpSchedule *s, PpReport *r);
// The microbatches of a pipeline step: local_batch_size / pipeline_parallel_microbatch_size.
int trainer_schedule_microbatches(const Config *c);
// pipeline.c: pipeline parallel. plan: after the model is built, before TP (the schedule,
// each stage's blocks, its parameters placed on its rank); activation_bytes: the regions'
// bytes (sizing pass); start: the executor on the committed activation arena (and
// Trainer.pp_tied); step: one
// batch's microbatches through this rank's stages, returning the mean loss on the last
// stage's rank and 0 on the others.
void trainer_pipeline_plan(Trainer *t);
// This rank's part of the pipeline, as --estimate reports it.
typedef struct {
    const char *schedule;       // parallelism.pipeline_parallel_schedule, or its CSV file
    int microbatches, stages, rank;
    const int *stage_rank;      // (stages) the pp rank that runs each virtual stage
    const int *first;           // (stages + 1) stage s runs blocks [first[s], first[s + 1])
    double bubble;              // the checker's idle fraction of all pp ranks' time
    int peak_live;              // this rank's most microbatches in flight (the checker's)
    int regions;                // its activation regions (pp_region_counts)
    size_t region_bytes;        // each one's bytes
    int eval_regions;           // validation's, taking turns in the same arena (0: none)
    size_t eval_region_bytes;
    uint64_t act_bytes_sent, grad_bytes_sent;  // per pipeline step, to other pp ranks:
                                               // activations forward, gradients backward
} PipelineRankPlan;
PipelineRankPlan trainer_pipeline_rank_plan(Trainer *t);
ArenaBytes trainer_pipeline_activation_bytes(Trainer *t);
void trainer_pipeline_start(Trainer *t);
// One training batch (trainer_next_batch's, of StepCtx.input's type): its mean loss on the last
// stage's rank, 0 on the others, and *aux_loss the mean over the microbatches of the MoE
// balance loss of this rank's stages' layers.
double trainer_pipeline_step(Trainer *t, const void *batch, double *aux_loss);
// One validation batch through this rank's stages, forward only: its mean loss on the last
// stage's rank, 0 on the others.
double trainer_pipeline_eval(Trainer *t);
