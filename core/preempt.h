// Preemption: SIGTERM, which Slurm sends to every task of a job before it is preempted or
// reaches its time limit (sbatch --signal, scancel --signal=TERM), asks for a checkpoint and a
// clean exit instead of the default immediate death.
//
// The handler only sets a flag (async-signal-safe); the trainer reads it at each step
// boundary, agrees with the other ranks (any rank signalled stops them all: parallel/comm.h
// is above core), saves and exits 0. The handler is installed with SA_RESETHAND, so the
// disposition goes back to the default as it runs: a second SIGTERM, as from a user or a
// scheduler that will not wait for the save, ends the process at once (killed by SIGTERM,
// status 143 in a shell). SIGINT keeps its default, as in torchtitan: Ctrl-C stops now.
#pragma once

#include <stdbool.h>

// Installs the SIGTERM handler (training only: other commands keep the default).
void preempt_install(void);
// Whether a SIGTERM has arrived since preempt_install.
bool preempt_requested(void);
