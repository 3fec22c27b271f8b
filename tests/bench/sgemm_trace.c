// An LD_PRELOAD shim for scripts/bench_gemm.sh: every fp32 GEMM the process calls through
// dnnl_sgemm (oneDNN: titan's cpu_sgemm) appends one line to the file named by $SGEMM_TRACE,
// then runs the library's (attention's tiles have their own kernels, kernels/cpu/small_gemm.c,
// and are not traced). A line is
//   trans_a trans_b m n k lda ldb ldc alpha beta in_parallel caller caller's_caller
// (row-major calls, transposes 0/1; in_parallel: called inside an OpenMP region, where the
// library runs single-threaded; the callers: return addresses as decimal offsets within their
// binary, which the script names from its symbol table: cpu_matmul's caller is the model
// function that asked for the GEMM); they are cpu_sgemm's, titan's one call site of dnnl_sgemm.
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef dnnl_status_t (*DnnlSgemmFn)(char, char, dnnl_dim_t, dnnl_dim_t, dnnl_dim_t, float,
                                     const float *, dnnl_dim_t, const float *, dnnl_dim_t, float,
                                     float *, dnnl_dim_t);

static DnnlSgemmFn real_dnnl_sgemm;
static int trace_fd = -1;
static pthread_once_t trace_once = PTHREAD_ONCE_INIT;

// On the first call, not at load: helper processes (MPI's daemon) inherit LD_PRELOAD without
// linking the libraries.
static void trace_open(void) {
    real_dnnl_sgemm = (DnnlSgemmFn)dlsym(RTLD_NEXT, "dnnl_sgemm");
    const char *path = getenv("SGEMM_TRACE");
    if (!path) {
        fprintf(stderr, "sgemm_trace: set SGEMM_TRACE\n");
        exit(3);
    }
    trace_fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (trace_fd < 0) {
        perror(path);
        exit(3);
    }
}

static unsigned long binary_offset(void *address) {
    Dl_info info = {0};
    if (!address || !dladdr(address, &info)) return 0;
    return (unsigned long)((char *)address - (char *)info.dli_fbase);
}

// One line; found: the library's own function was found (to run after).
static void trace_line(bool found, bool ta, bool tb, long m, long n, long k, long lda,
                       long ldb, long ldc, float alpha, float beta, void *caller,
                       void *callers_caller) {
    if (!found) {
        fprintf(stderr, "sgemm_trace: %s\n", dlerror());
        exit(3);
    }
    char line[256];
    // One write() per line: O_APPEND keeps lines from concurrent threads whole.
    int len = snprintf(line, sizeof line, "%d %d %ld %ld %ld %ld %ld %ld %g %g %d %lu %lu\n", ta,
                       tb, m, n, k, lda, ldb, ldc, alpha, beta, omp_in_parallel(),
                       binary_offset(caller), binary_offset(callers_caller));
    if (write(trace_fd, line, (size_t)len) != len) {
        fprintf(stderr, "sgemm_trace: short write\n");
        exit(3);
    }
}

dnnl_status_t dnnl_sgemm(char ta, char tb, dnnl_dim_t m, dnnl_dim_t n, dnnl_dim_t k, float alpha,
                         const float *a, dnnl_dim_t lda, const float *b, dnnl_dim_t ldb,
                         float beta, float *c, dnnl_dim_t ldc) {
    pthread_once(&trace_once, trace_open);
    void *frames[4] = {0};  // this shim, cpu_sgemm, its caller, that one's caller
    backtrace(frames, 4);
    trace_line(real_dnnl_sgemm != NULL, ta == 'T' || ta == 't', tb == 'T' || tb == 't', m,
               n, k, lda, ldb, ldc, alpha, beta, frames[2], frames[3]);
    return real_dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
