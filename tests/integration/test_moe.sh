#!/usr/bin/env bash
# Qwen3's MoE (models/moe in the decoder's blocks), titan's small_moe shape (8 experts, top 2):
# - auxiliary-loss-free load balancing: from a skewed start (a seed checkpoint whose expert
#   biases send every token to experts 0 and 1: the busiest expert at E / k = 4 times the mean;
#   0.12 is above the spread of the softmax scores over 50 steps from qwen3's N(0, 0.02) router,
#   which 0.08 is not, and the update closes it at 2 coeff a step, in 30 steps)
#   the step's max / mean expert load falls to about 2 within 50 steps with the bias update
#   (model.moe_load_balance_coeff 2e-3; the rest of the way is the noise of 256 tokens a step
#   whose router scores start nearly equal) and stays at 4 with a negligible one (1e-9);
# - the expert bias is checkpointed: a run resumed at step 25 continues bit-identically,
#   expert load included;
# - the expert load and the balance loss are in the JSONL.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1

run=(${SMALL[@]} --model.name qwen3 --model.flavor small_moe --lr_scheduler.warmup_steps 2
     --optimizer.lr 3e-4)
seed_dir=$SCRATCH/seed
$TITAN "${run[@]}" --checkpoint.enable --checkpoint.create_seed_checkpoint \
  --job.dump_folder "$seed_dir" >/dev/null
seed=$seed_dir/checkpoint/step-0.h5
$PY - "$seed" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    for name in ("layers.0.moe.expert_bias_E", "layers.1.moe.expert_bias_E"):
        bias = f["model"][name]
        bias[...] = [0.12, 0.12, 0, 0, 0, 0, 0, 0]
PY

balance() {  # name, coeff, more args
  local name=$1 coeff=$2; shift 2
  $TITAN "${run[@]}" --training.steps 50 --checkpoint.initial_load_path "$seed" \
    --model.moe_load_balance_coeff "$coeff" --job.dump_folder "$SCRATCH/$name" "$@" >/dev/null
}
balance on 2e-3
balance off 1e-9
$PY - "$SCRATCH/on/metrics.jsonl" "$SCRATCH/off/metrics.jsonl" <<'PY'
import json, sys
on, off = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
assert len(on) == len(off) == 50, (len(on), len(off))
last10 = lambda rows: sum(r["expert_load_max"] for r in rows[-10:]) / 10
first_on, last_on, first_off, last_off = on[0]["expert_load_max"], last10(on), \
    off[0]["expert_load_max"], last10(off)
print(f"max/mean expert load, step 1 -> mean of steps 41-50: balanced {first_on:.2f} -> "
      f"{last_on:.2f}, unbalanced {first_off:.2f} -> {last_off:.2f}")
assert first_on == first_off == 4.0, "the skewed start is not every token on experts 0 and 1"
assert last_on < 2.5, f"the bias update did not balance the load ({last_on})"
assert all(r["expert_load_max"] == 4.0 for r in off), "the load moved without the bias update"
assert all("aux_loss" not in r for r in on), "aux_loss reported without a balance loss"
PY

# The biases are state: resuming at step 25 (the step-50 file removed) continues the
# balanced run bit for bit.
balance resumed 2e-3 --checkpoint.enable --checkpoint.interval 25
rm "$SCRATCH/resumed/checkpoint/step-50.h5"
balance resumed 2e-3 --checkpoint.enable --checkpoint.interval 25
$PY - "$SCRATCH/on/metrics.jsonl" "$SCRATCH/resumed/metrics.jsonl" <<'PY'
import json, sys
on, resumed = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
keys = ("loss", "grad_norm", "expert_load_max", "expert_load_mean")
for a, b in zip(on, resumed):
    for k in keys:
        assert a[k] == b[k], f"step {a['step']} {k}: {a[k]!r} resumed as {b[k]!r}"
assert len(resumed) == 50
print("ok: resumed at step 25, bit-identical to step 50")
PY

# The balance loss: reported apart from the loss, positive, and it balances too.
$TITAN "${run[@]}" --training.steps 3 --model.moe_aux_loss_alpha 0.01 \
  --job.dump_folder "$SCRATCH/aux" >/dev/null
$PY - "$SCRATCH/aux/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert all(0 < r["aux_loss"] < 0.01 * 4 for r in rows), rows
print("ok: aux_loss", [round(r["aux_loss"], 5) for r in rows])
PY
echo "ok: test_moe"
