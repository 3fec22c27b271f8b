#!/usr/bin/env bash
# `titan --estimate`: prints per-rank arenas, FLOPs and communication per step for the 8B, 70B
# and 405B configs on thousands of ranks without MPI, equal to closed forms of the flavors'
# parameter, gradient, optimizer and FSDP buffer sizes and FLOPs; and for the debug model its
# numbers equal what a real run allocates and sends (run_summary.json: every arena's bytes, and
# each group's bytes = steps x the estimate's per-step bytes), for a 2D layout, for HSDP with
# activation checkpointing and gradient accumulation, for plain DDP and for pipeline parallel
# (rank 0's plan; the pp group's bytes are its sends, FSDP's are per microbatch). Under pipeline parallel every pp rank has
# its plan: its stages' FLOPs sum to the whole model's, its p2p bytes are the analytic ones, its
# activations follow the checker's peak live count (flat under 1F1B, growing under GPipe), and
# the bubble is --print-schedule's. Under context parallel the cp group's bytes are every layer's
# K/V traffic (forward, recompute, backward) for both rotate methods, and the end-of-run log's
# K/V line reports the bytes the comm report counts for the cp group. Under expert parallel the
# ep group's all-to-all bytes (data-dependent) lie under the estimate's bound. Under FSDP the
# params row's parts (shards, unsharded slots) sum to it and are what the run's memory line
# prints. --device-memory's verdict (fits / does not fit, with the memory check's 5% margin and
# fix) is exact at the margin; a bad size, or the flag on a run, is one line and exit 2. A device
# shared by several ranks (--ranks-per-device; on cuda under comm.backend mpi every rank on one
# GPU by default) is divided among them in the verdict and named in a line saying what is shared.
# The checkpoint line's full-state and model-only bytes are what a 2-rank run's files hold. The
# predicted step time's GEMM and attention terms are the FLOPs over a kept GPU row's rates.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# The big flavors' arenas and FLOPs against closed forms from the flavor's dims
# (tests/reference/estimate_ref.py: parameter count, FSDP x TP shards, AdamW's two moments).
for spec in 8b:8B:64:8 70b:70B:512:8 405b:405B:2048:8; do
  IFS=: read -r name flavor ranks tp <<<"$spec"
  $TITAN --estimate --config configs/llama3_$name.yaml --world-size "$ranks" \
    --parallelism.tensor_parallel_degree "$tp" >"$SCRATCH/$name.txt"
  for row in params grads optimizer activations comm total fsdp tp "FLOPs per step"; do
    grep -q "^  $row" "$SCRATCH/$name.txt" || fail "$name estimate has no '$row' row"
  done
  head -1 "$SCRATCH/$name.txt"
  (cd tests/reference &&
    $PY estimate_ref.py "$flavor" "$ranks" "$tp" 8192 1 "$SCRATCH/$name.txt") ||
    fail "$name estimate differs from the closed forms"
done

# --device-memory: the verdict on the peak per rank (the total row: every arena) against the
# named size with the memory check's 5% margin, exact to the byte at the margin; the fix named
# where it does not fit; pp ranks judged on the one that needs most. A size that is not one, or
# the flag on a run (whose memory check reads the device), is one line and exit 2.
total=$(awk '$1 == "total" {print $2}' "$SCRATCH/8b.txt")
at_margin=$((total * 105 / 100))  # total x 1.05 rounded down, then up: one byte each side
[ $((total * 105 % 100)) -eq 0 ] || at_margin=$((at_margin + 1))
estimate_8b=($TITAN --estimate --config configs/llama3_8b.yaml --world-size 64
             --parallelism.tensor_parallel_degree 8)
verdict() { "${estimate_8b[@]}" "$@" | tail -1; }
v=$(verdict --device-memory 80GiB)
want=$(awk -v t="$total" 'BEGIN {printf "fits: peak %.2f GiB per rank of 80 GiB (%.0f%%; %.0f%% with the memory check'"'"'s 5%% margin)", t / 2^30, 100 * t / 2^30 / 80, 105 * t / 2^30 / 80}')
[ "$v" = "$want" ] || fail "8B on 80GiB: '$v', want '$want'"
echo "ok: $v"
[[ "$(verdict --device-memory "${at_margin}B")" == "fits: "* ]] ||
  fail "8B at exactly its peak plus 5% ($at_margin bytes) does not fit: $(verdict --device-memory "${at_margin}B")"
v=$(verdict --device-memory "$((at_margin - 1))B")
[[ "$v" == "does not fit: peak "*" GiB per rank plus the memory check's 5% margin > "*" GiB; try "* ]] ||
  fail "8B a byte under its peak plus 5% ($((at_margin - 1)) bytes): '$v'"
v=$(verdict --device-memory 2GiB)
act=$(awk '$1 == "activations" {printf "%.2f", $2 / 2^30}' "$SCRATCH/8b.txt")
[[ "$v" == "does not fit: "*"; try a larger parallelism.context_parallel_degree or a shorter training.seq_len (activations are $act GiB)" ]] ||
  fail "8B on 2GiB (a row per rank, activations most of it): '$v'"
echo "ok: $v"
[[ "$(verdict --device-memory 80GB)" == "fits: "*" of 74.51 GiB "* ]] ||
  fail "80GB is not 80e9 bytes: $(verdict --device-memory 80GB)"
$TITAN --estimate --config configs/llama3_70b.yaml --world-size 128 --device-memory 40GiB \
  --parallelism.pipeline_parallel_degree 2 >"$SCRATCH/70b-pp.txt"
worst=$(awk '/^pp rank/ {r = $3 + 0} $1 == "total" {if ($2 > max) {max = $2; w = r}} END {print w}' "$SCRATCH/70b-pp.txt")
grep -q "^fits: peak [0-9.]* GiB per rank (pp rank $worst) of 40 GiB" "$SCRATCH/70b-pp.txt" ||
  fail "70B pp 2: the verdict is not pp rank $worst's: $(tail -1 "$SCRATCH/70b-pp.txt")"
echo "ok: $(tail -1 "$SCRATCH/70b-pp.txt")"
"${estimate_8b[@]}" | grep -Eq '^(fits|does not fit)' && fail "a verdict without --device-memory"
# An async checkpoint's staging copies (params and AdamW's two moments: 1.5 x the optimizer row)
# count where the arenas are host memory, as in the memory check: on cpu, not on cuda.
async=($TITAN --estimate --config configs/debug_model.yaml --model.tokenizer_path null
       --checkpoint.enable --checkpoint.async_mode async --device-memory 1GiB)
staging=$("${async[@]}" | awk '$1 == "optimizer" {printf "%.2f", 1.5 * $2 / 2^30}')
"${async[@]}" | tail -1 | grep -q "^fits: peak [0-9.]* GiB per rank (async checkpoint staging $staging GiB included) of 1 GiB" ||
  fail "async checkpoint on cpu: the verdict does not count $staging GiB of staging: $("${async[@]}" | tail -1)"
"${async[@]}" --device cuda | tail -1 | grep -q "^fits: peak [0-9.]* GiB per rank of 1 GiB" ||
  fail "async checkpoint on cuda: the verdict counts host staging: $("${async[@]}" --device cuda | tail -1)"
echo "ok: async checkpoint staging ($staging GiB) in the cpu verdict, not in the cuda one"
# A shared device: comm.backend mpi on cuda puts every rank on one GPU unless told otherwise,
# the verdict giving each its share; NCCL refuses ranks that share a GPU, and so does the estimate.
shared=($TITAN --estimate --config configs/debug_model.yaml --model.tokenizer_path null
        --world-size 4 --parallelism.data_parallel_shard_degree 4 --device cuda)
peak=$("${shared[@]}" | awk '$1 == "total" {printf "%.2f", $2 / 2^30}')
for spec in ":4:0.25" "--ranks-per-device 2:2:0.5" "--ranks-per-device 1:1:1"; do
  IFS=: read -r flag ranks room <<<"$spec"
  out=$("${shared[@]}" --comm.backend mpi --device-memory 1GiB $flag)
  if [ "$ranks" -gt 1 ]; then
    grep -q "^shared GPU (comm.backend mpi): $ranks ranks on each GPU share its memory and its compute, and every collective goes through host memory" <<<"$out" ||
      fail "comm.backend mpi with '$flag': no line saying $ranks ranks share the GPU"
    of="of $room GiB (1 GiB shared by $ranks ranks)"
  else
    grep -q "^shared" <<<"$out" && fail "one rank per GPU, yet a shared line"
    of="of $room GiB ("
  fi
  grep -q "^fits: peak $peak GiB per rank $of" <<<"$out" ||
    fail "comm.backend mpi with '$flag': the verdict is not on $room GiB per rank: $(tail -1 <<<"$out")"
  echo "ok: ${flag:-default}: $(tail -1 <<<"$out")"
done
"${shared[@]}" | grep -q "^shared" && fail "NCCL (comm.backend auto on cuda) planned as a shared GPU"
$TITAN --estimate --config configs/debug_model.yaml --model.tokenizer_path null --world-size 2 \
  --parallelism.data_parallel_shard_degree 2 --ranks-per-device 2 |
  grep -q "^shared host: 2 ranks on each node share its memory and its cores" ||
  fail "--ranks-per-device 2 on cpu: no shared host line"
expect_user_error "^titan: error: --ranks-per-device 2: NCCL \(comm.backend auto\) refuses ranks that share a GPU; set comm.backend: mpi" \
  "${shared[@]}" --ranks-per-device 2
expect_user_error "^titan: error: --ranks-per-device 5: more than the 4 ranks planned \(--world-size\)$" \
  "${shared[@]}" --comm.backend mpi --ranks-per-device 5
expect_user_error "^titan: error: --ranks-per-device is only for --estimate" \
  $TITAN --config configs/debug_model.yaml --ranks-per-device 2

# The predicted step time: on a kept GPU row (--device-table H100) the GEMM and attention terms
# are the FLOPs line's over the row's rates, by hand (8B: 32 layers of 32 heads x 128 on 8192
# tokens; a causal mask's kernels do half the attention), the terms add up to the step, and the
# summary's tokens/s and MFU follow; on cpu the rates are probed now. A name without a row, or
# the flag on a run, is one line and exit 2.
$TITAN --estimate --config configs/llama3_8b.yaml --world-size 64 \
  --parallelism.tensor_parallel_degree 8 --device-table H100 >"$SCRATCH/8b-h100.txt"
$PY - "$SCRATCH/8b-h100.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
assert re.search(r"^device: H100 SXM \(data sheet peaks; .*\): GEMM fp32 50 TFLOP/s bf16 740 "
                 r"TFLOP/s float8 1300 TFLOP/s, attention 450 TFLOP/s \(head_dim 128\)", text, re.M), text
flops, per_token = map(float, re.search(r"FLOPs per step per rank: (\S+) \((\S+) per token", text).groups())
tokens = flops / per_token
attention = 32 * 12 * 32 * 128 * 8192
step = re.search(r"^  step time (\S+) s: GEMM (\S+) s, attention (\S+) s, elementwise (\S+) s, "
                 r"optimizer (\S+) s, op issue (\S+) s; collectives (\S+) s blocking, (\S+) s "
                 r"overlapped \((\S+) s exposed\)", text, re.M)
total, gemm, attn, elementwise, optimizer, ops, blocking, overlapped, exposed = map(float, step.groups())
close = lambda a, b: abs(a - b) <= 1e-3 * abs(b)
assert close(gemm, tokens * (per_token - attention) / 740e12), (gemm, tokens, per_token)
assert close(attn, tokens * attention / 2 / 450e12), attn
assert close(total, gemm + attn + elementwise + optimizer + ops + blocking + exposed), step.groups()
# AdamW's 36 bytes per parameter of the rank's shards (its two fp32 moments, 8 bytes each, are
# the optimizer row) over the row's optimizer rate, 3 TB/s
moments = float(re.search(r"^  optimizer +(\d+)", text, re.M)[1])
assert close(optimizer, moments / 8 * 36 / 3e12), (optimizer, moments)
assert blocking > 0 and overlapped > 0, "tp and fsdp traffic: one blocks, one overlaps"
summary = re.search(r"^step time: (\S+) s predicted, (\S+) tokens/s per device, MFU (\S+)% of 989 "
                    r"TFLOP/s$", text, re.M)
assert summary and close(float(summary[1]), total), text
assert close(float(summary[2]), 8192 / 8 / total), summary[2]  # a tp group's share a row (total
# is printed to 4 digits)
print(f"ok: 8B on 64 H100s (tp 8): GEMM {gemm} s, attention {attn} s, optimizer {optimizer} s "
      f"by hand; step {total} s, MFU {summary[3]}%")
PY
# Under training.ema_decay the average adds 12 bytes a parameter (the optimizer row: 3 floats).
$TITAN --estimate --config configs/llama3_8b.yaml --world-size 64 \
  --parallelism.tensor_parallel_degree 8 --device-table H100 --training.ema_decay 0.999 |
  $PY -c '
import re, sys
text = sys.stdin.read()
state = float(re.search(r"^  optimizer +(\d+)", text, re.M)[1])
optimizer = float(re.search(r"^  step time .* optimizer (\S+) s", text, re.M)[1])
assert abs(optimizer - state / 12 * 48 / 3e12) <= 1e-3 * optimizer, (optimizer, state)
print(f"ok: the optimizer term under ema_decay: {optimizer} s")'
# The probe measures training.device: on a machine without a GPU (CI's), cuda's refuses.
expect_user_error "^titan: error: --device-table probe: training.device cuda: " \
  $TITAN --estimate --config configs/debug_model.yaml --device cuda --device-table probe
$TITAN --estimate --config configs/debug_model.yaml --model.tokenizer_path null \
  >"$SCRATCH/debug-probe.txt"
grep -Eq "^device: cpu.*\(probed now\): GEMM bf16 [0-9.e+-]+ TFLOP/s, attention [0-9.e+-]+ TFLOP/s \(head_dim 16\)" \
  "$SCRATCH/debug-probe.txt" || fail "cpu estimate: no probed device line: $(cat "$SCRATCH/debug-probe.txt")"
grep -Eq "^step time: [0-9.e+-]+ s predicted, [0-9]+ tokens/s per device, MFU [0-9.]+% of" \
  "$SCRATCH/debug-probe.txt" || fail "cpu estimate: no predicted step time"
expect_user_error "^titan: error: --device-table expects probe or a kept row \(H100 PCIe, H100 NVL, H100 SXM, H200 SXM, B200, A100 SXM, L40S\), got 'H300'$" \
  $TITAN --estimate --config configs/debug_model.yaml --device-table H300
expect_user_error "^titan: error: --device-table is only for --estimate" \
  $TITAN --config configs/debug_model.yaml --device-table H100

# A checkpoint's plan: the full state and the model-only bytes are what a run's files hold
# (h5py: every dataset's bytes), per rank and in all, and --checkpoint-bandwidth divides them.
plan=($TITAN --estimate --world-size 2 ${SMALL[@]} --parallelism.data_parallel_shard_degree 2)
"${plan[@]}" --checkpoint-bandwidth 0.5 >"$SCRATCH/plan.txt"
mpirun --oversubscribe -np 2 $TITAN ${SMALL[@]} --parallelism.data_parallel_shard_degree 2 \
  --training.steps 2 --checkpoint.enable --checkpoint.interval 1 \
  --job.dump_folder "$SCRATCH/plan" >"$SCRATCH/plan.log" 2>&1 || { tail -3 "$SCRATCH/plan.log"; fail "plan run"; }
$PY - "$SCRATCH/plan.txt" "$SCRATCH/plan/checkpoint/step-1.h5" "$SCRATCH/plan/checkpoint/step-2.h5" <<'PY'
import re, sys, h5py
text = open(sys.argv[1]).read()
m = re.search(r"^checkpoint: full state (\d+) bytes \(([\d.]+) GB: .*\), ([\d.]+) GB per rank at most; "
              r"model only (\d+) bytes \(([\d.]+) GB\), ([\d.]+) GB per rank$", text, re.M)
assert m, "no checkpoint line"
full, model = int(m[1]), int(m[4])
def nbytes(path):
    sizes = []
    h5py.File(path, "r").visititems(lambda n, o: sizes.append(o.nbytes) if isinstance(o, h5py.Dataset) else None)
    return sum(sizes)
assert nbytes(sys.argv[2]) == full, f"full state: estimated {full}, the file holds {nbytes(sys.argv[2])}"
assert nbytes(sys.argv[3]) == model, f"model only: estimated {model}, the file holds {nbytes(sys.argv[3])}"
assert abs(float(m[3]) - full / 2e9) < 1e-3 and abs(float(m[6]) - model / 2e9) < 1e-3, m[0]  # dp_shard 2
t = re.search(r"^checkpoint at 0.5 GB/s: a full save takes ([\d.e+-]+) s, a model-only save ([\d.e+-]+) s$", text, re.M)
assert t and abs(float(t[1]) - full / 0.5e9) < 1e-3 * full / 0.5e9, "the bandwidth line"
print(f"ok: checkpoint plan: full state {full} bytes and model only {model} bytes, as the files hold; {t[0]}")
PY
for bad in 0 -1 abc 10GB; do
  expect_user_error "^titan: error: --checkpoint-bandwidth expects the storage's write rate in GB/s \(a positive number, e.g. 10\), got '$bad'$" \
    "${plan[@]}" --checkpoint-bandwidth "$bad"
done
expect_user_error "^titan: error: --checkpoint-bandwidth is only for --estimate$" \
  $TITAN --config configs/debug_model.yaml --checkpoint-bandwidth 10
for bad in 80 80G 0GiB -1GiB nan abc; do
  expect_user_error "^titan: error: --device-memory expects a size such as 80GiB, 80GB or 512MiB \(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB\), got '$bad'$" \
    "${estimate_8b[@]}" --device-memory "$bad"
done
expect_user_error "^titan: error: --device-memory expects a size .*, got none$" "${estimate_8b[@]}" --device-memory
expect_user_error "^titan: error: --device-memory is only for --estimate" \
  $TITAN --config configs/llama3_8b.yaml --device-memory 80GiB

check() {  # name, ranks, overrides...: estimate vs a 3-step real run
  local name=$1 np=$2; shift 2
  local args=(${SMALL[@]} --training.steps 3 "$@")
  $TITAN --estimate --world-size "$np" "${args[@]}" >"$SCRATCH/$name.estimate"
  mpirun --oversubscribe -np "$np" $TITAN "${args[@]}" --job.dump_folder "$SCRATCH/$name" \
    >"$SCRATCH/$name.log" 2>&1 || { tail -5 "$SCRATCH/$name.log"; fail "$name: run failed"; }
  $PY - "$name" "$SCRATCH/$name.estimate" "$SCRATCH/$name/run_summary.json" "$SCRATCH/$name.log" <<'PY'
import json, sys
name, estimate, summary = sys.argv[1], open(sys.argv[2]).read().splitlines(), json.load(open(sys.argv[3]))
estimate = estimate[:next((i for i, l in enumerate(estimate) if l.startswith("pp rank 1:")), None)]  # rank 0's
rows = {l.split()[0]: int(l.split()[1]) for l in estimate if l.startswith("  ") and l.split()[1].isdigit()}
for arena, got in summary["arena_bytes"].items():
    assert rows[arena] == got, f"{name}: {arena} estimated {rows[arena]}, allocated {got}"
# Under FSDP the params row's two parts (the rank's shards, the units' unsharded slots) sum to
# it, and the run's memory line prints them; without FSDP there are no parts.
# (FSDP over a group of one, a pipeline's stages without dp_shard, splits them too, but moves
# nothing: no fsdp row.)
parts, log = [rows.get("shards"), rows.get("unsharded")], open(sys.argv[4]).read()
if "fsdp" in rows or "efsdp" in rows or None not in parts:
    assert None not in parts and sum(parts) == rows["params"], f"{name}: params {rows['params']} != {parts}"
    line = "shards %.2f MiB, unsharded %.2f MiB" % tuple(p / 2**20 for p in parts)
    assert line in log, f"{name}: the run's memory line lacks '{line}'"
else:
    assert parts == [None, None] and "unsharded" not in log, f"{name}: no FSDP, yet params split"
bound = [int(l.split("at most ")[1].split()[0]) for l in estimate if l.startswith("  ep all-to-all")]
for group, got in summary["comm_bytes"].items():
    if group == "ep":  # where the tokens go is data-dependent: under the bound, not equal
        assert 0 < got <= summary["steps"] * bound[0], f"{name}: ep sent {got}, bound {bound}"
        continue
    want = summary["steps"] * rows.get(group, 0)
    assert want == got, f"{name}: group {group}: estimated {want} bytes, sent {got}"
print(f"ok: {name}: arenas and per-group traffic equal the estimate")
PY
}

P=--parallelism
check dp_shard=2xtp=2 4 $P.data_parallel_shard_degree 2 $P.tensor_parallel_degree 2
check qwen3,dp_shard=2xtp=2 4 $P.data_parallel_shard_degree 2 $P.tensor_parallel_degree 2 \
  --model.name qwen3 --model.flavor small
# MoE layers (their arenas sized by the same code with the no-drop bound on expert rows; no tp
# seam in the FFN, the balance loss's statistics all-reduced over tp, again in the recompute).
check qwen3-moe,dp_shard=2xtp=2,AC 4 $P.data_parallel_shard_degree 2 \
  $P.tensor_parallel_degree 2 --model.name qwen3 --model.flavor small_moe \
  --model.moe_aux_loss_alpha 0.01 --activation_checkpoint.mode full
# DeepSeek-V3: MLA's seams as GQA's, a dense first layer's four seams beside the MoE layers'
# two, and two MTP modules in the head, each with its layer's seams and a loss of its own.
check deepseek-mtp,dp_shard=2xtp=2,AC 4 $P.data_parallel_shard_degree 2 \
  $P.tensor_parallel_degree 2 --model.name deepseek_v3 --model.flavor small --model.mtp_layers 2 \
  --model.moe_aux_loss_alpha 0.01 --activation_checkpoint.mode full
# Muon under FSDP and TP: each matrix's update all-gathered over fsdp, then tp, and its
# orthogonalization broadcast back over tp, then fsdp; its scratch in the optimizer arena.
check muon,dp_shard=2xtp=2 4 $P.data_parallel_shard_degree 2 $P.tensor_parallel_degree 2 \
  --optimizer.name Muon
# In a pipeline the head's copy of the embedding table (on the last stage) and the first
# stage's table sum their gradients over pp_tied: rank 0's shard of it a step.
check deepseek-mtp,pp=2 2 $P.pipeline_parallel_degree 2 $P.pipeline_parallel_microbatch_size 2 \
  $P.pipeline_parallel_schedule 1F1B $P.data_parallel_shard_degree 1 --model.name deepseek_v3 \
  --model.flavor small --model.mtp_layers 2
# FSDP's float8 all-gather: the float8 weights' e4m3 bytes and each one's amax all-reduce per
# gather, or one all-reduce of every amax a step with precomputed scales.
F8=(--model.converters float8 --float8.filter_fqns output --float8.enable_fsdp_float8_all_gather)
check float8-all-gather,dp_shard=2 2 $P.data_parallel_shard_degree 2 "${F8[@]}"
# The gathered float8 weights (bytes) are unsharded slots; the shards are the fp32 masters.
f8="$SCRATCH/float8-all-gather,dp_shard=2.estimate"
grep -Eq '^    shards +[0-9]+ +[0-9.]+  fp32 [0-9]+$' "$f8" &&
  grep -Eq '^    unsharded +[0-9]+ +[0-9.]+  fp32 [0-9]+, bytes [0-9]+$' "$f8" ||
  fail "float8 all-gather: its float8 slots are not unsharded params: $(grep -A2 '^  params' "$f8")"
check float8-precompute,dp_shard=2,bf16 2 $P.data_parallel_shard_degree 2 "${F8[@]}" \
  --float8.precompute_float8_dynamic_scale_for_fsdp --training.mixed_precision_param bfloat16
# Expert parallel: its all-to-alls' bytes lie under the estimate's bound (the ep row assumes
# even routing); the experts' FSDP traffic goes over efsdp, the rest of the model's over fsdp.
check qwen3-moe,ep=2 2 $P.data_parallel_shard_degree 2 $P.expert_parallel_degree 2 \
  --model.name qwen3 --model.flavor small_moe
# There ep takes both ranks: the experts' efsdp is a group of one, which moves nothing.
grep -q "^  efsdp " "$SCRATCH/qwen3-moe,ep=2.estimate" && fail "an efsdp row for a group of one"
grep -q "^comm: group efsdp" "$SCRATCH/qwen3-moe,ep=2.log" && fail "a group of one reports traffic"
$PY -c 'import json, sys; assert json.load(open(sys.argv[1]))["comm_bytes"]["efsdp"] == 0' \
  "$SCRATCH/qwen3-moe,ep=2/run_summary.json" || fail "run_summary.json counts efsdp bytes"
echo "ok: efsdp of one rank: no row, no traffic"
check qwen3-moe,ep=2xtp=2,AC 2 $P.tensor_parallel_degree 2 $P.data_parallel_shard_degree 1 \
  $P.expert_parallel_degree 2 --model.name qwen3 --model.flavor small_moe \
  --activation_checkpoint.mode full
check qwen3-moe,pp=2xep=2 4 $P.pipeline_parallel_degree 2 $P.data_parallel_shard_degree 2 \
  $P.expert_parallel_degree 2 $P.pipeline_parallel_microbatch_size 2 --model.name qwen3 \
  --model.flavor small_moe

# Qwen3 8B (untied, heads of 128 as wide as dim / n_heads, QK-norm): AdamW's two fp32 moments
# on 8 FSDP ranks hold the parameter count of its shapes (Qwen's model card: 8.2B).
$TITAN --estimate --config configs/debug_model.yaml --model.name qwen3 --model.flavor 8B \
  --model.tokenizer_path null --world-size 8 $P.data_parallel_shard_degree 8 >"$SCRATCH/qwen3-8b.txt"
layer=$((4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128))
params=$((2 * 151936 * 4096 + 36 * layer + 4096))
grep -Eq "^  optimizer +$((2 * 4 * params / 8)) " "$SCRATCH/qwen3-8b.txt" ||
  fail "qwen3 8B: optimizer row is not AdamW's moments of $params parameters: $(grep optimizer "$SCRATCH/qwen3-8b.txt")"
echo "ok: qwen3 8B estimate holds $params parameters"
check hsdp+ac+accum 4 --training.local_batch_size 2 --training.global_batch_size 16 \
  $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 2 --activation_checkpoint.mode full

# Plain DDP (dp_replicate 2 on an fsdp group of one) runs no FSDP: its fsdp group sends nothing
# (check's per-group comparison: the estimate has no fsdp row) and it holds no full-parameter
# slots beyond the model itself: its params arena is the 1-rank run's.
check ddp+accum 2 --training.global_batch_size 16 $P.data_parallel_replicate_degree 2 \
  $P.data_parallel_shard_degree 1
! grep -q "^  fsdp" "$SCRATCH/ddp+accum.estimate" || fail "DDP estimate has FSDP traffic"
$TITAN --estimate --world-size 1 "${SMALL[@]}" >"$SCRATCH/one.estimate"
[ "$(grep '^  params' "$SCRATCH/one.estimate")" = "$(grep '^  params' "$SCRATCH/ddp+accum.estimate")" ] ||
  fail "DDP params arena differs from one rank's: $(grep '^  params' "$SCRATCH/ddp+accum.estimate")"
echo "ok: DDP holds the 1-rank params arena and runs no FSDP collective"

# Pipeline parallel, checked against a real run (rank 0's plan: stage 0's arenas; the pp group's
# bytes: its activation sends plus the loss and grad norm summed over the stages).
check pp=2+accum 2 --training.local_batch_size 8 --training.global_batch_size 16 \
  $P.pipeline_parallel_degree 2
# FSDP under a pipeline gathers its stages' blocks once per microbatch and reduce-scatters
# once per step; TP moves the seams of its stages' blocks only.
check pp=2xdp_shard=2 4 --training.local_batch_size 8 $P.pipeline_parallel_degree 2 \
  $P.data_parallel_shard_degree 2
check pp=2xtp=2 4 --training.local_batch_size 8 $P.pipeline_parallel_degree 2 \
  $P.tensor_parallel_degree 2 $P.data_parallel_shard_degree 1

# Context parallel: the activations hold the attention workspace of T / cp tokens; the cp
# group carries the K/V of every layer's attention (all-gather and reduce-scatter, or the ring's
# sends), again for the recompute under activation checkpointing, per microbatch and stage.
check cp=2-allgather 2 $P.context_parallel_degree 2 $P.context_parallel_rotate_method allgather
check cp=4-alltoall+ac+accum 4 --training.global_batch_size 8 --activation_checkpoint.mode full \
  $P.context_parallel_degree 4 $P.context_parallel_rotate_method alltoall
check cp=2xtp=2-alltoall 4 $P.context_parallel_degree 2 $P.tensor_parallel_degree 2 \
  $P.context_parallel_rotate_method alltoall
check pp=2xcp=2-allgather+ac 4 --training.local_batch_size 8 --activation_checkpoint.mode full \
  $P.pipeline_parallel_degree 2 $P.context_parallel_degree 2
for name in cp=2-allgather cp=4-alltoall+ac+accum; do
  sent=$(grep -o 'cp: [0-9]* K/V transfers ([a-z ]*), [0-9.]* MiB sent' "$SCRATCH/$name.log" |
    grep -o '[0-9.]* MiB' || fail "$name: no K/V traffic line in the log")
  counted=$(awk '$2 == "group" && $3 == "cp" {printf "%.2f MiB", $6 / 1048576}' "$SCRATCH/$name.log")
  [ "$sent" = "$counted" ] || fail "$name: the K/V line says $sent, the comm report $counted"
  echo "ok: $name: the log's K/V line reports the cp group's $counted"
done

# Each pp rank's plan, for local batches of 4 and 8 rows in microbatches of one row.
# tp 1: an activation crossing a stage boundary is 1 row x 64 tokens x dim 256 floats.
pp_estimate() {  # name, world size, overrides...
  local name=$1 np=$2; shift 2
  $TITAN --estimate --world-size "$np" "${SMALL[@]}" "$@" >"$SCRATCH/$name.estimate"
}
for b in 4 8; do
  pp_estimate one-$b 1 --training.local_batch_size $b
  for schedule in 1F1B GPipe; do
    pp_estimate pp-$schedule-$b 2 --training.local_batch_size $b $P.pipeline_parallel_degree 2 \
      $P.pipeline_parallel_schedule $schedule
    $TITAN --print-schedule "${SMALL[@]}" --training.local_batch_size $b \
      $P.pipeline_parallel_degree 2 $P.pipeline_parallel_schedule $schedule \
      >"$SCRATCH/pp-$schedule-$b.schedule"
  done
  pp_estimate pp-fsdp-$b 4 --training.local_batch_size $b $P.pipeline_parallel_degree 2 \
    $P.data_parallel_shard_degree 2
  cp "$SCRATCH/pp-1F1B-$b.schedule" "$SCRATCH/pp-fsdp-$b.schedule"
done
$PY - "$SCRATCH" <<'PY'
import re, sys
scratch, width = sys.argv[1], 1 * 64 * 256 * 4  # bytes of one microbatch's activation
def ranks(name):  # each pp rank's lines, by rank
    out, rank = {}, None
    for l in open(f"{scratch}/{name}.estimate").read().splitlines():
        m = re.match(r"pp rank (\d+): stages? (.*)", l)
        if m: rank = int(m.group(1)); out[rank] = [l]
        elif rank is not None: out[rank].append(l)
    return out
def flops(lines): return float(re.search(r"FLOPs per step per rank: (\S+)", "\n".join(lines)).group(1))
def row(lines, key): return int(next(l.split()[1] for l in lines if l.startswith("  ") and l.split()[0] == key))
for b in (4, 8):
    whole = flops(open(f"{scratch}/one-{b}.estimate").read().splitlines())
    for name in (f"pp-1F1B-{b}", f"pp-GPipe-{b}", f"pp-fsdp-{b}"):
        r = ranks(name)
        assert sorted(r) == [0, 1], f"{name}: pp ranks {sorted(r)}"
        assert "stage 0 (blocks 0-3: embed, layers.0-2)" in r[0][0], r[0][0]
        assert "stage 1 (blocks 4-7: layers.3-5, head)" in r[1][0], r[1][0]
        total = flops(r[0]) + flops(r[1])
        assert total == whole, f"{name}: stages' FLOPs {total} != the whole model's {whole}"
        for rank, kind in ((0, "activations sent forward"), (1, "gradients backward")):
            text = "\n".join(r[rank])
            sent = [int(x) for x in re.search(r"p2p per pipeline step: (\d+) bytes of activations "
                                              r"sent forward, (\d+) of gradients", text).groups()]
            want = [b * width, 0] if rank == 0 else [0, b * width]
            assert sent == want, f"{name} rank {rank}: p2p {sent}, analytic {want}"
            assert row(r[rank], "pp") == b * width + 16, f"{name} rank {rank}: pp group bytes"
        live = [int(re.search(r"peak live (\d+) microbatches: activations in (\d+) regions x "
                              r"(\d+)", "\n".join(r[k])).group(1)) for k in (0, 1)]
        printed = re.search(r"pipeline \S+: 2 stages, %d microbatches, bubble (\S+)" % b,
                            open(f"{scratch}/{name}.estimate").read()).group(1)
        checker = open(f"{scratch}/{name}.schedule").read()
        assert f"bubble: {printed} " in checker, f"{name}: bubble {printed} is not --print-schedule's"
        assert f"peak live activations per rank: {live[0]} {live[1]}" in checker, f"{name}: {live}"
def acts(name): return row(ranks(name)[0], "activations")
assert acts("pp-1F1B-8") == acts("pp-1F1B-4"), "1F1B stage 0's activations grow with microbatches"
assert acts("pp-fsdp-8") == acts("pp-fsdp-4"), "pp x FSDP stage 0's activations grow"
assert acts("pp-GPipe-8") > acts("pp-GPipe-4"), "GPipe stage 0's activations do not grow"
print(f"ok: pp=2 (and x dp_shard=2): per-stage plans; FLOPs sum to the whole model's; p2p bytes "
      f"analytic; 1F1B stage 0 activations {acts('pp-1F1B-4')} at 4 and 8 microbatches, GPipe "
      f"{acts('pp-GPipe-4')} -> {acts('pp-GPipe-8')}; bubbles and peak live are --print-schedule's")
PY
