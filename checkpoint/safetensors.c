#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/bf16.h"
#include "core/errors.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian and is read in place"
#endif

// The reference implementation's bound on the header (its MAX_HEADER_SIZE): a length beyond it
// is a damaged or foreign file, not a header worth allocating.
#define HEADER_MAX 100000000u
#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define STAGE_ELEMS ((size_t)1 << 20)  // BF16 values converted per pread / fwrite

static size_t dtype_bytes(SafetensorsDtype d) { return d == SAFETENSORS_F32 ? 4 : 2; }

const char *safetensors_dtype_name(SafetensorsDtype d) {
    return d == SAFETENSORS_F32 ? "F32" : "BF16";
}

static void shape_format(char *out, size_t n, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(out, n, "(");
    for (int d = 0; d < ndim && used < n; d++)
        used += (size_t)snprintf(out + used, n - used, d ? ", %" PRId64 : "%" PRId64, shape[d]);
    if (used < n) snprintf(out + used, n - used, ")");
}

// ---- reading: headers ----------------------------------------------------------------------

// Exactly n bytes at offset; false on a short read (the file shrank) or an error.
static bool pread_all(int fd, void *buf, size_t n, uint64_t offset) {
    char *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)offset);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        p += got, n -= (size_t)got, offset += (uint64_t)got;
    }
    return true;
}

static bool json_int_in(const json_t *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!json_is_integer(v)) return false;
    *out = json_integer_value(v);
    return *out >= lo && *out <= hi;
}

static bool dtype_parse(const char *path, const char *q, const json_t *v, SafetensorsDtype *d,
                        char *err, size_t errlen) {
    const char *name = json_string_value(json_object_get(v, "dtype"));
    char text[64];
    if (!name) return error_set(err, errlen, "safetensors %s: tensor %s has no dtype", path, q);
    if (!strcmp(name, "F32")) *d = SAFETENSORS_F32;
    else if (!strcmp(name, "BF16")) *d = SAFETENSORS_BF16;
    else
        return error_set(err, errlen, "safetensors %s: tensor %s has dtype %s; titan reads F32 "
                         "and BF16", path, q, error_quote(text, sizeof text, name));
    return true;
}

// Sizes of at most CKPT_MAX_DIMS dimensions; numel their product, false past 2^60 elements (no
// file holds that many bytes, and the byte count below cannot overflow).
static bool shape_parse(const char *path, const char *q, const json_t *v, SafetensorsTensor *t,
                        uint64_t *numel, char *err, size_t errlen) {
    const json_t *shape = json_object_get(v, "shape");
    bool ok = json_is_array(shape) && json_array_size(shape) <= CKPT_MAX_DIMS;
    t->ndim = ok ? (int)json_array_size(shape) : 0;
    *numel = 1;
    for (int d = 0; ok && d < t->ndim; d++)
        ok = json_int_in(json_array_get(shape, (size_t)d), 0, INT64_MAX, &t->shape[d]) &&
             !__builtin_mul_overflow(*numel, (uint64_t)t->shape[d], numel);
    if (ok && *numel <= (uint64_t)1 << 60) return true;
    return error_set(err, errlen, "safetensors %s: tensor %s has no shape of at most %d "
                     "non-negative sizes", path, q, CKPT_MAX_DIMS);
}

// One header entry: dtype, shape and data_offsets within data_bytes, whose span is exactly the
// shape's bytes.
static bool tensor_parse(const char *path, const char *name, const json_t *v,
                         uint64_t data_bytes, SafetensorsTensor *t, char *err, size_t errlen) {
    char q[256];
    error_quote(q, sizeof q, name);
    if (!json_is_object(v))
        return error_set(err, errlen, "safetensors %s: tensor %s is not an object of dtype, "
                         "shape and data_offsets", path, q);
    uint64_t numel;
    if (!dtype_parse(path, q, v, &t->dtype, err, errlen) ||
        !shape_parse(path, q, v, t, &numel, err, errlen))
        return false;
    const json_t *offsets = json_object_get(v, "data_offsets");
    int64_t begin, end;
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 ||
        !json_int_in(json_array_get(offsets, 0), 0, INT64_MAX, &begin) ||
        !json_int_in(json_array_get(offsets, 1), 0, INT64_MAX, &end))
        return error_set(err, errlen, "safetensors %s: tensor %s has no data_offsets [begin, end]",
                         path, q);
    if (begin > end || (uint64_t)end > data_bytes)
        return error_set(err, errlen, "safetensors %s: tensor %s has data_offsets [%" PRId64
                         ", %" PRId64 "] outside the data section's %" PRIu64 " bytes", path, q,
                         begin, end, data_bytes);
    t->begin = (uint64_t)begin, t->end = (uint64_t)end;
    uint64_t bytes = numel * dtype_bytes(t->dtype);
    if (bytes != t->end - t->begin) {
        char s[256];
        shape_format(s, sizeof s, t->ndim, t->shape);
        return error_set(err, errlen, "safetensors %s: tensor %s of shape %s and dtype %s spans %"
                         PRIu64 " bytes of data_offsets instead of %" PRIu64, path, q, s,
                         safetensors_dtype_name(t->dtype), t->end - t->begin, bytes);
    }
    t->name = xmalloc(strlen(name) + 1);
    strcpy(t->name, name);
    return true;
}

static int by_begin(const void *pa, const void *pb) {
    const SafetensorsTensor *a = *(SafetensorsTensor *const *)pa;
    const SafetensorsTensor *b = *(SafetensorsTensor *const *)pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    return a->end < b->end ? -1 : a->end > b->end;
}

// The file's tensors (st->tensors[first..]) tile its data section exactly, as the format
// requires (and Hugging Face's reader checks): no two share a byte, and no byte is none's,
// neither between them (a hole) nor after the last (trailing bytes), which would let a file
// carry a second content unseen.
static bool layout_check(const char *path, const Safetensors *st, int first, uint64_t data_bytes,
                         char *err, size_t errlen) {
    int n = st->n_tensors - first;
    SafetensorsTensor **order = xcalloc((size_t)n + 1, sizeof *order);
    for (int i = 0; i < n; i++) order[i] = &st->tensors[first + i];
    qsort(order, (size_t)n, sizeof *order, by_begin);
    const SafetensorsTensor *reach = NULL;  // the tensor ending furthest so far
    uint64_t covered = 0;                   // the data's bytes up to reach's end
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        char a[256], b[256];
        if (reach && order[i]->begin < reach->end && order[i]->end > order[i]->begin)
            ok = error_set(err, errlen, "safetensors %s: tensors %s and %s overlap", path,
                           error_quote(a, sizeof a, reach->name),
                           error_quote(b, sizeof b, order[i]->name));
        else if (order[i]->begin > covered)
            ok = error_set(err, errlen, "safetensors %s: data bytes %" PRIu64 " to %" PRIu64
                           " belong to no tensor (before %s)", path, covered, order[i]->begin,
                           error_quote(b, sizeof b, order[i]->name));
        if (!reach || order[i]->end > reach->end) reach = order[i], covered = reach->end;
    }
    free(order);
    if (ok && covered != data_bytes)
        ok = error_set(err, errlen, "safetensors %s: %" PRIu64 " bytes after the last tensor's "
                       "data belong to no tensor", path, data_bytes - covered);
    return ok;
}

// The header's tensors appended to st; data_bytes: the size of the data section.
static bool header_parse(const char *path, const json_t *root, uint64_t data_bytes, int file,
                         Safetensors *st, char *err, size_t errlen) {
    if (!json_is_object(root))
        return error_set(err, errlen, "safetensors %s: header is not a JSON object", path);
    int first = st->n_tensors;
    size_t room = (size_t)st->n_tensors + json_object_size(root) + 1;  // + 1: never size 0
    st->tensors = realloc(st->tensors, room * sizeof *st->tensors);
    CHECK(st->tensors != NULL);
    const char *name;
    const json_t *v;
    json_object_foreach((json_t *)root, name, v) {
        if (!strcmp(name, "__metadata__")) {
            const char *key;
            const json_t *value;
            bool strings = json_is_object(v);
            json_object_foreach((json_t *)v, key, value) strings = strings && json_is_string(value);
            if (!strings)
                return error_set(err, errlen, "safetensors %s: __metadata__ is not an object of "
                                 "strings", path);
            continue;
        }
        char q[256];
        const SafetensorsTensor *twin = safetensors_find(st, name);
        if (twin)
            return error_set(err, errlen, "safetensors %s: tensor %s is also in %s", path,
                             error_quote(q, sizeof q, name), st->files[twin->file].path);
        SafetensorsTensor *t = &st->tensors[st->n_tensors];
        *t = (SafetensorsTensor){.file = file};
        if (!tensor_parse(path, name, v, data_bytes, t, err, errlen)) return false;
        st->n_tensors++;
    }
    return layout_check(path, st, first, data_bytes, err, errlen);
}

// Opens one .safetensors file into st (its header validated, its tensors added).
static bool file_open(const char *path, Safetensors *st, char *err, size_t errlen) {
    // O_NONBLOCK: a FIFO in its place must not block the open (refused below).
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT)
        return error_set(err, errlen, "safetensors file %s does not exist", path);
    if (fd < 0) return error_set(err, errlen, "cannot open safetensors file %s: %s", path,
                                 strerror(errno));
    struct stat s;
    SYS_CHECK(fstat(fd, &s));
    if (!S_ISREG(s.st_mode)) {
        close(fd);
        return error_set(err, errlen, "safetensors %s is not a regular file", path);
    }
    st->files = realloc(st->files, (st->n_files + 1) * sizeof *st->files);
    CHECK(st->files != NULL);
    SafetensorsFile *f = &st->files[st->n_files++];
    *f = (SafetensorsFile){.path = xmalloc(strlen(path) + 1), .fd = fd};
    strcpy(f->path, path);
    uint64_t size = (uint64_t)s.st_size, n = 0;
    uint8_t le[8];
    if (size < 8 || !pread_all(fd, le, 8, 0))
        return error_set(err, errlen, "safetensors %s has %" PRIu64 " bytes, too few for its "
                         "8-byte header length", path, size);
    for (int i = 7; i >= 0; i--) n = n << 8 | le[i];
    if (n < 2 || n > HEADER_MAX || n > size - 8)
        return error_set(err, errlen, "safetensors %s: header length %" PRIu64 " does not fit "
                         "the file's %" PRIu64 " bytes (not a safetensors file?)", path, n, size);
    char *text = xmalloc(n);
    bool ok = pread_all(fd, text, n, 8);
    json_error_t e;
    json_t *root = ok ? json_loadb(text, n, JSON_REJECT_DUPLICATES, &e) : NULL;
    free(text);
    char why[4 * JSON_ERROR_TEXT_LENGTH];
    if (!ok) return error_set(err, errlen, "safetensors %s: cannot read its header", path);
    if (!root)
        return error_set(err, errlen, "safetensors %s: header is not JSON (byte %d: %s)", path,
                         e.position, error_escape(why, sizeof why, e.text));
    f->data_start = 8 + n;
    ok = header_parse(path, root, size - 8 - n, st->n_files - 1, st, err, errlen);
    json_decref(root);
    return ok;
}

static int file_index(const Safetensors *st, const char *path) {
    for (int i = 0; i < st->n_files; i++)
        if (!strcmp(st->files[i].path, path)) return i;
    return -1;
}

// Every shard that index_path's weight_map names (files in dir), each mapped tensor checked
// to be in its file.
static bool index_open(const char *index_path, const char *dir, Safetensors *st, char *err,
                       size_t errlen) {
    json_error_t e;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &e);
    char why[4 * JSON_ERROR_TEXT_LENGTH], q[256], file[4096];
    if (!root)
        return error_set(err, errlen, "safetensors index %s: invalid JSON at line %d, column %d: "
                         "%s", index_path, e.line, e.column, error_escape(why, sizeof why, e.text));
    const json_t *map = json_object_get(root, "weight_map"), *v;
    bool ok = json_is_object(map);
    if (!ok) error_set(err, errlen, "safetensors index %s has no weight_map object", index_path);
    const char *name;
    json_object_foreach((json_t *)map, name, v) {
        const char *shard = json_string_value(v);
        if (!ok) break;
        if (!shard || !*shard || strchr(shard, '/')) {
            ok = error_set(err, errlen, "safetensors index %s: weight_map maps %s to no file name "
                           "in its folder", index_path, error_quote(q, sizeof q, name));
            break;
        }
        snprintf(file, sizeof file, "%s/%s", dir, shard);
        if (file_index(st, file) < 0 && !file_open(file, st, err, errlen)) ok = false;
        const SafetensorsTensor *t = ok ? safetensors_find(st, name) : NULL;
        if (ok && (!t || t->file != file_index(st, file)))
            ok = error_set(err, errlen, "safetensors index %s: weight_map puts %s in %s, which has "
                           "no such tensor", index_path, error_quote(q, sizeof q, name), file);
    }
    json_decref(root);
    return ok;
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

static bool open_any(const char *path, Safetensors *st, char *err, size_t errlen) {
    struct stat s;
    char file[4096], dir[4096];
    if (stat(path, &s) != 0)
        return error_set(err, errlen, "safetensors path %s does not exist", path);
    if (!S_ISDIR(s.st_mode)) {
        if (!ends_with(path, ".index.json")) return file_open(path, st, err, errlen);
        const char *slash = strrchr(path, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
        return index_open(path, dir, st, err, errlen);
    }
    snprintf(file, sizeof file, "%s/%s", path, INDEX_NAME);
    if (stat(file, &s) == 0) return index_open(file, path, st, err, errlen);
    snprintf(file, sizeof file, "%s/%s", path, SINGLE_NAME);
    if (stat(file, &s) == 0) return file_open(file, st, err, errlen);
    return error_set(err, errlen, "folder %s has neither %s nor %s", path, INDEX_NAME, SINGLE_NAME);
}

bool safetensors_try_open(const char *path, Safetensors *st, char *err, size_t errlen) {
    *st = (Safetensors){.path = xmalloc(strlen(path) + 1)};
    strcpy(st->path, path);
    if (open_any(path, st, err, errlen)) return true;
    safetensors_close(st);
    return false;
}

void safetensors_open(const char *path, Safetensors *st) {
    char err[1024];
    if (!safetensors_try_open(path, st, err, sizeof err)) die_user("%s", err);
}

void safetensors_close(Safetensors *st) {
    for (int i = 0; i < st->n_files; i++) {
        SYS_CHECK(close(st->files[i].fd));
        free(st->files[i].path);
    }
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->files);
    free(st->tensors);
    free(st->path);
    *st = (Safetensors){0};
}

const SafetensorsTensor *safetensors_find(const Safetensors *st, const char *name) {
    for (int i = 0; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}

// ---- reading: data -------------------------------------------------------------------------

static bool data_read(const SafetensorsFile *f, const SafetensorsTensor *t, float *out) {
    uint64_t at = f->data_start + t->begin, numel = (t->end - t->begin) / dtype_bytes(t->dtype);
    if (t->dtype == SAFETENSORS_F32) return pread_all(f->fd, out, numel * 4, at);
    uint16_t *stage = xmalloc(STAGE_ELEMS * sizeof *stage);
    bool ok = true;
    for (uint64_t i = 0; i < numel && ok; i += STAGE_ELEMS) {
        size_t n = numel - i < STAGE_ELEMS ? (size_t)(numel - i) : STAGE_ELEMS;
        ok = pread_all(f->fd, stage, n * 2, at + i * 2);
        for (size_t j = 0; ok && j < n; j++) out[i + j] = bf16_to_float(stage[j]);
    }
    free(stage);
    return ok;
}

bool safetensors_try_read(const Safetensors *st, const char *name, int ndim, const int64_t *shape,
                          float *out, char *err, size_t errlen) {
    const SafetensorsTensor *t = safetensors_find(st, name);
    if (!t) return error_set(err, errlen, "safetensors %s has no tensor %s", st->path, name);
    const SafetensorsFile *f = &st->files[t->file];
    bool same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char have[256], want[256];
        shape_format(have, sizeof have, t->ndim, t->shape);
        shape_format(want, sizeof want, ndim, shape);
        return error_set(err, errlen, "safetensors %s: tensor %s has shape %s but the model "
                         "expects %s", f->path, name, have, want);
    }
    if (!data_read(f, t, out))
        return error_set(err, errlen, "safetensors %s is truncated (reading tensor %s failed)",
                         f->path, name);
    // A NaN or infinity loads as it is (the file says so), but training on it stops at the
    // first step's loss: said here, where the tensor is named.
    size_t numel = 1, bad = 0;
    for (int d = 0; d < ndim; d++) numel *= (size_t)shape[d];
    for (size_t i = 0; i < numel; i++) bad += !isfinite(out[i]);
    if (bad)
        log_warn_shared("safetensors %s: tensor %s has %zu non-finite values (NaN or infinity) "
                        "of %zu", f->path, name, bad, numel);
    return true;
}

void safetensors_read(const Safetensors *st, const char *name, int ndim, const int64_t *shape,
                      float *out) {
    char err[1024];
    if (!safetensors_try_read(st, name, ndim, shape, out, err, sizeof err)) die_user("%s", err);
}

// ---- writing -------------------------------------------------------------------------------

static uint64_t tensor_numel(const CkptTensor *t) {
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

// The header for the listed tensors, laid out back to back in list order, padded with spaces
// to a multiple of 8 bytes (as the reference writer does, so the data stays aligned).
static char *header_text(const CkptTensor *tensors, int n_tensors, SafetensorsDtype dtype,
                         size_t *padded) {
    json_t *root = json_object();
    CHECK(json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt")) == 0);
    uint64_t at = 0;
    for (int i = 0; i < n_tensors; i++) {
        const CkptTensor *t = &tensors[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++)
            CHECK(json_array_append_new(shape, json_integer(t->shape[d])) == 0);
        uint64_t end = at + tensor_numel(t) * dtype_bytes(dtype);
        json_t *entry = json_pack("{s:s, s:o, s:[I, I]}", "dtype", safetensors_dtype_name(dtype),
                                  "shape", shape, "data_offsets", (json_int_t)at, (json_int_t)end);
        CHECK(entry != NULL && !json_object_get(root, t->path));
        CHECK(json_object_set_new(root, t->path, entry) == 0);
        at = end;
    }
    char *text = json_dumps(root, JSON_COMPACT);
    CHECK(text != NULL);
    json_decref(root);
    size_t len = strlen(text);
    *padded = (len + 7) & ~(size_t)7;
    text = realloc(text, *padded);
    CHECK(text != NULL);
    memset(text + len, ' ', *padded - len);
    return text;
}

static void file_put(SafetensorsWriter *w, const void *data, size_t bytes) {
    if (fwrite(data, 1, bytes, w->file) != bytes)
        die_user("cannot write safetensors file %s: %s", w->tmp, strerror(errno));
}

void safetensors_write_begin(SafetensorsWriter *w, const char *path, const CkptTensor *tensors,
                             int n_tensors, SafetensorsDtype dtype) {
    char tmp[1024];
    ckpt_tmp_prepare(path, tmp, sizeof tmp);
    *w = (SafetensorsWriter){.path = xmalloc(strlen(path) + 1), .tmp = xmalloc(strlen(tmp) + 1),
                             .dtype = dtype, .tensors = tensors, .n_tensors = n_tensors};
    strcpy(w->path, path);
    strcpy(w->tmp, tmp);
    w->file = fopen(tmp, "wb");
    if (!w->file) die_user("cannot create safetensors file %s: %s", tmp, strerror(errno));
    size_t n;
    char *text = header_text(tensors, n_tensors, dtype, &n);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)n >> (8 * i));
    file_put(w, le, 8);
    file_put(w, text, n);
    free(text);
}

void safetensors_write_put(SafetensorsWriter *w, const float *data) {
    CHECK(w->next < w->n_tensors);
    uint64_t numel = tensor_numel(&w->tensors[w->next++]);
    if (w->dtype == SAFETENSORS_F32) {
        file_put(w, data, numel * sizeof(float));
        return;
    }
    uint16_t *stage = xmalloc(STAGE_ELEMS * sizeof *stage);
    for (uint64_t i = 0; i < numel; i += STAGE_ELEMS) {
        size_t n = numel - i < STAGE_ELEMS ? (size_t)(numel - i) : STAGE_ELEMS;
        for (size_t j = 0; j < n; j++) stage[j] = bf16_from_float(data[i + j]);
        file_put(w, stage, n * sizeof *stage);
    }
    free(stage);
}

void safetensors_write_end(SafetensorsWriter *w) {
    CHECK(w->next == w->n_tensors);
    if (fflush(w->file) != 0 || fclose(w->file) != 0)
        die_user("cannot write safetensors file %s: %s", w->tmp, strerror(errno));
    ckpt_publish(w->tmp, w->path);
    free(w->path);
    free(w->tmp);
    *w = (SafetensorsWriter){0};
}

void safetensors_save(const char *path, const CkptTensor *tensors, int n_tensors,
                      SafetensorsDtype dtype) {
    SafetensorsWriter w;
    safetensors_write_begin(&w, path, tensors, n_tensors, dtype);
    for (int i = 0; i < n_tensors; i++) safetensors_write_put(&w, tensors[i].data);
    safetensors_write_end(&w);
}
