#include "data/dataset.h"

#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core/errors.h"

// Sits between a file's reader and the caller's fn: drops empty documents, counts the rest,
// and turns a file's own bytes_read into the dataset's.
typedef struct {
    DocumentFn fn;
    void *ctx;
    int64_t documents;
    uint64_t bytes_before;  // size of the files read before the current one
} Reader;

static void document_emit(const char *text, size_t len, const DocParts *parts,
                          uint64_t bytes_read, void *ctx) {
    Reader *r = ctx;
    if (len == 0 && !(parts && parts->conversation)) return;
    r->documents++;
    r->fn(text, len, parts, r->bytes_before + bytes_read, r->ctx);
}

static bool name_ends(const char *name, const char *suffix) {
    size_t n = strlen(name), k = strlen(suffix);
    return n > k && strcmp(name + n - k, suffix) == 0;
}

// The format extension ext, plain or gzip'd.
static bool format_is(const char *path, const char *ext) {
    char gz[32];
    snprintf(gz, sizeof(gz), "%s.gz", ext);
    return name_ends(path, ext) || name_ends(path, gz);
}

// Every file is read through zlib, which passes a file that is not gzip through unchanged:
// one reader for FILE and FILE.gz. (A plain file would be taken for gzip only if it began
// with the bytes 1f 8b, which no UTF-8 text and no R database does.)
static gzFile file_open(const char *path) {
    gzFile f = gzopen(path, "rb");
    if (!f) die_user("cannot read dataset file %s: %s", path, strerror(errno));
    return f;
}

// zlib's reason (a corrupt or truncated .gz), less the path it starts with, or the system's.
static void file_check(gzFile f, const char *path) {
    int code;
    const char *reason = gzerror(f, &code);
    if (code == Z_OK) return;
    size_t n = strlen(path);
    if (code == Z_ERRNO) reason = strerror(errno);
    else if (strncmp(reason, path, n) == 0 && strncmp(reason + n, ": ", 2) == 0) reason += n + 2;
    die_user("cannot read dataset file %s: %s", path, reason);
}

// The whole of FILE or FILE.gz, decompressed, from size (its bytes on disk) up: zlib's
// counterpart of core/files.h's file_read_all, which reads plain files only.
static uint8_t *gz_read_all(const char *path, uint64_t size, size_t *len) {
    gzFile f = file_open(path);
    size_t cap = size + 1, n = 0;  // exact for a plain file; a .gz grows
    uint8_t *buf = xmalloc(cap);
    for (int got = 1; got > 0; n += (size_t)got) {
        if (n == cap) {
            buf = realloc(buf, cap *= 2);
            CHECK(buf);
        }
        got = gzread(f, buf + n, (unsigned)(cap - n < INT_MAX ? cap - n : INT_MAX));
        file_check(f, path);
    }
    CHECK(gzclose(f) == Z_OK);
    *len = n;
    return buf;
}

// The next line of f, without its "\n", in *line (grown to any length); false at the end.
static bool line_read(gzFile f, const char *path, char **line, size_t *cap, size_t *len) {
    size_t n = 0;
    for (;;) {
        if (*cap - n < 2) {
            *line = realloc(*line, *cap *= 2);
            CHECK(*line);
        }
        int room = (int)(*cap - n < INT_MAX ? *cap - n : INT_MAX);
        bool got = gzgets(f, *line + n, room) != NULL;
        file_check(f, path);
        if (!got) break;
        n += strlen(*line + n);
        if (n > 0 && (*line)[n - 1] == '\n') {
            (*line)[--n] = '\0';
            *len = n;
            return true;
        }
    }
    *len = n;
    return n > 0;  // a last line without "\n"
}

static bool line_blank(const char *line, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (!strchr(" \t\r", line[i])) return false;
    return true;
}

// A prompt-completion example: the two strings back to back, the prompt untrained.
static void example_emit(const json_t *prompt, const json_t *completion, uint64_t bytes_read,
                         Reader *r) {
    size_t p = json_string_length(prompt), c = json_string_length(completion);
    char *text = xmalloc(p + c + 1);
    memcpy(text, json_string_value(prompt), p);
    memcpy(text + p, json_string_value(completion), c);
    size_t end[2] = {p, p + c};
    bool trained[2] = {false, true};
    document_emit(text, p + c, &(DocParts){2, end, trained, NULL, NULL}, bytes_read, r);
    free(text);
}

static void jsonl_line(const char *path, long number, const char *line, size_t len,
                       uint64_t bytes_read, Reader *r) {
    json_error_t e;
    json_t *doc = json_loadb(line, len, JSON_ALLOW_NUL, &e);
    if (!doc) die_user("%s:%ld:%d: %s", path, number, e.column, e.text);
    json_t *text = json_object_get(doc, "text");  // NULL when doc is not an object
    json_t *prompt = json_object_get(doc, "prompt");
    json_t *completion = json_object_get(doc, "completion");
    if (json_is_string(text)) {
        document_emit(json_string_value(text), json_string_length(text), NULL, bytes_read, r);
    } else if (json_is_string(prompt) && json_is_string(completion)) {
        example_emit(prompt, completion, bytes_read, r);
    } else if (json_object_get(doc, "messages")) {
        char where[PATH_MAX + 32];
        snprintf(where, sizeof where, "%s:%ld", path, number);
        document_emit("", 0, &(DocParts){0, NULL, NULL, doc, where}, bytes_read, r);
    } else {
        die_user("%s:%ld: no \"text\" field (nor \"prompt\" and \"completion\", strings, nor "
                 "\"messages\")", path, number);
    }
    json_decref(doc);
}

static void jsonl_read(const char *path, Reader *r) {
    gzFile f = file_open(path);
    size_t cap = 1 << 16, len;
    char *line = xmalloc(cap);
    for (long number = 1; line_read(f, path, &line, &cap, &len); number++)
        if (!line_blank(line, len)) jsonl_line(path, number, line, len, (uint64_t)gzoffset(f), r);
    free(line);
    CHECK(gzclose(f) == Z_OK);
}

static uint64_t file_size(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) die_user("cannot read dataset file %s: %s", path, strerror(errno));
    return (uint64_t)st.st_size;
}

// A whole-file format: one document, or the .rdb's character vectors.
static void file_read_whole(const char *path, uint64_t size, Reader *r) {
    size_t len;
    uint8_t *data = gz_read_all(path, size, &len);
    if (format_is(path, ".rdb")) rdata_for_each_document(path, data, len, size, document_emit, r);
    else document_emit((const char *)data, len, NULL, size, r);
    free(data);
}

static int hidden_skip(const struct dirent *e) { return e->d_name[0] != '.'; }

// Bytewise, not locale order, so every rank and every machine sees the same dataset.
static int name_compare(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

char **dataset_folder_files(const char *folder, bool (*keep)(const char *path), int *n) {
    struct dirent **entries;
    int count = scandir(folder, &entries, hidden_skip, name_compare);
    *n = 0;
    if (count < 0) return NULL;
    char **files = xmalloc((size_t)count * sizeof(char *));
    for (int i = 0; i < count; i++) {
        CHECK(asprintf(&files[*n], "%s/%s", folder, entries[i]->d_name) >= 0);
        if (keep(files[*n])) ++*n;
        else free(files[*n]);
        free(entries[i]);
    }
    free(entries);
    return files;
}

bool dataset_file_is_shard(const char *path) { return name_ends(path, ".bin"); }

int dataset_shard_find(const int64_t *first, int n_shards, int64_t i) {
    int lo = 0, hi = n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (first[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static bool text_keep(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool dataset_is_tokenized(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return false;
    if (!S_ISDIR(st.st_mode)) return dataset_file_is_shard(path);
    int n;
    char **files = dataset_folder_files(path, dataset_file_is_shard, &n);
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    return n > 0;
}

// The files of the text dataset at path: itself, or its folder's files.
static char **text_files(const char *path, int *n) {
    struct stat st;
    if (stat(path, &st) != 0) die_user("dataset %s does not exist", path);
    if (dataset_is_tokenized(path))
        die_user("dataset %s is already tokenized (.bin token shards), not text", path);
    if (S_ISDIR(st.st_mode)) {
        char **files = dataset_folder_files(path, text_keep, n);
        if (!files) die_user("cannot read dataset folder %s: %s", path, strerror(errno));
        return files;
    }
    char **files = xmalloc(sizeof(char *));
    files[0] = strdup(path);
    CHECK(files[0]);
    *n = 1;
    return files;
}

static void files_free(char **files, int n) {
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
}

uint64_t dataset_bytes(const char *path) {
    int n;
    char **files = text_files(path, &n);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += file_size(files[i]);
    files_free(files, n);
    return total;
}

int64_t dataset_for_each_document(const char *path, DocumentFn fn, void *ctx) {
    int n;
    char **files = text_files(path, &n);
    Reader r = {.fn = fn, .ctx = ctx};
    for (int i = 0; i < n; i++) {
        uint64_t size = file_size(files[i]);
        if (format_is(files[i], ".jsonl")) jsonl_read(files[i], &r);
        else file_read_whole(files[i], size, &r);
        r.bytes_before += size;
    }
    files_free(files, n);
    if (r.documents == 0) die_user("dataset %s holds no documents", path);
    return r.documents;
}
