// An LD_PRELOAD shim for scripts/bench_gemm.sh: every cblas_sgemm the process calls appends one
// line to the file named by $SGEMM_TRACE, then runs OpenBLAS's. A line is
//   trans_a trans_b m n k lda ldb ldc alpha beta in_parallel caller caller's_caller
// (row-major calls, transposes 0/1; in_parallel: called inside an OpenMP region, where OpenBLAS
// runs single-threaded; the callers: return addresses as decimal offsets within their binary,
// which the script names from its symbol table: cpu_matmul's caller is the model function that
// asked for the GEMM).
#include <cblas.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef void (*SgemmFn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint,
                        blasint, blasint, float, const float *, blasint, const float *, blasint,
                        float, float *, blasint);

static SgemmFn real_sgemm;
static int trace_fd = -1;
static pthread_once_t trace_once = PTHREAD_ONCE_INIT;

// On the first call, not at load: helper processes (MPI's daemon) inherit LD_PRELOAD without
// linking OpenBLAS.
static void trace_open(void) {
    real_sgemm = (SgemmFn)dlsym(RTLD_NEXT, "cblas_sgemm");
    const char *path = getenv("SGEMM_TRACE");
    if (!real_sgemm || !path) {
        fprintf(stderr, "sgemm_trace: %s\n", real_sgemm ? "set SGEMM_TRACE" : dlerror());
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

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                 const enum CBLAS_TRANSPOSE tb, const blasint m, const blasint n, const blasint k,
                 const float alpha, const float *a, const blasint lda, const float *b,
                 const blasint ldb, const float beta, float *c, const blasint ldc) {
    pthread_once(&trace_once, trace_open);
    void *frames[3] = {0};
    backtrace(frames, 3);
    char line[256];
    // One write() per line: O_APPEND keeps lines from concurrent threads whole.
    int len = snprintf(line, sizeof line, "%d %d %d %d %d %d %d %d %g %g %d %lu %lu\n",
                       ta == CblasTrans, tb == CblasTrans, (int)m, (int)n, (int)k, (int)lda,
                       (int)ldb, (int)ldc, alpha, beta, omp_in_parallel(),
                       binary_offset(frames[1]), binary_offset(frames[2]));
    if (order != CblasRowMajor || write(trace_fd, line, (size_t)len) != len) {
        fprintf(stderr, "sgemm_trace: column-major call or short write\n");
        exit(3);
    }
    real_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
