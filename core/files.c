#include "core/files.h"

#include <errno.h>
#include <stdio.h>
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
