#include "checkpoint/async.h"

#include <time.h>

#include "core/errors.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void ckpt_async_init(CkptAsync *a) {
    *a = (CkptAsync){0};
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &a->comm));
    MPI_CHECK(MPI_Comm_set_errhandler(a->comm, MPI_ERRORS_RETURN));  // MPI_CHECK names failures
}

static void *writer_main(void *arg) {
    CkptAsync *a = arg;
    double started = now_seconds();
    a->write(a->arg, a->comm);
    a->write_seconds = now_seconds() - started;
    atomic_store(&a->finished, true);
    return NULL;
}

void ckpt_async_start(CkptAsync *a, CkptWriteFn write, void *arg) {
    ckpt_async_wait(a);
    a->write = write;
    a->arg = arg;
    atomic_store(&a->finished, false);
    int rc = pthread_create(&a->thread, NULL, writer_main, a);
    if (rc != 0) die_internal(__FILE__, __LINE__, "pthread_create: %s", strerror(rc));
    a->in_flight = true;
}

bool ckpt_async_finished(CkptAsync *a) { return a->in_flight && atomic_load(&a->finished); }

bool ckpt_async_wait(CkptAsync *a) {
    if (!a->in_flight) return false;
    int rc = pthread_join(a->thread, NULL);
    if (rc != 0) die_internal(__FILE__, __LINE__, "pthread_join: %s", strerror(rc));
    a->in_flight = false;
    return true;
}

void ckpt_async_free(CkptAsync *a) {
    ckpt_async_wait(a);
    MPI_CHECK(MPI_Comm_free(&a->comm));
}
