#include "core/errors.h"

#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>

static int log_rank;
static bool errors_collective;

void log_set_rank(int rank) { log_rank = rank; }
void die_user_collective(bool collective) { errors_collective = collective; }
bool die_user_is_collective(void) { return errors_collective; }

// prefix, the formatted text and a newline in one write(2): stderr is unbuffered, and a line
// written in pieces can be split by another process's output under mpirun (the launcher's
// banner once landed between "titan: error: " and its message).
static void log_line(FILE *f, const char *prefix, const char *fmt, va_list ap) {
    char stack[4096], *line = stack;
    va_list measure;
    va_copy(measure, ap);
    int text = vsnprintf(NULL, 0, fmt, measure);
    va_end(measure);
    size_t room = strlen(prefix) + (size_t)(text > 0 ? text : 0) + 2;
    if (room > sizeof stack && !(line = malloc(room))) line = stack, room = sizeof stack;
    int n = snprintf(line, room, "%s", prefix);
    vsnprintf(line + n, room - (size_t)n, fmt, ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    fflush(f);
    for (const char *p = line; len > 0;) {
        ssize_t wrote = write(fileno(f), p, len);
        if (wrote < 0 && errno == EINTR) continue;
        if (wrote <= 0) break;  // nowhere left to say it
        p += wrote, len -= (size_t)wrote;
    }
    if (line != stack) free(line);
}

static void user_error_line(const char *fmt, va_list ap) {
    log_line(stderr, "titan: error: ", fmt, ap);
}

void log_user_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    user_error_line(fmt, ap);
    va_end(ap);
}

void die_user(const char *fmt, ...) {
    if (log_rank == 0 || !errors_collective) {
        va_list ap;
        va_start(ap, fmt);
        user_error_line(fmt, ap);
        va_end(ap);
    }
    exit(EXIT_USER_ERROR);
}

static char deferred[2048];

void defer_user_error(const char *fmt, ...) {
    if (deferred[0]) return;  // the first failure is the cause; later ones follow from it
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(deferred, sizeof deferred, fmt, ap);
    va_end(ap);
}

const char *deferred_user_error(void) { return deferred[0] ? deferred : NULL; }

void die_internal(const char *file, int line, const char *fmt, ...) {
    char prefix[512];
    snprintf(prefix, sizeof prefix, "titan: internal error at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    log_line(stderr, prefix, fmt, ap);
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

// Escapes text into buf[0..n) with quote (unless '\0') around it, cut short with "..." when
// it does not fit.
static const char *escape_into(char *buf, size_t n, const char *text, char quote) {
    CHECK(n >= 8);
    size_t used = 0, limit = n - 1 - (quote ? 1 : 0);  // room before the closing quote and '\0'
    if (quote) buf[used++] = quote;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        char piece[5];
        if (*p == '\n') snprintf(piece, sizeof piece, "\\n");
        else if (*p == '\t') snprintf(piece, sizeof piece, "\\t");
        else if (*p == '\\' || (quote && *p == quote)) snprintf(piece, sizeof piece, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) snprintf(piece, sizeof piece, "\\x%02x", *p);
        else snprintf(piece, sizeof piece, "%c", *p);
        size_t len = strlen(piece);
        if (used + len + (p[1] ? 3 : 0) > limit) {  // keeps room for "..." until the last piece
            memcpy(buf + used, "...", 3);
            used += 3;
            break;
        }
        memcpy(buf + used, piece, len);
        used += len;
    }
    if (quote) buf[used++] = quote;
    buf[used] = '\0';
    return buf;
}

const char *error_escape(char *buf, size_t n, const char *text) {
    return escape_into(buf, n, text, '\0');
}

const char *error_quote(char *buf, size_t n, const char *text) {
    return escape_into(buf, n, text, '\'');
}

void help_exit_if_asked(int argc, char **argv, const char *usage) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            fputc('\n', stdout);
            exit(0);
        }
    }
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

void log_warn_shared(const char *fmt, ...) {
    if (log_rank != 0) return;
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
