// The NCCL backend of parallel/comm.h (built with CUDA=1; plain C against the CUDA runtime
// API): device buffers, one communication stream per rank for collectives, a communicator and
// stream per direction of each ring neighbour pair for sends and receives (comm_p2p_ring), and
// a cudaEvent per pending operation that comm_wait polls. The world communicator comes from a
// unique id that rank 0 broadcasts over MPI; every other group replays its MPI split with
// ncclCommSplit, so NCCL and MPI agree on every group's ranks.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>

#include "core/errors.h"
#include "parallel/comm_internal.h"

// Operations pending at once: FSDP prefetch and pipeline sends keep a handful in flight.
#define NCCL_EVENT_POOL 256

static cudaStream_t comm_stream;     // non-blocking, so it runs beside the compute stream
static cudaStream_t compute_stream;  // whose queued work each collective waits for
static cudaEvent_t compute_ready;    // re-recorded on compute_stream at every start
static cudaEvent_t event_pool[NCCL_EVENT_POOL];  // free events: event_pool[0, n_free)
static int n_free;

void comm_nccl_setup(void *stream) {
    compute_stream = (cudaStream_t)stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready, cudaEventDisableTiming));
    for (int i = 0; i < NCCL_EVENT_POOL; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&event_pool[i], cudaEventDisableTiming));
    n_free = NCCL_EVENT_POOL;
}

// ---- ring channels (comm_p2p_ring) ----------------------------------------------------------

// One direction of a neighbour pair: a two-rank communicator (src its rank 0, dst its rank 1)
// on a stream of its own, so that its messages wait only for each other.
typedef struct {
    int src, dst;  // group ranks
    ncclComm_t comm;
    cudaStream_t stream;
} Channel;

// A group's channels: this rank's at most four (to and from each neighbour).
typedef struct {
    Channel c[4];
    int n;
} Channels;

// Every direction of every ring pair, each a split of g's communicator that only its two
// ranks join: 2 splits per pair (a ring of 2 has one pair), called by every rank in the same
// order.
static void nccl_p2p_ring(CommGroup *g) {
    if (g->size < 2 || g->channels) return;
    Channels *ch = xcalloc(1, sizeof *ch);
    int pairs = g->size == 2 ? 1 : g->size;
    for (int j = 0; j < pairs; j++)
        for (int dir = 0; dir < 2; dir++) {
            int a = j, b = (j + 1) % g->size;
            int src = dir ? b : a, dst = dir ? a : b;
            bool member = g->rank == src || g->rank == dst;
            ncclComm_t comm = NULL;
            NCCL_CHECK(ncclCommSplit(g->nccl, member ? 0 : NCCL_SPLIT_NOCOLOR,
                                     g->rank == src ? 0 : 1, &comm, NULL));
            if (!member) continue;
            CHECK(ch->n < 4);
            Channel *c = &ch->c[ch->n++];
            *c = (Channel){.src = src, .dst = dst, .comm = comm};
            CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
        }
    g->channels = ch;
}

// The channel from src to dst; a send or receive with any other peer is titan's bug (the
// executor and the ring talk to neighbours only, after comm_p2p_ring).
static Channel *channel(CommGroup *g, int src, int dst) {
    Channels *ch = g->channels;
    for (int i = 0; ch && i < ch->n; i++)
        if (ch->c[i].src == src && ch->c[i].dst == dst) return &ch->c[i];
    die_internal(__FILE__, __LINE__, "group %s: no point-to-point channel from rank %d to %d",
                 g->name, src, dst);
}

static void channels_free(CommGroup *g) {
    Channels *ch = g->channels;
    for (int i = 0; ch && i < ch->n; i++) {
        CUDA_CHECK(cudaStreamSynchronize(ch->c[i].stream));
        NCCL_CHECK(ncclCommDestroy(ch->c[i].comm));
        CUDA_CHECK(cudaStreamDestroy(ch->c[i].stream));
    }
    free(ch);
    g->channels = NULL;
}

static void nccl_attach(CommGroup *g) {
    ncclComm_t comm;
    if (g->parent) {
        NCCL_CHECK(ncclCommSplit(g->parent->nccl, g->color, g->key, &comm, NULL));
    } else {
        ncclUniqueId id;
        if (g->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
        MPI_CHECK(MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, g->mpi));
        NCCL_CHECK(ncclCommInitRank(&comm, g->size, id, g->rank));
    }
    g->nccl = comm;
    if (g->p2p_ring) nccl_p2p_ring(g);
}

static void nccl_detach(CommGroup *g) {
    channels_free(g);
    CUDA_CHECK(cudaStreamSynchronize(comm_stream));  // nothing may still use the communicator
    NCCL_CHECK(ncclCommDestroy(g->nccl));
    g->nccl = NULL;
}

// The stream to enqueue on (the communication stream, or a channel's), ordered after the
// compute already queued (which produced the buffers).
static cudaStream_t enqueue_begin_on(cudaStream_t stream) {
    CUDA_CHECK(cudaEventRecord(compute_ready, compute_stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, compute_ready, 0));
    return stream;
}

static cudaStream_t enqueue_begin(void) { return enqueue_begin_on(comm_stream); }

// The request: an event that completes with the operation just enqueued on stream.
static void *enqueue_end_on(cudaStream_t stream) {
    CHECK(n_free > 0);  // NCCL_EVENT_POOL operations pending: some handle is never waited on
    cudaEvent_t e = event_pool[--n_free];
    CUDA_CHECK(cudaEventRecord(e, stream));
    return e;
}

static void *enqueue_end(void) { return enqueue_end_on(comm_stream); }

static bool nccl_test(void *request) {
    cudaError_t rc = cudaEventQuery((cudaEvent_t)request);
    if (rc == cudaErrorNotReady) return false;
    CUDA_CHECK(rc);
    event_pool[n_free++] = (cudaEvent_t)request;
    return true;
}

static ncclRedOp_t nccl_op_of(CommOp op) {
    return op == COMM_SUM ? ncclSum : op == COMM_MAX ? ncclMax : ncclAvg;
}

static void *nccl_all_reduce(CommGroup *g, float *buf, size_t n, CommOp op) {
    cudaStream_t s = enqueue_begin();
    NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, nccl_op_of(op), g->nccl, s));
    return enqueue_end();
}

static ncclDataType_t nccl_type_of(CommDtype type) {
    switch (type) {
    case COMM_BFLOAT16: return ncclBfloat16;
    case COMM_BYTE: return ncclUint8;
    case COMM_FLOAT32: break;
    }
    return ncclFloat;
}

static void *nccl_all_gather(CommGroup *g, const void *send, void *recv, size_t n,
                             CommDtype type) {
    cudaStream_t s = enqueue_begin();
    NCCL_CHECK(ncclAllGather(send, recv, n, nccl_type_of(type), g->nccl, s));
    return enqueue_end();
}

static void *nccl_reduce_scatter(CommGroup *g, const void *send, void *recv, size_t n, CommOp op,
                                 CommDtype type) {
    cudaStream_t s = enqueue_begin();
    NCCL_CHECK(ncclReduceScatter(send, recv, n, nccl_type_of(type), nccl_op_of(op), g->nccl, s));
    return enqueue_end();
}

// NCCL has no all-to-all: one send and one receive per peer, fused by a group call.
static void *nccl_all_to_allv(CommGroup *g, const float *send, const int *send_counts,
                              const int *send_displs, float *recv, const int *recv_counts,
                              const int *recv_displs) {
    cudaStream_t s = enqueue_begin();
    NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < g->size; p++) {
        NCCL_CHECK(ncclSend(send + send_displs[p], (size_t)send_counts[p], ncclFloat, p, g->nccl,
                            s));
        NCCL_CHECK(ncclRecv(recv + recv_displs[p], (size_t)recv_counts[p], ncclFloat, p, g->nccl,
                            s));
    }
    NCCL_CHECK(ncclGroupEnd());
    return enqueue_end();
}

static void *nccl_broadcast(CommGroup *g, void *buf, size_t bytes, int root) {
    cudaStream_t s = enqueue_begin();
    NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclChar, root, g->nccl, s));
    return enqueue_end();
}

// On the channel of the pair's direction (comm_p2p_ring). NCCL has no tags: a channel's
// messages match in issue order (comm.h).
static void *nccl_send(CommGroup *g, const float *buf, size_t n, int peer, int tag) {
    (void)tag;
    Channel *c = channel(g, g->rank, peer);
    NCCL_CHECK(ncclSend(buf, n, ncclFloat, 1, c->comm, enqueue_begin_on(c->stream)));
    return enqueue_end_on(c->stream);
}

static void *nccl_recv(CommGroup *g, float *buf, size_t n, int peer, int tag) {
    (void)tag;
    Channel *c = channel(g, peer, g->rank);
    NCCL_CHECK(ncclRecv(buf, n, ncclFloat, 0, c->comm, enqueue_begin_on(c->stream)));
    return enqueue_end_on(c->stream);
}

const CommBackend comm_nccl_backend = {
    .native_avg = true,
    .max_poll_pause_ns = 20000,
    .attach = nccl_attach,
    .detach = nccl_detach,
    .p2p_ring = nccl_p2p_ring,
    .all_reduce = nccl_all_reduce,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_to_allv = nccl_all_to_allv,
    .broadcast = nccl_broadcast,
    .send = nccl_send,
    .recv = nccl_recv,
    .test = nccl_test,
};
