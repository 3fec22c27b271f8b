// Checkpoint tests: bit-exact round trips, atomic naming, and the one-line user errors that a
// missing, truncated or mismatched file must produce.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <hdf5.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/train_state.h"
#include "core/errors.h"

#include "tests/unit/test_support.h"

static void fill(float *x, int64_t n, uint32_t seed) {
    // Arbitrary bit patterns (xorshift), so a lossy conversion anywhere would show.
    for (int64_t i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
        uint32_t bits = (seed & 0x7f7fffffu) | 0x00800000u;  // finite, normal
        memcpy(&x[i], &bits, 4);
    }
}

// A small "model": a 2-D, 1-D and 3-D tensor with dotted names under nested groups.
#define N_TENSORS 3
static const int64_t shape_wq[] = {6, 4}, shape_norm[] = {7}, shape_cube[] = {2, 3, 5};
static float wq[24], norm[7], cube[30];
static const CkptTensor tensors[N_TENSORS] = {
    {.path = "/model/layers.0.attention.wq.weight", .ndim = 2, .shape = shape_wq, .data = wq},
    {.path = "/model/norm.weight", .ndim = 1, .shape = shape_norm, .data = norm},
    {.path = "/optimizer/exp_avg/layers.0.cube", .ndim = 3, .shape = shape_cube, .data = cube},
};

static void model_save(const char *path) {
    fill(wq, 24, 1), fill(norm, 7, 2), fill(cube, 30, 3);
    CkptAttr attrs[] = {{.name = "step", .type = CKPT_INT, .i = 10}};
    ckpt_save(path, tensors, N_TENSORS, attrs, 1, MPI_COMM_NULL);
}

static void test_roundtrip_bit_exact(void **state) {
    (void)state;
    char path[300];
    ckpt_path_for_step(path, sizeof(path), dir, 10);
    model_save(path);
    float wq2[24], norm2[7], cube2[30];
    CkptTensor back[N_TENSORS] = {tensors[0], tensors[1], tensors[2]};
    back[0].data = wq2, back[1].data = norm2, back[2].data = cube2;
    ckpt_load(path, back, N_TENSORS);
    assert_memory_equal(wq, wq2, sizeof(wq));
    assert_memory_equal(norm, norm2, sizeof(norm));
    assert_memory_equal(cube, cube2, sizeof(cube));
}

static void test_attrs_roundtrip(void **state) {
    (void)state;
    char path[300], tmp[310];
    snprintf(path, sizeof(path), "%s/attrs.h5", dir);
    // Larger than HDF5's 64 KiB compact-attribute limit, as a full resolved config may be.
    size_t big = 100000;
    char *config = xmalloc(big + 1);
    for (size_t i = 0; i < big; i++) config[i] = "model:\n  dim: 64\n"[i % 17];
    config[big] = '\0';
    CkptAttr attrs[] = {
        {.name = "step", .type = CKPT_INT, .i = 1234567890123LL},
        {.name = "model.dim", .type = CKPT_INT, .i = -7},
        {.name = "lr", .type = CKPT_DOUBLE, .d = 3e-4},
        {.name = "config", .type = CKPT_STRING, .s = config},
        {.name = "name", .type = CKPT_STRING, .s = "llama3 débug"},
    };
    ckpt_save(path, NULL, 0, attrs, 5, MPI_COMM_NULL);
    assert_int_equal(ckpt_read_int(path, "step"), 1234567890123LL);
    assert_int_equal(ckpt_read_int(path, "model.dim"), -7);
    assert_true(ckpt_read_double(path, "lr") == 3e-4);
    char *s = ckpt_read_string(path, "config");
    assert_string_equal(s, config);
    free(s);
    s = ckpt_read_string(path, "name");
    assert_string_equal(s, "llama3 débug");
    free(s), free(config);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0);
}

// Other writers (h5py's np.bytes_, Fortran codes) store fixed-length, NUL- or space-padded
// strings; they must read back whole.
static void test_fixed_length_string(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof(path), "%s/fixed.h5", dir);
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR);
    H5Tset_size(type, 5);
    H5Tset_strpad(type, H5T_STR_NULLPAD);
    hid_t attr = H5Acreate2(file, "name", type, space, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Awrite(attr, type, "hello") >= 0);
    H5Aclose(attr), H5Sclose(space), H5Tclose(type), H5Fclose(file);
    char *s = ckpt_read_string(path, "name");
    assert_string_equal(s, "hello");
    free(s);
}

static void test_stale_tmp_replaced(void **state) {
    (void)state;
    char path[300], tmp[310];
    snprintf(path, sizeof(path), "%s/sub/folder/step-3.h5", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    model_save(path);  // also creates sub/folder
    FILE *f = fopen(tmp, "w");
    fputs("half a checkpoint", f);
    fclose(f);
    model_save(path);
    assert_int_not_equal(access(tmp, F_OK), 0);
    assert_true(ckpt_has(path, "/model/norm.weight"));
}

static void test_latest_step(void **state) {
    (void)state;
    char folder[300], path[320];
    snprintf(folder, sizeof(folder), "%s/latest", dir);
    assert_int_equal(ckpt_latest_step(folder), -1);
    int64_t steps[] = {5, 12, 8};
    for (int i = 0; i < 3; i++) {
        ckpt_path_for_step(path, sizeof(path), folder, steps[i]);
        model_save(path);
    }
    const char *junk[] = {"step-99.h5.tmp", "step-100.h5.bak", "step-.h5", "notes.txt"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), "%s/%s", folder, junk[i]);
        FILE *f = fopen(path, "w");
        fclose(f);
    }
    assert_int_equal(ckpt_latest_step(folder), 12);
    ckpt_path_for_step(path, sizeof(path), folder, 12);
    assert_string_equal(path + strlen(folder), "/step-12.h5");
}

static void test_has(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof(path), "%s/has.h5", dir);
    model_save(path);
    assert_true(ckpt_has(path, "/optimizer"));
    assert_true(ckpt_has(path, "/optimizer/exp_avg/layers.0.cube"));
    assert_false(ckpt_has(path, "/optimizer/exp_avg_sq/layers.0.cube"));
    assert_false(ckpt_has(path, "/nothing/here"));
}

static void expect_load_error(const char *path, const CkptTensor *t, int n, const char *want) {
    char err[1024] = "";
    assert_false(ckpt_try_load(path, t, n, err, sizeof(err)));
    assert_string_equal(err, want);
}

static void test_truncated_and_garbage(void **state) {
    (void)state;
    char path[300], want[512];
    snprintf(path, sizeof(path), "%s/cut.h5", dir);
    snprintf(want, sizeof(want), "checkpoint %s is truncated or not an HDF5 file", path);
    model_save(path);
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    // Cut anywhere: inside the superblock, the metadata, the data, or the last byte.
    long cuts[] = {size - 1, size / 2, size / 4, 100, 10, 0};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(truncate(path, cuts[i]), 0);
        expect_load_error(path, tensors, N_TENSORS, want);
    }
    f = fopen(path, "w");
    fputs("step: 10\n", f);
    fclose(f);
    expect_load_error(path, tensors, N_TENSORS, want);
}

static void test_mismatch_messages(void **state) {
    (void)state;
    char path[300], want[512];
    snprintf(path, sizeof(path), "%s/mismatch.h5", dir);
    model_save(path);
    int64_t wrong[] = {256};
    float buf[256];
    CkptTensor bad_shape = {.path = "/model/norm.weight", .ndim = 1, .shape = wrong, .data = buf};
    snprintf(want, sizeof(want),
             "checkpoint %s: /model/norm.weight has shape (7) but the model expects (256)", path);
    expect_load_error(path, &bad_shape, 1, want);
    int64_t wrong_rank[] = {4, 6};
    CkptTensor bad_rank = {.path = "/model/layers.0.attention.wq.weight", .ndim = 2, .shape = wrong_rank, .data = buf};
    snprintf(want, sizeof(want),
             "checkpoint %s: /model/layers.0.attention.wq.weight has shape (6, 4) but the model "
             "expects (4, 6)",
             path);
    expect_load_error(path, &bad_rank, 1, want);
    CkptTensor missing = {.path = "/model/output.weight", .ndim = 1, .shape = wrong, .data = buf};
    snprintf(want, sizeof(want), "checkpoint %s has no dataset /model/output.weight", path);
    expect_load_error(path, &missing, 1, want);
    snprintf(path, sizeof(path), "%s/absent.h5", dir);
    snprintf(want, sizeof(want), "checkpoint file %s does not exist", path);
    expect_load_error(path, &missing, 1, want);
}

static void read_seed(const char *path) { ckpt_read_int(path, "seed"); }
static void read_step(const char *path) { ckpt_read_int(path, "step"); }

static void test_read_int_errors_die_once(void **state) {
    (void)state;
    char path[300], want[512];
    snprintf(path, sizeof(path), "%s/attr_err.h5", dir);
    model_save(path);
    snprintf(want, sizeof(want), "titan: error: checkpoint %s has no attribute seed\n", path);
    expect_die_user(read_seed, path, want);
    assert_int_equal(truncate(path, 64), 0);
    snprintf(want, sizeof(want), "titan: error: checkpoint %s is truncated or not an HDF5 file\n",
             path);
    expect_die_user(read_step, path, want);
}

// The file must read as plain tensors with other tools: checked through the raw HDF5 API,
// and through h5py where the system python has it.
static void test_plain_hdf5_layout(void **state) {
    (void)state;
    char path[300], cmd[1024];
    snprintf(path, sizeof(path), "%s/plain.h5", dir);
    model_save(path);
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(file >= 0);
    hid_t dset = H5Dopen2(file, "/model/layers.0.attention.wq.weight", H5P_DEFAULT);
    assert_true(dset >= 0);
    hid_t type = H5Dget_type(dset), space = H5Dget_space(dset);
    assert_true(H5Tequal(type, H5T_IEEE_F32LE) > 0);
    hsize_t dims[2];
    assert_int_equal(H5Sget_simple_extent_dims(space, dims, NULL), 2);
    assert_int_equal(dims[0], 6);
    assert_int_equal(dims[1], 4);
    H5Tclose(type), H5Sclose(space), H5Dclose(dset), H5Fclose(file);
    if (system("/usr/bin/python3 -c 'import h5py' 2>/dev/null") != 0) skip();
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 -c \"import h5py, numpy as np; f = h5py.File('%s', 'r'); "
             "w = f['model/layers.0.attention.wq.weight']; "
             "assert w.shape == (6, 4) and w.dtype == np.float32; "
             "assert f['model/norm.weight'].shape == (7,); "
             "assert int(f.attrs['step']) == 10\"",
             path);
    assert_int_equal(system(cmd), 0);
}

// ---- trainer state: weights, AdamW's moments and step, progress, seed and config -----------

// A two-parameter model with its optimizer: weights, exp_avg and exp_avg_sq each filled with
// different arbitrary bits (fill_seed 0: all zero, a fresh trainer's state before a resume).
typedef struct {
    ParamTable params;
    AdamW opt;
} StateCase;

static void state_make(StateCase *c, uint32_t fill_seed) {
    params_init(&c->params, 2);
    params_add(&c->params, INIT_NORMAL, 0.02, 2, (const int64_t[]){5, 3}, "layers.%d.w", 0);
    params_add(&c->params, INIT_ONES, 0.0, 1, (const int64_t[]){7}, "norm.weight");
    size_t n = c->params.numel;
    ParamTable table = c->params;
    params_view(&c->params, &table, xcalloc(n, sizeof(float)), NULL);
    params_free(&table);
    c->opt = (AdamW){.numel = n, .exp_avg = xcalloc(n, sizeof(float)),
                     .exp_avg_sq = xcalloc(n, sizeof(float))};
    if (!fill_seed) return;
    fill(c->params.shard_data, (int64_t)n, fill_seed);
    fill(c->opt.exp_avg, (int64_t)n, fill_seed + 1);
    fill(c->opt.exp_avg_sq, (int64_t)n, fill_seed + 2);
    c->opt.step = 36;
}

static void state_free(StateCase *c) {
    free(c->params.shard_data), free(c->opt.exp_avg), free(c->opt.exp_avg_sq);
    params_free(&c->params);
}

// Everything a resume restores comes back exactly: the weights, both moments, the optimizer's
// step (which AdamW's bias correction uses; here not the training step, so a swap shows), the
// training step, the loader position beyond 2^32, the seed and the config (the lr schedule is
// rebuilt from it and the step), and the model's attributes.
static void test_train_state_roundtrip(void **state) {
    (void)state;
    char path[300];
    path_make(path, sizeof path, "state.h5");
    StateCase saved, back;
    state_make(&saved, 7);
    state_make(&back, 0);
    const char *yaml = "training:\n  steps: 50\n  seed: 81985529216486895\n";
    CkptAttr model_attrs[] = {{.name = "model.dim", .type = CKPT_INT, .i = 3}};
    TrainProgress progress = {.step = 37, .windows_consumed = 5000000123LL}, got = {0};
    train_state_save(path, &saved.params, &saved.opt, progress, 0x0123456789abcdefull, yaml,
                     model_attrs, 1, MPI_COMM_NULL);
    train_state_load(path, &back.params, &back.opt, &got);
    size_t bytes = saved.params.numel * sizeof(float);
    assert_memory_equal(back.params.shard_data, saved.params.shard_data, bytes);
    assert_memory_equal(back.opt.exp_avg, saved.opt.exp_avg, bytes);
    assert_memory_equal(back.opt.exp_avg_sq, saved.opt.exp_avg_sq, bytes);
    assert_int_equal(back.opt.step, 36);
    assert_int_equal(got.step, 37);
    assert_int_equal(got.windows_consumed, 5000000123LL);
    assert_int_equal(ckpt_read_int(path, "seed"), 0x0123456789abcdefLL);
    assert_int_equal(ckpt_read_int(path, "model.dim"), 3);
    char *config = ckpt_read_string(path, "config");
    assert_string_equal(config, yaml);
    free(config);
    state_free(&back);

    // A model-only file (the last checkpoint under last_save_model_only) says so and restores
    // the weights alone.
    assert_true(train_state_has_optimizer(path));
    train_state_save(path, &saved.params, NULL, progress, 1, yaml, NULL, 0, MPI_COMM_NULL);
    assert_false(train_state_has_optimizer(path));
    state_make(&back, 0);
    train_state_load(path, &back.params, NULL, NULL);
    assert_memory_equal(back.params.shard_data, saved.params.shard_data, bytes);
    float *zeros = xcalloc(saved.params.numel, sizeof(float));
    assert_memory_equal(back.opt.exp_avg, zeros, bytes);
    assert_memory_equal(back.opt.exp_avg_sq, zeros, bytes);
    assert_int_equal(back.opt.step, 0);
    free(zeros);
    state_free(&back), state_free(&saved);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_bit_exact),
        cmocka_unit_test(test_attrs_roundtrip),
        cmocka_unit_test(test_fixed_length_string),
        cmocka_unit_test(test_stale_tmp_replaced),
        cmocka_unit_test(test_latest_step),
        cmocka_unit_test(test_has),
        cmocka_unit_test(test_truncated_and_garbage),
        cmocka_unit_test(test_mismatch_messages),
        cmocka_unit_test(test_read_int_errors_die_once),
        cmocka_unit_test(test_plain_hdf5_layout),
        cmocka_unit_test(test_train_state_roundtrip),
    };
    return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
