// FLUX shard reader and loader tests: shards written here with the HDF5 C API (as h5py lays
// them out: variable-length UTF-8 strings) read back value by value; the loader's epochs are
// permutations, its global batch is the same on 1, 2 and 4 ranks, it is a function of the seed,
// and a saved position resumes it exactly; each bad shard is one line and exit 2.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/flux_loader.h"

#include "tests/unit/test_support.h"

// Example i's element e of dataset d: distinct per (i, d, e) and exact in float32.
static float value(int64_t i, int d, int64_t e) {
    return (float)(i * 8 + d) + (float)(e % 1024) / 1024.0f;
}

typedef struct {
    int n, C, H, W, L, D_t5, D_clip;
    int64_t first;             // the dataset index of the shard's example 0
    const char *skip;          // a dataset left out
    const char *as_double;     // a dataset written as float64
    int clip_n;                // clip_encodings' N when not n (0: n)
    bool no_labels;            // leave out labels
    const char *t5_encoder;    // NULL: "t5-test"
} ShardSpec;

static const ShardSpec base = {.n = 5, .C = 2, .H = 4, .W = 6, .L = 3, .D_t5 = 5, .D_clip = 4};

static void dataset_write(hid_t f, const ShardSpec *sp, int d, const char *name, int rank,
                          const hsize_t *dims) {
    if (sp->skip && strcmp(sp->skip, name) == 0) return;
    hsize_t count = 1;
    for (int k = 0; k < rank; k++) count *= dims[k];
    float *x = malloc((count ? count : 1) * sizeof(float));
    hsize_t row = count / (dims[0] ? dims[0] : 1);
    for (hsize_t k = 0; k < count; k++)
        x[k] = value(sp->first + (int64_t)(k / row), d, (int64_t)(k % row));
    bool dbl = sp->as_double && strcmp(sp->as_double, name) == 0;
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t dset = H5Dcreate2(f, name, dbl ? H5T_IEEE_F64LE : H5T_IEEE_F32LE, space, H5P_DEFAULT,
                            H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) >= 0);
    H5Dclose(dset), H5Sclose(space), free(x);
}

static hid_t vlen_string_type(void) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE), H5Tset_cset(t, H5T_CSET_UTF8);
    return t;
}

static void captions_labels_write(hid_t f, const ShardSpec *sp) {
    hsize_t n = (hsize_t)sp->n;
    char **captions = malloc((n ? n : 1) * sizeof(char *));
    int32_t *labels = malloc((n ? n : 1) * sizeof(int32_t));
    for (hsize_t k = 0; k < n; k++) {
        long long i = (long long)(sp->first + (int64_t)k);
        assert_true(asprintf(&captions[k], "caption %lld", i) > 0);
        labels[k] = (int32_t)((sp->first + (int64_t)k) % 10);
    }
    hid_t space = H5Screate_simple(1, &n, NULL), type = vlen_string_type();
    hid_t dset = H5Dcreate2(f, "captions", type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Dwrite(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, captions) >= 0);
    H5Dclose(dset), H5Tclose(type);
    if (!sp->no_labels) {
        dset = H5Dcreate2(f, "labels", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        assert_true(H5Dwrite(dset, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels) >= 0);
        H5Dclose(dset);
    }
    H5Sclose(space);
    for (hsize_t k = 0; k < n; k++) free(captions[k]);
    free(captions), free(labels);
}

static void attrs_write(hid_t f, const ShardSpec *sp) {
    const char *names[] = {"t5_encoder", "clip_encoder", "autoencoder"};
    const char *values[] = {sp->t5_encoder ? sp->t5_encoder : "t5-test", "clip-test", "none"};
    hid_t scalar = H5Screate(H5S_SCALAR), type = vlen_string_type();
    for (int a = 0; a < 3; a++) {
        if (sp->skip && strcmp(sp->skip, names[a]) == 0) continue;
        hid_t attr = H5Acreate2(f, names[a], type, scalar, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(attr, type, &values[a]), H5Aclose(attr);
    }
    hsize_t two = 2;
    int32_t size[2] = {sp->H * 8, sp->W * 8};
    hid_t space = H5Screate_simple(1, &two, NULL);
    hid_t attr = H5Acreate2(f, "image_size", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, H5T_NATIVE_INT32, size), H5Aclose(attr);
    H5Sclose(space), H5Sclose(scalar), H5Tclose(type);
}

static void shard_make(const char *name, const ShardSpec *sp) {
    char path[512];
    path_make(path, sizeof(path), name);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(f >= 0);
    hsize_t n = (hsize_t)sp->n;
    hsize_t latents[4] = {n, (hsize_t)sp->C, (hsize_t)sp->H, (hsize_t)sp->W};
    hsize_t t5[3] = {n, (hsize_t)sp->L, (hsize_t)sp->D_t5};
    hsize_t clip[2] = {sp->clip_n ? (hsize_t)sp->clip_n : n, (hsize_t)sp->D_clip};
    dataset_write(f, sp, FLUX_LATENTS, "latents", 4, latents);
    dataset_write(f, sp, FLUX_T5, "t5_encodings", 3, t5);
    dataset_write(f, sp, FLUX_CLIP, "clip_encodings", 2, clip);
    captions_labels_write(f, sp);
    attrs_write(f, sp);
    assert_true(H5Fclose(f) >= 0);
}

// The good set: shards of 5, 0 and 7 examples in folder "good" (12 examples), plus a stray
// file the folder reader must skip.
#define N_GOOD 12
static void good_make(void) {
    char path[512];
    path_make(path, sizeof(path), "good");
    mkdir(path, 0755);
    ShardSpec a = base, empty = base, b = base;
    empty.n = 0, empty.first = 5;
    b.n = 7, b.first = 5;
    shard_make("good/a.h5", &a);
    shard_make("good/b0.h5", &empty);
    shard_make("good/c.h5", &b);
    path_make(path, sizeof(path), "good/notes.txt");
    bytes_write(path, "not a shard", 11);
}

static void example_check(FluxShards *s, int64_t i, const float *lat, const float *t5,
                          const float *clip) {
    for (int e = 0; e < s->C * s->H * s->W; e++) assert_true(lat[e] == value(i, FLUX_LATENTS, e));
    for (int e = 0; e < s->L * s->D_t5; e++) assert_true(t5[e] == value(i, FLUX_T5, e));
    for (int e = 0; e < s->D_clip; e++) assert_true(clip[e] == value(i, FLUX_CLIP, e));
}

static void test_read_back(void **state) {
    (void)state;
    good_make();
    char path[512];
    path_make(path, sizeof(path), "good");
    FluxShards s;
    flux_shards_open(&s, path, 2);
    assert_int_equal(s.n, N_GOOD);
    assert_int_equal(s.n_shards, 3);
    assert_int_equal(s.C, 2), assert_int_equal(s.H, 4), assert_int_equal(s.W, 6);
    assert_int_equal(s.L, 3), assert_int_equal(s.D_t5, 5), assert_int_equal(s.D_clip, 4);
    assert_int_equal(s.image_size[0], 32), assert_int_equal(s.image_size[1], 48);
    assert_string_equal(s.t5_encoder, "t5-test");
    assert_string_equal(s.clip_encoder, "clip-test");
    assert_string_equal(s.autoencoder, "none");
    assert_true(s.has_captions && s.has_labels);
    float lat[48], t5[15], clip[4];
    for (int64_t i = N_GOOD - 1; i >= 0; i--) {  // backwards: every shard switch
        int32_t label;
        flux_shards_read(&s, i, lat, t5, clip, &label);
        example_check(&s, i, lat, t5, clip);
        assert_int_equal(label, i % 10);
        char *caption = flux_shards_caption(&s, i), want[32];
        snprintf(want, sizeof(want), "caption %lld", (long long)i);
        assert_string_equal(caption, want);
        free(caption);
    }
    assert_int_equal(flux_shards_find_caption(&s, "caption 9"), 9);
    assert_int_equal(flux_shards_find_caption(&s, "caption 99"), -1);
    flux_shards_close(&s);
    // The same set through a glob, and one shard as a file.
    path_make(path, sizeof(path), "good/*.h5");
    flux_shards_open(&s, path, 2);
    assert_int_equal(s.n, N_GOOD);
    flux_shards_close(&s);
    path_make(path, sizeof(path), "good/c.h5");
    flux_shards_open(&s, path, 1);
    assert_int_equal(s.n, 7);
    flux_shards_read(&s, 6, lat, t5, clip, NULL);
    example_check(&s, 5 + 6, lat, t5, clip);  // written as dataset examples 5..11
    flux_shards_close(&s);
}

static void good_open(FluxShards *s) {
    char path[512];
    path_make(path, sizeof(path), "good");
    flux_shards_open(s, path, 2);
}

// Every epoch visits each example once, batches straddling epochs too (5 rows, 12 examples);
// rows carry their example's data and label.
#define ROWS 5
static void test_epochs_are_permutations(void **state) {
    (void)state;
    FluxShards s;
    good_open(&s);
    FluxLoader l;
    flux_loader_open(&l, &s, 1234, 0, 1, ROWS);
    int64_t index[ROWS], seen[4][N_GOOD] = {{0}};
    int32_t labels[ROWS];
    float lat[ROWS * 48], t5[ROWS * 15], clip[ROWS * 4];
    FluxExamples b = {.latents = lat, .t5 = t5, .clip = clip, .index = index, .labels = labels};
    bool shuffled = false;
    for (int step = 0; step < 8; step++) {  // 40 positions: 3 whole epochs and a part
        assert_int_equal(flux_loader_next(&l, &b), step * ROWS);
        for (int r = 0; r < ROWS; r++) {
            int64_t q = step * ROWS + r;
            seen[q / N_GOOD][index[r]]++;
            shuffled |= index[r] != q % N_GOOD;
            example_check(&s, index[r], lat + r * 48, t5 + r * 15, clip + r * 4);
            assert_int_equal(labels[r], index[r] % 10);
        }
    }
    for (int e = 0; e < 3; e++)
        for (int i = 0; i < N_GOOD; i++) assert_int_equal(seen[e][i], 1);
    assert_true(shuffled);
    flux_loader_close(&l);
    flux_shards_close(&s);
}

// The indices of steps batches of rows on one loader.
static void indices_run(FluxLoader *l, int steps, int rows, int64_t *out) {
    FluxExamples b = {0};
    for (int step = 0; step < steps; step++) {
        b.index = out + step * rows;
        flux_loader_next(l, &b);
    }
}

#define STEPS 10
#define GLOBAL_ROWS 4

// Ranks' batches in rank order are the one-rank global batch, for dp = 2 and 4.
static void test_data_parallel_layouts(void **state) {
    (void)state;
    FluxShards s;
    good_open(&s);
    FluxLoader one;
    flux_loader_open(&one, &s, 7, 0, 1, GLOBAL_ROWS);
    int64_t want[STEPS * GLOBAL_ROWS], got[GLOBAL_ROWS];
    indices_run(&one, STEPS, GLOBAL_ROWS, want);
    for (int dp = 2; dp <= 4; dp *= 2) {
        int rows = GLOBAL_ROWS / dp;
        FluxLoader ranks[4];
        for (int r = 0; r < dp; r++) flux_loader_open(&ranks[r], &s, 7, r, dp, rows);
        for (int step = 0; step < STEPS; step++) {
            for (int r = 0; r < dp; r++) {
                FluxExamples b = {.index = got + r * rows};
                assert_int_equal(flux_loader_next(&ranks[r], &b), step * GLOBAL_ROWS + r * rows);
                assert_int_equal(flux_loader_position(&ranks[r]), (step + 1) * GLOBAL_ROWS);
            }
            assert_memory_equal(got, want + step * GLOBAL_ROWS, sizeof(got));
        }
        for (int r = 0; r < dp; r++) flux_loader_close(&ranks[r]);
    }
    flux_loader_close(&one);
    flux_shards_close(&s);
}

// Same seed: same order; another seed: another; a saved position resumes exactly.
static void test_seed_and_resume(void **state) {
    (void)state;
    FluxShards s;
    good_open(&s);
    int64_t a[STEPS * 3], b[STEPS * 3], c[STEPS * 3];
    FluxLoader l;
    flux_loader_open(&l, &s, 42, 0, 1, 3);
    indices_run(&l, STEPS, 3, a);
    flux_loader_close(&l);
    flux_loader_open(&l, &s, 42, 0, 1, 3);
    indices_run(&l, STEPS, 3, b);
    flux_loader_close(&l);
    assert_memory_equal(a, b, sizeof(a));
    flux_loader_open(&l, &s, 43, 0, 1, 3);
    indices_run(&l, STEPS, 3, c);
    flux_loader_close(&l);
    assert_memory_not_equal(a, c, sizeof(a));
    // Resume after 5 steps (mid-epoch 2) in a fresh loader, and rewind an old one to 0.
    flux_loader_open(&l, &s, 42, 0, 1, 3);
    flux_loader_set_position(&l, 5 * 3);
    indices_run(&l, STEPS - 5, 3, c);
    assert_memory_equal(c, a + 5 * 3, (STEPS - 5) * 3 * sizeof(int64_t));
    flux_loader_set_position(&l, 0);
    indices_run(&l, STEPS, 3, c);
    assert_memory_equal(c, a, sizeof(a));
    flux_loader_close(&l);
    flux_shards_close(&s);
}

// ---- bad input: one line naming the file and the dataset, exit 2 ----

static int bad_patch = 2;

static void bad_open(const char *path) {
    FluxShards s;
    flux_shards_open(&s, path, bad_patch);
}

// Opening path must die with the line "titan: error: " + message, message formatted from fmt
// with a and b (paths).
static void bad_expect(const char *path, const char *fmt, const char *a, const char *b) {
    char message[1200], want[1300];
    snprintf(message, sizeof(message), fmt, a, b);
    snprintf(want, sizeof(want), "titan: error: %s\n", message);
    expect_die_user(bad_open, path, want);
}

// A set "name" of a good first shard and a second made as sp; fmt names the second's path,
// then the first's.
static void bad_pair_expect(const char *name, const ShardSpec *sp, const char *fmt) {
    char folder[512], first[600], second[600];
    path_make(folder, sizeof(folder), name);
    mkdir(folder, 0755);
    snprintf(first, sizeof(first), "%s/0.h5", name);
    shard_make(first, &base);
    snprintf(first, sizeof(first), "%s/0.h5", folder);
    snprintf(second, sizeof(second), "%s/1.h5", name);
    shard_make(second, sp);
    snprintf(second, sizeof(second), "%s/1.h5", folder);
    bad_expect(folder, fmt, second, first);
}

static void test_bad_shards(void **state) {
    (void)state;
    ShardSpec sp = base;
    sp.D_t5 = 6;
    bad_pair_expect("t5_width", &sp, "flux shard %s: dataset 't5_encodings' has shape (5, 3, 6), "
                    "but the first shard %s has (N, 3, 5)");
    sp = base, sp.H = 8;
    bad_pair_expect("latent_size", &sp, "flux shard %s: dataset 'latents' has shape "
                    "(5, 2, 8, 6), but the first shard %s has (N, 2, 4, 6)");
    sp = base, sp.skip = "clip_encodings";
    bad_pair_expect("no_clip", &sp, "flux shard %s: no dataset 'clip_encodings' "
                    "(float32 (N, D_clip))");
    sp = base, sp.clip_n = 4;
    bad_pair_expect("clip_n", &sp, "flux shard %s: dataset 'clip_encodings' holds 4 examples, "
                    "but 'latents' holds 5");
    sp = base, sp.as_double = "latents";
    bad_pair_expect("double", &sp, "flux shard %s: dataset 'latents' is not float32");
    sp = base, sp.no_labels = true;
    bad_pair_expect("labels", &sp, "flux shard %s: has no dataset 'labels', but the first shard "
                    "%s does");
    sp = base, sp.t5_encoder = "t5-other";
    bad_pair_expect("encoder", &sp, "flux shard %s: attribute 't5_encoder' is 't5-other', but "
                    "the first shard %s has 't5-test'");
    sp = base, sp.skip = "autoencoder";
    bad_pair_expect("no_attr", &sp, "flux shard %s: no attribute 'autoencoder' (a string)");
    // The same refusal without dying, in this process (what the sanitizers' leak check sees).
    char path[512], err[1024];
    path_make(path, sizeof(path), "encoder");
    FluxShards s;
    assert_false(flux_shards_try_open(&s, path, 2, err, sizeof(err)));
    assert_non_null(strstr(err, "attribute 't5_encoder' is 't5-other'"));
}

static void test_bad_paths(void **state) {
    (void)state;
    char path[512];
    path_make(path, sizeof(path), "good/a.h5");
    bad_patch = 4;  // latents are 4 x 6
    bad_expect(path, "flux shard %s: dataset 'latents' holds 4x6 images, not divisible by the "
               "model's patch size 4", path, NULL);
    bad_patch = 2;
    path_make(path, sizeof(path), "good/notes.txt");
    bad_expect(path, "flux shard %s is not an HDF5 file (or is truncated)", path, NULL);
    path_make(path, sizeof(path), "missing*.h5");
    bad_expect(path, "flux dataset %s does not exist (no file matches it)", path, NULL);
    path_make(path, sizeof(path), "empty");
    mkdir(path, 0755);
    bad_expect(path, "flux dataset folder %s has no .h5 shards", path, NULL);
    ShardSpec none = base;
    none.n = 0;
    shard_make("none.h5", &none);
    path_make(path, sizeof(path), "none.h5");
    bad_expect(path, "flux dataset %s holds no examples", path, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_back),
        cmocka_unit_test(test_epochs_are_permutations),
        cmocka_unit_test(test_data_parallel_layouts),
        cmocka_unit_test(test_seed_and_resume),
        cmocka_unit_test(test_bad_shards),
        cmocka_unit_test(test_bad_paths),
    };
    return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
