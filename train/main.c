// titan's entry point: config -> model -> optimizer -> data -> training loop (docs/design.md
// "Layout"). The command line (titan's own flags, then the config), the subcommands,
// `--print-schedule` and `--estimate`, which plan without MPI, and training: setup (setup.c),
// then the loop (loop.c) or a seed checkpoint (checkpoint.c).
//
//   titan --config configs/debug_model.yaml [--section.key value ...] [--print-config]
//   titan tokenize --tokenizer T --out DIR FILE...
//   titan tokenizer train --vocab-size N --out FILE.tiktoken FILE...
//   titan generate --checkpoint C [--tokenizer T] --prompt "..."
//   titan convert --to hf|titan FROM TO
#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "checkpoint/checkpoint.h"
#include "convert/convert.h"
#include "data/bpe_train.h"
#include "data/tokenize.h"
#include "infer/generate.h"
#include "kernels/device.h"
#include "train/train.h"

static void save_config(const Config *c, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) die_user("job.save_config_file: cannot write %s: %s", path, strerror(errno));
    config_print_yaml(c, f);
    if (fclose(f) != 0)
        die_user("job.save_config_file: cannot write %s: %s", path, strerror(errno));
}

// The usage of every command; each subcommand's own --help prints its line in full.
static const char USAGE[] =
    "usage: titan --config FILE.yaml [--section.key VALUE ...]   train a model\n"
    "       titan tokenize --tokenizer T --out DIR [--shard-tokens N] DATASET...\n"
    "       titan tokenizer train --vocab-size N --out FILE.tiktoken [--threads T] FILE...\n"
    "       titan generate --checkpoint C [--tokenizer T] --prompt TEXT [...]\n"
    "       titan convert --to hf [--dtype float32|bfloat16] CHECKPOINT.h5 OUT_DIR\n"
    "       titan convert --to titan HF_DIR OUT.h5\n"
    "       titan convert --to peft CHECKPOINT.h5 OUT_DIR   a LoRA run's adapters for PEFT\n"
    "       mpirun -np N titan --config FILE.yaml ...      train on N ranks\n"
    "\n"
    "Training flags:\n"
    "  --config FILE          torchtitan's job config in YAML; see configs/:\n"
    "                         debug models: debug_model.yaml (llama3), qwen3_debug.yaml,\n"
    "                         qwen3_moe_debug.yaml, deepseek_v3_debug.yaml (expert parallel),\n"
    "                         flux_digits.yaml, flux_debug.yaml, debug_lora.yaml (LoRA\n"
    "                         fine-tuning of debug_model's run); real sizes: llama3_8b.yaml,\n"
    "                         llama3_70b.yaml, llama3_405b.yaml, qwen3_0.6b.yaml,\n"
    "                         qwen3_8b.yaml, qwen3_32b.yaml, qwen3_30b_a3b.yaml (MoE),\n"
    "                         deepseek_v3_671b.yaml (2048 ranks)\n"
    "  --section.key VALUE    override one config key, e.g. --training.steps 100\n"
    "  --print-config         print the resolved config as YAML and exit\n"
    "  --device cpu|cuda      short for --training.device\n"
    "  --estimate [--world-size N] [--device-memory SIZE] [--ranks-per-device R]\n"
    "                         print each rank's memory and FLOPs plan and exit; with SIZE\n"
    "                         (80GiB, 80GB, 512MiB), whether each rank's peak fits a device\n"
    "                         of that memory shared by R ranks (default 1; on cuda under\n"
    "                         comm.backend mpi, all N ranks on one GPU)\n"
    "                         [--checkpoint-bandwidth GBPS]: a save's time at that rate\n"
    "                         [--device-table NAME|probe]: the step time predicted on a kept\n"
    "                         GPU row (H100, H200, ...; cuda's default H100) or on rates\n"
    "                         measured now on training.device (cpu's default)\n"
    "  --print-schedule [--microbatches N]  check the pipeline schedule, print it and exit\n"
    "  --help-config          list every config key: type, default, meaning\n"
    "  -h, --help             this text; `titan COMMAND --help` for a command's\n"
    "\n"
    "Exit status: 0 done, 2 a problem with your input (one line says which), 3 a bug in titan.\n"
    "More in README.md.";

// titan's own flags and --config: a misspelt one (`--confg`) is named with its nearest, as
// the config's keys are. A flag with no dot near none of them is left for the config to refuse.
static void refuse_misspelt_flag(const char *arg) {
    static const char *const FLAGS[] = {"config",        "print-config", "device",
                                        "estimate",      "world-size",   "device-memory",
                                        "ranks-per-device", "checkpoint-bandwidth",
                                        "device-table",
                                        "print-schedule", "microbatches",
                                        "help-config",   "help"};
    char name[64];
    if (strncmp(arg, "--", 2) != 0 || strchr(arg, '.')) return;
    snprintf(name, sizeof name, "%.*s", (int)strcspn(arg + 2, "="), arg + 2);
    const char *near = config_closest_name(name, FLAGS, sizeof FLAGS / sizeof FLAGS[0]);
    char quoted[160];
    if (near && strcmp(near, name) != 0) die_user("unknown option %s (did you mean '--%s'?)",
                       error_quote(quoted, sizeof quoted, arg), near);
}

// `--device-memory SIZE`: a number and a unit, decimal (KB, MB, GB, TB: powers of 1000, as
// vendors label GPUs) or binary (KiB, MiB, GiB, TiB), case-insensitive; 0 when s is not one.
static double parse_memory_size(const char *s) {
    static const struct {
        const char *unit;
        double bytes;
    } UNITS[] = {{"B", 1},      {"KB", 1e3},       {"MB", 1e6},        {"GB", 1e9},
                 {"TB", 1e12},  {"KiB", 0x1p10},   {"MiB", 0x1p20},    {"GiB", 0x1p30},
                 {"TiB", 0x1p40}};
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || !(v > 0) || !isfinite(v)) return 0;
    for (size_t i = 0; i < sizeof UNITS / sizeof UNITS[0]; i++)
        if (strcasecmp(end, UNITS[i].unit) == 0) return v * UNITS[i].bytes;
    return 0;
}

// titan's own flags, removed from argv before the config parses the rest: `--estimate
// [--world-size N] [--device-memory SIZE] [--ranks-per-device R] [--checkpoint-bandwidth
// GBPS] [--device-table NAME|probe]`; `--print-schedule [--microbatches N]`; and the short
// forms `--print-config` (`--job.print_config`) and `--device D` (`--training.device D`).
// `--help-config` prints the config keys and exits.
static int parse_titan_flags(int argc, char **argv, Trainer *t) {
    int kept = 1;
    bool estimate = false;
    int world = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help-config") == 0) {
            config_print_help(stdout);
            exit(0);
        } else if (strcmp(argv[i], "--estimate") == 0) {
            estimate = true;
        } else if (strcmp(argv[i], "--print-schedule") == 0) {
            t->print_schedule = true;
        } else if (strcmp(argv[i], "--world-size") == 0 ||
                   strcmp(argv[i], "--ranks-per-device") == 0 ||
                   strcmp(argv[i], "--microbatches") == 0) {
            char *end = NULL, quoted[160];
            long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (!end || *end || v < 1 || v > INT32_MAX)  // ranks and microbatches are ints
                die_user("%s expects an integer in [1, %d], got %s", argv[i], INT32_MAX,
                         i + 1 < argc ? error_quote(quoted, sizeof quoted, argv[i + 1]) : "none");
            *(strcmp(argv[i], "--world-size") == 0         ? &world
              : strcmp(argv[i], "--ranks-per-device") == 0 ? &t->estimate_ranks_per_device
                                                           : &t->schedule_microbatches) = (int)v;
            i++;
        } else if (strcmp(argv[i], "--checkpoint-bandwidth") == 0) {
            char *end = NULL, quoted[160];
            double v = i + 1 < argc ? strtod(argv[i + 1], &end) : 0;
            if (!end || *end || !(v > 0) || !isfinite(v))
                die_user("--checkpoint-bandwidth expects the storage's write rate in GB/s (a "
                         "positive number, e.g. 10), got %s",
                         i + 1 < argc ? error_quote(quoted, sizeof quoted, argv[i + 1]) : "none");
            t->estimate_checkpoint_bandwidth = v * 1e9;
            i++;
        } else if (strcmp(argv[i], "--device-table") == 0) {
            char names[256], quoted[160];
            device_table_names(names, sizeof names);
            if (i + 1 >= argc ||
                (strcmp(argv[i + 1], "probe") && !device_table_named(argv[i + 1])))
                die_user("--device-table expects probe or a kept row (%s), got %s", names,
                         i + 1 < argc ? error_quote(quoted, sizeof quoted, argv[i + 1]) : "none");
            t->estimate_device_table = argv[++i];
        } else if (strcmp(argv[i], "--device-memory") == 0) {
            char quoted[160];
            if (i + 1 >= argc || !(t->estimate_device_memory = parse_memory_size(argv[i + 1])))
                die_user("--device-memory expects a size such as 80GiB, 80GB or 512MiB (units B, "
                         "KB, MB, GB, TB, KiB, MiB, GiB, TiB), got %s",
                         i + 1 < argc ? error_quote(quoted, sizeof quoted, argv[i + 1]) : "none");
            i++;
        } else {
            refuse_misspelt_flag(argv[i]);
            argv[kept++] = strcmp(argv[i], "--print-config") == 0 ? "--job.print_config"
                           : strcmp(argv[i], "--device") == 0       ? "--training.device"
                                                                    : argv[i];
        }
    }
    if (world && !estimate) die_user("--world-size is only for --estimate");
    if (t->estimate_checkpoint_bandwidth && !estimate)
        die_user("--checkpoint-bandwidth is only for --estimate");
    if (t->estimate_device_table && !estimate)
        die_user("--device-table is only for --estimate (a run's step line measures its step)");
    if (t->estimate_ranks_per_device && !estimate)
        die_user("--ranks-per-device is only for --estimate (a run counts the ranks on its "
                 "device)");
    // A run checks its arenas against the memory its device reports free (the memory check),
    // which a named size could only contradict.
    if (t->estimate_device_memory && !estimate)
        die_user("--device-memory is only for --estimate (a run checks the memory its device "
                 "reports free)");
    if (t->schedule_microbatches && !t->print_schedule)
        die_user("--microbatches is only for --print-schedule");
    if (estimate) t->estimate_world_size = world ? world : 1;
    return kept;
}

// The config, with the choices core/config.c cannot know (the registry's models and their
// flavors) checked as soon as it is read: before --print-config prints it and before anything
// starts.
static void config_load(Config *c, int argc, char **argv) {
    config_load_or_die(c, argc, argv);
    ModelArgs args;
    trainer_model_args(c, &args);
}

// `titan tokenizer train ...`, the one tokenizer command so far; `titan tokenizer --help` is
// its help.
static int tokenizer_main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "train") == 0) return tokenizer_train_main(argc - 1, argv + 1);
    help_exit_if_asked(argc, argv, TOKENIZER_TRAIN_USAGE);
    die_user("tokenizer: unknown command %s; " TOKENIZER_TRAIN_USAGE,
             argc > 1 ? argv[1] : "(none)");
}

// The commands other than training, each with its own flags: true with *status their exit
// status when argv names one.
static bool run_command(int argc, char **argv, int *status) {
    if (strcmp(argv[1], "tokenize") == 0) *status = tokenize_main(argc - 1, argv + 1);
    else if (strcmp(argv[1], "tokenizer") == 0) *status = tokenizer_main(argc - 1, argv + 1);
    else if (strcmp(argv[1], "generate") == 0) *status = generate_main(argc - 1, argv + 1);
    else if (strcmp(argv[1], "convert") == 0) *status = convert_main(argc - 1, argv + 1);
    else return false;
    return true;
}

// `--print-schedule`, like --estimate: no MPI, nothing allocated but the schedule. The config
// is parsed but not checked against what training implements: planning a pipeline that
// training refuses today (pipeline_parallel_degree > 1) is the point.
static void print_schedule(Trainer *t, int argc, char **argv) {
    char err[1024];
    config_defaults(&t->cfg);
    if (!config_parse_args(&t->cfg, argc, argv, err, sizeof err)) die_user("%s", err);
    trainer_print_schedule(&t->cfg, t->schedule_microbatches);
}

// `--estimate`, planning only: no MPI, no files, no allocation. One plan per pp rank, each
// holding only its stages' blocks; the other coordinates are 0 (their ranks hold the same
// amounts).
static void print_estimate(Trainer *t, int argc, char **argv) {
    config_load(&t->cfg, argc, argv);
    int pp = (int)t->cfg.parallelism.pipeline_parallel_degree;
    Trainer *ranks = xcalloc((size_t)pp, sizeof(Trainer));
    for (int r = 0; r < pp; r++) {
        ranks[r] = (Trainer){.cfg = t->cfg, .estimate_world_size = t->estimate_world_size,
                             .estimate_pp_rank = r,
                             .estimate_device_memory = t->estimate_device_memory,
                             .estimate_ranks_per_device = t->estimate_ranks_per_device,
                             .estimate_checkpoint_bandwidth = t->estimate_checkpoint_bandwidth,
                             .estimate_device_table = t->estimate_device_table};
        trainer_setup(&ranks[r]);
    }
    trainer_print_estimate(ranks, pp);
}

// The comm.* keys the communication layer reads: the setup timeout and the flight recorder's
// traces, in torchtitan's <dump_folder>/<save_traces_folder>.
static void configure_comm(const Config *c) {
    const CommSection *cs = &c->comm;
    char traces[8192];
    snprintf(traces, sizeof traces, "%s/%s", c->job.dump_folder, cs->save_traces_folder);
    comm_configure(&(CommConfig){.timeout_seconds = (int)cs->init_timeout_seconds,
                                 .trace_buf_size = (int)cs->trace_buf_size,
                                 .trace_folder = traces});
}

int main(int argc, char **argv) {
    // Before any other HDF5 call: titan closes every file it opens, and a save whose file
    // would not close (checkpoint/save.c: a disk error) leaves one that HDF5's exit handler
    // would try to flush again after the .tmp was removed.
    H5dont_atexit();
    if (argc == 1) {  // no config: say what titan takes rather than train the defaults
        fprintf(stderr, "%s\n", USAGE);
        return EXIT_USER_ERROR;
    }
    int status;
    if (run_command(argc, argv, &status)) return status;
    help_exit_if_asked(argc, argv, USAGE);
    // The trainer lives as long as the process: static, so nothing it holds is lost when a
    // path below returns from main.
    static Trainer trainer;
    Trainer *t = &trainer;
    argc = parse_titan_flags(argc, argv, t);
    if (t->print_schedule) {
        print_schedule(t, argc, argv);
        return 0;
    }
    if (t->estimate_world_size) {
        print_estimate(t, argc, argv);
        return 0;
    }
    comm_init(&argc, &argv);
    preempt_install();  // from here a SIGTERM, even during setup, stops after the next step
    log_set_rank(comm_rank(comm_world()));
    die_user_collective(true);  // every rank reads the same config and plans the same mesh
    config_load(&t->cfg, argc, argv);
    configure_comm(&t->cfg);
    if (t->cfg.job.print_config) {
        config_print_yaml(&t->cfg, stdout);
        return 0;
    }
    if (t->cfg.job.save_config_file) save_config(&t->cfg, t->cfg.job.save_config_file);
    trainer_start_debug_server(&t->cfg);
    trainer_setup(t);
    die_user_collective(false);
    if (t->cfg.checkpoint.create_seed_checkpoint)
        trainer_create_seed_checkpoint(t);
    else if (!t->finished)
        trainer_train(t);
    debug_server_stop();
    comm_finalize();
    return 0;
}
