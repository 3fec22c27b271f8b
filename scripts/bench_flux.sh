#!/usr/bin/env bash
# FLUX training throughput on the bundled digits: images/s and TFLOP/s of a flavor (default
# flux-debug, its in/out channels, T5 and CLIP widths and sequence taken from the digits'
# shards: 1 + 8 text + 64 image rows per sample) on 1 rank x 2 threads and on 2 ranks x 1
# thread with dp_shard=2 (FSDP), the same global batch. Steps after the first are averaged.
#   scripts/bench_flux.sh [FLAVOR] [STEPS] [GLOBAL_BATCH]
set -euo pipefail
cd "$(dirname "$0")/.."
flavor=${1:-flux-debug} steps=${2:-5} batch=${3:-8}
make -s titan
out=$(mktemp -d /tmp/titan-bench-flux.XXXXXX)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
/usr/bin/python3 scripts/flux_preprocess.py --digits --out "$out/digits" >/dev/null
common=(--config configs/flux_digits.yaml --model.flavor "$flavor" --training.dataset_path
        "$out/digits" --training.global_batch_size "$batch" --training.steps "$steps"
        --metrics.log_freq 1 --checkpoint.enable false)

report() {  # name, dump folder, log, devices
  local rows
  rows=$(sed -n 's/.*batch [0-9]* x \([0-9]*\) tokens.*/\1/p' "$3")
  tail -n +2 "$2/metrics.jsonl" | /usr/bin/python3 -c '
import json, sys
name, rows, devices = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = [json.loads(l) for l in sys.stdin if "tokens_per_s" in l]
tps = sum(x["tokens_per_s"] for x in r) / len(r)
tf = sum(x["tflops"] for x in r) / len(r)
print(f"{name:28s} images/s {tps * devices / rows:8.2f}   TFLOP/s per device {tf:.4f}")
' "$1" "$rows" "$4"
}

OMP_NUM_THREADS=2 ./titan "${common[@]}" --training.local_batch_size "$batch" \
  --job.dump_folder "$out/one" >"$out/one.log"
report "$flavor 1 rank x 2 threads" "$out/one" "$out/one.log" 1
OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 ./titan "${common[@]}" \
  --training.local_batch_size $((batch / 2)) --parallelism.data_parallel_shard_degree 2 \
  --job.dump_folder "$out/fsdp" >"$out/fsdp.log" 2>&1
report "$flavor 2 ranks, dp_shard=2" "$out/fsdp" "$out/fsdp.log" 2
