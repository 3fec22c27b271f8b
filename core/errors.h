// Errors and logging: the two ways titan stops, and the one way it talks.
//
// A user error (bad config, missing file, impossible layout) is reported by die_user as one
// line and exit code 2. A broken internal invariant or a failed library call is reported with
// file:line and the failing expression, exit code 3. Every fallible library call goes through
// one of the *_CHECK macros so that no status code is ever dropped.
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define EXIT_USER_ERROR 2
#define EXIT_INTERNAL_ERROR 3

__attribute__((noreturn, format(printf, 1, 2))) void die_user(const char *fmt, ...);
__attribute__((noreturn, format(printf, 3, 4))) void die_internal(const char *file, int line,
                                                                 const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void log_info(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void log_warn(const char *fmt, ...);

// For the try_* forms that report a user error instead of dying: formats the one-line
// message into err and returns false, so a check reads `return error_set(err, n, ...)`.
__attribute__((format(printf, 3, 4))) bool error_set(char *err, size_t errlen, const char *fmt,
                                                      ...);

// Internal invariant: exit 3 naming the condition.
#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) die_internal(__FILE__, __LINE__, "check failed: %s", #cond);              \
    } while (0)

// POSIX calls that return -1 (or NULL through SYS_CHECK_PTR) and set errno.
#define SYS_CHECK(call)                                                                        \
    do {                                                                                       \
        if ((call) < 0) die_internal(__FILE__, __LINE__, "%s: %s", #call, strerror(errno));    \
    } while (0)

// HDF5 calls return a negative value on failure.
#define H5_CHECK(call)                                                                         \
    do {                                                                                       \
        if ((call) < 0) die_internal(__FILE__, __LINE__, "HDF5 call failed: %s", #call);       \
    } while (0)

// malloc-style calls; titan allocates only at setup, so running out is fatal.
void *xmalloc(size_t bytes);
void *xcalloc(size_t count, size_t bytes);
// Grows a buffer of *cap elements of elem bytes to hold at least need (doubling, so appends are
// amortised O(1)); updates *cap and returns the (possibly moved) buffer.
void *xgrow(void *p, size_t *cap, size_t need, size_t elem);
