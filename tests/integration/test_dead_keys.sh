#!/usr/bin/env bash
# Keys that used to be read and ignored now act, each checked where ignoring it would show:
# comm.init_timeout_seconds (the collective timeout through setup and the first step),
# comm.save_traces_folder (the flight recorder's per-rank files), metrics.save_for_all_ranks
# (a metrics file per rank), metrics.disable_color_printing (the colored step line on a
# terminal) and training.deterministic (the cpu backend always is; cuda refuses it by name).
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# comm.init_timeout_seconds: a rank stopped before its first step is done is given up on after
# the init timeout (2 s), not the train timeout (100 s). The first step is made long (seq_len
# 512, batch 8) so that the stop lands inside it.
mpirun --oversubscribe -np 2 $TITAN "${SMALL[@]}" --training.steps 3 --training.seq_len 512 \
  --training.local_batch_size 8 --parallelism.data_parallel_shard_degree 2 \
  --comm.init_timeout_seconds 2 --comm.train_timeout_seconds 100 \
  --job.dump_folder "$SCRATCH/init" >"$SCRATCH/init.out" 2>"$SCRATCH/init.err" &
launcher=$!
for _ in $(seq 300); do grep -q "^model:" "$SCRATCH/init.out" && break; sleep 0.1; done
grep -q "^model:" "$SCRATCH/init.out" || { kill -9 "$launcher"; fail "setup did not finish"; }
victim=$(pgrep -P "$launcher" -f titan | tail -n 1)
kill -STOP "$victim"
for _ in $(seq 150); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$launcher" 2>/dev/null; then
  kill -9 "$victim" "$launcher"; fail "still running 30 s after a rank stopped in its first step"
fi
rc=0; wait "$launcher" || rc=$?
kill -9 "$victim" 2>/dev/null || true
[ "$rc" -ne 0 ] || fail "the job exited 0"
[ -s "$SCRATCH/init/metrics.jsonl" ] && fail "step 1 completed before the stop: $(cat "$SCRATCH/init/metrics.jsonl")"
grep -E "did not complete within 2 s" "$SCRATCH/init.err" ||
  fail "no init timeout line: $(head -5 "$SCRATCH/init.err")"
# comm.save_traces_folder: the timeout's dump is also in <dump_folder>/<folder>/rank_<r>.txt.
grep -l "flight recorder (timeout)" "$SCRATCH"/init/comm_traces/rank_*.txt ||
  fail "no trace file: $(ls -R "$SCRATCH/init")"

# comm.save_traces_folder, named, and SIGUSR1 on one rank.
$TITAN "${SMALL[@]}" --training.steps 100000 --comm.save_traces_folder my_traces \
  --job.dump_folder "$SCRATCH/usr1" >/dev/null 2>"$SCRATCH/usr1.err" &
pid=$!
for _ in $(seq 300); do [ -s "$SCRATCH/usr1/metrics.jsonl" ] && break; sleep 0.1; done
kill -USR1 "$pid"
for _ in $(seq 100); do [ -s "$SCRATCH/usr1/my_traces/rank_0.txt" ] && break; sleep 0.1; done
kill "$pid"; wait "$pid" || true
grep -q "flight recorder (SIGUSR1)" "$SCRATCH/usr1/my_traces/rank_0.txt" ||
  fail "no SIGUSR1 trace in my_traces: $(ls -R "$SCRATCH/usr1")"
cmp <(grep "flight recorder" "$SCRATCH/usr1.err") <(grep "flight recorder" "$SCRATCH/usr1/my_traces/rank_0.txt") ||
  fail "the trace file is not the stderr dump"
echo "ok: SIGUSR1 dump in my_traces/rank_0.txt"

# metrics.save_for_all_ranks: rank 1 writes metrics_rank1.jsonl (the same all-reduced losses).
for all in false true; do
  mpirun --oversubscribe -np 2 $TITAN "${SMALL[@]}" --training.steps 2 \
    --parallelism.data_parallel_shard_degree 2 --metrics.save_for_all_ranks "$all" \
    --job.dump_folder "$SCRATCH/all_$all" >/dev/null
done
[ -e "$SCRATCH/all_false/metrics_rank1.jsonl" ] && fail "rank 1 wrote metrics without the key"
diff <(losses "$SCRATCH/all_true/metrics.jsonl") <(losses "$SCRATCH/all_true/metrics_rank1.jsonl") ||
  fail "rank 1's metrics file differs in its losses"
echo "ok: metrics.save_for_all_ranks wrote metrics_rank1.jsonl"

# metrics.disable_color_printing: on a terminal (script(1) gives one) the step line has ANSI
# colors unless disabled; piped, it never has.
ESC=$(printf '\033')
on_tty() { script -qec "$*" /dev/null; }
on_tty "$TITAN ${SMALL[*]} --training.steps 1 --job.dump_folder $SCRATCH/tty" >"$SCRATCH/tty.out"
grep "^.*step *1" "$SCRATCH/tty.out" | grep -q "$ESC\[31mstep" || fail "no color on a terminal: $(cat -v "$SCRATCH/tty.out")"
on_tty "$TITAN ${SMALL[*]} --training.steps 1 --metrics.disable_color_printing --job.dump_folder $SCRATCH/tty" >"$SCRATCH/plain.out"
grep -q "step *1" "$SCRATCH/plain.out" || fail "no step line: $(cat -v "$SCRATCH/plain.out")"
grep -q "$ESC\[" "$SCRATCH/plain.out" && fail "colors despite metrics.disable_color_printing"
$TITAN "${SMALL[@]}" --training.steps 2 --job.dump_folder "$SCRATCH/pipe" >"$SCRATCH/pipe.out"
grep -q "$ESC\[" "$SCRATCH/pipe.out" && fail "colors on a pipe"
# (One rank has no one to talk to: its log has no per-group comm lines; test_profiling reads a
# 2-rank run's.)
grep -q "^comm: .* waiting on collectives" "$SCRATCH/pipe.out" || fail "no comm summary line"
grep -q "^comm: group" "$SCRATCH/pipe.out" && fail "a 1-rank run printed comm-group lines"
# NO_COLOR set and non-empty disables colour on a terminal (no-color.org); empty, it does not.
NO_COLOR=1 on_tty "$TITAN ${SMALL[*]} --training.steps 1 --job.dump_folder $SCRATCH/tty" >"$SCRATCH/nocolor.out"
grep -q "step *1" "$SCRATCH/nocolor.out" || fail "no step line: $(cat -v "$SCRATCH/nocolor.out")"
grep -q "$ESC\[" "$SCRATCH/nocolor.out" && fail "colors despite NO_COLOR=1"
NO_COLOR= on_tty "$TITAN ${SMALL[*]} --training.steps 1 --job.dump_folder $SCRATCH/tty" >"$SCRATCH/emptync.out"
grep -q "$ESC\[31mstep" "$SCRATCH/emptync.out" || fail "an empty NO_COLOR disabled colour"
# Under mpirun a rank's stdout is a pty even when mpirun's output is redirected: no colour
# there unless FORCE_COLOR asks for it.
timeout 300 mpirun --oversubscribe -np 1 $TITAN "${SMALL[@]}" --training.steps 1 \
  --job.dump_folder "$SCRATCH/mpi_tty" >"$SCRATCH/mpi.out" 2>&1
grep -q "step *1" "$SCRATCH/mpi.out" || fail "no step line under mpirun: $(cat -v "$SCRATCH/mpi.out")"
grep -q "$ESC\[" "$SCRATCH/mpi.out" && fail "colors in mpirun's redirected output"
FORCE_COLOR=1 timeout 300 mpirun --oversubscribe -np 1 -x FORCE_COLOR $TITAN "${SMALL[@]}" \
  --training.steps 1 --job.dump_folder "$SCRATCH/mpi_tty" >"$SCRATCH/mpi_force.out" 2>&1
grep -q "$ESC\[31mstep" "$SCRATCH/mpi_force.out" ||
  fail "no colour under mpirun with FORCE_COLOR=1: $(cat -v "$SCRATCH/mpi_force.out")"
echo "ok: colored step line on a terminal only, unless disabled (NO_COLOR too); under mpirun only with FORCE_COLOR"

# training.deterministic: the cpu backend is deterministic, so it trains as without the key.
$TITAN "${SMALL[@]}" --training.steps 2 --training.deterministic --job.dump_folder "$SCRATCH/det" >/dev/null
diff <(losses "$SCRATCH/pipe/metrics.jsonl") <(losses "$SCRATCH/det/metrics.jsonl") ||
  fail "training.deterministic changed the cpu losses"
# cuda's embedding and attention backward use atomics: refused by name before the device is
# touched, so a CUDA=1 build checks it without a GPU.
TITAN_CUDA=${TITAN_CUDA:-build/cuda/titan}
if [ -x "$TITAN_CUDA" ]; then
  expect_user_error "training.deterministic: not implemented on training.device cuda" \
    "$TITAN_CUDA" "${SMALL[@]}" --training.device cuda --training.deterministic
else
  echo "skip: no $TITAN_CUDA (make CUDA=1 TITAN=build/cuda/titan) for the cuda refusal"
fi
