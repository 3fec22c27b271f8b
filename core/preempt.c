#include "core/preempt.h"

#include <signal.h>

#include "core/errors.h"
#include "core/signal_stack.h"

static volatile sig_atomic_t requested;

static void on_sigterm(int sig) {
    (void)sig;
    requested = 1;
}

void preempt_install(void) {
    // SA_RESTART: a signal landing in a read or write elsewhere in titan must not fail it;
    // SA_ONSTACK: not on the interrupted stack (core/signal_stack.h).
    signal_stack_ensure();
    struct sigaction sa = {.sa_handler = on_sigterm,
                           .sa_flags = SA_RESTART | SA_RESETHAND | SA_ONSTACK};
    SYS_CHECK(sigemptyset(&sa.sa_mask));
    SYS_CHECK(sigaction(SIGTERM, &sa, NULL));
}

bool preempt_requested(void) { return requested != 0; }
