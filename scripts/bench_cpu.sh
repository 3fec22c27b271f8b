#!/usr/bin/env bash
# CPU training throughput, titan against PyTorch eager, in one run on the same machine:
# the `small` flavor (dim 256, 4 layers, 8 heads, 4 kv heads, vocab 2048) at seq 256, batch 8,
# both on THREADS threads (default 2), fp32. Prints tokens/s of each and their ratio.
#   scripts/bench_cpu.sh [THREADS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
steps=${2:-30}
make -s titan test-data
out=$(mktemp -d /tmp/titan-bench.XXXXXX)
trap 'rm -rf "$out"' EXIT
./titan tokenize --tokenizer bytes --out "$out/austen.bin" build/test-data/corpus/austen.txt >/dev/null

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
# titan: tokens/s over the steps after the first 10 (the first logged interval includes warmup).
OMP_NUM_THREADS=$threads ./titan --config configs/debug_model.yaml --model.flavor small \
  --training.dataset_path "$out/austen.bin" --training.seq_len 256 --training.local_batch_size 8 \
  --training.steps "$steps" --lr_scheduler.warmup_steps 5 --metrics.log_freq 10 \
  --job.dump_folder "$out/titan" | grep -E "^kernels|^model" || true
titan_tps=$(tail -n +2 "$out/titan/metrics.jsonl" | grep -o '"tokens_per_s": [0-9.e+]*' |
            awk '{ s += $2; n++ } END { printf "%.0f", s / n }')
torch_line=$(/usr/bin/python3 scripts/bench_torch.py --dim 256 --n-layers 4 --n-heads 8 \
  --n-kv-heads 4 --vocab 2048 --seq 256 --batch 8 --steps 10 --warmup 3 --threads "$threads" \
  --data "$out/austen.bin")
torch_tps=$(sed -n 's/.*torch tokens\/s: \([0-9.]*\).*/\1/p' <<<"$torch_line")
echo "titan tokens/s: $titan_tps"
echo "$torch_line"
awk -v a="$titan_tps" -v b="$torch_tps" 'BEGIN { printf "ratio titan / torch: %.2fx\n", a / b }'
