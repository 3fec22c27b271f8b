// parallel/comm.h: the generic layer (groups, flight recording, byte counts, waits with a
// timeout, averaging) and the MPI backend. The backend is chosen in one place, comm_use_nccl;
// every operation dispatches through `backend`.
#include "parallel/comm.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/bf16.h"
#include "core/errors.h"
#include "parallel/comm_internal.h"

// The mesh makes about ten groups; a fixed table keeps group pointers stable without malloc.
#define COMM_MAX_GROUPS 64

static CommGroup groups[COMM_MAX_GROUPS];  // groups[0] is the world
static int n_groups;
static bool owns_mpi;        // comm_init started MPI, so comm_finalize ends it
static int thread_level;     // what MPI provides: MPI_THREAD_FUNNELED or MPI_THREAD_MULTIPLE
static int timeout_seconds;  // <= 0: wait forever

// ---- MPI backend ----------------------------------------------------------------------------

// An MPI_Request is a pointer in Open MPI and an int in MPICH; either fits the handle's void *.
_Static_assert(sizeof(MPI_Request) <= sizeof(void *), "an MPI_Request must fit a CommHandle");

static void *request_pack(MPI_Request r) {
    void *p = NULL;
    memcpy(&p, &r, sizeof(r));
    return p;
}

static MPI_Request request_unpack(void *p) {
    MPI_Request r;
    memcpy(&r, &p, sizeof(r));
    return r;
}

static int mpi_count(size_t n) {
    CHECK(n <= INT_MAX);  // MPI 3 counts are int; larger messages need the MPI 4 _c calls
    return (int)n;
}

// COMM_AVG is a sum here; comm_wait divides it (MPI has no average op).
static MPI_Op mpi_op_of(CommOp op) { return op == COMM_MAX ? MPI_MAX : MPI_SUM; }

// MPI has no bf16 type: the elements travel as 16-bit integers and sum through this op, which
// adds in fp32 and rounds back to bf16 (what NCCL does for ncclBfloat16).
static MPI_Op bf16_sum_op = MPI_OP_NULL;

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = bf16_from_float(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

static MPI_Datatype mpi_type_of(CommDtype type) {
    switch (type) {
    case COMM_BFLOAT16: return MPI_UINT16_T;
    case COMM_BYTE: return MPI_BYTE;
    case COMM_FLOAT32: break;
    }
    return MPI_FLOAT;
}

size_t comm_element_bytes(CommDtype type) {
    return type == COMM_BFLOAT16 ? 2 : type == COMM_BYTE ? 1 : 4;
}

static void *mpi_all_reduce(CommGroup *g, float *buf, size_t n, CommOp op) {
    MPI_Request r;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, mpi_count(n), MPI_FLOAT, mpi_op_of(op), g->mpi,
                             &r));
    return request_pack(r);
}

static void *mpi_all_gather(CommGroup *g, const void *send, void *recv, size_t n,
                            CommDtype type) {
    bool in_place = send == (const char *)recv + (size_t)g->rank * n * comm_element_bytes(type);
    MPI_Datatype t = mpi_type_of(type);
    MPI_Request r;
    MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, mpi_count(n), t, recv, mpi_count(n),
                             t, g->mpi, &r));
    return request_pack(r);
}

static void *mpi_reduce_scatter(CommGroup *g, const void *send, void *recv, size_t n, CommOp op,
                                CommDtype type) {
    MPI_Op mpi_op = mpi_op_of(op);
    if (type == COMM_BFLOAT16) {
        CHECK(op == COMM_SUM);
        if (bf16_sum_op == MPI_OP_NULL) MPI_CHECK(MPI_Op_create(bf16_sum, 1, &bf16_sum_op));
        mpi_op = bf16_sum_op;
    }
    MPI_Request r;
    MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, mpi_count(n), mpi_type_of(type), mpi_op,
                                        g->mpi, &r));
    return request_pack(r);
}

static void *mpi_exchange_chunks(CommGroup *g, const float *send, float *recv, size_t n) {
    MPI_Request r;
    MPI_CHECK(MPI_Ialltoall(send, mpi_count(n), MPI_FLOAT, recv, mpi_count(n), MPI_FLOAT, g->mpi,
                            &r));
    return request_pack(r);
}

static void *mpi_all_to_allv(CommGroup *g, const float *send, const int *send_counts,
                             const int *send_displs, float *recv, const int *recv_counts,
                             const int *recv_displs) {
    MPI_Request r;
    MPI_CHECK(MPI_Ialltoallv(send, send_counts, send_displs, MPI_FLOAT, recv, recv_counts,
                             recv_displs, MPI_FLOAT, g->mpi, &r));
    return request_pack(r);
}

static void *mpi_broadcast(CommGroup *g, void *buf, size_t bytes, int root) {
    MPI_Request r;
    MPI_CHECK(MPI_Ibcast(buf, mpi_count(bytes), MPI_BYTE, root, g->mpi, &r));
    return request_pack(r);
}

static void *mpi_send(CommGroup *g, const float *buf, size_t n, int peer, int tag) {
    MPI_Request r;
    MPI_CHECK(MPI_Isend(buf, mpi_count(n), MPI_FLOAT, peer, tag, g->mpi, &r));
    return request_pack(r);
}

static void *mpi_recv(CommGroup *g, float *buf, size_t n, int peer, int tag) {
    MPI_Request r;
    MPI_CHECK(MPI_Irecv(buf, mpi_count(n), MPI_FLOAT, peer, tag, g->mpi, &r));
    return request_pack(r);
}

static bool mpi_test(void *request) {
    MPI_Request r = request_unpack(request);
    int done = 0;
    MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    return done;
}

const CommBackend comm_mpi_backend = {
    .native_avg = false,
    .max_poll_pause_ns = 1000000,
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .exchange_chunks = mpi_exchange_chunks,
    .all_to_allv = mpi_all_to_allv,
    .broadcast = mpi_broadcast,
    .send = mpi_send,
    .recv = mpi_recv,
    .test = mpi_test,
};

static const CommBackend *backend = &comm_mpi_backend;

// ---- groups -----------------------------------------------------------------------------------

static CommGroup *group_add(MPI_Comm mpi, CommGroup *parent, int color, int key,
                            const char *name) {
    CHECK(n_groups < COMM_MAX_GROUPS);
    CHECK(strlen(name) < sizeof(groups[0].name));
    CommGroup *g = &groups[n_groups++];
    *g = (CommGroup){.mpi = mpi, .parent = parent, .color = color, .key = key};
    snprintf(g->name, sizeof(g->name), "%s", name);
    MPI_CHECK(MPI_Comm_rank(mpi, &g->rank));
    MPI_CHECK(MPI_Comm_size(mpi, &g->size));
    if (backend->attach) backend->attach(g);
    return g;
}

// Read before MPI_Init: Open MPI's singleton init sets OMPI_COMM_WORLD_* in the process too.
static bool launched;

bool comm_launched(void) { return launched; }

void comm_init(int *argc, char ***argv) {
    if (n_groups > 0) return;
    launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
    int initialized = 0;
    MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) {
        // MULTIPLE for the background checkpoint writer (checkpoint/async.h), whose collectives
        // on its own communicator run while this thread's do; FUNNELED is all the rest needs.
        MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level));
        CHECK(thread_level >= MPI_THREAD_FUNNELED);
        owns_mpi = true;
    } else {
        MPI_CHECK(MPI_Query_thread(&thread_level));
    }
    // A private copy of the world keeps titan's traffic apart from other MPI users (the
    // checkpoint writer's), and returning errors (inherited by every split) lets MPI_CHECK
    // name the failing call.
    MPI_Comm world;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
    MPI_CHECK(MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN));
    flight_init(group_add(world, NULL, 0, 0, "world")->rank);
}

// This rank's index among the ranks of its node, and their number (MPI's shared-memory split;
// collective over the world).
static void node_position(int *rank, int *size) {
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(groups[0].mpi, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, rank));
    MPI_CHECK(MPI_Comm_size(node, size));
    MPI_CHECK(MPI_Comm_free(&node));
}

int comm_local_rank(void) {
    int rank, size;
    node_position(&rank, &size);
    return rank;
}

int comm_local_count_equal(const char *id) {
    enum { ID_BYTES = 64 };
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(groups[0].mpi, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    int size;
    MPI_CHECK(MPI_Comm_size(node, &size));
    char mine[ID_BYTES] = {0}, *all = xcalloc((size_t)size, ID_BYTES);
    snprintf(mine, sizeof mine, "%s", id);
    MPI_CHECK(MPI_Allgather(mine, ID_BYTES, MPI_CHAR, all, ID_BYTES, MPI_CHAR, node));
    int equal = 0;
    for (int r = 0; r < size; r++)
        equal += strncmp(all + (size_t)r * ID_BYTES, mine, ID_BYTES) == 0;
    free(all);
    MPI_CHECK(MPI_Comm_free(&node));
    return equal;
}

int comm_local_size(void) {
    int rank, size;
    node_position(&rank, &size);
    return size;
}

void comm_configure(const CommConfig *config) {
    CHECK(config->trace_buf_size >= 0);
    timeout_seconds = config->timeout_seconds;
    flight_configure(config->trace_buf_size, config->trace_folder);
}

void comm_set_timeout(int seconds) { timeout_seconds = seconds; }

void comm_use_nccl(void *compute_stream) {
#if TITAN_CUDA
    CHECK(backend == &comm_mpi_backend);  // once per process
    comm_nccl_setup(compute_stream);
    backend = &comm_nccl_backend;
    for (int i = 0; i < n_groups; i++) backend->attach(&groups[i]);  // parents come first
#else
    (void)compute_stream;
    die_user("the cuda backend needs NCCL: build titan with `make CUDA=1`");
#endif
}

void comm_use_staged(CommCopy upload, CommCopy download) {
    CHECK(backend == &comm_mpi_backend);  // once per process
    comm_staged_setup(upload, download);
    backend = &comm_staged_backend;
}

void comm_finalize(void) {
    if (n_groups == 0) return;
    for (int i = n_groups - 1; i >= 0; i--) {
        if (backend->detach) backend->detach(&groups[i]);
        MPI_CHECK(MPI_Comm_free(&groups[i].mpi));
    }
    n_groups = 0;
    backend = &comm_mpi_backend;
    if (bf16_sum_op != MPI_OP_NULL) MPI_CHECK(MPI_Op_free(&bf16_sum_op));
    if (owns_mpi) MPI_CHECK(MPI_Finalize());
}

bool comm_threads_concurrent(void) {
    CHECK(n_groups > 0);  // comm_init first
    return thread_level >= MPI_THREAD_MULTIPLE;
}

CommGroup *comm_world(void) {
    CHECK(n_groups > 0);  // comm_init first
    return &groups[0];
}

CommGroup *comm_split(CommGroup *parent, int color, int key, const char *name) {
    CHECK(color >= 0);  // every rank lands in a group: MPI_UNDEFINED is not offered
    flight_poll_signal();
    MPI_Comm mpi;
    MPI_CHECK(MPI_Comm_split(parent->mpi, color, key, &mpi));
    return group_add(mpi, parent, color, key, name);
}

int comm_rank(const CommGroup *g) { return g->rank; }
int comm_size(const CommGroup *g) { return g->size; }
const char *comm_name(const CommGroup *g) { return g->name; }
uint64_t comm_bytes(const CommGroup *g) { return g->bytes; }
uint64_t comm_ops(const CommGroup *g) { return g->ops; }

int comm_counters(ProfilerCounter *out, int max) {
    for (int i = 0; i < n_groups && i < max; i++)
        out[i] = (ProfilerCounter){groups[i].name, groups[i].bytes, groups[i].ops};
    return n_groups;
}

// ---- waiting --------------------------------------------------------------------------------

static void abort_on_timeout(const CommHandle *h) {
    fprintf(stderr,
            "titan: rank %d: collective %s on group %s (seq %" PRId64 ", %" PRIu64
            " bytes) did not complete within %d s\n",
            groups[0].rank, h->op, h->group->name, h->trace_id, h->bytes, timeout_seconds);
    flight_dump("timeout");
    // Kills every rank (mpirun also stops a SIGSTOPped one), so the job exits instead of
    // hanging until the scheduler's limit.
    MPI_CHECK(MPI_Abort(MPI_COMM_WORLD, EXIT_INTERNAL_ERROR));
}

// The first millisecond polls flat out for the latency of small collectives; then the pause
// doubles from 10 us up to the backend's maximum (1 ms for MPI, which progresses only inside
// MPI calls: it frees the core when ranks oversubscribe it; 20 us for NCCL), which a long wait
// may overrun by.
static void pause_between_polls(double waited_s, long *pause_ns) {
    if (waited_s < 1e-3) return;
    *pause_ns = *pause_ns == 0 ? 10000 : *pause_ns * 2;
    if (*pause_ns > backend->max_poll_pause_ns) *pause_ns = backend->max_poll_pause_ns;
    struct timespec ts = {.tv_nsec = *pause_ns};
    // A SIGUSR1 cuts the pause short, which only means an earlier poll.
    if (nanosleep(&ts, NULL) < 0 && errno != EINTR)
        die_internal(__FILE__, __LINE__, "nanosleep: %s", strerror(errno));
}

// Time this rank has spent blocked in waits: communication that compute did not hide.
static double waited_total;

double comm_wait_seconds(void) { return waited_total; }

// out = ((chunk 0 + chunk 1) + chunk 2) + ...: a reduce-scatter adds the ranks' contributions in
// the order one rank accumulates the same microbatches (train/loop.c), so that FSDP over n ranks
// gives that run's gradients bit for bit. MPI's own reduce-scatter adds in its algorithm's order
// (Open MPI's: a tree, (g0 + g1) + (g2 + g3)), which float8's casts turn into whole e4m3 steps.
void comm_sum_in_rank_order(float *out, const float *chunks, size_t n, int ranks) {
    memcpy(out, chunks, n * sizeof(float));
    for (int q = 1; q < ranks; q++)
        for (size_t i = 0; i < n; i++) out[i] += chunks[(size_t)q * n + i];
}

// What completing h does, once its backend request has reported done.
static void handle_complete(CommHandle *h) {
    h->request = NULL;
    flight_complete(h->trace_id);
    profiler_collective_end(h->profile_id);
    if (h->chunks) {
        comm_sum_in_rank_order(h->sum_out, h->chunks, h->sum_n, h->group->size);
        free(h->chunks);
        h->chunks = NULL;
    }
    for (size_t i = 0; i < h->avg_n; i++) h->avg_buf[i] /= (float)h->group->size;
    h->avg_buf = NULL;
    h->avg_n = 0;
}

// Polls rather than blocking in MPI_Wait even without a timeout, so that a SIGUSR1 dump can
// happen while a rank hangs here.
static void wait_until(CommHandle *h, bool (*done)(void *request)) {
    double start = flight_now();
    bool traced = profiler_recording();  // a profiled step's trace shows the wait
    double traced_start = traced ? profiler_now() : 0;
    long pause_ns = 0;
    bool arrived = false;  // the backend's test releases the request once it reports true
    while (!(arrived = arrived || done(h->request)) || flight_now() < h->done_at) {
        flight_poll_signal();
        double waited = flight_now() - start;
        // (A simulated link's time, after the operation arrived, is no peer's hang.)
        if (timeout_seconds > 0 && !arrived && waited >= timeout_seconds) abort_on_timeout(h);
        pause_between_polls(waited, &pause_ns);
    }
    waited_total += flight_now() - start;
    handle_complete(h);
    if (traced) profiler_wait(h->op, h->group->name, h->trace_id, traced_start);
}

bool comm_test(CommHandle *h) {
    if (!h->request) return true;
    if (flight_now() < h->done_at || !backend->test(h->request)) return false;
    handle_complete(h);
    return true;
}

void comm_wait(CommHandle *h) {
    if (!h->request) return;
    wait_until(h, backend->test);
}

// ---- operations -----------------------------------------------------------------------------

// Counts and records an operation about to start; the caller fills in the request.
static CommHandle handle_begin(CommGroup *g, const char *op, uint64_t bytes, int peer) {
    flight_poll_signal();
    g->bytes += bytes;
    g->ops++;
    int64_t seq = flight_start(op, g->name, bytes, peer);
    double link = g->link_latency_s + (g->link_bytes_per_s > 0 ? bytes / g->link_bytes_per_s : 0);
    return (CommHandle){.trace_id = seq, .group = g, .op = op, .bytes = bytes,
                        .profile_id = profiler_collective_begin(op, g->name, bytes, seq, peer),
                        .done_at = link > 0 ? flight_now() + link : 0};
}

void comm_simulate_link(CommGroup *g, double latency_s, double bytes_per_s) {
    g->link_latency_s = latency_s;
    g->link_bytes_per_s = bytes_per_s;
}

static void average_on_wait(CommHandle *h, CommOp op, float *buf, size_t n) {
    if (op != COMM_AVG || backend->native_avg) return;
    h->avg_buf = buf;
    h->avg_n = n;
}

CommHandle comm_all_reduce_start(CommGroup *g, float *buf, size_t n, CommOp op) {
    CommHandle h = handle_begin(g, "all_reduce", 4 * (uint64_t)n, -1);
    h.request = backend->all_reduce(g, buf, n, op);
    average_on_wait(&h, op, buf, n);
    return h;
}

CommHandle comm_all_gather_start(CommGroup *g, const float *send, float *recv, size_t n) {
    CommHandle h = handle_begin(g, "all_gather", 4 * (uint64_t)n, -1);
    h.request = backend->all_gather(g, send, recv, n, COMM_FLOAT32);
    return h;
}

CommHandle comm_all_gather_bf16_start(CommGroup *g, const uint16_t *send, uint16_t *recv,
                                      size_t n) {
    CommHandle h = handle_begin(g, "all_gather_bf16", 2 * (uint64_t)n, -1);
    h.request = backend->all_gather(g, send, recv, n, COMM_BFLOAT16);
    return h;
}

CommHandle comm_all_gather_bytes_start(CommGroup *g, const void *send, void *recv,
                                       size_t bytes) {
    CommHandle h = handle_begin(g, "all_gather_bytes", bytes, -1);
    h.request = backend->all_gather(g, send, recv, bytes, COMM_BYTE);
    return h;
}

CommHandle comm_reduce_scatter_start(CommGroup *g, const float *send, float *recv, size_t n,
                                     CommOp op) {
    CommHandle h = handle_begin(g, "reduce_scatter", 4 * (uint64_t)n * (uint64_t)g->size, -1);
    if (backend->exchange_chunks && op != COMM_MAX) {  // summed in rank order on completion
        // Per call, freed on completion: the chunks are a whole FSDP unit's gradient, held only
        // while the reduce-scatter is in flight (as MPI's own algorithm holds its temporaries);
        // a kept buffer would hold the largest unit for the whole run.
        h.chunks = xmalloc((size_t)g->size * n * sizeof(float));
        h.sum_out = recv;
        h.sum_n = n;
        h.request = backend->exchange_chunks(g, send, h.chunks, n);
    } else {
        h.request = backend->reduce_scatter(g, send, recv, n, op, COMM_FLOAT32);
    }
    average_on_wait(&h, op, recv, n);
    return h;
}

CommHandle comm_reduce_scatter_bf16_start(CommGroup *g, const uint16_t *send, uint16_t *recv,
                                          size_t n) {
    CommHandle h = handle_begin(g, "reduce_scatter_bf16", 2 * (uint64_t)n * (uint64_t)g->size,
                                -1);
    h.request = backend->reduce_scatter(g, send, recv, n, COMM_SUM, COMM_BFLOAT16);
    return h;
}

CommHandle comm_all_to_allv_start(CommGroup *g, const float *send, const int *send_counts,
                                  const int *send_displs, float *recv, const int *recv_counts,
                                  const int *recv_displs) {
    uint64_t floats = 0;
    for (int p = 0; p < g->size; p++) floats += (uint64_t)send_counts[p];
    CommHandle h = handle_begin(g, "all_to_allv", 4 * floats, -1);
    h.request = backend->all_to_allv(g, send, send_counts, send_displs, recv, recv_counts,
                                     recv_displs);
    return h;
}

CommHandle comm_broadcast_start(CommGroup *g, void *buf, size_t bytes, int root) {
    CommHandle h = handle_begin(g, "broadcast", bytes, root);
    h.request = backend->broadcast(g, buf, bytes, root);
    return h;
}

void comm_p2p_ring(CommGroup *g) {
    if (g->p2p_ring) return;
    g->p2p_ring = true;
    if (backend->p2p_ring) backend->p2p_ring(g);
}

CommHandle comm_send_start(CommGroup *g, const float *buf, size_t n, int peer, int tag) {
    CommHandle h = handle_begin(g, "send", 4 * (uint64_t)n, peer);
    h.request = backend->send(g, buf, n, peer, tag);
    return h;
}

CommHandle comm_recv_start(CommGroup *g, float *buf, size_t n, int peer, int tag) {
    CommHandle h = handle_begin(g, "recv", 0, peer);
    h.request = backend->recv(g, buf, n, peer, tag);
    return h;
}

void comm_all_reduce(CommGroup *g, float *buf, size_t n, CommOp op) {
    CommHandle h = comm_all_reduce_start(g, buf, n, op);
    comm_wait(&h);
}

void comm_all_gather(CommGroup *g, const float *send, float *recv, size_t n) {
    CommHandle h = comm_all_gather_start(g, send, recv, n);
    comm_wait(&h);
}

void comm_reduce_scatter(CommGroup *g, const float *send, float *recv, size_t n, CommOp op) {
    CommHandle h = comm_reduce_scatter_start(g, send, recv, n, op);
    comm_wait(&h);
}

void comm_broadcast(CommGroup *g, void *buf, size_t bytes, int root) {
    CommHandle h = comm_broadcast_start(g, buf, bytes, root);
    comm_wait(&h);
}

// Host-side synchronisation, so MPI on both backends.
void comm_barrier(CommGroup *g) {
    CommHandle h = handle_begin(g, "barrier", 0, -1);
    MPI_Request r;
    MPI_CHECK(MPI_Ibarrier(g->mpi, &r));
    h.request = request_pack(r);
    wait_until(&h, mpi_test);
}

// A host scalar, so MPI on both backends.
double comm_all_reduce_double(CommGroup *g, double value, CommOp op) {
    CommHandle h = handle_begin(g, "all_reduce_double", sizeof(value), -1);
    MPI_Request r;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, mpi_op_of(op), g->mpi, &r));
    h.request = request_pack(r);
    wait_until(&h, mpi_test);
    return op == COMM_AVG ? value / g->size : value;
}

// Host counts, so MPI on both backends (the rows they size then move over the group's backend).
void comm_all_to_all_ints(CommGroup *g, const int *send, int *recv, int n) {
    CommHandle h = handle_begin(g, "all_to_all_ints", sizeof(int) * (uint64_t)n * g->size, -1);
    MPI_Request r;
    MPI_CHECK(MPI_Ialltoall(send, n, MPI_INT, recv, n, MPI_INT, g->mpi, &r));
    h.request = request_pack(r);
    wait_until(&h, mpi_test);
}

void comm_all_gather_host(CommGroup *g, const void *send, void *recv, size_t bytes) {
    CommHandle h = handle_begin(g, "all_gather_host", bytes, -1);
    MPI_Request r;
    MPI_CHECK(MPI_Iallgather(send, mpi_count(bytes), MPI_BYTE, recv, mpi_count(bytes), MPI_BYTE,
                             g->mpi, &r));
    h.request = request_pack(r);
    wait_until(&h, mpi_test);
}

// ---- reports --------------------------------------------------------------------------------

// The mesh names every group once, so a line per group is a line per name. The mesh makes
// every group; the ones used are reported, but a group of one rank (the experts' efsdp when ep
// takes all of dp_shard, say), whose operations are local copies that move nothing.
void comm_report(void) {
    if (n_groups == 0 || groups[0].rank != 0) return;
    for (int i = 0; i < n_groups; i++)
        if (groups[i].ops > 0 && groups[i].size > 1)
            log_info("comm: group %-14s %10" PRIu64 " ops %16" PRIu64 " bytes (%.1f MiB)",
                 groups[i].name, groups[i].ops, groups[i].bytes,
                 (double)groups[i].bytes / (1024.0 * 1024.0));
}

void comm_dump_trace(const char *why) { flight_dump(why); }
void comm_write_trace(FILE *f) { flight_write(f, "debug server"); }
void comm_write_trace_summary(FILE *f) { flight_write_summary(f); }
