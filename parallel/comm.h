// The one door to collectives (docs/design.md "Communication"). Backends: MPI (the cpu backend's
// collective library, and the bootstrap for everything) and NCCL (built with CUDA=1; ids are
// broadcast over MPI, groups made by ncclCommSplit).
//
// Every operation has a non-blocking form returning a CommHandle so that compute overlaps
// communication; the blocking form is start + comm_wait. Every operation is recorded in a
// per-rank flight recorder (the last comm.trace_buf_size entries: sequence number, op, group,
// bytes, state), dumped to stderr (and to <trace_folder>/rank_<r>.txt) on SIGUSR1 or when a
// wait outlives the timeout (comm.init_timeout_seconds during setup and the first step, then
// comm.train_timeout_seconds, as torchtitan), so a hang names the rank and the collective; the
// timed-out job is then aborted (non-zero exit) instead of hanging. Every group counts the
// bytes its operations send, reported by comm_report at the end of a run.
//
// Buffers are fp32 (reductions sum in fp32, as torch.distributed does for fp32 tensors),
// except the bf16 all-gather and reduce-scatter; byte-level operations (broadcast) take void *. On the NCCL backend every buffer is a device
// pointer, except comm_all_reduce_double's value and comm_barrier, which stay on the host and
// go over MPI on both backends.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/profiler.h"

typedef struct CommGroup CommGroup;

typedef enum { COMM_SUM, COMM_MAX, COMM_AVG } CommOp;

// A pending operation. Waiting on a handle twice, or on a zero handle, is a no-op.
typedef struct {
    void *request;     // backend request (MPI_Request, cudaEvent_t), NULL when complete
    int64_t trace_id;  // its sequence number: the flight-recorder entry
    int64_t profile_id;  // its event in a profiled step's trace (core/profiler.h); 0: none
    // What a timeout names, so that the message does not depend on the recorder's depth.
    CommGroup *group;
    const char *op;
    uint64_t bytes;
    // COMM_AVG on MPI, which has no average op: the sum in avg_buf (avg_n) is divided by the
    // group size on completion. NULL otherwise.
    float *avg_buf;
    size_t avg_n;
    // A float reduce-scatter on MPI: every rank's chunk for this one (group size x sum_n floats,
    // the handle's own), summed into sum_out in rank order on completion. NULL otherwise.
    float *chunks;
    float *sum_out;
    size_t sum_n;
    double done_at;  // a simulated link's (comm_simulate_link): not complete before this time
} CommHandle;

typedef struct {
    int timeout_seconds;       // comm.init_timeout_seconds, until comm_set_timeout; <= 0: none
    int trace_buf_size;        // comm.trace_buf_size; 0 turns the recorder off
    const char *trace_folder;  // <job.dump_folder>/<comm.save_traces_folder>; NULL: stderr only
} CommConfig;

// MPI_Init (asking for MPI_THREAD_MULTIPLE), the world group, the SIGUSR1 handler. Idempotent.
// Until comm_configure, waits have no timeout and the recorder keeps the last 64 operations.
void comm_init(int *argc, char ***argv);
// Whether an MPI launcher (mpirun: Open MPI's OMPI_COMM_WORLD_SIZE, PMIx's PMIX_RANK, MPICH's
// PMI_RANK) started this process, not a singleton run.
bool comm_launched(void);
// May be called again; the recorder keeps its newest entries across a resize. The folder is
// created when a dump first writes to it.
void comm_configure(const CommConfig *config);
// The collective timeout from now on (train/loop.c: comm.train_timeout_seconds once the first step
// is done); <= 0 waits forever.
void comm_set_timeout(int seconds);
// Selects the NCCL backend for every group, existing and future (collective over the world;
// call after cudaSetDevice). compute_stream: the cudaStream_t whose queued work each
// collective waits for, NULL for the legacy default stream. Without it a run uses MPI; a build
// without CUDA=1 reports a user error. train/setup.c calls it when the kernels backend keeps its
// tensors in device memory (training.device cuda) and comm.backend is not mpi.
void comm_use_nccl(void *compute_stream);
// Copies between device memory (dst or src) and the host, returning once the bytes have arrived
// (the kernels backend's upload and download).
typedef void (*CommCopy)(void *dst, const void *src, size_t bytes);
// Selects host-staged MPI for device buffers instead (comm.backend: mpi; comm_staged.c): each
// operation downloads its input, runs on MPI in host memory and uploads its result. Any number
// of ranks may share a GPU, which NCCL refuses.
void comm_use_staged(CommCopy upload, CommCopy download);
// Whether MPI lets several threads call it at once (MPI_THREAD_MULTIPLE was granted): what a
// background checkpoint writer needs. Without it only the thread that called comm_init may.
bool comm_threads_concurrent(void);
// Ends communication for the process (MPI_Finalize if comm_init started MPI).
void comm_finalize(void);
CommGroup *comm_world(void);
// Collective over parent: ranks with the same color form one group, ordered by key. name
// (e.g. "dp_shard") labels the group in traces and byte reports.
CommGroup *comm_split(CommGroup *parent, int color, int key, const char *name);
int comm_rank(const CommGroup *g);
// This rank's index among the ranks on its node (MPI's shared-memory split): picks its GPU.
int comm_local_rank(void);
// How many of this node's ranks (this one included) pass the same id (at most 63 bytes
// compared); collective over the world.
int comm_local_count_equal(const char *id);
// How many ranks run on this node (the same split): they share its host memory.
int comm_local_size(void);
int comm_size(const CommGroup *g);
const char *comm_name(const CommGroup *g);

// In place: buf (n) = op over the group's buf. COMM_AVG divides the sum by the group size.
CommHandle comm_all_reduce_start(CommGroup *g, float *buf, size_t n, CommOp op);
// recv (size * n) = the concatenation, in rank order, of every rank's send (n). In place when
// send == recv + rank * n (NCCL's convention).
CommHandle comm_all_gather_start(CommGroup *g, const float *send, float *recv, size_t n);
// recv (n) = op over ranks of block `rank` of send (size * n).
CommHandle comm_reduce_scatter_start(CommGroup *g, const float *send, float *recv, size_t n,
                                     CommOp op);
// The same two on bf16 buffers (uint16_t, kernels.h's to_bf16): FSDP's mixed precision, which
// gathers the compute weights and may reduce the gradients in bf16 (torchtitan's
// mixed_precision_param / mixed_precision_reduce), for half the bytes. The reduce-scatter sums,
// rounding to bf16 after each addition as NCCL does (MPI through a user-defined op).
CommHandle comm_all_gather_bf16_start(CommGroup *g, const uint16_t *send, uint16_t *recv,
                                      size_t n);
CommHandle comm_reduce_scatter_bf16_start(CommGroup *g, const uint16_t *send, uint16_t *recv,
                                          size_t n);
// The same on bytes whose layout the caller defines: recv (size * bytes) = every rank's send
// (bytes), in rank order. FSDP's float8 all-gather sends its units' shards as one flat buffer
// of mixed element types (float8 weights, the rest in bf16 or fp32), as FSDP2 packs its
// all-gather inputs into one uint8 buffer.
CommHandle comm_all_gather_bytes_start(CommGroup *g, const void *send, void *recv,
                                       size_t bytes);
// MPI_Alltoallv semantics, counts and displacements in floats; the four arrays must stay
// unchanged until the wait (MPI reads them while the operation runs).
CommHandle comm_all_to_allv_start(CommGroup *g, const float *send, const int *send_counts,
                                  const int *send_displs, float *recv, const int *recv_counts,
                                  const int *recv_displs);
CommHandle comm_broadcast_start(CommGroup *g, void *buf, size_t bytes, int root);
// Readies g for sends and receives between ring neighbours (group ranks r - 1 and r + 1, the
// only peers the pipeline executor and the CP ring have); collective over g, before the first.
// On NCCL each direction of each neighbour pair gets a communicator and a stream of its own,
// so that a send waiting for its peer holds back only the later messages of its own channel
// (parallel/p2p_check.h's P2P_CHANNELS, under which the executor's and the ring's orders are
// proven to run); MPI's messages progress on their own already. Calling it again does nothing.
void comm_p2p_ring(CommGroup *g);
CommHandle comm_send_start(CommGroup *g, const float *buf, size_t n, int peer, int tag);
CommHandle comm_recv_start(CommGroup *g, float *buf, size_t n, int peer, int tag);
// Polls until complete (so that a SIGUSR1 dump can happen meanwhile). Once the wait itself has
// lasted the timeout, it prints one line naming the rank, op, group, sequence number and
// bytes, dumps the recorder and aborts the job (exit 3). NCCL ignores tags: send/recv pairs
// match in issue order.
void comm_wait(CommHandle *h);
// Whether h is complete, without waiting (completing it, as comm_wait would, if so). MPI
// moves a large message only inside its calls: a rank computing between a start and its wait
// calls this now and then so that the transfer overlaps the compute.
bool comm_test(CommHandle *h);

// Blocking forms.
void comm_all_reduce(CommGroup *g, float *buf, size_t n, CommOp op);
void comm_all_gather(CommGroup *g, const float *send, float *recv, size_t n);
void comm_reduce_scatter(CommGroup *g, const float *send, float *recv, size_t n, CommOp op);
void comm_broadcast(CommGroup *g, void *buf, size_t bytes, int root);
void comm_barrier(CommGroup *g);
// A double all-reduced in double precision (loss, grad norm).
double comm_all_reduce_double(CommGroup *g, double value, CommOp op);
// recv (size * n) = block `rank` (n ints) of every rank's send (size * n), in rank order:
// MPI_Alltoall of host ints (expert parallel's token counts), on both backends.
void comm_all_to_all_ints(CommGroup *g, const int *send, int *recv, int n);

// For benchmarks: every operation on g completes no sooner than latency_s + its bytes /
// bytes_per_s (0: no limit) after it starts, as over a slower link between g's ranks (the
// wide-area link between replica groups that semi-synchronous training is for). The wait
// counts the difference as waiting; an operation overlapped with compute hides it.
void comm_simulate_link(CommGroup *g, double latency_s, double bytes_per_s);

// Bytes this rank has handed to g's operations so far: the size of each operation's local
// input (all-reduce of n floats: 4n; all-gather of n per rank: 4n, in bf16 2n, of n bytes n;
// reduce-scatter to n per rank: 4n * size; all-to-all: its whole send buffer; broadcast: its
// bytes on every rank; send: its bytes; recv: 0). Independent of the algorithm the library
// picks, so tests can compare it with the analytic volume.
uint64_t comm_bytes(const CommGroup *g);
uint64_t comm_ops(const CommGroup *g);
// Every group's name, comm_bytes and comm_ops, the world's first, into out (max of them): how
// many groups there are. What a trace's window is checked against (core/profiler.h).
int comm_counters(ProfilerCounter *out, int max);
// Seconds this rank has spent blocked in comm_wait (and the blocking forms) since comm_init:
// the communication that compute did not hide.
double comm_wait_seconds(void);
// One line per group that was used, with its bytes and operation count: world rank 0 prints
// its own counts (not a sum over ranks, which would need a collective at exit).
void comm_report(void);
// Writes the flight recorder to stderr and the trace folder (also what SIGUSR1 does).
void comm_dump_trace(const char *why);
// The same dump into f; and three lines "operations: N", "last operation: ...", "oldest
// pending: ..." (or "none"). Callable from any thread while another communicates: the debug
// server's pages (core/debug_server.h).
void comm_write_trace(FILE *f);
void comm_write_trace_summary(FILE *f);
// recv (size * bytes) = every rank's send (bytes) of host memory, in rank order, over MPI on
// both backends (setup-time exchanges such as the debug servers' addresses).
void comm_all_gather_host(CommGroup *g, const void *send, void *recv, size_t bytes);
