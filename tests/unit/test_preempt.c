// core/preempt: a first SIGTERM only sets the flag (the process goes on), a second one kills;
// each case in a child process, since the second SIGTERM is meant to end it.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/preempt.h"

// The child's exit status after `signals` SIGTERMs to itself: 10 + whether the flag is set
// when it survives them.
static int child_status(int signals) {
    pid_t pid = fork();
    if (pid == 0) {
        preempt_install();
        bool before = preempt_requested();
        for (int i = 0; i < signals; i++) raise(SIGTERM);  // delivered before raise returns
        _exit(before ? 1 : 10 + preempt_requested());
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static void test_first_sigterm_sets_the_flag(void **state) {
    (void)state;
    int status = child_status(1);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 11);
}

static void test_no_sigterm_no_flag(void **state) {
    (void)state;
    int status = child_status(0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 10);
}

static void test_second_sigterm_kills(void **state) {
    (void)state;
    int status = child_status(2);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGTERM);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_sigterm_no_flag),
        cmocka_unit_test(test_first_sigterm_sets_the_flag),
        cmocka_unit_test(test_second_sigterm_kills),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
