// Shared by the data-loader fuzz targets (header-only): they hand each input to a loader as a
// file, since the loaders read paths, in a per-process folder under /dev/shm (memory, so an
// execution costs no disk I/O), removed when the fuzzer exits.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_folder[64];

static inline void fuzz_folder_remove(void) {
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fuzz_folder);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_folder);
}

// The folder, made on the first call.
static inline const char *fuzz_folder_path(void) {
    if (fuzz_folder[0]) return fuzz_folder;
    snprintf(fuzz_folder, sizeof fuzz_folder, "/dev/shm/titan-fuzz-XXXXXX");
    if (!mkdtemp(fuzz_folder)) abort();
    atexit(fuzz_folder_remove);
    return fuzz_folder;
}

// Writes data[0, size) to the file `name` in the folder; its path goes to out.
static inline void fuzz_file_write(const char *name, const uint8_t *data, size_t size, char *out,
                            size_t outlen) {
    snprintf(out, outlen, "%s/%s", fuzz_folder_path(), name);
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
}

// Splits data[0, size) at the first occurrence of sep: *head_size bytes before it; the part
// after it starts at the returned pointer (NULL, and head_size = size, when sep is absent).
static inline const uint8_t *fuzz_split(const uint8_t *data, size_t size, const char *sep,
                                 size_t *head_size) {
    const uint8_t *at = memmem(data, size, sep, strlen(sep));
    *head_size = at ? (size_t)(at - data) : size;
    return at ? at + strlen(sep) : NULL;
}

// A loader's refusal must be one non-empty line, as die_user would print it.
static inline void fuzz_refusal_check(const char *err) {
    if (err[0] && !strchr(err, '\n')) return;
    fprintf(stderr, "fuzz: a refusal that is not one line: \"%s\"\n", err);
    abort();
}
