#!/usr/bin/env bash
# The GPU speed benchmark (issue 33's reference), on one GPU: four of Llama 3 8B's layers
# (flavor 8B_4L, B=1, T=8192: dim 4096, FFN 14336, 32 heads, 8 KV heads, with the whole
# training state on the GPU, no FSDP) and the 1B flavor (B=4, T=2048), each in bf16 mixed
# precision and in float8 tensorwise and rowwise, no activation checkpointing. For each run:
# tokens/s, TFLOP/s, MFU against the GPU's dense bf16 peak (its kept row in
# kernels/device_table.c, named), peak memory, the step time `titan --estimate --device-table
# probe` predicts (rates measured on this GPU now) beside the measured one, and a profiled
# step's time by op class (scripts/trace_breakdown.py). First it prints the probed device row,
# the figures to keep in kernels/device_table.c with the date.
#
# Usage: scripts/bench_gpu.sh [OUT_DIR] (default /tmp/titan-bench-gpu; TITAN=path for another
# build, DEVICE=cpu to try it on a cpu with tiny sizes: SMOKE=1). About 4 minutes on an H100.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-/tmp/titan-bench-gpu}
TITAN=${TITAN:-./titan}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT_DIR"
# Tokens wrap around (data/shard.h): any text of a few KB will do.
"$TITAN" tokenize --tokenizer bytes --out "$OUT_DIR/text.bin" README.md train/*.c core/*.c >/dev/null

STEPS=12  # steps 1-10 warm up and are logged; step 12 is profiled alone
COMMON=(--device "$DEVICE" --config configs/debug_model.yaml --model.tokenizer_path null
        --training.dataset_path "$OUT_DIR/text.bin" --activation_checkpoint.mode none
        --training.steps "$STEPS" --lr_scheduler.warmup_steps 2 --metrics.log_freq 10
        --training.mixed_precision_param bfloat16)
MODELS=("8B_4L:1:8192" "1B:4:2048")
if [ "${SMOKE:-0}" = 1 ]; then MODELS=("debugmodel:2:256"); fi
PRECISIONS=("bf16:" "tensorwise:--model.converters float8 --float8.recipe_name tensorwise --float8.filter_fqns output"
            "rowwise:--model.converters float8 --float8.recipe_name rowwise --float8.filter_fqns output")

printf '%-10s %-10s %10s %9s %7s %9s %11s %11s  %s\n' model precision tokens/s TFLOP/s MFU% "mem GiB" \
  "step ms" "predicted" "profiled step by op class" | tee "$OUT_DIR/table.txt"
first=1
for model in "${MODELS[@]}"; do
  IFS=: read -r flavor B T <<<"$model"
  for precision in "${PRECISIONS[@]}"; do
    name=${precision%%:*}
    read -r -a extra <<<"${precision#*:}"
    args=("${COMMON[@]}" --model.flavor "$flavor" --training.local_batch_size "$B"
          --training.seq_len "$T" "${extra[@]}")
    run="$OUT_DIR/$flavor-$name"
    # A row that fails says so and the table goes on.
    "$TITAN" --estimate "${args[@]}" --device-table probe >"$run.estimate.txt" 2>&1 ||
      echo "$flavor $name: the estimate failed, see $run.estimate.txt"
    if [ "$first" = 1 ]; then grep '^device:' "$run.estimate.txt" || true; first=0; fi
    predicted=$(sed -n 's/^step time: \([^ ]*\) s predicted.*/\1/p' "$run.estimate.txt")
    "$TITAN" "${args[@]}" --job.dump_folder "$run" --profiling.enable_profiling \
      --profiling.profile_freq "$STEPS" --profiling.profiler_warmup 0 \
      --profiling.profiler_active 1 >"$run.log" 2>&1 || { echo "$flavor $name: failed, see $run.log"; continue; }
    last=$(grep '"step": 10,' "$run/metrics.jsonl" || true)
    [ -n "$last" ] || { echo "$flavor $name: no step 10 in $run/metrics.jsonl"; continue; }
    field() { printf '%s\n' "$last" | grep -o "\"$1\": [^,}]*" | cut -d' ' -f2; }
    tokens=$(field tokens_per_s)
    step_ms=$(awk -v t="$tokens" -v n=$((B * T)) 'BEGIN { printf "%.1f", 1000 * n / t }')
    breakdown=$(python3 scripts/trace_breakdown.py "$run/profile_traces/iteration_$STEPS/rank0_trace.json" 2>&1 || true)
    printf '%-10s %-10s %10.0f %9.1f %7.1f %9.1f %11s %11s  %s\n' "$flavor" "$name" "$tokens" \
      "$(field tflops)" "$(field mfu)" "$(field peak_memory_gib)" "$step_ms" \
      "$(awk -v s="${predicted:-nan}" 'BEGIN { printf "%.1f", 1000 * s }')" "${breakdown#*: }" |
      tee -a "$OUT_DIR/table.txt"
  done
done
grep -h "MFU is against\|peak_flops" "$OUT_DIR"/*.log 2>/dev/null | sort -u | head -2 || true
