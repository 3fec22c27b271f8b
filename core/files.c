#include "core/files.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    // O_NONBLOCK: a FIFO must not block the open; it is refused below, as is any file that
    // is not regular (a folder, /dev/zero), whose size says nothing of what a read gives.
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return FILE_OPEN_FAILED;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return FILE_NOT_REGULAR;
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return FILE_TOO_LARGE;
    }
    // Its size, and a byte to see its end (a file that grew meanwhile is read as far as max).
    size_t cap = (size_t)st.st_size + 2, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 == cap) {
            if (n > max) break;
            buf = xgrow(buf, &cap, cap + 1, 1);
        }
        ssize_t got = read(fd, buf + n, cap - 1 - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int why = errno;
            close(fd);
            free(buf);
            errno = why;
            return FILE_READ_FAILED;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    close(fd);
    if (n > max) {
        free(buf);
        return FILE_TOO_LARGE;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return FILE_READ_OK;
}

const char *write_error_why(int err, char *buf, size_t n) {
    snprintf(buf, n, "%s", strerror(err));
    buf[0] = (char)tolower((unsigned char)buf[0]);
    return buf;
}

const char *write_error_remedy(int err) {
    return err == ENOSPC || err == EDQUOT ? "free space" : "check the disk";
}

const char *file_read_why(FileReadResult r, size_t max, const char *what, char *buf, size_t n) {
    switch (r) {
    case FILE_OPEN_FAILED: snprintf(buf, n, "cannot open it: %s", strerror(errno)); break;
    case FILE_READ_FAILED: snprintf(buf, n, "cannot read it: %s", strerror(errno)); break;
    case FILE_NOT_REGULAR: snprintf(buf, n, "is not a regular file"); break;
    case FILE_TOO_LARGE:
        snprintf(buf, n, "has more than the %zu bytes %s may have", max, what);
        break;
    case FILE_READ_OK: CHECK(!"file_read_why of a read that succeeded");
    }
    return buf;
}
