#!/usr/bin/env bash
# Parity with PyTorch (tests/reference): on the same HDF5 weights and token batch, titan's loss,
# logits and every parameter gradient match a float64 reference within 1e-5 relative; and 20
# AdamW steps with warmup, cosine decay, clipping and gradient accumulation give the losses of
# torch.optim.AdamW + LambdaLR within 1e-4 relative at every step. The `small` flavor is used
# for its grouped-query attention (8 heads, 4 kv heads); one more step check covers Llama 3.1
# RoPE scaling and tied embeddings. Qwen3's `small` (QK-norm, heads of head_dim 32 where
# dim / n_heads is 16, untied) gets the step and training checks, and a tied one the step check:
# the reference reads the architecture from each checkpoint.
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
