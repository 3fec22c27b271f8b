#!/usr/bin/env bash
# Every parallel layout on one GPU: its ranks share the GPU through host-staged MPI (comm.backend:
# mpi, parallel/comm_staged.c; NCCL takes one rank per GPU), 10 steps of the debug model in fp32
# compute, each layout's losses and grad norms against the same layout on cpu within 1e-5 relative
# at every step; dp_shard 2, pp 2 1F1B and cp 2 alltoall again in bf16 against cpu's fp32 within
# the 3e-2 the 1-GPU bf16 run meets (tests/gpu/test_train_cuda.sh). The layouts: dp_shard 2, HSDP
# 2x2, DDP 2, tp 2 (loss parallel), pp 2 under 1F1B, ZBVZeroBubble and DualPipeV, cp 2 under
# allgather and alltoall with document masking, ep 2 (Qwen3 small_moe), FSDP's float8 all-gather
# on 2 ranks (bf16's tolerance: float8 rounds), FLUX dp_shard 2 on the digits, and pp 2 x dp_shard
# 2 x cp 2 x tp 2 on 16 ranks. Prints one row per run and a table at the end. The digits' shards
# come from the GPU bundle (.gpu/data/digits, scripts/gpu_bundle.sh), or are made here by
# scripts/flux_preprocess.py when Debian's python3 with scikit-learn is at hand.
#
# Usage: tests/gpu/test_layouts_cuda.sh [DIR] (after `make CUDA=1`; on a machine with 16+ cores):
# runs and logs go to DIR (kept), else to a scratch folder removed at exit. Exits 0, or 1 naming
# the layouts that failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
TITAN=./titan
if [ $# -gt 0 ]; then
  RUNS=$1
  mkdir -p "$RUNS"
else
  RUNS=$(mktemp -d /tmp/titan-layouts-cuda.XXXXXX)
  trap 'rm -rf "$RUNS"' EXIT
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$TITAN" ] || fail "$TITAN not found: build it with make CUDA=1"

# The repository's text as byte tokens; its paragraphs as JSONL documents for document masking
# (a trained 512-token BPE, whose end-of-text token ends each document).
TEXT=(README.md docs/*.md)
$TITAN tokenize --tokenizer bytes --out "$RUNS/text.bin" "${TEXT[@]}" >/dev/null
cat "${TEXT[@]}" >"$RUNS/text.txt"
$TITAN tokenizer train --vocab-size 512 --out "$RUNS/tok.tiktoken" "$RUNS/text.txt" >/dev/null
awk 'BEGIN { RS = "" } {
       gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, " "); gsub(/\n/, "\\n")
       printf "{\"text\": \"%s\"}\n", $0 }' "$RUNS/text.txt" >"$RUNS/docs.jsonl"
$TITAN tokenize --tokenizer "$RUNS/tok.tiktoken" --out "$RUNS/docs.bin" "$RUNS/docs.jsonl" \
  >/dev/null

DIGITS=.gpu/data/digits
if [ ! -d "$DIGITS" ]; then
  DIGITS=$RUNS/digits
  /usr/bin/python3 scripts/flux_preprocess.py --digits --out "$DIGITS" >/dev/null ||
    fail "no FLUX digits: neither .gpu/data/digits nor scripts/flux_preprocess.py's python"
fi

RUN=(--config configs/debug_model.yaml --model.tokenizer_path null
     --training.dataset_path "$RUNS/text.bin" --training.seq_len 64 --training.global_batch_size 8
     --training.steps 10 --lr_scheduler.warmup_steps 2 --metrics.log_freq 1)
DOCS=(--model.tokenizer_path "$RUNS/tok.tiktoken" --training.dataset_path "$RUNS/docs.bin"
      --training.document_masking)
FLUX=(--config configs/flux_digits.yaml --training.dataset_path "$DIGITS" --training.steps 10
      --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --checkpoint.enable false)
FP32=(--training.mixed_precision_param float32)
P=--parallelism

rows=()
failed=()

# train NAME NP DEVICE ARGS...: one mpirun of the model $BASE names (RUN, or FLUX); its dump
# folder and log under $RUNS.
train() {
  local name=$1 np=$2 device=$3 comm=()
  local -n base=${BASE:-RUN}
  shift 3
  [ "$device" = cuda ] && comm=(--comm.backend mpi)
  timeout 300 mpirun --oversubscribe -np "$np" $TITAN "${base[@]}" --device "$device" \
    "${comm[@]}" "$@" --job.dump_folder "$RUNS/$name" >"$RUNS/$name.log" 2>&1
}

# compare NAME REF RUN TOL: losses and grad norms of RUN against REF, 10 steps each.
compare() {
  paste <(grep -o '"loss": [^,]*\|"grad_norm": [^,]*' "$RUNS/$2/metrics.jsonl" | cut -d' ' -f2) \
        <(grep -o '"loss": [^,]*\|"grad_norm": [^,]*' "$RUNS/$3/metrics.jsonl" | cut -d' ' -f2) |
    awk -v name="$1" -v tol="$4" '
      { r = $1 < 0 ? -$1 : $1; d = ($2 - $1) / (r > 1e-30 ? r : 1e-30); d = d < 0 ? -d : d
        if (d > worst) worst = d }
      END {
        ok = NR == 20 && worst <= tol
        printf "%-52s %s worst %.2e (bound %g, %d values)\n", name, ok ? "ok  " : "FAIL", worst, tol, NR
        exit !ok
      }'
}

# layout NAME NP BF16 ARGS...: the layout on cpu (fp32) and on cuda (fp32, and bf16 when BF16 is
# 1), each cuda run against the cpu run.
layout() {
  local name=$1 np=$2 bf16=$3; shift 3
  local start=$SECONDS row
  if ! train "$name.cpu" "$np" cpu "${FP32[@]}" "$@"; then
    tail -n 5 "$RUNS/$name.cpu.log" >&2
    rows+=("$(printf '%-52s FAIL (cpu run failed)' "$name")"); failed+=("$name"); return
  fi
  local variants=(fp32) tol
  [ "$bf16" = 1 ] && variants+=(bf16)
  for v in "${variants[@]}"; do
    local args=("${FP32[@]}") tol=1e-5
    [ "$v" = bf16 ] && args=() tol=3e-2
    [ -n "${TOL:-}" ] && [ "$v" = fp32 ] && tol=$TOL
    if ! train "$name.cuda_$v" "$np" cuda "${args[@]}" "$@"; then
      tail -n 5 "$RUNS/$name.cuda_$v.log" >&2
      rows+=("$(printf '%-52s FAIL (cuda run failed)' "$name, cuda $v")"); failed+=("$name $v")
      continue
    fi
    if row=$(compare "$name, cuda $v" "$name.cpu" "$name.cuda_$v" "$tol"); then :; else
      failed+=("$name $v"); fi
    rows+=("$row")
    echo "$row ($((SECONDS - start)) s)"
  done
}

layout "dp_shard=2" 2 1 $P.data_parallel_shard_degree 2 --training.local_batch_size 4
layout "hsdp=2x2" 4 0 $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 2 \
  --training.local_batch_size 2
layout "ddp=2" 2 0 $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 1 \
  --training.local_batch_size 4
layout "tp=2 (loss parallel)" 2 0 $P.tensor_parallel_degree 2 $P.data_parallel_shard_degree 1 \
  --training.local_batch_size 8
for schedule in 1F1B ZBVZeroBubble DualPipeV; do
  layout "pp=2 $schedule" 2 "$([ $schedule = 1F1B ] && echo 1 || echo 0)" \
    $P.pipeline_parallel_degree 2 $P.pipeline_parallel_schedule "$schedule" \
    $P.pipeline_parallel_microbatch_size 2 $P.data_parallel_shard_degree 1 \
    --training.local_batch_size 8
done
for rotate in allgather alltoall; do
  layout "cp=2 $rotate, document masking" 2 "$([ $rotate = alltoall ] && echo 1 || echo 0)" \
    "${DOCS[@]}" $P.context_parallel_degree 2 $P.context_parallel_rotate_method "$rotate" \
    $P.data_parallel_shard_degree 1 --training.local_batch_size 8
done
layout "ep=2 (qwen3 small_moe)" 2 0 --model.name qwen3 --model.flavor small_moe \
  $P.expert_parallel_degree 2 $P.data_parallel_shard_degree 2 --training.local_batch_size 4
TOL=3e-2 layout "dp_shard=2 float8 all-gather" 2 0 --model.converters float8 \
  --float8.filter_fqns output --float8.enable_fsdp_float8_all_gather \
  $P.data_parallel_shard_degree 2 --training.local_batch_size 4
BASE=FLUX layout "flux dp_shard=2" 2 0 $P.data_parallel_shard_degree 2 \
  --training.local_batch_size 4
layout "pp=2 x dp_shard=2 x cp=2 x tp=2 (16 ranks)" 16 0 $P.pipeline_parallel_degree 2 \
  $P.data_parallel_shard_degree 2 $P.context_parallel_degree 2 $P.tensor_parallel_degree 2 \
  $P.context_parallel_rotate_method alltoall $P.pipeline_parallel_schedule 1F1B \
  $P.pipeline_parallel_microbatch_size 1 --training.local_batch_size 4

echo "== layouts on one GPU (comm.backend mpi) against cpu"
printf '%s\n' "${rows[@]}"
[ ${#failed[@]} -eq 0 ] || fail "${#failed[@]} layout runs: ${failed[*]}"
echo "ok: every layout on one GPU matches cpu"
