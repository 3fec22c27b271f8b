// core/preempt: a first SIGTERM or SIGUSR2 only sets the flag (the process goes on), a second
// one of either kills; each case in a child process, since the second signal is meant to end it.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/preempt.h"

// The child's exit status after raising the n signals sigs[0..n-1] to itself: 10 + whether
// the flag is set when it survives them.
static int child_status(const int *sigs, int n) {
    pid_t pid = fork();
    if (pid == 0) {
        preempt_install();
        bool before = preempt_requested();
        for (int i = 0; i < n; i++) raise(sigs[i]);  // delivered before raise returns
        _exit(before ? 1 : 10 + preempt_requested());
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static void test_no_sigterm_no_flag(void **state) {
    (void)state;
    int status = child_status(NULL, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 10);
}

static void test_first_signal_sets_the_flag(void **state) {
    (void)state;
    const int sigs[] = {SIGTERM, SIGUSR2};  // Slurm's and mpirun's (./run_train.sh's)
    for (int i = 0; i < 2; i++) {
        int status = child_status(&sigs[i], 1);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 11);
    }
}

// A second request of either signal, after either, ends the process by that signal.
static void test_second_signal_kills(void **state) {
    (void)state;
    const int pairs[][2] = {{SIGTERM, SIGTERM}, {SIGUSR2, SIGUSR2}, {SIGTERM, SIGUSR2},
                            {SIGUSR2, SIGTERM}};
    for (int i = 0; i < 4; i++) {
        int status = child_status(pairs[i], 2);
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), pairs[i][1]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_sigterm_no_flag),
        cmocka_unit_test(test_first_signal_sets_the_flag),
        cmocka_unit_test(test_second_signal_kills),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
