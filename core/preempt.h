// Preemption: a request for a checkpoint and a clean exit instead of the default immediate
// death. Two signals ask for it:
// - SIGTERM, which Slurm sends to every task of a job before it is preempted or reaches its
//   time limit (sbatch --signal=TERM@..., scancel --signal=TERM);
// - SIGUSR2, which Open MPI 4.1's mpirun forwards to every rank (as it does SIGUSR1 and
//   SIGTSTP) without ending the job. A SIGTERM to mpirun cannot serve: mpirun forwards it and
//   SIGKILLs the ranks a second later (odls_base_sigkill_timeout), in the middle of the save,
//   and refuses to forward SIGTERM alone (ess_base_forward_signals). ./run_train.sh turns the
//   SIGTERM or Ctrl-C it gets into a SIGUSR2 to mpirun. SIGUSR1 is taken: it dumps the flight
//   recorder (parallel/comm.h).
//
// The handler only sets a flag (async-signal-safe); the trainer reads it at each step
// boundary, agrees with the other ranks (any rank signalled stops them all: parallel/comm.h
// is above core), saves and exits 0. The first request puts both signals back to their
// default disposition: a second SIGTERM or SIGUSR2, as from a user or a scheduler that will
// not wait for the save, ends the process at once (killed by the signal, status 143 or 140 in
// a shell). SIGINT keeps its default, as in torchtitan: Ctrl-C stops now (./run_train.sh
// turns a Ctrl-C into a preemption request instead).
#pragma once

#include <stdbool.h>

// Installs the SIGTERM and SIGUSR2 handler (training only: other commands keep the default).
void preempt_install(void);
// Whether a SIGTERM or SIGUSR2 has arrived since preempt_install.
bool preempt_requested(void);
