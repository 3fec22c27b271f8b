// Errors and logging: the two ways titan stops, and the one way it talks.
//
// A user error (bad config, missing file, impossible layout) is reported by die_user as one
// line and exit code 2. A broken internal invariant or a failed library call is reported with
// file:line and the failing expression, exit code 3. Every fallible library call goes through
// one of the *_CHECK macros so that no status code is ever dropped.
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {  // the cuda backend's .cu files are compiled as C++
#endif

#define EXIT_USER_ERROR 2
#define EXIT_INTERNAL_ERROR 3

__attribute__((noreturn, format(printf, 1, 2))) void die_user(const char *fmt, ...);
// die_user's line without the exit, for ranks that agree on an error and must have it printed
// before any of them exits (checkpoint/checkpoint.c's failed save).
__attribute__((format(printf, 1, 2))) void log_user_error(const char *fmt, ...);
// A user error every rank of the trainer must stop on together (a metrics record, TensorBoard
// event or trace the disk refused, on whichever rank writes it): the first one is kept, and
// train/loop.c's agreement after each step ends the run on every rank with its line (exit 2).
// Until then metrics.jsonl takes no more records and a failed TensorBoard writer closes; the
// rest keep writing whole records.
__attribute__((format(printf, 1, 2))) void defer_user_error(const char *fmt, ...);
const char *deferred_user_error(void);  // NULL while none
__attribute__((noreturn, format(printf, 3, 4))) void die_internal(const char *file, int line,
                                                                 const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void log_info(const char *fmt, ...);
// In a multi-rank job only rank 0 prints log_info lines. While every rank checks the same
// inputs (config, mesh), die_user_collective(true) makes only rank 0 print the error line, so
// a bad config gives one line, not one per rank; afterwards errors print on the rank that
// hits them.
void log_set_rank(int rank);
void die_user_collective(bool collective);
bool die_user_is_collective(void);
__attribute__((format(printf, 1, 2))) void log_warn(const char *fmt, ...);
// A warning every rank would give alike (about a file they all read): rank 0 prints it.
__attribute__((format(printf, 1, 2))) void log_warn_shared(const char *fmt, ...);

// For the try_* forms that report a user error instead of dying: formats the one-line
// message into err and returns false, so a check reads `return error_set(err, n, ...)`.
__attribute__((format(printf, 3, 4))) bool error_set(char *err, size_t errlen, const char *fmt,
                                                      ...);

// User text echoed in a message (a value, a key, a path) on one line: control characters as
// \n, \t or \xNN, backslashes doubled, and text longer than the buffer cut short with "...".
// error_quote also wraps it in single quotes (and escapes those). Both return buf.
const char *error_escape(char *buf, size_t n, const char *text);
const char *error_quote(char *buf, size_t n, const char *text);

// A command's `--help` (or `-h`) anywhere among its arguments: prints usage to stdout, exit 0.
void help_exit_if_asked(int argc, char **argv, const char *usage);

// Internal invariant: exit 3 naming the condition.
#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) die_internal(__FILE__, __LINE__, "check failed: %s", #cond);              \
    } while (0)

// POSIX calls that return -1 (or NULL through SYS_CHECK_PTR) and set errno.
#define SYS_CHECK(call)                                                                        \
    do {                                                                                       \
        if ((call) < 0) die_internal(__FILE__, __LINE__, "%s: %s", #call, strerror(errno));    \
    } while (0)

// HDF5 calls return a negative value on failure.
#define H5_CHECK(call)                                                                         \
    do {                                                                                       \
        if ((call) < 0) die_internal(__FILE__, __LINE__, "HDF5 call failed: %s", #call);       \
    } while (0)

// MPI calls return MPI_SUCCESS or an error code (comm_init sets MPI_ERRORS_RETURN on titan's
// communicators so that the code reaches this check). Usable where mpi.h is included.
#define MPI_CHECK(call)                                                                        \
    do {                                                                                       \
        int mpi_rc_ = (call);                                                                  \
        if (mpi_rc_ != MPI_SUCCESS) {                                                          \
            char mpi_msg_[MPI_MAX_ERROR_STRING];                                               \
            int mpi_len_ = 0;                                                                  \
            MPI_Error_string(mpi_rc_, mpi_msg_, &mpi_len_);                                    \
            die_internal(__FILE__, __LINE__, "%s: %s", #call, mpi_msg_);                      \
        }                                                                                      \
    } while (0)

// CUDA runtime and NCCL calls return a status with a message; usable where cuda_runtime.h or
// nccl.h is included.
#define CUDA_CHECK(call)                                                                       \
    do {                                                                                       \
        cudaError_t cuda_rc_ = (call);                                                         \
        if (cuda_rc_ != cudaSuccess)                                                           \
            die_internal(__FILE__, __LINE__, "%s: %s", #call, cudaGetErrorString(cuda_rc_));   \
    } while (0)

#define NCCL_CHECK(call)                                                                       \
    do {                                                                                       \
        ncclResult_t nccl_rc_ = (call);                                                        \
        if (nccl_rc_ != ncclSuccess)                                                           \
            die_internal(__FILE__, __LINE__, "%s: %s", #call, ncclGetErrorString(nccl_rc_));   \
    } while (0)

// cuBLASLt and cuDNN calls return a status; usable where cublasLt.h or cudnn.h is included.
#define CUBLAS_CHECK(call)                                                                     \
    do {                                                                                       \
        cublasStatus_t cublas_rc_ = (call);                                                    \
        if (cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                               \
            die_internal(__FILE__, __LINE__, "%s: %s", #call,                                  \
                         cublasLtGetStatusString(cublas_rc_));                                 \
    } while (0)

#define CUDNN_CHECK(call)                                                                      \
    do {                                                                                       \
        cudnnStatus_t cudnn_rc_ = (call);                                                      \
        if (cudnn_rc_ != CUDNN_STATUS_SUCCESS)                                                 \
            die_internal(__FILE__, __LINE__, "%s: %s", #call, cudnnGetErrorString(cudnn_rc_)); \
    } while (0)

// malloc-style calls; titan allocates only at setup, so running out is fatal.
void *xmalloc(size_t bytes);
void *xcalloc(size_t count, size_t bytes);
// Grows a buffer of *cap elements of elem bytes to hold at least need (doubling, so appends are
// amortised O(1)); updates *cap and returns the (possibly moved) buffer.
void *xgrow(void *p, size_t *cap, size_t need, size_t elem);

#ifdef __cplusplus
}
#endif
