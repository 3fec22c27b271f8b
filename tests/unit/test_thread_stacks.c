// core/thread_stacks: every thread of the process is listed, once, with the function it is
// in named (a static one too: the names come from the full symbol table); a thread that blocks
// the signal is reported as not answering, after the wait, without holding up the others.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/thread_stacks.h"

static atomic_bool stop;
static atomic_int parked_tid, deaf_tid;

// noinline: the frame must exist for its name to show.
static __attribute__((noinline)) void parked_in_this_function(void) {
    atomic_store(&parked_tid, (int)syscall(SYS_gettid));
    while (!atomic_load(&stop)) nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
}

static void *parked(void *arg) {
    (void)arg;
    parked_in_this_function();
    return NULL;
}

static void *deaf(void *arg) {  // blocks every signal, as some library threads do
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    atomic_store(&deaf_tid, (int)syscall(SYS_gettid));
    while (!atomic_load(&stop)) nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    return NULL;
}

static int threads_now(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

// The block of text after 'thread <tid> ', up to its blank line.
static char *block_of(const char *text, int tid) {
    char head[64];
    snprintf(head, sizeof head, "thread %d ", tid);
    const char *start = strstr(text, head);
    if (!start) return NULL;
    const char *end = strstr(start, "\n\n");
    return strndup(start, end ? (size_t)(end - start) : strlen(start));
}

static void test_every_thread_named(void **state) {
    (void)state;
    thread_stacks_init();
    pthread_t a, b;
    assert_int_equal(pthread_create(&a, NULL, parked, NULL), 0);
    assert_int_equal(pthread_create(&b, NULL, deaf, NULL), 0);
    while (!atomic_load(&parked_tid) || !atomic_load(&deaf_tid))
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    int listed = threads_now();  // these two, main, and any a library started
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    thread_stacks_write(f);
    fclose(f);
    atomic_store(&stop, true);
    pthread_join(a, NULL);
    pthread_join(b, NULL);

    int threads = 0;
    for (const char *p = text; (p = strstr(p, "thread ")); p++)
        threads += p == text || p[-1] == '\n';
    assert_int_equal(threads, listed);
    char *main_block = block_of(text, getpid()), *parked_block = block_of(text, parked_tid),
         *deaf_block = block_of(text, deaf_tid);
    assert_non_null(main_block);
    assert_non_null(parked_block);
    assert_non_null(deaf_block);
    if (!strstr(main_block, "(main)") || !strstr(main_block, " thread_stacks_write+") ||
        !strstr(main_block, " test_every_thread_named+") ||
        !strstr(parked_block, " parked_in_this_function+") ||
        !strstr(deaf_block, "no answer"))
        fail_msg("unexpected stacks:\n%s", text);
    free(main_block);
    free(parked_block);
    free(deaf_block);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_thread_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
