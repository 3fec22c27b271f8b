#include "core/files.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/errors.h"

bool try_make_dirs(const char *path, char *err, size_t errlen) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return error_set(err, errlen, "path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0777) < 0 && errno != EEXIST)
            return error_set(err, errlen, "cannot create directory %s: %s", buf, strerror(errno));
        *p = c;
        if (c == '\0') return true;
    }
}

void make_dirs(const char *path) {
    char err[4096 + 256];
    if (!try_make_dirs(path, err, sizeof err)) die_user("%s", err);
}

FileReadResult file_read_all(const char *path, size_t max, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return FILE_OPEN_FAILED;
    // A regular file's size, and a byte to see its end, make one read of it; others grow.
    struct stat st;
    size_t cap = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) ? (size_t)st.st_size + 2 : 4096;
    if (cap - 1 > max) cap = max + 1;
    char *buf = xmalloc(cap);
    size_t n = 0;
    while (n < max && !feof(f) && !ferror(f)) {
        if (n + 1 == cap) buf = xgrow(buf, &cap, cap + 1, 1);
        size_t want = (cap - 1 < max ? cap - 1 : max) - n;
        n += fread(buf + n, 1, want, f);
    }
    int failed = ferror(f), why = errno;
    fclose(f);
    if (failed) {
        free(buf);
        errno = why;
        return FILE_READ_FAILED;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return FILE_READ_OK;
}
