#!/usr/bin/env bash
# The weights' exponential moving average (training.ema_decay, issue 16). A 2-rank FSDP run
# starts from a seed checkpoint (step 0) and saves every step; each step's /ema datasets equal,
# bit for bit, the average recomputed in float32 from the saved weights: ema_0 = w_0,
# ema_k = ema_{k-1} + (1 - decay) (w_k - ema_{k-1}). Resharded: a 1-rank run resumes the
# 2-rank step-3 file, and its step-4 average is the 2-rank step-3 average updated with its own
# step-4 weights, bit for bit, and within 1e-5 of the 2-rank step 4. convert --ema writes the
# average as the Hugging Face weights; generate --ema reads it; a file without one is refused
# in one line; decay 0 keeps none, with unchanged losses.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
run=(${SMALL[@]} --training.steps 4 --lr_scheduler.warmup_steps 2 --training.global_batch_size 8
     --checkpoint.enable --checkpoint.interval 1 --checkpoint.keep_latest_k 0)
EMA=(--training.ema_decay 0.75)
DP2=(--training.local_batch_size 4 --parallelism.data_parallel_shard_degree 2)

$TITAN "${run[@]}" --checkpoint.create_seed_checkpoint --job.dump_folder "$SCRATCH/two" >/dev/null
train_ranks two 2 "${run[@]}" "${DP2[@]}" "${EMA[@]}"
train_ranks off 2 "${run[@]}" "${DP2[@]}" --checkpoint.interval 4
diff <(losses "$SCRATCH/two/metrics.jsonl") <(losses "$SCRATCH/off/metrics.jsonl") ||
  fail "keeping an average changed the losses"
$PY -c 'import h5py, sys; assert "ema" not in h5py.File(sys.argv[1], "r")' \
  "$SCRATCH/off/checkpoint/step-4.h5" || fail "training.ema_decay 0 saved an average"

# The 2-rank step-3 file, resumed on one rank for step 4.
mkdir -p "$SCRATCH/one/checkpoint"
cp "$SCRATCH/two/checkpoint/step-3.h5" "$SCRATCH/one/checkpoint/"
train_ranks one 1 "${run[@]}" --training.local_batch_size 8 "${EMA[@]}"
grep -q "resumed from .*step-3.h5 at step 3" "$SCRATCH/one.log" || fail "did not resume at step 3"

$PY - "$SCRATCH" 0.75 <<'PY'
import sys
import h5py, numpy as np
scratch, decay = sys.argv[1], float(sys.argv[2])
weight = np.float32(1 - decay)
def tensors(path, group):
    with h5py.File(path, "r") as f:
        return {name: f[group][name][()] for name in f[group]}
def step(run, k, group):
    return tensors(f"{scratch}/{run}/checkpoint/step-{k}.h5", group)
def update(ema, w):  # the kernel's lerp, in float32
    return {n: (ema[n] + weight * (w[n] - ema[n])).astype(np.float32) for n in ema}
ema = step("two", 0, "model")
assert len(ema) > 10, sorted(ema)
with h5py.File(f"{scratch}/two/checkpoint/step-0.h5", "r") as f:
    assert "ema" not in f, "the seed checkpoint has an average"
for k in range(1, 5):
    ema = update(ema, step("two", k, "model"))
    saved = step("two", k, "ema")
    assert saved.keys() == ema.keys(), (sorted(saved), sorted(ema))
    for n in ema:
        assert np.array_equal(saved[n], ema[n]), \
            f"step {k} {n}: max |diff| {np.abs(saved[n] - ema[n]).max()}"
w4 = step("two", 4, "model")
moved = max(float(np.abs(ema[n] - w4[n]).max()) for n in ema)
assert moved > 1e-4, f"the average is the weights: {moved}"
# Resharded: the 1-rank run's step 4 from the 2-rank step-3 average and its own weights.
resumed = update(step("two", 3, "ema"), step("one", 4, "model"))
one = step("one", 4, "ema")
for n in one:
    assert np.array_equal(one[n], resumed[n]), f"resumed {n}: {np.abs(one[n] - resumed[n]).max()}"
    scale = float(np.abs(ema[n]).max())
    assert np.abs(one[n] - ema[n]).max() <= 1e-5 * scale, f"1 rank vs 2 at step 4: {n}"
print(f"ok: the average of {len(ema)} tensors equals the float32 recurrence over steps 0-4 "
      f"(dp_shard 2) bit for bit, {moved:.2e} from the weights; resharded to 1 rank it carries on")
PY

# convert --ema: the average as the HF weights (back to titan: /model == the /ema datasets).
ck=$SCRATCH/two/checkpoint/step-4.h5
$TITAN convert --to hf --ema "$ck" "$SCRATCH/hf" >/dev/null
$TITAN convert --to titan "$SCRATCH/hf" "$SCRATCH/back.h5" >/dev/null
$PY - "$ck" "$SCRATCH/back.h5" <<'PY'
import sys
import h5py, numpy as np
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    for n in a["ema"]:
        assert np.array_equal(a["ema"][n][()], b["model"][n][()]), n
print("ok: convert --ema writes the average as the weights")
PY
# generate --ema reads the average (the same loader as convert's): it runs, and continues as the
# converted file's weights do.
gen() {
  $TITAN generate --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0 --ids "$@" 2>/dev/null
}
[ "$(gen --checkpoint "$ck" --ema)" = "$(gen --checkpoint "$SCRATCH/back.h5")" ] ||
  fail "generate --ema does not read the average"
expect_user_error "holds no average of the weights \(/ema\)" \
  $TITAN generate --checkpoint "$SCRATCH/two/checkpoint/step-0.h5" --prompt-ids 1 --ema
expect_user_error "holds no average of the weights \(/ema\)" \
  $TITAN convert --to hf --ema "$SCRATCH/two/checkpoint/step-0.h5" "$SCRATCH/none"
echo "ok: test_ema"
