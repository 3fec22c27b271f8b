#!/usr/bin/env bash
# Parity with PyTorch (tests/reference): on the same HDF5 weights and token batch, titan's loss,
# logits and every parameter gradient match a float64 reference within 1e-5 relative; and 20
# AdamW steps with warmup, cosine decay, clipping and gradient accumulation give the losses of
# torch.optim.AdamW + LambdaLR within 1e-4 relative at every step. The `small` flavor is used
# for its grouped-query attention (8 heads, 4 kv heads); one more step check covers Llama 3.1
# RoPE scaling and tied embeddings. Qwen3's `small` (QK-norm, heads of head_dim 32 where
# dim / n_heads is 16, untied) gets the step and training checks, and a tied one the step check:
# the reference reads the architecture from each checkpoint. Qwen3's `small_moe` (8 experts, top
# 2, softmax router with route norm): the step check, again with expert biases that send every
# token to experts 1 and 4 (six experts without a token in each layer), and the training check
# twice, both with the aux-loss-free bias updates (torchtitan's 1e-3; 1e-2 with the sequence-wise
# balance loss, alpha 0.01, whose value titan logs is checked too); without the updates the
# reference's losses leave the bound by step 3.
source "$(dirname "$0")/lib.sh"

run=(${SMALL[@]} --model.flavor small --job.dump_folder "$SCRATCH/run" --training.steps 20
     --training.global_batch_size 8 --lr_scheduler.warmup_steps 5 --lr_scheduler.decay_type cosine
     --lr_scheduler.decay_ratio 0.6 --lr_scheduler.min_lr_factor 0.1 --training.max_norm 0.5)
$TITAN "${run[@]}" --checkpoint.create_seed_checkpoint
seed=$SCRATCH/run/checkpoint/step-0.h5

./build/tests/dump_step "$seed" "$DATA" 4 64 "$SCRATCH/dump.h5"
$PY tests/reference/check_step.py "$seed" "$SCRATCH/dump.h5"

# The same check for Llama 3.1 RoPE scaling and tied embeddings.
$TITAN "${run[@]}" --model.rope_scaling --model.tie_word_embeddings --checkpoint.create_seed_checkpoint \
  --job.dump_folder "$SCRATCH/variant"
./build/tests/dump_step "$SCRATCH/variant/checkpoint/step-0.h5" "$DATA" 2 64 "$SCRATCH/variant.h5"
$PY tests/reference/check_step.py "$SCRATCH/variant/checkpoint/step-0.h5" "$SCRATCH/variant.h5"

$TITAN "${run[@]}" --checkpoint.initial_load_path "$seed"
$PY tests/reference/check_train.py "$seed" "$SCRATCH/run/metrics.jsonl"

# Qwen3: the same checks, the reference built from the checkpoint's head_dim and qk_norm.
qwen=("${run[@]}" --model.name qwen3 --model.flavor small)
$TITAN "${qwen[@]}" --checkpoint.create_seed_checkpoint --job.dump_folder "$SCRATCH/qwen3"
qseed=$SCRATCH/qwen3/checkpoint/step-0.h5
./build/tests/dump_step "$qseed" "$DATA" 4 64 "$SCRATCH/qwen3.h5"
$PY tests/reference/check_step.py "$qseed" "$SCRATCH/qwen3.h5"
$TITAN "${qwen[@]}" --model.tie_word_embeddings --checkpoint.create_seed_checkpoint \
  --job.dump_folder "$SCRATCH/qwen3-tied"
./build/tests/dump_step "$SCRATCH/qwen3-tied/checkpoint/step-0.h5" "$DATA" 2 64 "$SCRATCH/qwen3-tied.h5"
$PY tests/reference/check_step.py "$SCRATCH/qwen3-tied/checkpoint/step-0.h5" "$SCRATCH/qwen3-tied.h5"
$TITAN "${qwen[@]}" --checkpoint.initial_load_path "$qseed" --job.dump_folder "$SCRATCH/qwen3-run"
$PY tests/reference/check_train.py "$qseed" "$SCRATCH/qwen3-run/metrics.jsonl"

# Qwen3 MoE: the same checks, the reference's MoE layer built from the checkpoint's moe_* shape.
moe=("${run[@]}" --model.name qwen3 --model.flavor small_moe)
$TITAN "${moe[@]}" --checkpoint.create_seed_checkpoint --job.dump_folder "$SCRATCH/moe"
mseed=$SCRATCH/moe/checkpoint/step-0.h5
./build/tests/dump_step "$mseed" "$DATA" 4 64 "$SCRATCH/moe.h5"
$PY tests/reference/check_step.py "$mseed" "$SCRATCH/moe.h5"
cp "$mseed" "$SCRATCH/moe-skewed.h5"
$PY - "$SCRATCH/moe-skewed.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    for layer in (0, 1):
        f["model"][f"layers.{layer}.moe.expert_bias_E"][...] = [0, 0.5, 0, 0, 0.5, 0, 0, 0]
PY
./build/tests/dump_step "$SCRATCH/moe-skewed.h5" "$DATA" 2 64 "$SCRATCH/moe-skewed-dump.h5"
out=$($PY tests/reference/check_step.py "$SCRATCH/moe-skewed.h5" "$SCRATCH/moe-skewed-dump.h5") ||
  { echo "$out"; fail "MoE step with idle experts"; }
grep -q "per MoE layer: \[6, 6\]" <<<"$out" || { echo "$out"; fail "the skewed biases left no expert idle"; }
tail -1 <<<"$out"
$TITAN "${moe[@]}" --checkpoint.initial_load_path "$mseed" --job.dump_folder "$SCRATCH/moe-run"
$PY tests/reference/check_train.py "$mseed" "$SCRATCH/moe-run/metrics.jsonl"
aux=("${moe[@]}" --model.moe_aux_loss_alpha 0.01 --model.moe_load_balance_coeff 1e-2)
$TITAN "${aux[@]}" --checkpoint.create_seed_checkpoint --job.dump_folder "$SCRATCH/moe-aux"
$TITAN "${aux[@]}" --checkpoint.initial_load_path "$SCRATCH/moe-aux/checkpoint/step-0.h5" \
  --job.dump_folder "$SCRATCH/moe-aux-run"
$PY tests/reference/check_train.py "$SCRATCH/moe-aux/checkpoint/step-0.h5" \
  "$SCRATCH/moe-aux-run/metrics.jsonl"
