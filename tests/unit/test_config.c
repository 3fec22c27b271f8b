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

    supported_error_is("--parallelism.pipeline_parallel_degree=2",
                       "parallelism.pipeline_parallel_degree = 2 is not implemented yet");
    supported_error_is("--activation_checkpoint.mode=selective",
                       "activation_checkpoint.mode = selective is not implemented yet");
    supported_error_is("--float8.recipe_name=rowwise",
                       "float8.recipe_name = rowwise is not implemented yet");
    supported_error_is("--model.converters=float8",
                       "model.converters = [float8] is not implemented yet");
    supported_error_is("--model.name=deepseek_v3", "model.name = deepseek_v3 is not implemented yet");
    supported_error_is("--training.steps=-1", "training.steps = -1 must be >= 0");
    supported_error_is("--training.seq_len=0", "training.seq_len = 0 must be >= 1");
    supported_error_is("--optimizer.beta1=1", "optimizer.beta1 = 1.0 must be in [0, 1)");
    supported_error_is("--optimizer.lr=-0.1", "optimizer.lr = -0.1 must be >= 0");
    supported_error_is("--training.max_norm=0", "training.max_norm = 0.0 must be > 0");
    supported_error_is("--parallelism.data_parallel_shard_degree=0",
                       "parallelism.data_parallel_shard_degree = 0 must be -1 or >= 1");
    supported_error_is("--training.global_batch_size=12",
                       "training.global_batch_size = 12 must be -1 or a multiple of "
                       "training.local_batch_size (8)");
    supported_error_is("--checkpoint.keep_latest_k=1",
                       "checkpoint.keep_latest_k = 1 must be 0 (keep all) or at least 2");
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
    };
    return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
