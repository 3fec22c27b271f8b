#!/usr/bin/env bash
# The decoder's loss mask (TokenBatch.loss_mask: SFT's prompt tokens, torchtitan's IGNORE_INDEX
# labels), one step of the debug model through build/tests/dump_step with the first 20 targets
# of each row masked:
# - loss, logits and every gradient within 1e-5 of the float64 PyTorch reference with those
#   targets at ignore_index (check_step.py): the loss the mean over the other targets;
# - the masked targets replaced by other token ids give the same loss and gradients bit for bit;
# - and the mask changes the loss (the check above could fail).
source "$(dirname "$0")/lib.sh"

$TITAN ${SMALL[@]} --training.steps 1 --job.dump_folder "$SCRATCH/seed" \
  --checkpoint.create_seed_checkpoint >/dev/null 2>&1
seed=$SCRATCH/seed/checkpoint/step-0.h5
step() { ./build/tests/dump_step "$seed" "$DATA" 4 64 "$SCRATCH/$1.h5" "${@:2}" >/dev/null; }
step masked --mask-first 20
step garbage --mask-first 20 --garbage-masked
step whole
$PY tests/reference/check_step.py "$seed" "$SCRATCH/masked.h5" | tail -1
$PY - "$SCRATCH/masked.h5" "$SCRATCH/garbage.h5" "$SCRATCH/whole.h5" <<'PY'
import sys, h5py, numpy as np
masked, garbage, whole = (h5py.File(p, "r") for p in sys.argv[1:])
assert masked["loss"][0] == garbage["loss"][0], (masked["loss"][0], garbage["loss"][0])
differ = [k for k in masked["grad"] if not np.array_equal(masked["grad"][k][...], garbage["grad"][k][...])]
assert not differ, f"garbage masked targets change the gradients of {differ}"
assert masked["loss"][0] != whole["loss"][0], "the mask does not change the loss"
print(f"ok: garbage masked targets: the same loss ({masked['loss'][0]:.7f}) and "
      f"{len(masked['grad'])} gradients bit for bit; unmasked {whole['loss'][0]:.7f}")
PY
