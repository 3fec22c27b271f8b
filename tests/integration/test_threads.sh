#!/usr/bin/env bash
# OpenMP threads per rank (train/threads.c): unset OMP_NUM_THREADS, each rank takes its share of
# the node's cores (4 ranks on 2 cores: 1 thread each, where libgomp's default gave each 2 and
# ran 10x slower), a lone rank all of them; the startup line says so. OMP_NUM_THREADS is taken
# as is, and ranks x threads past the cores is one warning line.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMP_NUM_THREADS
cores=$(nproc)  # this shell's cpus, which mpirun --oversubscribe leaves every rank
RUN=("${SMALL[@]}" --training.steps 1 --lr_scheduler.warmup_steps 1 --training.seq_len 16
     --training.local_batch_size 1)

# run NAME NP [MPIRUN_ARGS...]: one step on NP ranks (NP 0: titan without mpirun), stdout in
# $SCRATCH/NAME.out, stderr in $SCRATCH/NAME.err.
run() {
  local name=$1 np=$2; shift 2
  local launch=(mpirun --oversubscribe -np "$np" "$@")
  [ "$np" -eq 0 ] && launch=()
  timeout 300 "${launch[@]}" $TITAN "${RUN[@]}" --job.dump_folder "$SCRATCH/$name" \
    >"$SCRATCH/$name.out" 2>"$SCRATCH/$name.err" ||
    { tail -5 "$SCRATCH/$name.err"; fail "$name: run failed"; }
}
# expect_threads NAME RANKS THREADS ENV: the startup line, and the backend's own count.
expect_threads() {
  local name=$1 ranks=$2 threads=$3 env=$4 line
  line=$(grep '^threads: ' "$SCRATCH/$name.out") || fail "$name: no threads line"
  [[ $line =~ ^threads:\ $ranks\ ranks?\ x\ $threads\ OpenMP\ threads?\ on\ .*\ core.*\($env\)$ ]] ||
    fail "$name: expected $ranks ranks x $threads threads ($env), got: $line"
  grep -q "^kernels: cpu: $threads OpenMP threads" "$SCRATCH/$name.out" ||
    fail "$name: the backend runs $(grep -o 'cpu: [0-9]* OpenMP' "$SCRATCH/$name.out") threads, not $threads"
  echo "ok: $line"
}
no_warning() { ! stderr_of "$SCRATCH/$1.err" | grep -q 'titan: warning' || fail "$1: $(cat "$SCRATCH/$1.err")"; }

share=$(( cores / 4 > 0 ? cores / 4 : 1 ))
run four 4
expect_threads four 4 "$share" "OMP_NUM_THREADS unset"
no_warning four

run alone 0
expect_threads alone 1 "$cores" "OMP_NUM_THREADS unset"
no_warning alone

# OMP_NUM_THREADS wins; 4 ranks of at least 2 threads on these cores are too many: one line,
# naming the numbers and the fix. Passive waits keep the oversubscribed run at seconds (its
# idle threads would spin for ~25 s).
many=$(( cores > 2 ? cores : 2 ))
run many 4 -x OMP_NUM_THREADS=$many -x OMP_WAIT_POLICY=passive
expect_threads many 4 "$many" "OMP_NUM_THREADS=$many"
warn=$(stderr_of "$SCRATCH/many.err" | grep '^titan: warning: ' || true)
[ "$(printf '%s' "$warn" | grep -c .)" -eq 1 ] || fail "expected one warning line, got: $warn"
[[ $warn == *"4 ranks x $many OpenMP threads oversubscribe the $cores cores of "*"unset OMP_NUM_THREADS or set it to $share"* ]] ||
  fail "the warning does not name the numbers and the fix: $warn"
echo "ok: $warn"
