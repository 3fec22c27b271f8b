// Shared by the unit tests that write files or check user errors (header-only; include after
// cmocka.h): a scratch directory per test group, small file helpers, and a check that a call
// dies as die_user must, with exit code 2 and exactly one expected line.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/errors.h"

static char dir[256];  // the group's scratch directory

static inline int dir_setup(void **state) {
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/titan_test_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static inline int dir_teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd);
}

// The dying child's exit status, without the exit handlers registered before fork: under
// AddressSanitizer one is the leak check, and the forked child lacks the parent's other threads,
// so what only their thread-local caches point at would be reported as leaked.
static inline void child_exit_now(int status, void *unused) {
    (void)unused;
    fflush(NULL);
    _exit(status);
}

// Runs fn(arg) in a child; it must exit 2 having printed exactly `want` (stdout and stderr).
static inline void expect_die_user(void (*fn)(const char *), const char *arg, const char *want) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1), dup2(fds[1], 2);
        on_exit(child_exit_now, NULL);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    char out[1024] = "";
    ssize_t got, used = 0;
    while ((got = read(fds[0], out + used, sizeof(out) - 1 - (size_t)used)) > 0) used += got;
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), EXIT_USER_ERROR);
    assert_string_equal(out, want);
}

// out = "<scratch dir>/name".
static inline void path_make(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", dir, name);
}

static inline void bytes_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

// The whole file, malloc'd; NULL (and *len untouched) when it cannot be opened.
static inline char *file_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    rewind(f);
    char *buf = malloc(*len ? *len : 1);
    assert_int_equal(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}
