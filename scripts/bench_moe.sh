#!/usr/bin/env bash
# Mixture of experts on cpu, in two parts:
# (a) training throughput of the MoE flavor (--model.flavor debugmodel_moe, or what MOE_ARGS
#     says) against the dense debugmodel at the same seq and batch: tokens/s over the steps
#     after the first logged interval (which includes warmup). Skipped, with the reason, while
#     titan does not accept the flavor (models/moe is built beside this script).
# (b) the grouped GEMM against its limit, by build/tests/bench_grouped_matmul
#     (tests/reference/bench_grouped_matmul.c): an expert projection's forward, input and weight
#     gradient GEMMs, each as kernels_backend("cpu")->grouped_matmul, as a loop of sgemms over
#     experts with OpenBLAS's threads inside each, as an OpenMP loop over experts of
#     single-threaded sgemms (the two the op chose between), and as ONE sgemm of the same
#     total size (the limit), with balanced and Zipf-skewed routing, at debugmodel_moe-like
#     shapes (8 experts, dim 256, hidden 768, 2048 tokens x 8 routed rows) and
#     DeepSeek-V2-Lite-like ones (64 experts, dim 512, hidden 1408, 4096 tokens x 6).
#   scripts/bench_moe.sh [THREADS] [STEPS]   (default 2 and 30)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2} steps=${2:-30}
read -r -a moe_args <<<"${MOE_ARGS:---model.flavor debugmodel_moe}"
make -s titan build/tests/bench_grouped_matmul
out=$(mktemp -d /tmp/titan-bench-moe.XXXXXX)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=$threads
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, OMP_NUM_THREADS=$threads"
./titan tokenize --tokenizer bytes --out "$out/austen.bin" ../shared/data/corpus/austen.txt >/dev/null

train_tps() {  # name, model overrides...: prints tokens/s, or returns 1 with the log in $out/name.log
  local name=$1; shift
  ./titan --config configs/debug_model.yaml "$@" --training.dataset_path "$out/austen.bin" \
    --training.seq_len 256 --training.local_batch_size 8 --training.steps "$steps" \
    --lr_scheduler.warmup_steps 5 --metrics.log_freq 10 --job.dump_folder "$out/$name" \
    >"$out/$name.log" 2>&1 || return 1
  tail -n +2 "$out/$name/metrics.jsonl" | grep -o '"tokens_per_s": [0-9.e+]*' |
    awk '{ s += $2; n++ } END { printf "%.0f", s / n }'
}

echo
echo "## (a) training, seq 256 x batch 8"
if moe=$(train_tps moe "${moe_args[@]}"); then
  dense=$(train_tps dense --model.flavor debugmodel) || { tail -n 5 "$out/dense.log"; exit 1; }
  grep -E "^kernels|^model" "$out/moe.log" || true
  echo "MoE (${moe_args[*]}) tokens/s: $moe; dense debugmodel tokens/s: $dense"
elif grep -q "flavor" "$out/moe.log"; then
  echo "skipped: titan does not accept ${moe_args[*]} yet: $(grep -m1 error "$out/moe.log")"
else
  tail -n 5 "$out/moe.log"; exit 1
fi

echo
echo "## (b) grouped GEMM, GFLOP/s (best of repeated calls)"
./build/tests/bench_grouped_matmul describe
echo
echo "| GEMM | grouped_matmul | OpenBLAS threads per expert | OpenMP over experts |" \
  "one sgemm (limit) | grouped / one |"
echo "|---|---|---|---|---|---|"
for routing in balanced skewed; do
  ./build/tests/bench_grouped_matmul 8 256 768 2048 8 "$routing"
  ./build/tests/bench_grouped_matmul 64 512 1408 4096 6 "$routing"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
