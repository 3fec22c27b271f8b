#!/usr/bin/env bash
# The cuda backend end to end: the small flavor trained for 20 steps on the repository's own
# text (README.md and the C sources, as a byte-token shard) on cpu in fp32 compute (the
# reference; cpu's own bf16 path is tests/integration/test_bf16.sh's), on cuda in fp32 compute and
# on cuda in bf16 compute (the default). The fp32 run must match the cpu losses within 1e-3
# relative at every step, the bf16 run within 3e-2 (bf16 rounding of every GEMM and attention
# operand), and each run's loss must fall. A bf16 run resumed from its step-10 checkpoint
# (saved from device memory through host copies, loaded back the same way) continues within
# 1e-3 of the uninterrupted run (not bit for bit: the embedding backward's atomics). `titan
# generate --device cuda` (weights and KV cache on the GPU) continues a prompt from the bf16
# run's last checkpoint with the same 24 greedy ids as the cpu backend. QLoRA (NF4 weights
# dequantized at each GEMM) in fp32 compute matches its cpu run within 1e-3, and resumes on
# cuda from its step-10 checkpoint within 1e-3. Also: with no visible device, --device cuda
# exits 2 with one line.
#
# Usage: tests/gpu/test_train_cuda.sh [DIR] (after `make CUDA=1`): the runs' dump folders and
# logs go to DIR (kept), else to a scratch folder removed at exit. Exits 0, or 1 naming what
# failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
TITAN=./titan
if [ $# -gt 0 ]; then
  RUNS=$1
  mkdir -p "$RUNS"
else
  RUNS=$(mktemp -d /tmp/titan-train-cuda.XXXXXX)
  trap 'rm -rf "$RUNS"' EXIT
fi
STEPS=20
FP32_TOL=1e-3
BF16_TOL=3e-2

fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$TITAN" ] || fail "$TITAN not found: build it with make CUDA=1"

DATA=$RUNS/repo.bin
$TITAN tokenize --tokenizer bytes --out "$DATA" README.md train/*.c core/*.c data/*.c \
  models/llama3/*.c kernels/cpu/*.c >/dev/null

SMALL=(--config configs/debug_model.yaml --model.flavor small --model.tokenizer_path null
       --training.dataset_path "$DATA" --training.seq_len 64 --training.local_batch_size 4
       --training.steps "$STEPS" --metrics.log_freq 1)

# No device: one line on stderr, exit 2 (a user error, not a crash).
err=$(CUDA_VISIBLE_DEVICES="" $TITAN --device cuda "${SMALL[@]}" \
      --job.dump_folder "$RUNS/no_device" 2>&1 >/dev/null) && rc=0 || rc=$?
[ "$rc" -eq 2 ] || fail "--device cuda without a device: expected exit 2, got $rc ($err)"
[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] ||
  fail "--device cuda without a device: expected one line, got: $err"
echo "ok: no device -> exit 2: $err"

train() {  # name, extra args...
  local name=$1; shift
  local start=$SECONDS
  if ! $TITAN "${SMALL[@]}" --job.dump_folder "$RUNS/$name" "$@" >"$RUNS/$name.log" 2>&1; then
    tail -n 20 "$RUNS/$name.log" >&2
    fail "training $name ($*) failed"
  fi
  echo "ok: trained $name in $((SECONDS - start)) s"
}
train cpu --device cpu --training.mixed_precision_param float32
train cuda_fp32 --device cuda --training.mixed_precision_param float32
train cuda_bf16 --device cuda --checkpoint.enable --checkpoint.interval 10
mkdir -p "$RUNS/cuda_resumed/checkpoint"
cp "$RUNS/cuda_bf16/checkpoint/step-10.h5" "$RUNS/cuda_resumed/checkpoint/"
train cuda_resumed --device cuda --checkpoint.enable --checkpoint.interval 10
QLORA=(--training.mixed_precision_param float32 --model.converters lora --lora.quantize_base)
train qlora_cpu --device cpu "${QLORA[@]}"
train qlora_cuda --device cuda "${QLORA[@]}" --checkpoint.enable --checkpoint.interval 10
mkdir -p "$RUNS/qlora_resumed/checkpoint"
cp "$RUNS/qlora_cuda/checkpoint/step-10.h5" "$RUNS/qlora_resumed/checkpoint/"
train qlora_resumed --device cuda "${QLORA[@]}" --checkpoint.enable --checkpoint.interval 10

losses() { grep -o '"loss": [^,]*' "$RUNS/$1/metrics.jsonl" | cut -d' ' -f2; }

echo "step  cpu                  cuda fp32            cuda bf16"
paste <(losses cpu) <(losses cuda_fp32) <(losses cuda_bf16) |
  awk '{ printf "%4d  %-20.15g %-20.15g %-20.15g\n", NR, $1, $2, $3 }'

# within NAME TOL [REF]: NAME's loss within TOL relative of REF's (cpu's) at each of the STEPS
# steps.
within() {
  paste <(losses "${3:-cpu}") <(losses "$1") | awk -v name="$1" -v tol="$2" -v steps="$STEPS" \
    -v ref="${3:-cpu}" '
    BEGIN { worst = 0; at = 1 }
    { d = ($2 - $1) / $1; d = d < 0 ? -d : d; if (d > worst) { worst = d; at = NR } }
    END {
      if (NR != steps) { printf "FAIL: %s logged %d steps, expected %d\n", name, NR, steps; exit 1 }
      printf "%s: %s relative to %s, worst %.3g at step %d (bound %g)\n",
             worst <= tol ? "ok" : "FAIL", name, ref, worst, at, tol
      exit worst > tol
    }'
}

# falls NAME: the last loss below 0.8 of the first (the cpu run goes from ~8.1 to ~4).
falls() {
  losses "$1" | awk -v name="$1" '
    NR == 1 { first = $1 } { last = $1 }
    END {
      printf "%s: %s loss %.4f -> %.4f\n", last < 0.8 * first ? "ok" : "FAIL", name, first, last
      exit !(last < 0.8 * first)
    }'
}

# resumed RUN RESUMED: the resumed run's steps 11.. against the same steps of the uninterrupted
# one.
resumed() {
  paste <(losses "$1" | tail -n +11) <(losses "$2") | awk -v steps=$((STEPS - 10)) -v name="$2" '
    { d = ($2 - $1) / $1; d = d < 0 ? -d : d; if (d > worst) worst = d }
    END {
      ok = NR == steps && worst <= 1e-3
      printf "%s: %s at step 10, %d steps, worst %.3g relative (bound 1e-3)\n",
             ok ? "ok" : "FAIL", name, NR, worst
      exit !ok
    }'
}

# Greedy decoding of the same checkpoint on both backends (fp32 compute): the same ids.
generated() {  # device
  $TITAN generate --checkpoint "$RUNS/cuda_bf16/checkpoint/step-$STEPS.h5" --prompt-ids 10,20,30 \
    --max-new-tokens 24 --temperature 0 --device "$1" 2>"$RUNS/generate_$1.log"
}
status=0
cpu_ids=$(generated cpu) || { tail -n 3 "$RUNS/generate_cpu.log"; status=1; }
cuda_ids=$(generated cuda) || { tail -n 3 "$RUNS/generate_cuda.log"; status=1; }
if [ -n "$cpu_ids" ] && [ "$cpu_ids" = "$cuda_ids" ]; then
  echo "ok: generate --device cuda gives cpu's greedy ids: $cuda_ids"
else
  echo "FAIL: generate: cpu '$cpu_ids', cuda '$cuda_ids'"
  status=1
fi
resumed cuda_bf16 cuda_resumed || status=1
resumed qlora_cuda qlora_resumed || status=1  # the NF4 blobs downloaded, saved, uploaded
within cuda_fp32 "$FP32_TOL" || status=1
within cuda_bf16 "$BF16_TOL" || status=1
within qlora_cuda "$FP32_TOL" qlora_cpu || status=1  # the NF4 weights dequantized on the GPU
for run in cpu cuda_fp32 cuda_bf16; do falls "$run" || status=1; done
[ "$status" -eq 0 ] || fail "cuda training does not match cpu"
echo "ok: cuda training matches cpu (fp32 within $FP32_TOL, bf16 within $BF16_TOL) and learns"
