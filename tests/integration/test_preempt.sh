#!/usr/bin/env bash
# Preemption under a real Slurm (tests/integration/slurm.sh): a batch job preempted mid-run
# with `scancel --signal=TERM` (what Slurm sends at preemption, and at sbatch --signal's time
# before the limit) saves a checkpoint at the step it was in and exits 0; resubmitted, it
# resumes there, and its losses equal an uninterrupted run's bit for bit. A second SIGTERM
# while the first is being honoured ends the job at once.
# run_all: alone (tests/run_all.sh): it times signals and timeouts
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/slurm.sh"

# The ranks of every job: dp_shard takes the 2 (debug_model.yaml's -1), the same layout for
# both runs, each rank saving and loading its own shards.
RANKS=2
export OMP_NUM_THREADS=$(( $(nproc) / RANKS > 0 ? $(nproc) / RANKS : 1 ))
STEPS=30
slurm_start

run=(${SMALL[@]} --training.steps $STEPS --training.local_batch_size 8 --checkpoint.enable
     --checkpoint.interval 1000)  # only the preemption save and the last step's
start=$SECONDS
srun -n $RANKS $TITAN "${run[@]}" --job.dump_folder "$SCRATCH/whole" >"$SCRATCH/whole.out" 2>&1 ||
  fail "the uninterrupted run failed: $(tail -n 5 "$SCRATCH/whole.out")"
echo "ok: uninterrupted run of $STEPS steps in $((SECONDS - start)) s"

# The user's batch script (docs/slurm.md): srun in the foreground.
cat >"$SCRATCH/job.sh" <<EOF
#!/bin/bash
#SBATCH --signal=TERM@120
srun $TITAN "\$@"
EOF

# job_state ID: JobState and ExitCode (status:signal) as slurmctld reports them.
job_state() { scontrol show job "$1" | grep -o -E '(JobState|ExitCode)=[^ ]*' | xargs; }
job_done() { ! squeue -h -j "$1" 2>/dev/null | grep -q .; }
# logged_steps FILE N: FILE (a metrics.jsonl) has N training rows.
logged_steps() { [ -f "$1" ] && [ "$(grep -c '"step"' "$1")" -ge "$2" ]; }
# titan_pid FOLDER RANK: the process of that rank of the job writing to FOLDER.
titan_pid() {
  local p
  for p in $(pgrep -x "$(basename "$TITAN")"); do
    tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "--job.dump_folder $1 " &&
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_PROCID=$2" &&
      { echo "$p"; return; }
  done
}

# Preempted once training is under way, then resubmitted.
job=(sbatch --parsable -n $RANKS -o "$SCRATCH/%j.out" "$SCRATCH/job.sh" "${run[@]}"
     --job.dump_folder "$SCRATCH/preempted")
start=$SECONDS
id=$("${job[@]}")
slurm_wait_for 300 logged_steps "$SCRATCH/preempted/metrics.jsonl" 3 ||
  fail "job $id logged no third step: $(cat "$SCRATCH/$id.out")"
scancel --signal=TERM "$id"
slurm_wait_for 300 job_done "$id" || fail "job $id still runs 300 s after SIGTERM"
[ "$(job_state "$id")" = "JobState=COMPLETED ExitCode=0:0" ] ||
  fail "preempted job $id: $(job_state "$id"): $(cat "$SCRATCH/$id.out")"
line=$(grep "^preempted at step" "$SCRATCH/$id.out") || fail "no preemption line: $(cat "$SCRATCH/$id.out")"
step=$(echo "$line" | cut -d' ' -f4 | tr -d :)
[ "$step" -lt $STEPS ] || fail "the run ended before the signal arrived: make steps longer"
ckpt=$SCRATCH/preempted/checkpoint/step-$step.h5
[ "$line" = "preempted at step $step: checkpoint saved to $ckpt" ] || fail "unexpected: $line"
[ -f "$ckpt" ] || fail "$ckpt was not written"
echo "ok: job $id preempted at step $step of $STEPS, checkpoint written, exit 0 ($((SECONDS - start)) s)"

id=$("${job[@]}")
slurm_wait_for 300 job_done "$id" || fail "resubmitted job $id still runs after 300 s"
[ "$(job_state "$id")" = "JobState=COMPLETED ExitCode=0:0" ] ||
  fail "resubmitted job $id: $(job_state "$id"): $(cat "$SCRATCH/$id.out")"
grep -q "resumed from $ckpt at step $step" "$SCRATCH/$id.out" ||
  fail "job $id did not resume from step $step: $(cat "$SCRATCH/$id.out")"
diff <(losses "$SCRATCH/whole/metrics.jsonl") <(losses "$SCRATCH/preempted/metrics.jsonl") ||
  fail "the preempted and resumed losses differ from the uninterrupted run's"
echo "ok: resubmitted job $id resumed at step $step; losses of steps 1..$STEPS equal the uninterrupted run's"

# A second SIGTERM once the first has been taken (the handler's SA_RESETHAND cleared SIGTERM
# from the rank's caught signals) ends the job at once, without waiting for the step or the
# save. Long steps (about a second) so that the second lands inside the step.
id=$(sbatch --parsable -n $RANKS -o "$SCRATCH/%j.out" "$SCRATCH/job.sh" "${run[@]}" \
       --training.steps 1000 --training.seq_len 256 --training.local_batch_size 16 \
       --job.dump_folder "$SCRATCH/twice")
slurm_wait_for 300 logged_steps "$SCRATCH/twice/metrics.jsonl" 1 ||
  fail "job $id logged no step: $(cat "$SCRATCH/$id.out")"
pid=$(titan_pid "$SCRATCH/twice" 0)
[ -n "$pid" ] || fail "no titan process of job $id"
term_caught() { (( 0x$(awk '/^SigCgt:/ {print $2}' "/proc/$pid/status") & 1 << 14 )); }
term_caught || fail "titan (pid $pid) does not catch SIGTERM"
scancel --signal=TERM "$id"
slurm_wait_for 10 eval '! term_caught' || fail "titan (pid $pid) never took the first SIGTERM"
scancel --signal=TERM "$id"
start=$SECONDS
slurm_wait_for 10 eval '! kill -0 "$pid" 2>/dev/null' || fail "titan still runs 10 s after a second SIGTERM"
elapsed=$((SECONDS - start))
slurm_wait_for 30 job_done "$id" || fail "job $id still runs after its titan ended"
state=$(job_state "$id")
[ "$state" != "JobState=COMPLETED ExitCode=0:0" ] || fail "job $id exited 0 after a second SIGTERM"
grep -q "^preempted at step" "$SCRATCH/$id.out" && fail "job $id saved despite the second SIGTERM"
[ "$elapsed" -le 2 ] || fail "titan took $elapsed s to end after a second SIGTERM"
echo "ok: a second SIGTERM ended job $id within $elapsed s: $state"

# A SIGTERM to one rank of two stops both after the same step, exit 0 (here without a
# checkpoint; the jobs above save and resume on RANKS ranks).
id=$(OMP_NUM_THREADS=1 sbatch --parsable -n 2 -o "$SCRATCH/%j.out" "$SCRATCH/job.sh" \
       "${SMALL[@]}" --training.steps 1000 --metrics.save_for_all_ranks \
       --job.dump_folder "$SCRATCH/one_rank")
slurm_wait_for 300 logged_steps "$SCRATCH/one_rank/metrics_rank1.jsonl" 2 ||
  fail "job $id logged no second step: $(cat "$SCRATCH/$id.out")"
pid=$(titan_pid "$SCRATCH/one_rank" 1)
[ -n "$pid" ] || fail "no rank 1 of job $id"
kill -TERM "$pid"
slurm_wait_for 300 job_done "$id" || fail "job $id still runs 300 s after SIGTERM to rank 1"
[ "$(job_state "$id")" = "JobState=COMPLETED ExitCode=0:0" ] ||
  fail "job $id: $(job_state "$id"): $(cat "$SCRATCH/$id.out")"
line=$(grep "^preempted at step" "$SCRATCH/$id.out") || fail "no preemption line: $(cat "$SCRATCH/$id.out")"
step=$(echo "$line" | cut -d' ' -f4 | tr -d :)
[ "$line" = "preempted at step $step: checkpoint.enable is off, nothing saved" ] ||
  fail "unexpected: $line"
for f in metrics.jsonl metrics_rank1.jsonl; do
  last=$(tail -n 1 "$SCRATCH/one_rank/$f" | grep -o '"step": [0-9]*' | cut -d' ' -f2)
  [ "$last" = "$step" ] || fail "$f ends at step $last, the job stopped at $step"
done
echo "ok: a SIGTERM to rank 1 of job $id stopped both ranks after step $step, exit 0"
