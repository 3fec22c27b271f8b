#include "core/preempt.h"

#include <signal.h>

#include "core/errors.h"
#include "core/signal_stack.h"

static volatile sig_atomic_t requested;

static const int PREEMPT_SIGNALS[] = {SIGTERM, SIGUSR2};
enum { N_PREEMPT_SIGNALS = sizeof PREEMPT_SIGNALS / sizeof PREEMPT_SIGNALS[0] };

// sigaction is async-signal-safe (POSIX): the first request, of either signal, restores the
// default of both, so that the next one of either ends the process. The signal being handled
// is blocked meanwhile (no SA_NODEFER) and the other is in sa_mask, so neither runs this twice.
static void on_request(int sig) {
    (void)sig;
    requested = 1;
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    for (int i = 0; i < N_PREEMPT_SIGNALS; i++) sigaction(PREEMPT_SIGNALS[i], &dfl, NULL);
}

void preempt_install(void) {
    // SA_RESTART: a signal landing in a read or write elsewhere in titan must not fail it;
    // SA_ONSTACK: not on the interrupted stack (core/signal_stack.h).
    signal_stack_ensure();
    struct sigaction sa = {.sa_handler = on_request, .sa_flags = SA_RESTART | SA_ONSTACK};
    SYS_CHECK(sigemptyset(&sa.sa_mask));
    for (int i = 0; i < N_PREEMPT_SIGNALS; i++)
        SYS_CHECK(sigaddset(&sa.sa_mask, PREEMPT_SIGNALS[i]));
    for (int i = 0; i < N_PREEMPT_SIGNALS; i++)
        SYS_CHECK(sigaction(PREEMPT_SIGNALS[i], &sa, NULL));
}

bool preempt_requested(void) { return requested != 0; }
