#!/usr/bin/env bash
# Checkpoints: a run resumed from its step-6 checkpoint continues bit-exactly like the
# uninterrupted run (model, AdamW moments, step, data position all restored); the file is a
# plain HDF5 view (h5py reads global-shaped tensors and the attributes); no temporary file is
# left behind; keep_latest_k and enable_first_step_checkpoint behave as torchtitan's.
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
