// Config: torchtitan's defaults, YAML typing, override order, print/parse round trip, the exact
// one-line error for each class of mistake, and the supported-feature gate.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"

static char tmp_dir[] = "/tmp/titan_test_config_XXXXXX";
static char tmp_path[256];  // the YAML file the current test wrote

static int dir_setup(void **state) {
    (void)state;
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int dir_teardown(void **state) {
    (void)state;
    unlink(tmp_path);
    return rmdir(tmp_dir);
}

static const char *yaml_write(const char *text) {
    snprintf(tmp_path, sizeof tmp_path, "%s/config.yaml", tmp_dir);
    FILE *f = fopen(tmp_path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return tmp_path;
}

// Parses text over the defaults; the caller frees c.
static bool yaml_parse(Config *c, const char *text, char *err, size_t n) {
    config_defaults(c);
    return config_parse_file(c, yaml_write(text), err, n);
}

static void test_defaults_match_torchtitan(void **state) {
    (void)state;
    Config c;
    config_defaults(&c);
    assert_string_equal(c.job.dump_folder, "./outputs");
    assert_null(c.job.config_file);
    assert_string_equal(c.model.name, "llama3");
    assert_string_equal(c.model.flavor, "debugmodel");
    assert_false(c.model.tie_word_embeddings);
    assert_string_equal(c.optimizer.name, "AdamW");
    assert_true(c.optimizer.lr == 8e-4);
    assert_true(c.optimizer.eps == 1e-8);
    assert_true(c.optimizer.beta1 == 0.9 && c.optimizer.beta2 == 0.95);
    assert_true(c.optimizer.weight_decay == 0.1);
    assert_int_equal(c.lr_scheduler.warmup_steps, 200);
    assert_true(isnan(c.lr_scheduler.decay_ratio));
    assert_string_equal(c.lr_scheduler.decay_type, "linear");
    assert_true(c.lr_scheduler.min_lr_factor == 0.0);
    assert_int_equal(c.training.local_batch_size, 8);
    assert_int_equal(c.training.global_batch_size, -1);
    assert_int_equal(c.training.seq_len, 2048);
    assert_int_equal(c.training.steps, 10000);
    assert_true(c.training.max_norm == 1.0);
    assert_null(c.training.dataset_path);
    assert_string_equal(c.training.mixed_precision_param, "bfloat16");
    assert_int_equal(c.parallelism.data_parallel_shard_degree, -1);
    assert_int_equal(c.parallelism.tensor_parallel_degree, 1);
    assert_true(c.parallelism.pipeline_parallel_layers_per_stage == CONFIG_INT_UNSET);
    assert_string_equal(c.parallelism.pipeline_parallel_schedule, "1F1B");
    assert_false(c.checkpoint.enable);
    assert_string_equal(c.checkpoint.folder, "checkpoint");
    assert_int_equal(c.checkpoint.interval, 500);
    assert_int_equal(c.checkpoint.load_step, -1);
    assert_int_equal(c.checkpoint.keep_latest_k, 10);
    assert_true(c.checkpoint.initial_load_model_only);
    assert_string_equal(c.checkpoint.async_mode, "disabled");
    assert_int_equal(c.checkpoint.exclude_from_loading.count, 0);
    assert_null(c.float8.recipe_name);
    assert_int_equal(c.comm.init_timeout_seconds, 300);
    assert_int_equal(c.comm.train_timeout_seconds, 100);
    assert_int_equal(c.comm.trace_buf_size, 20000);
    assert_int_equal(c.metrics.log_freq, 10);
    assert_int_equal(c.validation.steps, -1);
    config_free(&c);
}

static void test_yaml_gives_typed_values(void **state) {
    (void)state;
    Config c;
    char err[512] = "";
    bool ok = yaml_parse(&c,
                         "# a comment\n"
                         "training:\n"
                         "  steps: 42\n"
                         "  max_norm: 0.5\n"
                         "  deterministic: true\n"
                         "  dataset_path: data/shard.bin\n"
                         "optimizer:\n"
                         "  lr: 3e-4\n"
                         "lr_scheduler:\n"
                         "  decay_ratio: 0.25\n"
                         "  decay_type: cosine\n"
                         "parallelism:\n"
                         "  pipeline_parallel_layers_per_stage: 4\n"
                         "  pipeline_parallel_schedule_csv: ~\n"
                         "model:\n"
                         "  converters: [float8, \"x,y\"]\n"
                         "float8:\n"
                         "  filter_fqns: \"output, layers.0.attention.wq\"\n"
                         "checkpoint:\n"
                         "  initial_load_path: null\n"
                         "  exclude_from_loading: []\n"
                         "comm:\n",
                         err, sizeof err);
    assert_true(ok);
    assert_int_equal(c.training.steps, 42);
    assert_true(c.training.max_norm == 0.5);
    assert_true(c.training.deterministic);
    assert_string_equal(c.training.dataset_path, "data/shard.bin");
    assert_true(c.optimizer.lr == 3e-4);
    assert_true(c.lr_scheduler.decay_ratio == 0.25);
    assert_string_equal(c.lr_scheduler.decay_type, "cosine");
    assert_int_equal(c.parallelism.pipeline_parallel_layers_per_stage, 4);
    assert_null(c.parallelism.pipeline_parallel_schedule_csv);
    assert_int_equal(c.model.converters.count, 2);
    assert_string_equal(c.model.converters.items[0], "float8");
    assert_string_equal(c.model.converters.items[1], "x,y");  // sequence items are not split
    assert_int_equal(c.float8.filter_fqns.count, 2);
    assert_string_equal(c.float8.filter_fqns.items[1], "layers.0.attention.wq");
    assert_null(c.checkpoint.initial_load_path);
    assert_int_equal(c.training.seq_len, 2048);  // untouched keys keep their defaults

    assert_true(config_parse_file(&c, yaml_write("lr_scheduler:\n  decay_ratio: null\n"), err,
                                  sizeof err));
    assert_true(isnan(c.lr_scheduler.decay_ratio));
    config_free(&c);
}

static void test_overrides_beat_file_in_any_order(void **state) {
    (void)state;
    const char *path = yaml_write("training:\n  steps: 100\n  deterministic: true\n"
                                  "optimizer:\n  lr: 0.1\n"
                                  "checkpoint:\n  enable: false\n  folder: from_file\n");
    char *argv[] = {"titan", "--training.steps", "7", "--config", (char *)path,
                    "--optimizer.lr=0.5", "--checkpoint.enable", "--training.deterministic",
                    "false", "--float8.filter_fqns", "a,b", "--training.dataset_path", "null"};
    Config c;
    char err[512] = "";
    config_defaults(&c);
    assert_true(config_parse_args(&c, sizeof argv / sizeof argv[0], argv, err, sizeof err));
    assert_int_equal(c.training.steps, 7);
    assert_true(c.optimizer.lr == 0.5);
    assert_true(c.checkpoint.enable);
    assert_false(c.training.deterministic);
    assert_string_equal(c.checkpoint.folder, "from_file");
    assert_int_equal(c.float8.filter_fqns.count, 2);
    assert_null(c.training.dataset_path);
    assert_string_equal(c.job.config_file, path);
    config_free(&c);
}

static void test_print_then_parse_round_trips(void **state) {
    (void)state;
    Config a, b;
    char err[512] = "";
    config_defaults(&a);
    a.optimizer.lr = 0.1 + 0.2;  // not the shortest decimal of anything simple
    a.optimizer.eps = 1e-300;
    a.lr_scheduler.decay_ratio = 1.0 / 3.0;
    a.training.seed = -123456789012345;
    a.training.compile = true;
    free(a.training.dataset);
    a.training.dataset = strdup("quote\" back\\slash\nnew\tline: # not a comment");
    free(a.parallelism.pipeline_parallel_schedule_csv);
    a.parallelism.pipeline_parallel_schedule_csv = NULL;
    a.parallelism.pipeline_parallel_layers_per_stage = 3;
    free(a.activation_checkpoint.mode);
    a.activation_checkpoint.mode = strdup("full");
    char *argv[] = {"titan", "--model.converters", "float8,mx", "--job.description=",
                    "--checkpoint.initial_load_path", "~/ckpt/step_10"};
    assert_true(config_parse_args(&a, 6, argv, err, sizeof err));
    char *text = config_to_yaml(&a);

    config_defaults(&b);
    assert_true(config_parse_file(&b, yaml_write(text), err, sizeof err));
    char *again = config_to_yaml(&b);
    assert_string_equal(text, again);
    assert_true(b.optimizer.lr == a.optimizer.lr);
    assert_true(b.optimizer.eps == 1e-300);
    assert_true(b.lr_scheduler.decay_ratio == 1.0 / 3.0);
    assert_int_equal(b.training.seed, -123456789012345);
    assert_string_equal(b.training.dataset, a.training.dataset);
    assert_string_equal(b.job.description, "");
    assert_null(b.parallelism.pipeline_parallel_schedule_csv);
    assert_string_equal(b.checkpoint.initial_load_path, "~/ckpt/step_10");
    assert_int_equal(b.model.converters.count, 2);

    FILE *f = tmpfile();
    config_print_yaml(&a, f);
    long len = ftell(f);
    assert_int_equal(len, (long)strlen(text));
    fclose(f);
    free(text);
    free(again);
    config_free(&a);
    config_free(&b);
}

// Each mistake in a file gives one exact line: file:line:col, the key, and what was expected.
static void file_error_is(const char *yaml, const char *expected_tail) {
    Config c;
    char err[512] = "", expected[768];
    assert_false(yaml_parse(&c, yaml, err, sizeof err));
    snprintf(expected, sizeof expected, "%s:%s", tmp_path, expected_tail);
    assert_string_equal(err, expected);
    config_free(&c);
}

static void test_file_errors_are_exact(void **state) {
    (void)state;
    file_error_is("training:\n  stpes: 5\n",
                  "2:3: unknown key 'training.stpes' (did you mean 'training.steps'?)");
    file_error_is("optimizer:\n  lr: 1\n  zzzzzzzzzzzz: 1\n",
                  "3:3: unknown key 'optimizer.zzzzzzzzzzzz'");
    file_error_is("trainig:\n  steps: 5\n",
                  "1:1: unknown section 'trainig' (did you mean 'training'?)");
    file_error_is("training:\n  steps: ten\n",
                  "2:10: training.steps expects an integer, got 'ten'");
    file_error_is("training:\n  max_norm: big\n",
                  "2:13: training.max_norm expects a number, got 'big'");
    file_error_is("checkpoint:\n  enable: maybe\n",
                  "2:11: checkpoint.enable expects true or false, got 'maybe'");
    file_error_is("lr_scheduler:\n  decay_type: cos\n",
                  "2:15: lr_scheduler.decay_type expects one of linear, sqrt, cosine, got 'cos'");
    file_error_is("training:\n  steps:\n", "2:9: training.steps cannot be null");
    file_error_is("training:\n  steps: [1]\n",
                  "2:10: training.steps expects an integer, got a list");
    file_error_is("model:\n  converters: {a: 1}\n",
                  "2:15: model.converters expects a list of strings, got a mapping");
    file_error_is("model:\n  converters: [[a]]\n",
                  "2:15: model.converters expects a list of strings, got a nested list");
    file_error_is("- training\n", "1:1: top level must be a mapping of sections");
    file_error_is("training: 5\n", "1:11: section 'training' must be a mapping of keys");
    file_error_is("training:\n  steps: 1\n  steps: 2\n", "3:3: duplicate key 'training.steps'");
    file_error_is("training:\n  steps: 1\ntraining:\n  seq_len: 2\n",
                  "3:1: duplicate section 'training'");
    file_error_is("training:\n  steps: [1, 2\n",
                  "3:1: did not find expected ',' or ']' (while parsing a flow sequence at 2:10)");
    file_error_is("training: {}\n---\njob: {}\n", "3:1: only one YAML document is allowed");
}

static void test_missing_file_is_named(void **state) {
    (void)state;
    Config c;
    char err[512] = "";
    config_defaults(&c);
    assert_false(config_parse_file(&c, "/nonexistent/x.yaml", err, sizeof err));
    assert_string_equal(err, "/nonexistent/x.yaml: cannot open config file: No such file or "
                             "directory");
    config_free(&c);
}

static void arg_error_is(int argc, char **argv, const char *expected) {
    Config c;
    char err[512] = "";
    config_defaults(&c);
    assert_false(config_parse_args(&c, argc, argv, err, sizeof err));
    assert_string_equal(err, expected);
    config_free(&c);
}

static void test_override_errors_are_exact(void **state) {
    (void)state;
    char *bad_int[] = {"titan", "--training.steps", "x"};
    arg_error_is(3, bad_int, "--training.steps: expects an integer, got 'x'");
    char *typo[] = {"titan", "--training.stpes", "3"};
    arg_error_is(3, typo, "unknown option '--training.stpes' (did you mean '--training.steps'?)");
    char *wrong_section[] = {"titan", "--training.lr=3"};
    arg_error_is(2, wrong_section, "unknown option '--training.lr' (did you mean '--optimizer.lr'?)");
    char *no_value[] = {"titan", "--training.steps", "--checkpoint.enable"};
    arg_error_is(3, no_value, "--training.steps: expects a value");
    char *stray[] = {"titan", "--checkpoint.enable", "yes", "oops"};
    arg_error_is(4, stray, "unexpected argument 'oops'");
    char *no_path[] = {"titan", "--config"};
    arg_error_is(2, no_path, "--config: expects a path");
    char *null_int[] = {"titan", "--training.seq_len", "null"};
    arg_error_is(3, null_int, "--training.seq_len: cannot be null");
}

static void supported_error_is(const char *override, const char *expected) {
    Config c;
    char err[512] = "";
    char *argv[] = {"titan", (char *)override};
    config_defaults(&c);
    assert_true(config_parse_args(&c, 2, argv, err, sizeof err));
    assert_false(config_check_supported(&c, err, sizeof err));
    assert_string_equal(err, expected);
    config_free(&c);
}

static void test_check_supported(void **state) {
    (void)state;
    Config c;
    char err[512] = "";
    config_defaults(&c);
    assert_true(config_check_supported(&c, err, sizeof err));
    char *ok_args[] = {"titan", "--parallelism.data_parallel_shard_degree=1",
                       "--activation_checkpoint.mode=full", "--training.global_batch_size=32",
                       "--lr_scheduler.decay_ratio=0.1", "--checkpoint.enable"};
    assert_true(config_parse_args(&c, 6, ok_args, err, sizeof err));
    assert_true(config_check_supported(&c, err, sizeof err));
    config_free(&c);

    supported_error_is("--parallelism.expert_tensor_parallel_degree=2",
                       "--parallelism.expert_tensor_parallel_degree: "
                       "parallelism.expert_tensor_parallel_degree = 2 is not implemented yet "
                       "(implemented: 1)");
    supported_error_is("--float8.recipe_name=rowwise",
                       "--float8.recipe_name: float8.recipe_name = 'rowwise' does nothing: "
                       "model.converters has no float8");
    supported_error_is("--model.converters=mx",
                       "--model.converters: model.converters = [mx] is not implemented yet "
                       "(implemented: float8, lora)");
    supported_error_is("--lora.alpha=8",
                       "--lora.alpha: lora.alpha = 8.0 does nothing: model.converters has no lora");
    supported_error_is("--optimizer.name=Adam",
                       "--optimizer.name: optimizer.name = 'Adam' is not implemented yet "
                       "(implemented: AdamW, Muon)");
    supported_error_is("--training.compile",
                       "--training.compile: training.compile = true is not implemented yet");
    supported_error_is("--training.global_batch_size=12",
                       "training.global_batch_size = 12 (--training.global_batch_size) must be -1 "
                       "or a multiple of training.local_batch_size = 8 (default)");
    supported_error_is("--checkpoint.keep_latest_k=1",
                       "--checkpoint.keep_latest_k: checkpoint.keep_latest_k = 1 must be 0 (keep "
                       "all) or at least 2");
    supported_error_is("--training.local_batch_size=1048576",
                       "training.local_batch_size = 1048576 (--training.local_batch_size) x "
                       "training.seq_len = 2048 (default) = 2147483648 tokens per microbatch, more "
                       "than 2147483647");
    supported_error_is("--validation.seq_len=2147483646",
                       "validation.local_batch_size = 8 (default) x validation.seq_len = "
                       "2147483646 (--validation.seq_len) = 17179869168 tokens per microbatch, "
                       "more than 2147483647");
    // The debug server on an address other hosts can reach needs comm.debug_server_allow_remote,
    // which on a loopback address does nothing (refused).
    static const struct {
        const char *host;
        bool loopback;
    } hosts[] = {{"127.0.0.1", true},  {"127.3.2.1", true}, {"::1", true},
                 {"::ffff:127.0.0.9", true}, {"0.0.0.0", false}, {"::", false},
                 {"10.1.2.3", false}, {"::ffff:10.0.0.1", false}, {"::2", false},
                 {"128.0.0.1", false}};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
        char host[64];
        snprintf(host, sizeof host, "--comm.debug_server_host=%s", hosts[i].host);
        char *args[] = {"titan", "--comm.enable_debug_server", host,
                        "--comm.debug_server_allow_remote"};
        for (int allow = 0; allow < 2; allow++) {
            config_defaults(&c);
            assert_true(config_parse_args(&c, 3 + allow, args, err, sizeof err));
            assert_int_equal(config_check_supported(&c, err, sizeof err),
                             hosts[i].loopback != (bool)allow);
            if (!hosts[i].loopback && !allow)
                assert_non_null(strstr(err, "set comm.debug_server_allow_remote to allow that"));
            if (hosts[i].loopback && allow)
                assert_non_null(strstr(err, "does nothing: comm.debug_server_host is a loopback"));
            config_free(&c);
        }
    }
}

// Ranges are checked as values are read, so the message names the flag or file:line:col.
static void test_ranges_checked_at_parse(void **state) {
    (void)state;
    static const struct {
        const char *key, *value, *message;
    } cases[] = {
        {"--training.steps", "-1",
         "--training.steps: expects an integer in [0, 2147483646], got '-1'"},
        {"--training.seq_len", "0",
         "--training.seq_len: expects an integer in [1, 2147483646], got '0'"},
        {"--optimizer.beta1", "1", "--optimizer.beta1: expects a number in [0, 1), got '1'"},
        {"--optimizer.lr", "-0.1", "--optimizer.lr: expects a number >= 0, got '-0.1'"},
        {"--training.max_norm", "0", "--training.max_norm: expects a number > 0, got '0'"},
        {"--parallelism.data_parallel_shard_degree", "0",
         "--parallelism.data_parallel_shard_degree: expects -1 or an integer in [1, "
         "2147483647], got '0'"},
        {"--parallelism.tensor_parallel_degree", "9223372036854775807",
         "--parallelism.tensor_parallel_degree: expects an integer in [1, 2147483647], got "
         "'9223372036854775807'"},
        {"--training.seed", "9223372036854775808",
         "--training.seed: expects an integer in [-9223372036854775807, 9223372036854775807], "
         "got '9223372036854775808'"},
        {"--comm.trace_buf_size", "4294967295",
         "--comm.trace_buf_size: expects an integer in [0, 1048576], got '4294967295'"},
        {"--activation_checkpoint.selective_ac_option", "0",
         "--activation_checkpoint.selective_ac_option: expects op or an integer in [1, "
         "2147483647], got '0'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[] = {"titan", (char *)cases[i].key, (char *)cases[i].value};
        arg_error_is(3, argv, cases[i].message);
    }
    char *joined[] = {"titan", "--training.seq_len=0"};  // the key=value form
    arg_error_is(2, joined, "--training.seq_len: expects an integer in [1, 2147483646], got '0'");
    file_error_is("training:\n  seq_len: 4294967297\n",
                  "2:12: training.seq_len expects an integer in [1, 2147483646], got '4294967297'");
}

// Every integer key: its maximum reads back, one more and the null sentinel do not, and no
// key stores more than an int32 unless its range says so (seed).
static void test_every_int_key_is_bounded(void **state) {
    (void)state;
    for (size_t i = 0; i < config_key_count(); i++) {
        ConfigKeyInfo k = config_key_info(i);
        if (k.type != CONFIG_INT) continue;
        char name[128], max[32], above[32], got[64], err[512];
        snprintf(name, sizeof name, "--%s.%s", k.section, k.key);
        // int64's maximum (seed) is not a double: print it exactly
        snprintf(max, sizeof max, k.hi >= 9.2e18 ? "9223372036854775807" : "%.0f", k.hi);
        snprintf(above, sizeof above, "%.0f", k.hi + 1);
        if (strcmp(k.key, "seed") != 0) assert_true(k.hi <= INT32_MAX);
        char *values[] = {above, "-9223372036854775808", "-9223372036854775809"};
        for (int v = 0; v < 3; v++) {
            if (v == 0 && k.hi >= 9.2e18) continue;  // seed's maximum is int64's: nothing above
            Config c;
            config_defaults(&c);
            char *argv[] = {"titan", name, values[v]};
            assert_false(config_parse_args(&c, 3, argv, err, sizeof err));
            assert_non_null(strstr(err, "expects"));
            config_free(&c);
        }
        Config c;
        config_defaults(&c);
        char *argv[] = {"titan", name, max};
        bool ok = config_parse_args(&c, 3, argv, err, sizeof err);
        if (!ok) fail_msg("%s %s: %s", name, max, err);
        assert_true(config_value_text(&c, name + 2, got, sizeof got));
        assert_string_equal(got, max);
        config_free(&c);
    }
}

// A valid value of key k other than the default: what the override test sets.
static void value_other(ConfigKeyInfo k, const char *current, char *buf, size_t n) {
    switch (k.type) {
    case CONFIG_BOOL: snprintf(buf, n, "%s", strcmp(current, "true") ? "true" : "false"); break;
    case CONFIG_INT: {
        long long v = strcmp(current, "null") ? atoll(current) : (long long)k.lo;
        snprintf(buf, n, "%lld", v >= k.lo && v + 1 <= k.hi ? v + 1 : (long long)k.lo + 1);
        break;
    }
    case CONFIG_FLOAT: snprintf(buf, n, "%g", (k.lo + (isinf(k.hi) ? k.lo + 1 : k.hi)) / 2); break;
    case CONFIG_STRING:
        if (!strcmp(k.key, "selective_ac_option")) snprintf(buf, n, "op");
        else if (!strcmp(k.key, "debug_server_host")) snprintf(buf, n, "0.0.0.0");
        else snprintf(buf, n, "set_%s", k.key);
        break;
    case CONFIG_ENUM:
        for (const char *const *c = k.choices; *c; c++)
            if (strcmp(*c, current)) {
                snprintf(buf, n, "%s", *c);
                break;
            }
        break;
    case CONFIG_STRING_LIST: snprintf(buf, n, "set_%s", k.key); break;
    }
}

// Every key of the table, set from the command line, reads back as set (a parsed override
// that is not applied fails here); and the result prints and reads back the same.
static void test_every_key_override_applies(void **state) {
    (void)state;
    size_t n = config_key_count();
    char **argv = calloc(2 * n + 1, sizeof *argv), (*expected)[128] = calloc(n, sizeof *expected);
    Config c;
    char err[512] = "";
    config_defaults(&c);
    int argc = 1;
    argv[0] = "titan";
    for (size_t i = 0; i < n; i++) {
        ConfigKeyInfo k = config_key_info(i);
        char name[128], current[128];
        snprintf(name, sizeof name, "%s.%s", k.section, k.key);
        if (!strcmp(name, "job.config_file")) continue;  // names the file to read, not a value
        assert_true(config_value_text(&c, name, current, sizeof current));
        value_other(k, current, expected[i], sizeof expected[i]);
        assert_string_not_equal(expected[i], current);
        argv[argc] = malloc(strlen(name) + 3);
        sprintf(argv[argc++], "--%s", name);
        argv[argc++] = expected[i];
    }
    bool ok = config_parse_args(&c, argc, argv, err, sizeof err);
    if (!ok) fail_msg("%s", err);
    for (size_t i = 0; i < n; i++) {
        ConfigKeyInfo k = config_key_info(i);
        char name[128], got[128], want[160];
        snprintf(name, sizeof name, "%s.%s", k.section, k.key);
        if (!strcmp(name, "job.config_file")) continue;
        assert_true(config_value_text(&c, name, got, sizeof got));
        snprintf(want, sizeof want, k.type == CONFIG_STRING_LIST ? "[%s]" : "%s", expected[i]);
        if (strcmp(got, want)) fail_msg("--%s %s reads back as %s", name, expected[i], got);
    }
    assert_true(config_roundtrip_check(&c, err, sizeof err));
    for (int i = 1; i < argc; i += 2) free(argv[i]);
    free(argv);
    free(expected);
    config_free(&c);
}

// config_parse_text is config_parse_file without the file; config_roundtrip_check finds a
// config whose printed form reads back differently.
static void test_text_parse_and_roundtrip_check(void **state) {
    (void)state;
    Config c;
    char err[512] = "";
    const char text[] = "training:\n  steps: 5\n  seq_len: 99\n";
    config_defaults(&c);
    assert_true(config_parse_text(&c, "mem.yaml", text, strlen(text) - 14, err, sizeof err));
    assert_int_equal(c.training.steps, 5);
    assert_int_equal(c.training.seq_len, 2048);  // past len: not read
    assert_true(config_roundtrip_check(&c, err, sizeof err));
    c.training.steps = INT64_MAX;  // no parse gives this: its printed form does not read back
    assert_false(config_roundtrip_check(&c, err, sizeof err));
    assert_true(strncmp(err, "the printed config does not parse: <printed config>:", 52) == 0);
    assert_non_null(strstr(err, ":10: training.steps expects an integer in [0, 2147483646], got "
                                "'9223372036854775807'"));
    config_free(&c);
}

// Every string YAML can hold prints in a form that reads back as itself: code points YAML may
// not hold raw (C1 controls, line separators) are escaped; bytes that are not UTF-8, which no
// YAML file can hold, are refused on the command line.
static void test_any_text_round_trips(void **state) {
    (void)state;
    Config c;
    char err[512] = "";
    assert_true(yaml_parse(&c, "job:\n  description: \"a\\x85b\\u2028c\\u2029d\\x01e\\u0080f "
                               "\\ufeffg\\uffffh \\u00e9\\U0001F600\"\n",
                           err, sizeof err));
    assert_string_equal(c.job.description, "a\xc2\x85" "b\u2028c\u2029d\x01" "e\xc2\x80" "f "
                                           "\ufeffg\uffffh \u00e9\U0001F600");
    if (!config_roundtrip_check(&c, err, sizeof err)) fail_msg("%s", err);
    config_free(&c);
    char *latin1[] = {"titan", "--job.description", "caf\xe9"};
    arg_error_is(3, latin1, "--job.description: expects UTF-8 text, got 'caf\xe9'");
    char *list[] = {"titan", "--model.converters", "a,\xff"};
    arg_error_is(3, list, "--model.converters: expects UTF-8 text, got 'a,\xff'");
}

// Size and depth limits hold before libyaml builds anything; the deep case used to take 25 s.
static void test_size_and_depth_limits(void **state) {
    (void)state;
    Config c;
    char err[512] = "";
    size_t deep = 100000;
    char *text = malloc(CONFIG_MAX_BYTES + 2);
    memcpy(text, "training:\n  steps: ", 19);
    memset(text + 19, '[', deep);
    config_defaults(&c);
    assert_false(config_parse_text(&c, "deep.yaml", text, 19 + deep, err, sizeof err));
    assert_string_equal(err, "deep.yaml:2:12: nested more than 4 levels deep (a config is "
                             "sections of keys, whose values may be lists)");
    file_error_is("model:\n  converters: [[[a]]]\n",
                  "2:17: nested more than 4 levels deep (a config is sections of keys, whose "
                  "values may be lists)");
    memset(text, '#', CONFIG_MAX_BYTES + 1);
    assert_true(config_parse_text(&c, "big.yaml", text, CONFIG_MAX_BYTES, err, sizeof err));
    assert_false(config_parse_text(&c, "big.yaml", text, CONFIG_MAX_BYTES + 1, err, sizeof err));
    assert_string_equal(err, "big.yaml: larger than the 1048576 bytes a config may have");
    free(text);
    config_free(&c);
}

// User text is echoed quoted and escaped, so a message stays on one line.
static void test_messages_are_one_line(void **state) {
    (void)state;
    file_error_is("training:\n  steps: \"a\\nb\"\n",
                  "2:10: training.steps expects an integer, got 'a\\nb'");
    file_error_is("training:\n  steps: |\n    1\n    2\n",
                  "2:10: training.steps expects an integer, got '1\\n2\\n'");
    file_error_is("training:\n  \"st\\teps\": 1\n", "2:3: unknown key 'training.st\\teps' (did you mean "
                  "'training.steps'?)");
    file_error_is("\"tr'ain\": {}\n", "1:1: unknown section 'tr\\'ain'");
    char *value[] = {"titan", "--optimizer.name", "Ad\nam"};
    arg_error_is(3, value, "--optimizer.name: expects one of Adam, AdamW, Muon, got 'Ad\\nam'");
    char *stray[] = {"titan", "x\ny"};
    arg_error_is(2, stray, "unexpected argument 'x\\ny'");
    char long_value[1000];
    memset(long_value, 'x', sizeof long_value - 1);
    long_value[sizeof long_value - 1] = '\0';
    char *tail[] = {"titan", "--training.steps", long_value};
    Config c;
    char err[512];
    config_defaults(&c);
    assert_false(config_parse_args(&c, 3, tail, err, sizeof err));
    assert_non_null(strstr(err, "xxx...'"));
    assert_null(strchr(err, '\n'));
    config_free(&c);
}

// Each key knows where its value came from, and the checks after parsing say so.
static void test_origins_are_named(void **state) {
    (void)state;
    const char *path = yaml_write("training:\n  steps: 3\nparallelism:\n"
                                  "  expert_tensor_parallel_degree: 2\n");
    char *argv[] = {"titan", "--config", (char *)path, "--training.seq_len", "7"};
    Config c;
    char err[512] = "", origin[256], expected[512];
    config_defaults(&c);
    assert_true(config_parse_args(&c, 5, argv, err, sizeof err));
    assert_true(config_key_origin(&c, "training.steps", origin, sizeof origin));
    snprintf(expected, sizeof expected, "%s:2:10", path);
    assert_string_equal(origin, expected);
    assert_true(config_key_origin(&c, "training.seq_len", origin, sizeof origin));
    assert_string_equal(origin, "--training.seq_len");
    assert_true(config_key_origin(&c, "training.seed", origin, sizeof origin));
    assert_string_equal(origin, "default");
    assert_false(config_key_origin(&c, "training.nope", origin, sizeof origin));
    assert_false(config_check_supported(&c, err, sizeof err));
    snprintf(expected, sizeof expected,
             "%s:4:34: parallelism.expert_tensor_parallel_degree = 2 is not implemented yet "
             "(implemented: 1)",
             path);
    assert_string_equal(err, expected);
    config_free(&c);
}

// --help-config is generated from the table: every key, its range and its default.
static void test_help_lists_every_key(void **state) {
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    config_print_help(f);
    fclose(f);
    for (size_t i = 0; i < config_key_count(); i++) {
        ConfigKeyInfo k = config_key_info(i);
        char name[160];
        snprintf(name, sizeof name, "  --%s.%s: ", k.section, k.key);
        assert_non_null(strstr(text, name));
    }
    assert_non_null(strstr(text, "  --training.steps: an integer in [0, 2147483646]; default "
                                 "10000\n      How many train steps to run\n"));
    assert_non_null(strstr(text, "  --float8.recipe_name: one of tensorwise, rowwise, "
                                 "rowwise_with_gw_hp or null; default null\n"));
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_match_torchtitan),
        cmocka_unit_test(test_yaml_gives_typed_values),
        cmocka_unit_test(test_overrides_beat_file_in_any_order),
        cmocka_unit_test(test_print_then_parse_round_trips),
        cmocka_unit_test(test_file_errors_are_exact),
        cmocka_unit_test(test_missing_file_is_named),
        cmocka_unit_test(test_override_errors_are_exact),
        cmocka_unit_test(test_check_supported),
        cmocka_unit_test(test_ranges_checked_at_parse),
        cmocka_unit_test(test_every_int_key_is_bounded),
        cmocka_unit_test(test_every_key_override_applies),
        cmocka_unit_test(test_text_parse_and_roundtrip_check),
        cmocka_unit_test(test_any_text_round_trips),
        cmocka_unit_test(test_size_and_depth_limits),
        cmocka_unit_test(test_messages_are_one_line),
        cmocka_unit_test(test_origins_are_named),
        cmocka_unit_test(test_help_lists_every_key),
    };
    return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
