#!/usr/bin/env bash
# Checkpoints: a run resumed from its step-6 checkpoint continues bit-exactly like the
# uninterrupted run (model, AdamW moments, step, data position all restored); the file is a
# plain HDF5 view (h5py reads global-shaped tensors and the attributes); no temporary file is
# left behind; keep_latest_k and enable_first_step_checkpoint behave as torchtitan's, and so do
# exclude_from_loading (each of its three states) and initial_load_model_only false.
source "$(dirname "$0")/lib.sh"

run=(${SMALL[@]} --training.steps 12 --checkpoint.enable --checkpoint.interval 6)
$TITAN "${run[@]}" --job.dump_folder "$SCRATCH/full" >/dev/null
# The interrupted run: the same job with only its step-6 checkpoint left.
mkdir -p "$SCRATCH/part/checkpoint"
cp "$SCRATCH/full/checkpoint/step-6.h5" "$SCRATCH/part/checkpoint/"
$TITAN "${run[@]}" --job.dump_folder "$SCRATCH/part" >"$SCRATCH/part.log"
grep -q "resumed from .*step-6.h5 at step 6" "$SCRATCH/part.log" ||
  fail "the second run did not resume from step 6"

diff <(losses "$SCRATCH/full/metrics.jsonl" | tail -n 6) <(losses "$SCRATCH/part/metrics.jsonl") ||
  fail "the resumed run's losses differ from the uninterrupted run's"
cmp <(h5dump -d /model/norm.weight "$SCRATCH/full/checkpoint/step-12.h5" | tail -n +2) \
    <(h5dump -d /model/norm.weight "$SCRATCH/part/checkpoint/step-12.h5" | tail -n +2) ||
  fail "final weights differ after resume"
ls "$SCRATCH/full/checkpoint" | grep -q tmp && fail "a temporary checkpoint file was left"

# The same command again after the run finished (a second `make run`, a requeued job): one line
# saying so, exit 0, the folder and the metrics untouched.
before=$(ls -l --time-style=full-iso "$SCRATCH/full" "$SCRATCH/full/checkpoint" | md5sum)
$TITAN "${run[@]}" --job.dump_folder "$SCRATCH/full" >"$SCRATCH/again.log" 2>&1 ||
  fail "running the finished job again failed: $(tail -n 3 "$SCRATCH/again.log")"
grep -q "checkpoint: .*/step-12.h5 is at training.steps 12: this run has finished, nothing to train" \
  "$SCRATCH/again.log" || fail "the finished run is not recognised: $(cat "$SCRATCH/again.log")"
[ "$(ls -l --time-style=full-iso "$SCRATCH/full" "$SCRATCH/full/checkpoint" | md5sum)" = "$before" ] ||
  fail "running the finished job again changed its folder"
echo "ok: the finished job run again says so and exits 0"
# Finished is said of this job only: another job's settings in its folder are still refused.
expect_user_error "full/checkpoint/step-12.h5 was written with training.seq_len 64, this run has 32" \
  $TITAN "${run[@]}" --job.dump_folder "$SCRATCH/full" --training.seq_len 32

# The step-6 file is a full training state; the last one holds the model only
# (checkpoint.last_save_model_only, true by default as in torchtitan).
$PY - "$SCRATCH/full/checkpoint/step-6.h5" "$SCRATCH/full/checkpoint/step-12.h5" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r")
assert f["model/tok_embeddings.weight"].shape == (2048, 256)
assert f["model/layers.5.feed_forward.w1.weight"].shape == (768, 256)
assert f["optimizer/exp_avg_sq/output.weight"].shape == (2048, 256)
assert f.attrs["step"] == 6 and f.attrs["optimizer_step"] == 6
assert f.attrs["data_windows_consumed"] == 6 * 4
assert "training:" in f.attrs["config"]
last = h5py.File(sys.argv[2], "r")
assert "optimizer" not in last and last.attrs["step"] == 12
print("ok: h5py reads", len(f["model"]), "model tensors")
PY

# Retention: every 2 steps with keep_latest_k 2 leaves only the two newest; a first-step
# checkpoint is written when asked.
$TITAN "${SMALL[@]}" --training.steps 8 --checkpoint.enable --checkpoint.interval 2 \
  --checkpoint.keep_latest_k 2 --job.dump_folder "$SCRATCH/keep" >/dev/null
[ "$(ls "$SCRATCH/keep/checkpoint")" = "$(printf 'step-6.h5\nstep-8.h5')" ] ||
  fail "keep_latest_k 2 left: $(ls "$SCRATCH/keep/checkpoint" | xargs)"
$TITAN "${SMALL[@]}" --training.steps 3 --checkpoint.enable --checkpoint.interval 10 \
  --checkpoint.enable_first_step_checkpoint --job.dump_folder "$SCRATCH/first" >/dev/null
[ -f "$SCRATCH/first/checkpoint/step-1.h5" ] || fail "no first-step checkpoint"

# checkpoint.exclude_from_loading: a resume from step 6 leaving the data loader fresh reads
# from the first window again (its step-12 file counts 6 steps of windows, not 12); leaving
# the LR schedule fresh restarts its warmup (step 7's lr is the uninterrupted run's step 1's);
# leaving the optimizer fresh starts AdamW from zero moments and step 0 even though the file
# holds them: from step 8 its losses leave the uninterrupted run's and equal those of a resume
# of the same file with its /optimizer deleted, and its step-12 file counts 6 AdamW steps;
# a state titan does not save is refused in one line.
mkdir -p "$SCRATCH/model-only/checkpoint"
cp "$SCRATCH/full/checkpoint/step-6.h5" "$SCRATCH/model-only/checkpoint/"
$PY -c 'import h5py, sys; del h5py.File(sys.argv[1], "r+")["optimizer"]' \
  "$SCRATCH/model-only/checkpoint/step-6.h5"
$TITAN "${run[@]}" --checkpoint.exclude_from_loading optimizer \
  --job.dump_folder "$SCRATCH/model-only" >/dev/null
for state in dataloader lr_scheduler optimizer; do
  mkdir -p "$SCRATCH/no-$state/checkpoint"
  cp "$SCRATCH/full/checkpoint/step-6.h5" "$SCRATCH/no-$state/checkpoint/"
  $TITAN "${run[@]}" --checkpoint.last_save_model_only false \
    --checkpoint.exclude_from_loading "$state" --job.dump_folder "$SCRATCH/no-$state" >/dev/null
done
$PY - "$SCRATCH" <<'PY'
import h5py, json, sys
s = sys.argv[1]
assert h5py.File(f"{s}/no-dataloader/checkpoint/step-12.h5", "r").attrs["data_windows_consumed"] == 6 * 4
lr = lambda p: {r["step"]: r["lr"] for r in map(json.loads, open(p)) if "lr" in r}
full, fresh = lr(f"{s}/full/metrics.jsonl"), lr(f"{s}/no-lr_scheduler/metrics.jsonl")
assert fresh[7] == full[1] and fresh[12] == full[6], (fresh, full)
loss = lambda p: [r["loss"] for r in map(json.loads, open(p)) if "loss" in r]
full, fresh = loss(f"{s}/full/metrics.jsonl")[6:], loss(f"{s}/no-optimizer/metrics.jsonl")
assert fresh[0] == full[0] and all(a != b for a, b in zip(fresh[1:], full[1:])), (fresh, full)
assert fresh == loss(f"{s}/model-only/metrics.jsonl"), fresh
assert h5py.File(f"{s}/no-optimizer/checkpoint/step-12.h5", "r").attrs["optimizer_step"] == 6
print("ok: exclude_from_loading dataloader restarts the data, lr_scheduler the schedule, "
      "optimizer AdamW")
PY
# initial_load_model_only false: a new run starts from another run's whole state, as a resume.
$TITAN "${run[@]}" --checkpoint.initial_load_path "$SCRATCH/full/checkpoint/step-6.h5" \
  --checkpoint.initial_load_model_only false --job.dump_folder "$SCRATCH/whole" >/dev/null
diff <(losses "$SCRATCH/full/metrics.jsonl" | tail -n 6) <(losses "$SCRATCH/whole/metrics.jsonl") ||
  fail "initial_load_model_only false did not continue the run from step 6"
echo "ok: initial_load_model_only false continues another run's state bit-exactly"
expect_user_error "checkpoint.exclude_from_loading: 'model' is not a state titan saves" \
  $TITAN "${run[@]}" --checkpoint.exclude_from_loading model --job.dump_folder "$SCRATCH/part"
