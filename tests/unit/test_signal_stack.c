// core/signal_stack: titan's signals arriving while oneDNN's fp32 GEMM runs leave the process
// intact. A helper thread sends, for about a second, SIGUSR1 to the process (the flight
// recorder's handler) and the debug server's stack-sampling signal to every thread (each
// OpenMP thread in the GEMM's parallel region too), while the main thread runs the cpu backend's
// matmul on 2 OpenMP threads. Without the alternate stacks the handlers' frames overwrite what
// oneDNN's JIT kernels keep below the stack pointer: glibc aborts on a corrupted heap, or the
// results go wrong, within a fraction of that time. In a child process, so that a crash is a
// failed test rather than a dead test binary.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/thread_stacks.h"
#include "kernels/kernels.h"
#include "parallel/comm_internal.h"

enum { M = 256, N = 768, K = 256 };  // the debug model's w1 GEMM on 4 x 64 tokens

static atomic_bool stop;

static void *signaller(void *arg) {
    (void)arg;
    FILE *sink = fopen("/dev/null", "w");
    while (!atomic_load(&stop)) {
        kill(getpid(), SIGUSR1);
        thread_stacks_write(sink);  // signals every thread and waits for its answer
    }
    fclose(sink);
    return NULL;
}

// The child: the GEMM again and again under the signals; exit 0 when every result is right.
static int gemms_under_signals(void) {
    omp_set_num_threads(2);
    const KernelOps *k = kernels_backend("cpu");
    char why[256];
    if (!k || !k->init(&(KernelInit){0}, why, sizeof why)) return 2;
    flight_init(0);
    thread_stacks_init();
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * N * K);
    float *c = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; i++) a[i] = 1.0f;
    for (int i = 0; i < N * K; i++) b[i] = 0.5f;
    pthread_t t;
    pthread_create(&t, NULL, signaller, NULL);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int bad = 0;
    do {
        k->matmul(c, a, b, DTYPE_FP32, M, N, K, false, true, 0.0f);  // c = a b^T: K / 2 each
        for (int i = 0; i < M * N; i++) bad += c[i] != 0.5f * K;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (!bad && now.tv_sec - start.tv_sec + 1e-9 * (now.tv_nsec - start.tv_nsec) < 1.0);
    atomic_store(&stop, true);
    pthread_join(t, NULL);
    return bad ? 1 : 0;
}

static void test_gemms_survive_signals(void **state) {
    (void)state;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(gemms_under_signals());
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) fail_msg("the child died of signal %d", WTERMSIG(status));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gemms_survive_signals)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
