#!/usr/bin/env bash
# Convergence smoke test: the debug model on real text (six Austen novels, byte tokens) must
# bring the loss from above 7 (chance over its 2048 ids is ln 2048 = 7.62) to below 3.0 within
# 60 steps of 8 x 128 tokens; the mean of the last 5 logged losses is used to avoid judging on
# one noisy batch.
source "$(dirname "$0")/lib.sh"

$TITAN "${SMALL[@]}" --training.seq_len 128 --training.local_batch_size 8 --training.steps 60 \
  --lr_scheduler.warmup_steps 10 --job.dump_folder "$SCRATCH/run" >/dev/null
mapfile -t l < <(losses "$SCRATCH/run/metrics.jsonl" | sed 's/"loss": //')
first=${l[0]}
last=$(printf '%s\n' "${l[@]: -5}" | awk '{ s += $1 } END { print s / NR }')
echo "loss: step 1 $first, mean of steps 56-60 $last"
awk -v f="$first" -v l="$last" 'BEGIN { exit !(f > 7.0 && l < 3.0) }' ||
  fail "loss did not fall from > 7 to < 3.0 (got $first -> $last)"
