#include "core/errors.h"

#include <stdarg.h>
#include <stdlib.h>

static int log_rank;
static bool errors_collective;

void log_set_rank(int rank) { log_rank = rank; }
void die_user_collective(bool collective) { errors_collective = collective; }

void die_user(const char *fmt, ...) {
    if (log_rank == 0 || !errors_collective) {
        va_list ap;
        va_start(ap, fmt);
        fputs("titan: error: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    exit(EXIT_USER_ERROR);
}

void die_internal(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "titan: internal error at %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(EXIT_INTERNAL_ERROR);
}

bool error_set(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return false;
}

static void log_line(FILE *f, const char *prefix, const char *fmt, va_list ap) {
    fputs(prefix, f);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    fflush(f);
}

void log_info(const char *fmt, ...) {
    if (log_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    log_line(stdout, "", fmt, ap);
    va_end(ap);
}

void log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_line(stderr, "titan: warning: ", fmt, ap);
    va_end(ap);
}

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die_internal(__FILE__, __LINE__, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *xcalloc(size_t count, size_t bytes) {
    void *p = calloc(count ? count : 1, bytes ? bytes : 1);
    if (!p) die_internal(__FILE__, __LINE__, "out of memory allocating %zu x %zu bytes", count, bytes);
    return p;
}

void *xgrow(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    size_t grown = *cap ? *cap : 16;
    while (grown < need) grown *= 2;
    p = realloc(p, grown * elem);
    if (!p) die_internal(__FILE__, __LINE__, "out of memory growing to %zu x %zu bytes", grown, elem);
    *cap = grown;
    return p;
}
