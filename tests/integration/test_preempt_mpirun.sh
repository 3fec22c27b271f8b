#!/usr/bin/env bash
# Preemption under mpirun through ./run_train.sh: a plain `kill` (SIGTERM) of the launcher, as
# a scheduler sends, and a Ctrl-C (SIGINT to the launcher's whole process group, as a terminal
# sends) each end the run with a checkpoint at the step it was in and exit 0; resumed, the run's
# losses equal an uninterrupted run's bit for bit. A save left unfinished (step-K.h5.tmp) is
# removed at start with one line. A titan error through the launcher is titan's one line and
# its exit status 2, without Open MPI's banner. A SIGKILLed launcher leaves no run behind.
# run_all: alone (tests/run_all.sh): it times signals and timeouts
source "$(dirname "$0")/lib.sh"

export NPROC=2 OMP_NUM_THREADS=1
STEPS=16
run=(${SMALL[@]} --training.steps $STEPS --training.local_batch_size 1 --checkpoint.enable
     --checkpoint.interval 1000)  # only the preemption saves and the last step's

# The uninterrupted run.
start=$SECONDS
TITAN=$TITAN ./run_train.sh "${run[@]}" --job.dump_folder "$SCRATCH/whole" >"$SCRATCH/whole.out" 2>&1 ||
  fail "the uninterrupted run failed: $(tail -n 5 "$SCRATCH/whole.out")"
echo "ok: uninterrupted run of $STEPS steps in $((SECONDS - start)) s"

# wait_for SECONDS CMD...: polls CMD every 0.1 s until it succeeds; fails after SECONDS.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -lt $deadline ] || return 1; sleep 0.1; done
}
# logged_steps FILE N: FILE (a metrics.jsonl) has at least N training rows.
logged_steps() { [ -f "$1" ] && [ "$(grep -c '"step"' "$1")" -ge "$2" ]; }
# preempted OUT RC: the launcher's output OUT and status RC tell of a preemption with a saved
# checkpoint before the last step; prints its step.
preempted() {
  [ "$2" -eq 0 ] || fail "the preempted launcher exited $2: $(tail -n 5 "$1")"
  local line step
  line=$(grep "^preempted at step" "$1") || fail "no preemption line: $(tail -n 5 "$1")"
  step=$(echo "$line" | cut -d' ' -f4 | tr -d :)
  [ "$step" -lt $STEPS ] || fail "the run ended before the signal arrived: make steps longer"
  local ckpt=$SCRATCH/preempted/checkpoint/step-$step.h5
  [ "$line" = "preempted at step $step: checkpoint saved to $ckpt" ] || fail "unexpected: $line"
  [ -f "$ckpt" ] || fail "$ckpt was not written"
  echo "$step"
}

# A plain kill of the launcher once training is under way.
start=$SECONDS
TITAN=$TITAN ./run_train.sh "${run[@]}" --job.dump_folder "$SCRATCH/preempted" >"$SCRATCH/term.out" 2>&1 &
pid=$!
wait_for 60 logged_steps "$SCRATCH/preempted/metrics.jsonl" 3 ||
  fail "no third step: $(tail -n 5 "$SCRATCH/term.out")"
kill "$pid"
rc=0; wait "$pid" || rc=$?
step=$(preempted "$SCRATCH/term.out" $rc)
echo "ok: kill $pid (SIGTERM) preempted the run at step $step of $STEPS, exit 0 ($((SECONDS - start)) s)"

# An earlier save killed mid-write (not this launcher's: an mpirun SIGKILLed), and a file of
# another name that stays.
touch "$SCRATCH/preempted/checkpoint/step-2.h5.tmp" "$SCRATCH/preempted/checkpoint/notes.tmp"

# Resumed, then a Ctrl-C. Job control (set -m) gives the launcher a process group of its own,
# as a terminal's foreground job has, and the whole group gets the SIGINT, as from a terminal.
# env puts SIGINT back to its default: a background job of a script (this test under
# run_all.sh &, or nohup) starts with SIGINT ignored, and bash cannot trap what it inherits
# ignored.
set -m
TITAN=$TITAN env --default-signal=INT ./run_train.sh "${run[@]}" --job.dump_folder "$SCRATCH/preempted" \
  >"$SCRATCH/int.out" 2>&1 &
pid=$!
set +m
wait_for 60 logged_steps "$SCRATCH/preempted/metrics.jsonl" $((step + 3)) ||
  fail "no third step after the resume: $(tail -n 5 "$SCRATCH/int.out")"
kill -INT -- "-$pid"
rc=0; wait "$pid" || rc=$?
grep -q "resumed from $SCRATCH/preempted/checkpoint/step-$step.h5 at step $step" "$SCRATCH/int.out" ||
  fail "the run did not resume from step $step: $(head -n 20 "$SCRATCH/int.out")"
removed=$(grep "^checkpoint: removed" "$SCRATCH/int.out") || fail "no line about step-2.h5.tmp"
[ "$removed" = "checkpoint: removed 1 unfinished save left by an earlier run: step-2.h5.tmp" ] ||
  fail "unexpected: $removed"
[ ! -e "$SCRATCH/preempted/checkpoint/step-2.h5.tmp" ] || fail "step-2.h5.tmp is still there"
[ -e "$SCRATCH/preempted/checkpoint/notes.tmp" ] || fail "notes.tmp, not a save, was removed"
echo "ok: step-2.h5.tmp removed at start: $removed"
step=$(preempted "$SCRATCH/int.out" $rc)
echo "ok: Ctrl-C (SIGINT to the launcher's process group) preempted the run at step $step, exit 0"

TITAN=$TITAN ./run_train.sh "${run[@]}" --job.dump_folder "$SCRATCH/preempted" >"$SCRATCH/end.out" 2>&1 ||
  fail "the resumed run failed: $(tail -n 5 "$SCRATCH/end.out")"
grep -q "resumed from $SCRATCH/preempted/checkpoint/step-$step.h5 at step $step" "$SCRATCH/end.out" ||
  fail "the run did not resume from step $step"
[ "$(losses "$SCRATCH/whole/metrics.jsonl")" = "$(losses "$SCRATCH/preempted/metrics.jsonl")" ] ||
  fail "the preempted and resumed losses differ from the uninterrupted run's:
$(diff <(losses "$SCRATCH/whole/metrics.jsonl") <(losses "$SCRATCH/preempted/metrics.jsonl") | head -n 4)"
echo "ok: resumed at step $step; losses of steps 1..$STEPS equal the uninterrupted run's"

# A config error: titan's one line, exit 2.
rc=0
out=$(TITAN=$TITAN ./run_train.sh "${SMALL[@]}" --training.stepz 3 2>&1) || rc=$?
[ "$rc" -eq 2 ] || fail "a config error through run_train.sh exited $rc: $out"
[ "$out" = "titan: error: unknown option '--training.stepz' (did you mean '--training.steps'?)" ] ||
  fail "a config error through run_train.sh printed: $out"
echo "ok: a config error through run_train.sh: one line, exit 2"
expect_user_error "^run_train.sh: NPROC must be a positive number of ranks, not 'two'$" \
  env NPROC=two ./run_train.sh "${SMALL[@]}"

# A launcher killed outright (SIGKILL: nothing to pass on) takes its run with it: mpirun, in a
# session of its own, hears of it through its parent-death signal.
TITAN=$TITAN ./run_train.sh "${run[@]}" --training.steps 1000 --job.dump_folder "$SCRATCH/killed" \
  >"$SCRATCH/killed.out" 2>&1 &
pid=$!
wait_for 60 logged_steps "$SCRATCH/killed/metrics.jsonl" 1 ||
  fail "no first step: $(tail -n 5 "$SCRATCH/killed.out")"
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
alive() { pgrep -f -- "--job.dump_folder $SCRATCH/killed" >/dev/null; }
if ! wait_for 10 eval '! alive'; then
  left=$(pgrep -f -- "--job.dump_folder $SCRATCH/killed" | grep -vx $$ | xargs)
  kill $left 2>/dev/null  # not to leave them running
  fail "mpirun or a rank (pids $left) outlived its killed launcher"
fi
echo "ok: a SIGKILLed launcher's mpirun and ranks ended with it"
