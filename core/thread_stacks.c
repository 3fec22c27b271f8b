#include "core/thread_stacks.h"

#include <dirent.h>
#include <elfutils/libdwfl.h>
#include <execinfo.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/errors.h"
#include "core/signal_stack.h"

#define MAX_THREADS 256
#define MAX_FRAMES 64
// The handler's own frame and the kernel's signal trampoline (__restore_rt) come first in
// what backtrace() returns; the interrupted function is the next.
#define HANDLER_FRAMES 2

// A slot's life: the asker sets ASKED and signals the thread; the handler takes it (WRITING),
// fills it and marks it DONE. An asker that gives up takes an ASKED slot back to IDLE; one
// WRITING is waited for, as it ends soon. The state also holds the request's number (state =
// request << 2 | phase), which the signal carries too (request * MAX_THREADS + slot), so a
// handler that runs after its asker gave up, when the slot may ask another thread, writes
// nothing.
enum { SLOT_IDLE, SLOT_ASKED, SLOT_WRITING, SLOT_DONE };
#define REQUESTS (1 << 22)  // request numbers wrap so that the signal's value fits an int

typedef struct {
    atomic_int state;
    int depth;
    void *frames[MAX_FRAMES];  // (depth) return addresses, innermost first
} StackSlot;

static StackSlot slots[MAX_THREADS];
static int stack_signal;
static int request;  // the asker's current request

static void on_stack_signal(int sig, siginfo_t *info, void *context) {
    (void)sig, (void)context;
    int value = info->si_value.sival_int;
    if (info->si_code != SI_QUEUE || info->si_pid != getpid() || value < 0) return;  // not ours
    int i = value % MAX_THREADS, tag = value / MAX_THREADS << 2;
    int asked = tag | SLOT_ASKED;
    if (!atomic_compare_exchange_strong(&slots[i].state, &asked, tag | SLOT_WRITING)) return;
    int saved_errno = errno;
    slots[i].depth = backtrace(slots[i].frames, MAX_FRAMES);
    errno = saved_errno;
    atomic_store(&slots[i].state, tag | SLOT_DONE);
}

void thread_stacks_init(void) {
    void *warm[1];
    backtrace(warm, 1);
    stack_signal = SIGRTMIN + 4;
    // SA_ONSTACK: not on the sampled thread's stack (core/signal_stack.h); backtrace() unwinds
    // from the alternate stack through the signal frame into it.
    signal_stack_ensure();
    struct sigaction sa = {.sa_sigaction = on_stack_signal,
                           .sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK};
    SYS_CHECK(sigemptyset(&sa.sa_mask));
    SYS_CHECK(sigaction(stack_signal, &sa, NULL));
}

// The process's threads, at most max of them; how many there are.
static int threads_list(pid_t *tids, int max) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n < max) tids[n] = (pid_t)atoi(e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

static bool thread_ask(pid_t tid, int slot) {
    siginfo_t si;
    memset(&si, 0, sizeof si);
    si.si_signo = stack_signal;
    si.si_code = SI_QUEUE;
    si.si_pid = getpid();
    si.si_uid = getuid();
    si.si_value.sival_int = request * MAX_THREADS + slot;
    atomic_store(&slots[slot].state, request << 2 | SLOT_ASKED);
    if (syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, stack_signal, &si) == 0) return true;
    atomic_store(&slots[slot].state, SLOT_IDLE);  // the thread has exited since it was listed
    return false;
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Until every asked slot is DONE or the wait is over; then the unanswered go back to IDLE.
static void slots_wait(int n) {
    double deadline = seconds_now() + THREAD_STACKS_WAIT_S;
    for (;;) {
        bool pending = false;
        for (int i = 0; i < n; i++) {
            int s = atomic_load(&slots[i].state);
            pending |= s == (request << 2 | SLOT_WRITING) ||
                       (s == (request << 2 | SLOT_ASKED) && seconds_now() < deadline);
        }
        if (!pending) break;
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    for (int i = 0; i < n; i++) {
        int asked = request << 2 | SLOT_ASKED;
        atomic_compare_exchange_strong(&slots[i].state, &asked, SLOT_IDLE);
    }
}

static void thread_name(pid_t tid, char *name, size_t n) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)tid);
    FILE *f = fopen(path, "r");
    name[0] = 0;
    if (f && fgets(name, (int)n, f)) name[strcspn(name, "\n")] = 0;
    if (f) fclose(f);
}

// '<function>+0x<offset> (<object>)', or '?? (<object>+0x<offset>)' where the object exports
// no symbol there. A return address names the instruction after the call, so address - 1 (the
// call) is looked up; the innermost frame's address is where the thread was interrupted.
static void frame_write(FILE *f, Dwfl *dwfl, int i, void *frame) {
    uintptr_t address = (uintptr_t)frame, back = i > 0 ? 1 : 0;
    Dwfl_Module *m = dwfl ? dwfl_addrmodule(dwfl, address - back) : NULL;
    fprintf(f, "  #%-2d 0x%016" PRIxPTR " ", i, address);
    if (!m) {
        fputs("??\n", f);
        return;
    }
    Dwarf_Addr start = 0;
    const char *object = dwfl_module_info(m, NULL, &start, NULL, NULL, NULL, NULL, NULL);
    const char *base = object && strrchr(object, '/') ? strrchr(object, '/') + 1 : object;
    GElf_Off offset = 0;
    GElf_Sym sym;
    const char *name = dwfl_module_addrinfo(m, address - back, &offset, &sym, NULL, NULL, NULL);
    if (name)
        fprintf(f, "%s+0x%" PRIx64 " (%s)\n", name, (uint64_t)(offset + back), base);
    else
        fprintf(f, "?? (%s+0x%" PRIx64 ")\n", base, (uint64_t)(address - start));
}

// The process's objects as now mapped (a library loaded since is found too); NULL: addresses
// are printed unnamed.
static Dwfl *symbols_open(void) {
    static const Dwfl_Callbacks callbacks = {.find_elf = dwfl_linux_proc_find_elf,
                                             .find_debuginfo = dwfl_standard_find_debuginfo};
    Dwfl *dwfl = dwfl_begin(&callbacks);
    if (dwfl && (dwfl_linux_proc_report(dwfl, getpid()) != 0 ||
                 dwfl_report_end(dwfl, NULL, NULL) != 0)) {
        dwfl_end(dwfl);
        return NULL;
    }
    return dwfl;
}

void thread_stacks_write(FILE *f) {
    CHECK(stack_signal != 0);  // thread_stacks_init first
    pid_t tids[MAX_THREADS];
    int all = threads_list(tids, MAX_THREADS), n = all < MAX_THREADS ? all : MAX_THREADS;
    bool asked[MAX_THREADS];
    request = (request + 1) % REQUESTS;
    for (int i = 0; i < n; i++) asked[i] = thread_ask(tids[i], i);
    slots_wait(n);
    Dwfl *dwfl = symbols_open();
    for (int i = 0; i < n; i++) {
        char name[64];
        thread_name(tids[i], name, sizeof name);
        fprintf(f, "thread %d \"%s\"%s\n", (int)tids[i], name,
                tids[i] == getpid() ? " (main)" : "");
        if (atomic_load(&slots[i].state) != (request << 2 | SLOT_DONE))
            fprintf(f, "  %s\n", asked[i] ? "no answer (it blocks the signal)" : "exited");
        else
            for (int j = HANDLER_FRAMES; j < slots[i].depth; j++)
                frame_write(f, dwfl, j - HANDLER_FRAMES, slots[i].frames[j]);
        atomic_store(&slots[i].state, SLOT_IDLE);
        fputc('\n', f);
    }
    if (all > n) fprintf(f, "(%d more threads not shown)\n", all - n);
    if (dwfl) dwfl_end(dwfl);
}
