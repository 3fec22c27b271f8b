#!/usr/bin/env bash
# Validation reads the same batches every time: each validation rewinds its loader to the start
# of the set, so with unchanged weights (optimizer.lr 0: AdamW's update and its decoupled
# weight decay both scale with lr) every validation loss is bit-identical. validation.steps 2
# reads 4 of the set's thousands of windows, so a loader that went on from where the previous
# validation stopped would read other windows and give other losses.
source "$(dirname "$0")/lib.sh"

$TITAN "${SMALL[@]}" --training.local_batch_size 2 --training.steps 4 --optimizer.lr 0 \
  --validation.enable --validation.dataset_path "$DATA" --validation.freq 1 \
  --validation.steps 2 --validation.seq_len 64 --validation.local_batch_size 2 \
  --job.dump_folder "$SCRATCH/run" >/dev/null
mapfile -t l < <(losses "$SCRATCH/run/metrics.jsonl" | sed 's/"loss": //')
mapfile -t v < <(grep -o '"validation_loss": [^,}]*' "$SCRATCH/run/metrics.jsonl" | sed 's/.*: //')
echo "training losses: ${l[*]}; validation losses: ${v[*]}"
[ ${#l[@]} -eq 4 ] && [ ${#v[@]} -eq 4 ] || fail "expected 4 training and 4 validation entries"
# The training batches differ (the train loader moves on), so equal validations are not an
# accident of the data.
[ "$(printf '%s\n' "${l[@]}" | sort -u | wc -l)" -eq 4 ] || fail "training losses repeat: ${l[*]}"
[ "$(printf '%s\n' "${v[@]}" | sort -u | wc -l)" -eq 1 ] ||
  fail "validations of unchanged weights differ: ${v[*]}"
echo "ok: four validations of unchanged weights give the same loss ${v[0]}"
