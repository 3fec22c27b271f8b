#include "kernels/kernels.h"

#include <string.h>

#include "kernels/cpu/cpu.h"
#if TITAN_CUDA
#include "kernels/cuda/cuda.h"
#endif

// The one registry of backends: a backend is added here and nowhere else.
static const KernelOps *const backends[] = {
    &kernels_cpu,
#if TITAN_CUDA
    &kernels_cuda,
#endif
};

const KernelOps *kernels_backend(const char *name) {
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (strcmp(backends[i]->name, name) == 0) return backends[i];
    return NULL;
}
