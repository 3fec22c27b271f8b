#!/usr/bin/env bash
# The GPU check, on a machine with one GPU: builds titan and the GPU tests with CUDA=1, runs
# every cuda op against the cpu backend (tests/gpu/test_cuda_ops, in bf16 and in fp32
# compute), trains on cuda against cpu (tests/gpu/test_train_cuda.sh), runs every parallel layout
# on the one GPU against cpu (tests/gpu/test_layouts_cuda.sh), then benchmarks four of the 8B's
# layers and the 1B flavor in bf16 and float8 (scripts/bench_gpu.sh: tokens/s, TFLOP/s, MFU,
# the predicted step time beside the measured, a profiled step by op class). Each part runs under timeout, all
# of them within 9.5 minutes (the benchmarks get what the tests leave); a failed part does not
# stop the next. Ends with a PASS/FAIL line
# per part and exits non-zero if any failed.
#
# On a GPU machine without titan's host libraries, run `scripts/gpu_bundle.sh pack` on a machine
# with them first and bring .gpu/ along: this script then unpacks that bundle instead of building.
#
# Usage: scripts/gpu_check.sh. Outputs (the op tables, every log, the benchmark's dump folder)
# are written under $OUT/gpu_check when OUT is set (the GPU machine's output folder), else
# under /tmp/titan-gpu-check.
set -euo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:+$OUT/gpu_check}
LOGS=${LOGS:-/tmp/titan-gpu-check}
mkdir -p "$LOGS"
DEADLINE=$((SECONDS + 555))  # 9.5 minutes, less timeout's kill grace and the summary

names=()
results=()
record() { names+=("$1"); results+=("$2"); }

# part NAME CAP CMD...: CMD under timeout, at most CAP seconds and never past DEADLINE; its
# output to the terminal and to $LOGS/NAME.log.
part() {
  local name=$1 cap=$2; shift 2
  local left=$((DEADLINE - SECONDS)) start=$SECONDS rc
  local limit=$((cap < left ? cap : left))
  echo "== $name (limit $limit s)"
  if [ "$limit" -le 0 ]; then
    record "$name" "FAIL (no time left)"
    return
  fi
  set +e
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  local took=$((SECONDS - start))
  case $rc in
    0) record "$name" "PASS ($took s)" ;;
    77) record "$name" "FAIL (skipped: no usable GPU, $took s)" ;;
    124 | 137) record "$name" "FAIL (timed out after $took s)" ;;
    *) record "$name" "FAIL (exit $rc, $took s)" ;;
  esac
  echo "== $name: ${results[-1]}"
}

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader |
    tee "$LOGS/gpu.txt" || true
fi

if [ -d .gpu ]; then
  part unpack 60 bash scripts/gpu_bundle.sh unpack
  export PATH="$PWD/.gpu/path:$PATH"  # the bundle's mpirun
else
  part build 240 make -j16 CUDA=1 gpu
fi
part ops_bf16 90 build/cuda/tests/test_cuda_ops
part ops_fp32 90 build/cuda/tests/test_cuda_ops fp32
part train_cuda 120 bash tests/gpu/test_train_cuda.sh "$LOGS/train_cuda"
part layouts_cuda 240 bash tests/gpu/test_layouts_cuda.sh "$LOGS/layouts_cuda"
part bench_gpu 240 bash scripts/bench_gpu.sh "$LOGS/bench_gpu"

failed=0
for result in "${results[@]}"; do
  case $result in FAIL*) failed=$((failed + 1)) ;; esac
done
{
  echo "== summary (outputs in $LOGS)"
  for i in "${!names[@]}"; do printf '%-12s %s\n' "${names[$i]}" "${results[$i]}"; done
  if [ "$failed" -eq 0 ]; then echo "gpu_check: PASS"
  else echo "gpu_check: FAIL ($failed of ${#names[@]} parts)"; fi
} | tee "$LOGS/summary.txt"
[ "$failed" -eq 0 ]
