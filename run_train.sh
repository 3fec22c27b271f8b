#!/usr/bin/env bash
# Launches a titan training run on NPROC ranks through mpirun, as torchtitan's run_train.sh
# does through torchrun:
#
#   NPROC=4 ./run_train.sh --config configs/debug_model.yaml [titan arguments]
#   NPROC=16 MPIRUN_ARGS="--hostfile hosts" ./run_train.sh --config configs/llama3_8b.yaml \
#     --device cuda
#
# NPROC: ranks (default 1). MPIRUN_ARGS: more mpirun arguments (hostfile, mapping), split on
# spaces. OMP_NUM_THREADS, when set, goes to every rank; otherwise titan picks its threads.
# TITAN: the binary, when not the ./titan beside this script.
#
# A SIGTERM, SIGINT (Ctrl-C) or SIGHUP to this script preempts the run: every rank finishes its
# step, saves a checkpoint (with checkpoint.enable) and exits 0, and so does this script. A
# second one ends the run at once. Under a bare mpirun that is not possible: Open MPI 4.1
# forwards a SIGTERM to the ranks and SIGKILLs them a second later, in the middle of the save.
# It does forward SIGUSR2 without ending the job, and titan takes SIGUSR2 as it takes SIGTERM
# (core/preempt.h), so the first signal here becomes a SIGUSR2 to mpirun.
set -uo pipefail
titan=${TITAN:-$(dirname "$0")/titan}

nproc_ranks=${NPROC:-1}
[[ $nproc_ranks =~ ^[1-9][0-9]*$ ]] ||
  { echo "run_train.sh: NPROC must be a positive number of ranks, not '$nproc_ranks'" >&2; exit 2; }

# The physical cores this process may run on: Open MPI's slots, which counts cores, not
# hardware threads (lscpu's CORE,SOCKET pairs over Cpus_allowed_list); nproc without lscpu.
cores() {
  local allowed
  allowed=$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status 2>/dev/null)
  if [ -z "$allowed" ] || ! command -v lscpu >/dev/null; then nproc; return; fi
  lscpu -p=CPU,CORE,SOCKET | awk -F, -v allowed="$allowed" '
    BEGIN { n = split(allowed, ranges, ",")
            for (i = 1; i <= n; i++) { m = split(ranges[i], r, "-"); hi = m > 1 ? r[2] : r[1]
                                       for (c = r[1]; c <= hi; c++) ok[c] = 1 } }
    /^#/ { next }
    ok[$1] && !seen[$2 "," $3]++ { count++ }
    END { print count ? count : 1 }'
}

args=(-q -np "$nproc_ranks")
# mpirun binds each of 1 or 2 ranks to one core (to a socket from 3 ranks on): every OpenMP
# thread of a rank would share its one core. titan gives each rank its share of the node's
# cores as threads, so the ranks run unbound.
args+=(--bind-to none)
[ "$nproc_ranks" -gt "$(cores)" ] && args+=(--oversubscribe)
[ -n "${OMP_NUM_THREADS+set}" ] && args+=(-x OMP_NUM_THREADS)
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
read -r -a extra <<<"${MPIRUN_ARGS:-}"

signals=0  # how many stop requests have arrived
stop() {
  signals=$((signals + 1))
  [ -n "${pid:-}" ] || exit $((128 + $1))  # before mpirun started
  if [ "$signals" -eq 1 ]; then
    echo "run_train.sh: stopping after this step, saving a checkpoint (checkpoint.enable);" \
      "another signal ends the run now" >&2
    kill -USR2 "$pid" 2>/dev/null
  else
    kill -TERM "$pid" 2>/dev/null
  fi
}
trap 'stop 15' TERM
trap 'stop 2' INT
trap 'stop 1' HUP

# A session of its own, so that a Ctrl-C, which the terminal sends to its whole foreground
# process group, reaches this script alone and mpirun hears of it as a SIGUSR2; a SIGTERM to
# mpirun if this script dies without passing a signal on (a SIGKILL), so that no run outlives
# it; stdin from /dev/null (mpirun would otherwise forward the terminal's input to rank 0).
setsid setpriv --pdeathsig TERM mpirun "${args[@]}" "${extra[@]}" "$titan" "$@" </dev/null &
pid=$!

# A trapped signal interrupts `wait` (status 128 + the signal) while mpirun still runs: wait
# again until mpirun's own status comes back. If mpirun ended just as a signal came, its
# status was already collected (bash then answers 127: no such child) and is the one before.
while :; do
  before=$signals
  wait "$pid"
  status=$?
  [ "$signals" -ne "$before" ] && [ "$status" -gt 128 ] || break
  interrupted=$status
done
[ "$status" -eq 127 ] && [ -n "${interrupted:-}" ] && status=$interrupted
exit "$status"
