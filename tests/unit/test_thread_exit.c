// core/thread_exit: what a thread registers is freed when it exits, newest first, and only
// what that thread registered.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>

#include "core/thread_exit.h"

static int freed[8], n_freed;

static void record_free(void *ptr) { freed[n_freed++] = (int)(intptr_t)ptr; }

static void *register_two(void *first) {
    thread_exit_free(first, record_free);
    thread_exit_free((void *)((intptr_t)first + 1), record_free);
    return NULL;
}

static void test_freed_at_thread_exit_newest_first(void **state) {
    (void)state;
    pthread_t thread;
    register_two((void *)100);  // the main thread's: kept until the process ends
    assert_int_equal(n_freed, 0);
    assert_int_equal(pthread_create(&thread, NULL, register_two, (void *)10), 0);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(n_freed, 2);
    assert_int_equal(freed[0], 11);
    assert_int_equal(freed[1], 10);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_freed_at_thread_exit_newest_first),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
