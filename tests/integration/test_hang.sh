#!/usr/bin/env bash
# A hang becomes a diagnosis: one rank of a 2-rank FSDP run is stopped (SIGSTOP) mid-training;
# the other's next collective outlives comm.train_timeout_seconds (3 s), it prints which
# collective on which group timed out and its flight recorder, and the job exits non-zero
# instead of hanging.
# run_all: alone (tests/run_all.sh): it times signals and timeouts
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

mpirun --oversubscribe -np 2 $TITAN "${SMALL[@]}" --training.steps 100000 --metrics.log_freq 1 \
  --parallelism.data_parallel_shard_degree 2 --comm.train_timeout_seconds 3 \
  --job.dump_folder "$SCRATCH/hang" >"$SCRATCH/out" 2>"$SCRATCH/err" &
launcher=$!
for _ in $(seq 100); do  # until training is under way
  [ -f "$SCRATCH/hang/metrics.jsonl" ] && [ "$(wc -l <"$SCRATCH/hang/metrics.jsonl")" -ge 3 ] && break
  sleep 0.2
done
victim=$(pgrep -P "$launcher" -f titan | tail -n 1)
[ -n "$victim" ] || fail "no titan rank found under mpirun"
kill -STOP "$victim"
started=$SECONDS
for _ in $(seq 150); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$launcher" 2>/dev/null; then
  kill -9 "$victim" "$launcher"; fail "the job was still running 30 s after a rank stopped"
fi
rc=0; wait "$launcher" || rc=$?
kill -9 "$victim" 2>/dev/null || true
echo "job exited with $rc, $((SECONDS - started)) s after the stop"
[ "$rc" -ne 0 ] || fail "the job exited 0"
grep -E "collective [a-z_]+ on group [a-z_]+ .*did not complete within 3 s" "$SCRATCH/err" ||
  fail "no timeout line naming the collective: $(head -5 "$SCRATCH/err")"
grep -qi "flight recorder" "$SCRATCH/err" || fail "no flight recorder dump"
grep -i -A3 "flight recorder" "$SCRATCH/err" | head -5
