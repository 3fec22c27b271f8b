// OpenMP threads per rank. libgomp's default is every cpu in the process's affinity mask, and
// Open MPI binds each rank to a core at np <= 2, to a socket above, and not at all when
// oversubscribed: `mpirun --oversubscribe -np 4` on 2 cores ran 2 threads per rank, 8 threads
// on 2 cores, at 19-33 tokens/s against ~250 with one each. So each rank takes its share of
// the cores its node's ranks may run on, and no more than its own mask holds (a rank bound to
// one core gains nothing from a second thread); OMP_NUM_THREADS, when set, is taken as is.
// oneDNN (on libgomp) asks omp_get_max_threads() per call, so it follows.
#include <mpi.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "train/train.h"

// The cores the node's ranks may run on together: the union of their affinity masks, since
// one rank's mask is its binding (a core, a socket), not the node; within the cpus online.
// `mask` gets this rank's own count, `online` the node's.
static int node_cores(MPI_Comm node, int *mask, int *online) {
    cpu_set_t mine, all;
    CPU_ZERO(&mine);
    SYS_CHECK(sched_getaffinity(0, sizeof mine, &mine));
    MPI_CHECK(MPI_Allreduce(&mine, &all, (int)sizeof all, MPI_UNSIGNED_CHAR, MPI_BOR, node));
    *mask = CPU_COUNT(&mine);
    int n = CPU_COUNT(&all);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    *online = cpus > 0 ? (int)cpus : n;
    return n < *online ? n : *online;
}

void trainer_plan_threads(Trainer *t) {
    ThreadPlan *p = &t->threads;
    MPI_Comm node;  // the ranks sharing this node's memory: its ranks, under mpirun or srun
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_size(node, &p->local_ranks));
    MPI_CHECK(MPI_Comm_rank(node, &p->local_rank));
    int mask;
    p->node_cores = node_cores(node, &mask, &p->node_online);
    MPI_CHECK(MPI_Comm_free(&node));
    const char *env = getenv("OMP_NUM_THREADS");
    p->env = env && *env ? env : NULL;
    if (!p->env) {
        int share = p->node_cores / p->local_ranks;
        omp_set_num_threads(share < 1 ? 1 : share < mask ? share : mask);
    }
    p->threads = omp_get_max_threads();
}

// The startup line (rank 0, for its node), and one warning per node whose ranks' threads
// outnumber its cores. More ranks than cores at one thread each is the launcher's choice
// (mpirun refuses it without --oversubscribe): only threads titan could drop are warned of.
void trainer_log_threads(const Trainer *t) {
    const ThreadPlan *p = &t->threads;
    char env[64] = "OMP_NUM_THREADS unset";
    if (p->env) {
        char value[32];
        snprintf(env, sizeof env, "OMP_NUM_THREADS=%s", error_escape(value, sizeof value, p->env));
    }
    char cores[128];  // fewer than the node's: a container's cpuset, or mpirun's binding at np 1
    if (p->node_cores < p->node_online)
        snprintf(cores, sizeof cores, "%d of this node's %d cores (the ranks' affinity; ",
                 p->node_cores, p->node_online);
    else
        snprintf(cores, sizeof cores, "this node's %d core%s (", p->node_cores,
                 p->node_cores == 1 ? "" : "s");
    log_info("threads: %d rank%s x %d OpenMP thread%s on %s%s)", p->local_ranks,
             p->local_ranks == 1 ? "" : "s", p->threads, p->threads == 1 ? "" : "s", cores, env);
    if (p->local_rank != 0 || p->threads == 1 ||
        (long)p->local_ranks * p->threads <= p->node_cores)
        return;
    char host[256] = "?";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    int share = p->node_cores / p->local_ranks;
    log_warn("%d ranks x %d OpenMP threads oversubscribe the %d cores of %s: unset "
             "OMP_NUM_THREADS or set it to %d", p->local_ranks, p->threads, p->node_cores, host,
             share < 1 ? 1 : share);
}
