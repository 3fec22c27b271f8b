// The host-staged MPI backend of parallel/comm.h (comm.backend: mpi on a device): every
// operation copies its device input into a host buffer, runs MPI's operation there, and copies
// the result back once it completes. It is slower than NCCL (two copies over the bus per
// operation, MPI's own algorithm in host memory) but takes any number of ranks on one GPU,
// which NCCL refuses: how every layout runs on a machine with one GPU, and how a user debugs a
// layout on a workstation. The copies are the kernels backend's upload and download (download
// waits for the queued compute that produces its input), so on cpu, where they are memcpy, the
// staging itself runs in tests/integration/test_comm.sh.
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "parallel/comm_internal.h"

static CommCopy to_device, to_host;

// One operation in flight: MPI's request on the host buffer, and what completing it does.
typedef struct {
    void *mpi;            // the MPI backend's request
    void *host;           // the staging buffer (malloc'd; freed on completion)
    const void *result;   // inside host: the bytes that go back to the device
    void *device;         // where they go (NULL: nothing comes back: a send)
    size_t bytes;
    const float *chunks;  // a float reduce-scatter's received chunks, summed into result first
    size_t avg_floats;    // COMM_AVG: the result's floats, divided by ranks first
    int ranks;
} Staged;

static Staged *staged_new(size_t host_bytes) {
    Staged *s = xcalloc(1, sizeof *s);
    s->host = xmalloc(host_bytes ? host_bytes : 1);
    return s;
}

// Where the result goes back, and the average MPI's sum becomes.
static void *staged_start(Staged *s, void *mpi, const void *result, void *device, size_t bytes,
                          CommOp op, CommGroup *g) {
    *s = (Staged){.mpi = mpi, .host = s->host, .result = result, .device = device,
                  .bytes = bytes, .chunks = s->chunks,
                  .avg_floats = op == COMM_AVG ? bytes / sizeof(float) : 0, .ranks = g->size};
    return s;
}

// MPI has no average: it sums, and completion divides.
static CommOp mpi_op(CommOp op) { return op == COMM_AVG ? COMM_SUM : op; }

static void *staged_all_reduce(CommGroup *g, float *buf, size_t n, CommOp op) {
    Staged *s = staged_new(n * sizeof(float));
    to_host(s->host, buf, n * sizeof(float));
    void *r = comm_mpi_backend.all_reduce(g, s->host, n, mpi_op(op));
    return staged_start(s, r, s->host, buf, n * sizeof(float), op, g);
}

static void *staged_all_gather(CommGroup *g, const void *send, void *recv, size_t n,
                               CommDtype type) {
    size_t block = n * comm_element_bytes(type), all = block * (size_t)g->size;
    Staged *s = staged_new(all);
    char *own = (char *)s->host + (size_t)g->rank * block;  // in place, as the MPI backend takes it
    to_host(own, send, block);
    void *r = comm_mpi_backend.all_gather(g, own, s->host, n, type);
    return staged_start(s, r, s->host, recv, all, COMM_SUM, g);
}

// Floats as the MPI backend does them: every rank's chunks exchanged, then summed here in rank
// order (comm.c's contract: FSDP over n ranks gives the one-rank run's gradients bit for bit).
static void *staged_reduce_scatter(CommGroup *g, const void *send, void *recv, size_t n,
                                   CommOp op, CommDtype type) {
    size_t block = n * comm_element_bytes(type), all = block * (size_t)g->size;
    bool in_rank_order = type == COMM_FLOAT32 && op != COMM_MAX;
    Staged *s = staged_new(all + (in_rank_order ? all : 0) + block);
    char *chunks = (char *)s->host + all, *out = chunks + (in_rank_order ? all : 0);
    to_host(s->host, send, all);
    void *r;
    if (in_rank_order) {
        s->chunks = (const float *)chunks;
        r = comm_mpi_backend.exchange_chunks(g, s->host, (float *)chunks, n);
    } else {
        r = comm_mpi_backend.reduce_scatter(g, s->host, out, n, mpi_op(op), type);
    }
    return staged_start(s, r, out, recv, block, op, g);
}

// The extent of a variable all-to-all's buffer: the end of its furthest block.
static size_t extent(const int *counts, const int *displs, int size) {
    size_t end = 0;
    for (int p = 0; p < size; p++)
        if (counts[p] > 0 && (size_t)(displs[p] + counts[p]) > end)
            end = (size_t)(displs[p] + counts[p]);
    return end * sizeof(float);
}

static void *staged_all_to_allv(CommGroup *g, const float *send, const int *send_counts,
                                const int *send_displs, float *recv, const int *recv_counts,
                                const int *recv_displs) {
    size_t out = extent(send_counts, send_displs, g->size);
    size_t in = extent(recv_counts, recv_displs, g->size);
    Staged *s = staged_new(out + in);
    float *host_in = (float *)((char *)s->host + out);
    to_host(s->host, send, out);
    // The receive buffer's gaps keep what the device held there: it is copied in first.
    to_host(host_in, recv, in);
    void *r = comm_mpi_backend.all_to_allv(g, s->host, send_counts, send_displs, host_in,
                                           recv_counts, recv_displs);
    return staged_start(s, r, host_in, recv, in, COMM_SUM, g);
}

static void *staged_broadcast(CommGroup *g, void *buf, size_t bytes, int root) {
    Staged *s = staged_new(bytes);
    to_host(s->host, buf, bytes);
    void *r = comm_mpi_backend.broadcast(g, s->host, bytes, root);
    return staged_start(s, r, s->host, buf, bytes, COMM_SUM, g);
}

static void *staged_send(CommGroup *g, const float *buf, size_t n, int peer, int tag) {
    Staged *s = staged_new(n * sizeof(float));
    to_host(s->host, buf, n * sizeof(float));
    void *r = comm_mpi_backend.send(g, s->host, n, peer, tag);
    return staged_start(s, r, NULL, NULL, 0, COMM_SUM, g);
}

static void *staged_recv(CommGroup *g, float *buf, size_t n, int peer, int tag) {
    Staged *s = staged_new(n * sizeof(float));
    void *r = comm_mpi_backend.recv(g, s->host, n, peer, tag);
    return staged_start(s, r, s->host, buf, n * sizeof(float), COMM_SUM, g);
}

static bool staged_test(void *request) {
    Staged *s = request;
    if (!comm_mpi_backend.test(s->mpi)) return false;
    float *sum = (float *)s->result;
    if (s->chunks) comm_sum_in_rank_order(sum, s->chunks, s->bytes / sizeof(float), s->ranks);
    for (size_t i = 0; i < s->avg_floats; i++) sum[i] /= (float)s->ranks;
    if (s->device && s->bytes) to_device(s->device, s->result, s->bytes);
    free(s->host);
    free(s);
    return true;
}

const CommBackend comm_staged_backend = {
    .native_avg = true,  // the host buffer is divided before it goes back
    .max_poll_pause_ns = 1000000,
    .all_reduce = staged_all_reduce,
    .all_gather = staged_all_gather,
    .reduce_scatter = staged_reduce_scatter,
    .all_to_allv = staged_all_to_allv,
    .broadcast = staged_broadcast,
    .send = staged_send,
    .recv = staged_recv,
    .test = staged_test,
};

void comm_staged_setup(CommCopy upload, CommCopy download) {
    to_device = upload;
    to_host = download;
}
