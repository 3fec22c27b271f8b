// A background checkpoint writer (checkpoint.async_mode async, docs/design.md "Checkpoints"): the
// caller copies the state into its own staging memory at a step boundary, then hands a write
// function to one background thread and goes on training while it runs.
//
// MPI: the write is collective (ckpt_save's gather of the boxes, its agreements) and runs while
// the training thread's collectives do, so MPI must grant MPI_THREAD_MULTIPLE (the caller checks
// comm_threads_concurrent) and the writer gets its own duplicate of MPI_COMM_WORLD, made by
// ckpt_async_init on the training thread: the two threads never share a communicator.
//
// HDF5 is not thread-safe (checkpoint/checkpoint.h): while a write is in flight the writer is
// the only thread inside HDF5, so the caller does no checkpoint I/O of its own between
// ckpt_async_start and ckpt_async_wait. At most one write is in flight: starting one first
// waits for the previous one.
#pragma once

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

// Writes one checkpoint from memory the caller does not touch until the write is waited for,
// collectively over comm (ckpt_save's communicator).
typedef void (*CkptWriteFn)(void *arg, MPI_Comm comm);

typedef struct {
    MPI_Comm comm;           // the writer's duplicate of MPI_COMM_WORLD
    pthread_t thread;
    bool in_flight;          // started and not yet waited for
    atomic_bool finished;    // the write in flight has returned (ckpt_async_finished)
    CkptWriteFn write;
    void *arg;
    double write_seconds;    // how long the last write took on the writer's thread
} CkptAsync;

// Collective over MPI_COMM_WORLD (the communicator's duplication); on the training thread.
void ckpt_async_init(CkptAsync *a);
// Waits for any write in flight, then starts write(arg, a->comm) on the background thread.
void ckpt_async_start(CkptAsync *a, CkptWriteFn write, void *arg);
// Whether the write in flight has returned, so that waiting for it will not block.
bool ckpt_async_finished(CkptAsync *a);
// Waits for the write in flight; false if there was none. a->write_seconds is then its time.
bool ckpt_async_wait(CkptAsync *a);
// Waits, then frees the communicator: collective over MPI_COMM_WORLD.
void ckpt_async_free(CkptAsync *a);
