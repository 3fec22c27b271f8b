#!/usr/bin/env bash
# Mixture of experts on cpu, in two parts:
# (a) training throughput of qwen3's debugmodel_moe (64 experts of width 768, top 8) against a
#     dense model of the same ACTIVE parameters per token: debugmodel_moe_dense, the same
#     attention, norms and untied embeddings with one SwiGLU FFN of width 8 x 768 = 6144, so
#     a token's FFN multiplies the same 3 x 256 x 6144 weights either way; only the router's
#     (64, 256) gate is extra (0.2% of the FLOPs). titan's FLOPs per token (6 x active weights
#     + attention, from the metrics: TFLOP/s over tokens/s) are printed for both. A run's
#     tokens/s is the mean over its logged intervals after the first (which includes warmup),
#     and each model's the best of REPEATS runs (default 2) taken in turn with the other's,
#     against the load of a shared machine (printed before and after); the ratio
#     MoE / dense is what routing, the sort and permutations and the 64 smaller grouped GEMMs
#     cost against one large GEMM of the same FLOPs. The OpenBLAS kernels are the run's
#     "kernels:" line.
# (b) the grouped GEMM against its limit, by build/tests/bench_grouped_matmul
#     (tests/reference/bench_grouped_matmul.c): an expert projection's forward, input and weight
#     gradient GEMMs, each as kernels_backend("cpu")->grouped_matmul, as a loop of sgemms over
#     experts with OpenBLAS's threads inside each, as an OpenMP loop over experts of
#     single-threaded sgemms (the two the op chose between), and as ONE sgemm of the same
#     total size (the limit), with balanced and Zipf-skewed routing, at debugmodel_moe-like
#     shapes (8 experts, dim 256, hidden 768, 2048 tokens x 8 routed rows) and
#     DeepSeek-V2-Lite-like ones (64 experts, dim 512, hidden 1408, 4096 tokens x 6).
#   scripts/bench_moe.sh [THREADS] [STEPS]   (default 2 and 6: a benchmark, not part of make test;
#   debugmodel_moe's 300M parameters at seq 256 x batch 2 take about 4 s a step on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2} steps=${2:-6} repeats=${REPEATS:-2}
make -s titan build/tests/bench_grouped_matmul test-data
out=$(mktemp -d /tmp/titan-bench-moe.XXXXXX)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=$threads
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, OMP_NUM_THREADS=$threads"
./titan tokenize --tokenizer bytes --out "$out/austen.bin" build/test-data/corpus/austen.txt >/dev/null

# name, flavor: trains it, leaving $out/name.log and $out/name/metrics.jsonl.
train() {
  rm -rf "${out:?}/$1"
  ./titan --config configs/debug_model.yaml --model.name qwen3 --model.flavor "$2" \
    --model.tokenizer_path null --training.dataset_path "$out/austen.bin" \
    --training.seq_len 256 --training.local_batch_size 2 --training.steps "$steps" \
    --lr_scheduler.warmup_steps 2 --metrics.log_freq 2 --job.dump_folder "$out/$1" \
    >"$out/$1.log" 2>&1 || { tail -n 5 "$out/$1.log"; exit 1; }
}
# name: "tokens/s FLOPs/token" over the logged intervals after the first.
throughput() {
  tail -n +2 "$out/$1/metrics.jsonl" | tr -d '{}",' |
    awk '{ for (i = 1; i < NF; i++) { if ($i == "tokens_per_s:") t = $(i + 1)
                                      if ($i == "tflops:") f = $(i + 1) }
           s += t; n++; flops = f * 1e12 / t }
         END { printf "%.1f %.4g", s / n, flops }'
}
# "tokens/s FLOPs/token" a and b: the one of higher tokens/s.
best() { printf '%s\n%s\n' "$1" "$2" | sort -g -r | head -n 1; }

echo
echo "## (a) training, seq 256 x batch 2, $steps steps, best of $repeats runs each"
moe="0 0" dense="0 0"
for ((r = 0; r < repeats; r++)); do
  train moe debugmodel_moe
  moe=$(best "$moe" "$(throughput moe)")
  train dense debugmodel_moe_dense
  dense=$(best "$dense" "$(throughput dense)")
done
read -r moe_tps moe_flops <<<"$moe"
read -r dense_tps dense_flops <<<"$dense"
echo "$(grep '^kernels' "$out/moe.log")"
echo
echo "| model | FLOPs/token | tokens/s | TFLOP/s |"
echo "|---|---|---|---|"
for m in "debugmodel_moe $moe_flops $moe_tps" "debugmodel_moe_dense $dense_flops $dense_tps"; do
  read -r name flops tps <<<"$m"
  awk -v n="$name" -v f="$flops" -v t="$tps" \
    'BEGIN { printf "| %s | %.4g | %.1f | %.3f |\n", n, f, t, f * t / 1e12 }'
done
awk -v m="$moe_tps" -v d="$dense_tps" -v fm="$moe_flops" -v fd="$dense_flops" \
  'BEGIN { printf "MoE / dense: tokens/s %.3f, FLOPs per token %.4f\n", m / d, fm / fd }'

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
