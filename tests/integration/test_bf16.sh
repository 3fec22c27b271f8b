#!/usr/bin/env bash
# bf16 mixed precision on the cpu backend (training.mixed_precision_param: bfloat16, the
# default): GEMMs on bf16-rounded inputs with fp32 accumulation, as cuda computes them. 30
# steps of the debug model must track the fp32 run at every step: loss within 2e-3 relative,
# grad norm within 2e-2 (measured on an AMX Xeon: 2e-4 and 5e-3; bf16 keeps 8 significant bits,
# a relative rounding of up to 2^-9 on every GEMM operand, and the grad norm sums squares of
# gradients that each carry it), yet differ from it (the bf16 path really ran). The same for:
# the exact emulation oneDNN-less cpus run (DNNL_MAX_CPU_ISA=AVX2 hides oneDNN's bf16
# kernels), also checked op by op by test_bf16_gemm; a 2-rank FSDP run, which all-gathers bf16
# weights as torchtitan's MixedPrecisionPolicy (norms and embeddings too, so it is not the
# 1-rank bf16 run: measured 1e-3 and 8e-3 from fp32); a 2-rank tensor parallel run, whose
# sequence-parallel gathers move the bf16 activations the GEMMs read (half fp32's bytes: checked
# exactly against the fp32 run's tp counter); and the MoE model's grouped GEMMs.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
BF16=(--training.mixed_precision_param bfloat16)
RUN=("${SMALL[@]}" --training.steps 30 --training.global_batch_size 8)
MOE=("${RUN[@]}" --model.name qwen3 --model.flavor small_moe --training.steps 20)

# tracks NAME REFERENCE RUN: RUN's losses and grad norms against REFERENCE's, step by step.
tracks() {
  $PY - "$@" <<'PY'
import json, sys
name, ref, run = sys.argv[1], *([json.loads(l) for l in open(p)] for p in sys.argv[2:4])
bounds = {"loss": 2e-3, "grad_norm": 2e-2}
assert [r["step"] for r in run] == [r["step"] for r in ref], f"{name}: steps differ"
worst = {}
for key, bound in bounds.items():
    errs = [abs(b[key] - a[key]) / abs(a[key]) for a, b in zip(ref, run)]
    worst[key] = max(errs)
    at = errs.index(worst[key])
    assert worst[key] <= bound, f"{name}: {key} at step {ref[at]['step']}: {run[at][key]!r} " \
        f"vs fp32 {ref[at][key]!r}, {worst[key]:.1e} relative (bound {bound})"
assert worst["loss"] > 1e-7, f"{name}: the losses equal fp32's: bf16 compute did not run"
print(f"ok: {name:32s} {len(run)} steps, worst loss {worst['loss']:.1e}, "
      f"grad norm {worst['grad_norm']:.1e} relative to fp32")
PY
}

train_ranks fp32 1 "${RUN[@]}"
train_ranks bf16 1 "${RUN[@]}" "${BF16[@]}"
grep -q "^kernels: bf16 compute: oneDNN [0-9.]* bf16 matmul (.*), attention's bf16 tiles on " "$SCRATCH/bf16.log" ||
  fail "the log does not name the bf16 GEMMs: $(grep '^kernels:' "$SCRATCH/bf16.log")"
grep -q "^kernels: .*fp32 GEMMs: oneDNN [0-9.]* sgemm ([a-z0-9_]*)$" "$SCRATCH/fp32.log" &&
  grep -q "^kernels: attention's tiles: titan's fp32 kernels$" "$SCRATCH/fp32.log" ||
  fail "the log does not name the fp32 GEMMs: $(grep '^kernels:' "$SCRATCH/fp32.log")"
tracks "1 rank, oneDNN" "$SCRATCH/fp32/metrics.jsonl" "$SCRATCH/bf16/metrics.jsonl"

DNNL_MAX_CPU_ISA=AVX2 train_ranks emulated 1 "${RUN[@]}" "${BF16[@]}"
grep -q 'bf16 compute: bf16-rounded inputs through sgemm' "$SCRATCH/emulated.log" ||
  fail "the emulated run's log: $(grep '^kernels:' "$SCRATCH/emulated.log")"
tracks "1 rank, emulated" "$SCRATCH/fp32/metrics.jsonl" "$SCRATCH/emulated/metrics.jsonl"
DNNL_MAX_CPU_ISA=AVX2 build/tests/test_bf16_gemm >"$SCRATCH/emulated_ops.log" 2>&1 ||
  fail "test_bf16_gemm under the emulation: $(tail -n 5 "$SCRATCH/emulated_ops.log")"
echo "ok: test_bf16_gemm under the emulation"

train_ranks fsdp 2 "${RUN[@]}" "${BF16[@]}" --parallelism.data_parallel_shard_degree 2
tracks "2 ranks FSDP, bf16 all-gather" "$SCRATCH/fp32/metrics.jsonl" "$SCRATCH/fsdp/metrics.jsonl"

train_ranks moe_fp32 1 "${MOE[@]}"
train_ranks moe_bf16 1 "${MOE[@]}" "${BF16[@]}"
tracks "1 rank MoE, grouped GEMMs" "$SCRATCH/moe_fp32/metrics.jsonl" \
  "$SCRATCH/moe_bf16/metrics.jsonl"

# TP: the normed rows (2 per layer and the head's, forward) and the output gradients (2 per
# layer, backward) are gathered in bf16. debugmodel: 6 layers, dim 256; 128 rows a rank; 2
# microbatches a step.
TP=(--parallelism.tensor_parallel_degree 2)
train_ranks tp_fp32 2 "${RUN[@]}" "${TP[@]}"
train_ranks tp 2 "${RUN[@]}" "${BF16[@]}" "${TP[@]}"
tracks "2 ranks TP, bf16 gathers" "$SCRATCH/fp32/metrics.jsonl" "$SCRATCH/tp/metrics.jsonl"
tp_bytes() { sed -n 's/^comm: group tp .* \([0-9]*\) bytes.*/\1/p' "$1"; }
saved=$(( $(tp_bytes "$SCRATCH/tp_fp32.log") - $(tp_bytes "$SCRATCH/tp.log") ))
expected=$(( 30 * 2 * (4 * 6 + 1) * 128 * 256 * 2 ))
[ "$saved" -eq "$expected" ] ||
  fail "tp bytes saved by bf16 gathers: $saved, expected $expected (25 gathers of 128 x 256 a microbatch, 2 bytes less each)"
echo "ok: 2 ranks TP gathers bf16 rows: $saved bytes fewer over 30 steps"
