// Private to parallel/comm*.c and parallel/flight_recorder.c: the group record, the backend
// table the generic layer (comm.c) dispatches through, and the flight recorder.
#pragma once

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "parallel/comm.h"

struct CommGroup {
    MPI_Comm mpi;       // always present: bootstrap, barriers, host scalars
    void *nccl;         // ncclComm_t once the NCCL backend is attached, else NULL
    CommGroup *parent;  // NULL for the world; with color and key, lets NCCL replay the split
    int color, key;
    int rank, size;
    bool p2p_ring;      // comm_p2p_ring was called: the backend's ring channels exist
    void *channels;     // the NCCL backend's (comm_nccl.c), NULL on MPI
    char name[32];
    uint64_t bytes, ops;
    double link_latency_s, link_bytes_per_s;  // comm_simulate_link's; 0: the real link
};

// Element types of the all-gather and reduce-scatter (bytes: all-gather only).
typedef enum { COMM_FLOAT32, COMM_BFLOAT16, COMM_BYTE } CommDtype;

// One collective library. Each start enqueues the operation and returns its request (packed
// into a void *); test reports completion without blocking and releases the request when it
// reports true. The generic layer does the tracing, byte counting, timeout and averaging.
typedef struct {
    // NCCL averages natively (ncclAvg, on device buffers); MPI has no average op, so the
    // generic layer asks for a sum and divides it when the wait completes.
    bool native_avg;
    // The longest pause between two polls of a pending operation: what a completed wait may
    // overrun by. MPI progresses only inside its calls, so polling it flat out would steal the
    // core of oversubscribed ranks; a GPU collective progresses by itself and costs a poll
    // nothing but latency.
    long max_poll_pause_ns;
    // Gives g its backend communicator, and its ring channels when g->p2p_ring; collective
    // over g's parent (NULL: nothing to do).
    void (*attach)(CommGroup *g);
    // Gives attached g its ring channels (comm_p2p_ring); collective over g (NULL: none needed).
    void (*p2p_ring)(CommGroup *g);
    void (*detach)(CommGroup *g);
    void *(*all_reduce)(CommGroup *g, float *buf, size_t n, CommOp op);
    void *(*all_gather)(CommGroup *g, const void *send, void *recv, size_t n, CommDtype type);
    void *(*reduce_scatter)(CommGroup *g, const void *send, void *recv, size_t n, CommOp op,
                            CommDtype type);
    // Sends chunk q of send (n floats each) to rank q and receives every rank's chunk for this
    // one into recv (size x n, in rank order). A backend that has it reduce-scatters floats
    // through it, the generic layer taking the sums in rank order (comm_reduce_scatter_start);
    // NULL (NCCL): reduce_scatter, summed in the order of its own algorithm.
    void *(*exchange_chunks)(CommGroup *g, const float *send, float *recv, size_t n);
    void *(*all_to_allv)(CommGroup *g, const float *send, const int *send_counts,
                         const int *send_displs, float *recv, const int *recv_counts,
                         const int *recv_displs);
    void *(*broadcast)(CommGroup *g, void *buf, size_t bytes, int root);
    void *(*send)(CommGroup *g, const float *buf, size_t n, int peer, int tag);
    void *(*recv)(CommGroup *g, float *buf, size_t n, int peer, int tag);
    bool (*test)(void *request);
} CommBackend;

// Bytes of one element of type.
size_t comm_element_bytes(CommDtype type);
// out (n) = ((chunk 0 + chunk 1) + chunk 2) + ... of chunks (ranks x n): a float reduce-scatter's
// sum in the order one rank accumulates the same microbatches (comm.c).
void comm_sum_in_rank_order(float *out, const float *chunks, size_t n, int ranks);

// MPI on host buffers (comm.c); the host-staged MPI backend for device buffers over it
// (comm_staged.c, comm_use_staged), whose copies comm_staged_setup sets.
extern const CommBackend comm_mpi_backend;
extern const CommBackend comm_staged_backend;
void comm_staged_setup(CommCopy upload, CommCopy download);

#if TITAN_CUDA
extern const CommBackend comm_nccl_backend;
// The communication stream and the event pool; compute_stream is the cudaStream_t whose
// queued work every collective waits for (NULL: the legacy default stream).
void comm_nccl_setup(void *compute_stream);
#endif

// ---- flight recorder (flight_recorder.c) ----------------------------------------------------

// Keeps the last capacity entries (those recorded so far survive the resize); dumps also go
// to <folder>/rank_<r>.txt (folder NULL: stderr only).
void flight_configure(int capacity, const char *folder);
// Installs the SIGUSR1 handler; rank labels the dumps.
void flight_init(int rank);
int64_t flight_start(const char *op, const char *group, uint64_t bytes, int peer);
void flight_complete(int64_t seq);
void flight_dump(const char *why);
// What flight_dump prints, into f; and the newest operation and the oldest still pending, one
// line each (comm_write_trace, comm_write_trace_summary).
void flight_write(FILE *f, const char *why);
void flight_write_summary(FILE *f);
// Dumps if a SIGUSR1 arrived since the last call. Called from every comm call and from the
// polling loop of comm_wait, which is where a hung rank sits.
void flight_poll_signal(void);
double flight_now(void);
