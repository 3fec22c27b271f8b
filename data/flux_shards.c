#include "data/flux_shards.h"

#include <glob.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/errors.h"
#include "core/h5_string.h"
#include "data/dataset.h"

// The largest size of each dimension after N, and of an example (their product): what a shard
// may say before titan sizes anything by it. Far beyond any real model (FLUX's autoencoder:
// 16 channels, 128 x 128 latents for 1024 px; T5 512 x 4096; CLIP 768), and small enough that
// every size derived from them (image tokens, packed patches, an example's floats) fits an int.
#define FLUX_MAX_DIM 65536
#define FLUX_MAX_CHANNELS 4096
#define FLUX_MAX_EXAMPLE ((hsize_t)1 << 30)  // elements of one example in one dataset
#define FLUX_MAX_IMAGE_SIZE (1 << 20)        // pixels per side of the source images

typedef struct {
    const char *name;
    int rank;
    H5T_class_t cls;   // float32, int32 or any string
    const char *dims;  // the shape's names, for messages
    bool required;
    const char *dim_names[4];
    hsize_t max[4];    // each dimension's limit after N
} DatasetSpec;

static const DatasetSpec specs[FLUX_N_DATASETS] = {
    [FLUX_LATENTS] = {"latents", 4, H5T_FLOAT, "(N, C, H, W)", true, {"N", "C", "H", "W"},
                      {0, FLUX_MAX_CHANNELS, FLUX_MAX_DIM, FLUX_MAX_DIM}},
    [FLUX_T5] = {"t5_encodings", 3, H5T_FLOAT, "(N, L, D_t5)", true, {"N", "L", "D_t5"},
                 {0, FLUX_MAX_DIM, FLUX_MAX_DIM}},
    [FLUX_CLIP] = {"clip_encodings", 2, H5T_FLOAT, "(N, D_clip)", true, {"N", "D_clip"},
                   {0, FLUX_MAX_DIM}},
    [FLUX_CAPTIONS] = {"captions", 1, H5T_STRING, "(N)", false, {"N"}, {0}},
    [FLUX_LABELS] = {"labels", 1, H5T_INTEGER, "(N)", false, {"N"}, {0}},
};

static const char *const string_attrs[] = {"t5_encoder", "clip_encoder", "autoencoder"};
#define N_STRING_ATTRS 3

// ---- the shard files of a dataset path ----

static bool shard_keep(const char *path) {
    size_t n = strlen(path);
    struct stat st;
    return n > 3 && strcmp(path + n - 3, ".h5") == 0 && stat(path, &st) == 0 &&
           S_ISREG(st.st_mode);
}

static int path_compare(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// glob(3) sorts by the locale's collation; titan reads files in bytewise order everywhere.
static char **glob_files(const char *pattern, int *n, char *err, size_t errlen) {
    glob_t g;
    int rc = glob(pattern, GLOB_NOSORT, NULL, &g);
    *n = 0;
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        error_set(err, errlen, "flux dataset %s does not exist (no file matches it)", pattern);
        return NULL;
    }
    CHECK(rc == 0);
    char **files = xmalloc(g.gl_pathc * sizeof(char *));
    for (size_t i = 0; i < g.gl_pathc; i++) CHECK(files[i] = strdup(g.gl_pathv[i]));
    *n = (int)g.gl_pathc;
    globfree(&g);
    qsort(files, (size_t)*n, sizeof(char *), path_compare);
    return files;
}

// The shard files of path in example order; NULL (err set) when there are none.
static char **files_list(const char *path, int *n, char *err, size_t errlen) {
    struct stat st;
    *n = 0;
    if (stat(path, &st) != 0) return glob_files(path, n, err, errlen);
    if (!S_ISDIR(st.st_mode)) {
        char **files = xmalloc(sizeof(char *));
        CHECK(files[0] = strdup(path));
        *n = 1;
        return files;
    }
    char **files = dataset_folder_files(path, shard_keep, n);
    if (!files)
        error_set(err, errlen, "cannot read flux dataset folder %s: %s", path, strerror(errno));
    else if (*n == 0) error_set(err, errlen, "flux dataset folder %s has no .h5 shards", path);
    return files;
}

// ---- validating one shard ----

// The first shard's record, that every later one must match.
typedef struct {
    const char *file;
    hsize_t dims[FLUX_N_DATASETS][4];
    bool present[FLUX_N_DATASETS];
    char *strings[N_STRING_ATTRS];
    int image_size[2];
} ShardInfo;

static void info_free(ShardInfo *info) {
    for (int a = 0; a < N_STRING_ATTRS; a++) free(info->strings[a]);
}

static hid_t file_open(const char *file, char *err, size_t errlen) {
    H5_CHECK(H5Eset_auto2(H5E_DEFAULT, NULL, NULL));  // titan reports one line of its own
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5_CHECK(fapl);
    // A leaked handle then fails H5Fclose instead of keeping the file open behind our back.
    H5_CHECK(H5Pset_fclose_degree(fapl, H5F_CLOSE_SEMI));
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, fapl);
    H5_CHECK(H5Pclose(fapl));
    if (f < 0) error_set(err, errlen, "flux shard %s is not an HDF5 file (or is truncated)", file);
    return f;
}

static bool type_ok(hid_t type, H5T_class_t cls) {
    if (H5Tget_class(type) != cls) return false;
    if (cls == H5T_STRING) return true;
    return H5Tget_size(type) == 4 && (cls == H5T_FLOAT || H5Tget_sign(type) == H5T_SGN_2);
}

// Dataset d's shape into info (absent: present false); false with err on a bad dataset.
static bool dataset_check(hid_t f, const char *file, int d, ShardInfo *info, char *err,
                          size_t errlen) {
    const DatasetSpec *sp = &specs[d];
    info->present[d] = H5Lexists(f, sp->name, H5P_DEFAULT) > 0;
    if (!info->present[d])
        return !sp->required ||
               error_set(err, errlen, "flux shard %s: no dataset '%s' (float32 %s)", file,
                         sp->name, sp->dims);
    hid_t dset = H5Dopen2(f, sp->name, H5P_DEFAULT);
    if (dset < 0) return error_set(err, errlen, "flux shard %s: cannot open '%s'", file, sp->name);
    hid_t type = H5Dget_type(dset), space = H5Dget_space(dset);
    H5_CHECK(type);
    H5_CHECK(space);
    bool typed = type_ok(type, sp->cls);
    int rank = H5Sget_simple_extent_ndims(space);
    if (rank == sp->rank) H5_CHECK(H5Sget_simple_extent_dims(space, info->dims[d], NULL));
    H5_CHECK(H5Tclose(type));
    H5_CHECK(H5Sclose(space));
    H5_CHECK(H5Dclose(dset));
    const char *want = sp->cls == H5T_FLOAT     ? "float32"
                       : sp->cls == H5T_INTEGER ? "int32"
                                                : "a list of strings";
    if (!typed)
        return error_set(err, errlen, "flux shard %s: dataset '%s' is not %s", file, sp->name, want);
    if (rank != sp->rank)
        return error_set(err, errlen, "flux shard %s: dataset '%s' has %d dimensions, not %d %s",
                         file, sp->name, rank, sp->rank, sp->dims);
    return true;
}

static void shape_format(char *out, size_t n, const hsize_t *dims, int rank, bool n_first) {
    size_t used = (size_t)snprintf(out, n, n_first ? "(N" : "(%" PRIu64, (uint64_t)dims[0]);
    for (int k = 1; k < rank && used < n; k++)
        used += (size_t)snprintf(out + used, n - used, ", %" PRIu64, (uint64_t)dims[k]);
    if (used < n) snprintf(out + used, n - used, ")");
}

// Every dataset's N equals the latents'; every dimension after N from 1 to its limit, and an
// example's elements (their product, each factor already bounded) at most FLUX_MAX_EXAMPLE.
static bool shapes_check(const char *file, const ShardInfo *info, char *err, size_t errlen) {
    for (int d = 0; d < FLUX_N_DATASETS; d++) {
        if (!info->present[d]) continue;
        const hsize_t *dims = info->dims[d];
        const DatasetSpec *sp = &specs[d];
        if (dims[0] != info->dims[FLUX_LATENTS][0])
            return error_set(err, errlen, "flux shard %s: dataset '%s' holds %" PRIu64
                             " examples, but 'latents' holds %" PRIu64, file, sp->name,
                             (uint64_t)dims[0], (uint64_t)info->dims[FLUX_LATENTS][0]);
        char shape[128];
        shape_format(shape, sizeof(shape), dims, sp->rank, false);
        hsize_t example = 1;
        for (int k = 1; k < sp->rank; k++) {
            if (dims[k] < 1 || dims[k] > sp->max[k])
                return error_set(err, errlen, "flux shard %s: dataset '%s' %s has shape %s: %s "
                                 "must be 1 to %" PRIu64, file, sp->name, sp->dims, shape,
                                 sp->dim_names[k], (uint64_t)sp->max[k]);
            example *= dims[k];  // at most 4096 x 65536 x 65536: no overflow
        }
        if (example > FLUX_MAX_EXAMPLE)
            return error_set(err, errlen, "flux shard %s: dataset '%s' has shape %s: %" PRIu64
                             " elements per example, more than the limit of 2^30", file,
                             sp->name, shape, (uint64_t)example);
    }
    return true;
}

// A root attribute of class cls and npoints values, open; -1 with err when missing or wrong.
static hid_t attr_open(hid_t f, const char *file, const char *name, H5T_class_t cls,
                       hssize_t npoints, char *err, size_t errlen) {
    const char *kind = cls == H5T_STRING ? "a string" : "2 integers (height, width)";
    if (H5Aexists(f, name) <= 0) {
        error_set(err, errlen, "flux shard %s: no attribute '%s' (%s)", file, name, kind);
        return -1;
    }
    hid_t attr = H5Aopen(f, name, H5P_DEFAULT);
    H5_CHECK(attr);
    hid_t type = H5Aget_type(attr), space = H5Aget_space(attr);
    H5_CHECK(type);
    H5_CHECK(space);
    bool ok = H5Tget_class(type) == cls && H5Sget_simple_extent_npoints(space) == npoints;
    H5_CHECK(H5Tclose(type));
    H5_CHECK(H5Sclose(space));
    if (ok) return attr;
    H5_CHECK(H5Aclose(attr));
    error_set(err, errlen, "flux shard %s: attribute '%s' is not %s", file, name, kind);
    return -1;
}

static bool attrs_read(hid_t f, const char *file, ShardInfo *info, char *err, size_t errlen) {
    for (int a = 0; a < N_STRING_ATTRS; a++) {
        hid_t attr = attr_open(f, file, string_attrs[a], H5T_STRING, 1, err, errlen);
        if (attr < 0) return false;
        info->strings[a] = h5_string_read(attr, H5S_ALL);
        H5_CHECK(H5Aclose(attr));
        if (!info->strings[a])
            return error_set(err, errlen, "flux shard %s: cannot read attribute '%s' (the file "
                             "is damaged)", file, string_attrs[a]);
    }
    hid_t attr = attr_open(f, file, "image_size", H5T_INTEGER, 2, err, errlen);
    if (attr < 0) return false;
    // As 64-bit integers: HDF5 would clip a larger value to INT_MAX when converting to int.
    long long size[2];
    herr_t rc = H5Aread(attr, H5T_NATIVE_LLONG, size);
    H5_CHECK(H5Aclose(attr));
    if (rc < 0 || size[0] < 1 || size[1] < 1 || size[0] > FLUX_MAX_IMAGE_SIZE ||
        size[1] > FLUX_MAX_IMAGE_SIZE)
        return error_set(err, errlen, "flux shard %s: attribute 'image_size' is not 2 integers "
                         "(height, width) from 1 to 2^20", file);
    info->image_size[0] = (int)size[0], info->image_size[1] = (int)size[1];
    return true;
}

// One shard on its own: every dataset and attribute present and well-formed.
static bool shard_check(const char *file, ShardInfo *info, char *err, size_t errlen) {
    hid_t f = file_open(file, err, errlen);
    if (f < 0) return false;
    bool ok = true;
    for (int d = 0; d < FLUX_N_DATASETS && ok; d++)
        ok = dataset_check(f, file, d, info, err, errlen);
    ok = ok && shapes_check(file, info, err, errlen) && attrs_read(f, file, info, err, errlen);
    H5_CHECK(H5Fclose(f));
    return ok;
}

// ---- a shard against the first ----

static bool shape_match(const ShardInfo *first, const ShardInfo *info, int d, char *err,
                        size_t errlen) {
    const char *name = specs[d].name;
    if (info->present[d] != first->present[d])
        return error_set(err, errlen, "flux shard %s: %s dataset '%s', but the first shard %s %s",
                         info->file, info->present[d] ? "has a" : "has no", name, first->file,
                         info->present[d] ? "does not" : "does");
    if (!info->present[d]) return true;
    for (int k = 1; k < specs[d].rank; k++)
        if (info->dims[d][k] != first->dims[d][k]) {
            char got[128], want[128];
            shape_format(got, sizeof(got), info->dims[d], specs[d].rank, false);
            shape_format(want, sizeof(want), first->dims[d], specs[d].rank, true);
            return error_set(err, errlen, "flux shard %s: dataset '%s' has shape %s, but the "
                             "first shard %s has %s", info->file, name, got, first->file, want);
        }
    return true;
}

static bool attrs_match(const ShardInfo *first, const ShardInfo *info, char *err, size_t errlen) {
    for (int a = 0; a < N_STRING_ATTRS; a++)
        if (strcmp(info->strings[a], first->strings[a]) != 0) {
            char got[256], want[256];
            return error_set(err, errlen, "flux shard %s: attribute '%s' is %s, but the first "
                             "shard %s has %s", info->file, string_attrs[a],
                             error_quote(got, sizeof(got), info->strings[a]), first->file,
                             error_quote(want, sizeof(want), first->strings[a]));
        }
    if (info->image_size[0] != first->image_size[0] || info->image_size[1] != first->image_size[1])
        return error_set(err, errlen, "flux shard %s: attribute 'image_size' is (%d, %d), but "
                         "the first shard %s has (%d, %d)", info->file, info->image_size[0],
                         info->image_size[1], first->file, first->image_size[0],
                         first->image_size[1]);
    return true;
}

static bool patch_check(const ShardInfo *first, int patch, char *err, size_t errlen) {
    const hsize_t *dims = first->dims[FLUX_LATENTS];
    if (dims[2] % (hsize_t)patch == 0 && dims[3] % (hsize_t)patch == 0) return true;
    return error_set(err, errlen, "flux shard %s: dataset 'latents' holds %" PRIu64 "x%" PRIu64
                     " images, not divisible by the model's patch size %d", first->file,
                     (uint64_t)dims[2], (uint64_t)dims[3], patch);
}

// The dataset's sizes and attributes, from its first shard.
static void shards_describe(FluxShards *s, ShardInfo *first) {
    const hsize_t(*dims)[4] = first->dims;
    s->C = (int)dims[FLUX_LATENTS][1], s->H = (int)dims[FLUX_LATENTS][2];
    s->W = (int)dims[FLUX_LATENTS][3];
    s->L = (int)dims[FLUX_T5][1], s->D_t5 = (int)dims[FLUX_T5][2];
    s->D_clip = (int)dims[FLUX_CLIP][1];
    s->image_size[0] = first->image_size[0], s->image_size[1] = first->image_size[1];
    s->t5_encoder = first->strings[0], s->clip_encoder = first->strings[1];
    s->autoencoder = first->strings[2];
    first->strings[0] = first->strings[1] = first->strings[2] = NULL;  // s owns them now
    s->has_captions = first->present[FLUX_CAPTIONS];
    s->has_labels = first->present[FLUX_LABELS];
}

// Shard info->file on its own, then against the first.
static bool shard_check_against(const ShardInfo *first, ShardInfo *info, char *err, size_t errlen) {
    if (!shard_check(info->file, info, err, errlen)) return false;
    for (int d = 0; d < FLUX_N_DATASETS; d++)
        if (!shape_match(first, info, d, err, errlen)) return false;
    return attrs_match(first, info, err, errlen);
}

static bool shards_check(FluxShards *s, int patch, char *err, size_t errlen) {
    ShardInfo first = {.file = s->files[0]};
    bool ok = shard_check(first.file, &first, err, errlen) &&
              patch_check(&first, patch, err, errlen);
    s->first[1] = (int64_t)first.dims[FLUX_LATENTS][0];
    for (int k = 1; k < s->n_shards && ok; k++) {
        ShardInfo info = {.file = s->files[k]};
        ok = shard_check_against(&first, &info, err, errlen);
        s->first[k + 1] = s->first[k] + (int64_t)info.dims[FLUX_LATENTS][0];
        info_free(&info);
    }
    if (ok) shards_describe(s, &first);
    info_free(&first);
    s->n = s->first[s->n_shards];
    if (ok && s->n == 0)
        return error_set(err, errlen, "flux dataset %s holds no examples", s->path);
    return ok;
}

bool flux_shards_try_open(FluxShards *s, const char *path, int patch, char *err, size_t errlen) {
    CHECK(patch >= 1);
    *s = (FluxShards){.open = -1, .file = -1};
    CHECK(s->path = strdup(path));
    for (int d = 0; d < FLUX_N_DATASETS; d++) s->dsets[d] = -1;
    s->files = files_list(path, &s->n_shards, err, errlen);
    bool ok = s->files != NULL && s->n_shards > 0;
    if (ok) {
        s->first = xcalloc((size_t)s->n_shards + 1, sizeof(int64_t));
        ok = shards_check(s, patch, err, errlen);
    }
    if (!ok) flux_shards_close(s);
    return ok;
}

void flux_shards_open(FluxShards *s, const char *path, int patch) {
    char err[1024];
    if (!flux_shards_try_open(s, path, patch, err, sizeof(err))) die_user("%s", err);
}

// ---- reading ----

static void shard_release(FluxShards *s) {
    if (s->open < 0) return;
    for (int d = 0; d < FLUX_N_DATASETS; d++) {
        if (s->dsets[d] >= 0) H5_CHECK(H5Dclose(s->dsets[d]));
        s->dsets[d] = -1;
    }
    H5_CHECK(H5Fclose(s->file));
    s->open = -1, s->file = -1;
}

void flux_shards_close(FluxShards *s) {
    shard_release(s);
    for (int k = 0; k < s->n_shards; k++) free(s->files[k]);
    free(s->files);
    free(s->first);
    free(s->path);
    free(s->t5_encoder), free(s->clip_encoder), free(s->autoencoder);
    *s = (FluxShards){.open = -1, .file = -1};
}

// The file changed since it was validated: the user's to fix, so a line and exit 2.
static void shard_damaged(const FluxShards *s, int d) {
    die_user("flux shard %s: cannot read dataset '%s' (the file changed or is damaged since "
             "titan opened it)", s->files[s->open], specs[d].name);
}

static void shard_acquire(FluxShards *s, int k) {
    if (s->open == k) return;
    shard_release(s);
    char err[1024];
    s->file = file_open(s->files[k], err, sizeof(err));
    if (s->file < 0) die_user("%s", err);
    s->open = k;
    for (int d = 0; d < FLUX_N_DATASETS; d++) {
        bool wanted = d == FLUX_CAPTIONS ? s->has_captions
                      : d == FLUX_LABELS ? s->has_labels
                                         : true;
        if (!wanted) continue;
        s->dsets[d] = H5Dopen2(s->file, specs[d].name, H5P_DEFAULT);
        if (s->dsets[d] < 0) shard_damaged(s, d);
    }
}

// Opens example i's shard; returns its index within the shard.
static hsize_t example_locate(FluxShards *s, int64_t i) {
    CHECK(i >= 0 && i < s->n);
    int k = dataset_shard_find(s->first, s->n_shards, i);
    shard_acquire(s, k);
    return (hsize_t)(i - s->first[k]);
}

// Selects row j of dataset d: the file space (to close) with the selection, and its count.
static hid_t row_select(const FluxShards *s, int d, hsize_t j, hsize_t count[4]) {
    hid_t space = H5Dget_space(s->dsets[d]);
    H5_CHECK(space);
    H5_CHECK(H5Sget_simple_extent_dims(space, count, NULL));
    hsize_t start[4] = {j, 0, 0, 0};
    count[0] = 1;
    H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL));
    return space;
}

static void row_read(FluxShards *s, int d, hsize_t j, hid_t mem_type, void *out) {
    hsize_t count[4];
    hid_t space = row_select(s, d, j, count);
    hid_t mem = H5Screate_simple(specs[d].rank, count, NULL);
    H5_CHECK(mem);
    herr_t rc = H5Dread(s->dsets[d], mem_type, mem, space, H5P_DEFAULT, out);
    H5_CHECK(H5Sclose(mem));
    H5_CHECK(H5Sclose(space));
    if (rc < 0) shard_damaged(s, d);
}

void flux_shards_read(FluxShards *s, int64_t i, float *latent, float *t5, float *clip,
                      int32_t *label) {
    hsize_t j = example_locate(s, i);
    if (latent) row_read(s, FLUX_LATENTS, j, H5T_NATIVE_FLOAT, latent);
    if (t5) row_read(s, FLUX_T5, j, H5T_NATIVE_FLOAT, t5);
    if (clip) row_read(s, FLUX_CLIP, j, H5T_NATIVE_FLOAT, clip);
    if (label) {
        CHECK(s->has_labels);
        row_read(s, FLUX_LABELS, j, H5T_NATIVE_INT32, label);
    }
}

char *flux_shards_caption(FluxShards *s, int64_t i) {
    CHECK(s->has_captions);
    hsize_t j = example_locate(s, i), count[4];
    hid_t space = row_select(s, FLUX_CAPTIONS, j, count);
    char *caption = h5_string_read(s->dsets[FLUX_CAPTIONS], space);
    H5_CHECK(H5Sclose(space));
    if (!caption) shard_damaged(s, FLUX_CAPTIONS);
    return caption;
}

int64_t flux_shards_find_caption(FluxShards *s, const char *caption) {
    if (!s->has_captions) return -1;
    for (int64_t i = 0; i < s->n; i++) {
        char *c = flux_shards_caption(s, i);
        bool same = strcmp(c, caption) == 0;
        free(c);
        if (same) return i;
    }
    return -1;
}
