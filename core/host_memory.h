// What this process may still allocate of the host's memory: the kernel's MemAvailable, or
// less where a memory cgroup (a container's, a Slurm job's) leaves less room. The cpu backend's
// memory_free, and what a data module checks its host buffers against before allocating them.
#pragma once

#include <stddef.h>

// SIZE_MAX when neither /proc/meminfo nor a cgroup limit can be read.
size_t host_memory_free(void);
