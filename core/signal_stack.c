#include "core/signal_stack.h"

#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "core/errors.h"

// Every stack given out, linked from here: a thread's lives as long as the thread (the OpenMP
// pool's, as the process), and the list keeps it reachable meanwhile, as the leak checker sees.
typedef struct SignalStack {
    struct SignalStack *next;
    alignas(64) char bytes[];
} SignalStack;

static _Atomic(SignalStack *) stacks;
static _Thread_local bool has_stack;

void signal_stack_ensure(void) {
    if (has_stack) return;
    // Room for the kernel's frame with the AVX-512 state (about 3 KiB) and a handler that calls
    // backtrace() (the stack sampler), with a wide margin.
    long minimum = sysconf(_SC_MINSIGSTKSZ);
    size_t bytes = minimum > 16384 ? 4 * (size_t)minimum : 65536;
    SignalStack *s = xmalloc(sizeof *s + bytes);
    s->next = atomic_load(&stacks);
    while (!atomic_compare_exchange_weak(&stacks, &s->next, s)) {}
    SYS_CHECK(sigaltstack(&(stack_t){.ss_sp = s->bytes, .ss_size = bytes}, NULL));
    has_stack = true;
}
