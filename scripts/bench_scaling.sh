#!/usr/bin/env bash
# Scaling on one 2-core machine: the `small` flavor (seq 256, batch 8 per step in total) on
# 1 rank x 2 threads, against 2 ranks x 1 thread with dp_shard=2 (FSDP) and with tp=2 (tensor
# + sequence parallel), in one run. Prints tokens/s per device, total tokens/s, and the share of
# training time each rank 0 spent waiting on collectives.
#   scripts/bench_scaling.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
make -s titan test-data
out=$(mktemp -d /tmp/titan-scaling.XXXXXX)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
./titan tokenize --tokenizer bytes --out "$out/data" build/test-data/corpus/austen.txt >/dev/null
common=(--config configs/debug_model.yaml --model.flavor small --model.tokenizer_path null
        --training.dataset_path "$out/data" --training.seq_len 256 --training.global_batch_size 8
        --training.steps "$steps" --lr_scheduler.warmup_steps 5 --metrics.log_freq 5)

report() {  # name, log, dump folder, devices
  local tps share
  tps=$(tail -n +2 "$3/metrics.jsonl" | grep -o '"tokens_per_s": [0-9.e+]*' |
        awk '{ s += $2; n++ } END { printf "%.0f", s / n }')
  share=$(sed -n 's/.*waiting on collectives (\(.*%\)).*/\1/p' "$2")
  printf "%-26s tokens/s per device %7d   total %7d   comm wait %s\n" "$1" "$tps" \
    "$((tps * $4))" "${share:-0%}"
}

OMP_NUM_THREADS=2 ./titan "${common[@]}" --training.local_batch_size 8 \
  --job.dump_folder "$out/one" >"$out/one.log"
report "1 rank x 2 threads" "$out/one.log" "$out/one" 1
OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 ./titan "${common[@]}" --training.local_batch_size 4 \
  --parallelism.data_parallel_shard_degree 2 --job.dump_folder "$out/fsdp" >"$out/fsdp.log" 2>&1
report "2 ranks x 1, dp_shard=2" "$out/fsdp.log" "$out/fsdp" 2
OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 ./titan "${common[@]}" --training.local_batch_size 8 \
  --parallelism.data_parallel_shard_degree 1 --parallelism.tensor_parallel_degree 2 \
  --job.dump_folder "$out/tp" >"$out/tp.log" 2>&1
report "2 ranks x 1, tp=2" "$out/tp.log" "$out/tp" 2
