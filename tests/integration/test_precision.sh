#!/usr/bin/env bash
# Which dtypes a run holds and which precision it ran. `titan --estimate` splits every arena by
# the dtypes carved in it (core/arena.h): each row's parts sum to its bytes; on 2 FSDP ranks
# training.mixed_precision_param bfloat16 adds FSDP's bf16 all-gather buffers to the comm arena
# (absent under float32, whose fp32 buffers are the same), mixed_precision_reduce bfloat16 the
# reduce-scatter's as many again; a MoE model's activations hold its int32 expert indices, the
# dense model's none. A real run's startup memory line shows the estimate's split, and its
# startup log, step line and metrics.jsonl name the precision that ran (bf16 or fp32).
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
P=--parallelism
FSDP2=($P.data_parallel_shard_degree 2)
BF16=(--training.mixed_precision_param bfloat16)

estimate() {  # name, world size, overrides...
  local name=$1 np=$2; shift 2
  $TITAN --estimate --world-size "$np" "${SMALL[@]}" "$@" >"$SCRATCH/$name.estimate"
}
estimate fp32 2 "${FSDP2[@]}"
estimate bf16 2 "${FSDP2[@]}" "${BF16[@]}"
estimate bf16-reduce 2 "${FSDP2[@]}" "${BF16[@]}" --training.mixed_precision_reduce bfloat16
estimate moe 1 --model.name qwen3 --model.flavor small_moe

train_ranks bf16 2 "${SMALL[@]}" "${FSDP2[@]}" "${BF16[@]}" --training.steps 2
train_ranks fp32 1 "${SMALL[@]}" --training.steps 2
for name in bf16 fp32; do cp "$SCRATCH/$name/metrics.jsonl" "$SCRATCH/$name.jsonl"; done

$PY - "$SCRATCH" <<'PY'
import json, re, sys
scratch = sys.argv[1]
ARENAS = ("params", "grads", "optimizer", "activations", "comm")

def arenas(name):  # {arena: (bytes, {dtype: bytes})} of an --estimate
    out = {}
    for l in open(f"{scratch}/{name}.estimate").read().splitlines():
        f = l.split(None, 3)
        if len(f) >= 3 and f[0] in ARENAS + ("total",) and f[1].isdigit():
            parts = f[3].split(", ") if len(f) == 4 else []
            out[f[0]] = (int(f[1]), {d: int(n) for d, n in (p.split() for p in parts)})
    assert set(out) == set(ARENAS + ("total",)), f"{name}: rows {sorted(out)}"
    return out

plans = {name: arenas(name) for name in ("fp32", "bf16", "bf16-reduce", "moe")}
for name, plan in plans.items():
    for arena, (total, parts) in plan.items():
        assert sum(parts.values()) == total, f"{name}: {arena} {total} bytes, its dtypes {parts}"
    summed = {}
    for arena in ARENAS:
        for d, n in plan[arena][1].items(): summed[d] = summed.get(d, 0) + n
    assert plan["total"][1] == summed, f"{name}: total's {plan['total'][1]}, arenas' {summed}"
    for arena in ("params", "grads", "optimizer"):  # fp32 masters, gradients and AdamW moments
        assert set(plan[arena][1]) == {"fp32"}, f"{name}: {arena} holds {plan[arena][1]}"
fp32, bf16, both = (plans[n]["comm"][1] for n in ("fp32", "bf16", "bf16-reduce"))
assert "bf16" not in fp32, f"float32 run's comm holds bf16: {fp32}"
assert bf16.get("bf16", 0) > 0, f"bfloat16 run's comm holds no bf16 gather buffers: {bf16}"
assert bf16["fp32"] == fp32["fp32"], f"comm's fp32 buffers differ: bf16 {bf16}, fp32 {fp32}"
assert both == {"fp32": fp32["fp32"], "bf16": 2 * bf16["bf16"]}, \
    f"bf16 reduce-scatter buffers are not the gather's size again: {both} vs {bf16}"
assert "int32" in plans["moe"]["activations"][1], f"MoE activations: {plans['moe']['activations']}"
assert "int32" not in plans["fp32"]["activations"][1], f"dense: {plans['fp32']['activations']}"
print(f"ok: every arena's dtypes sum to its bytes; comm on 2 FSDP ranks: float32 {fp32}, "
      f"bfloat16 {bf16}, with a bf16 reduce-scatter {both}; MoE activations' int32 "
      f"{plans['moe']['activations'][1]['int32']} bytes")

# The run's memory line: each arena as the estimate split it, in MiB.
MiB = 2 ** 20
log = open(f"{scratch}/bf16.log").read()
lines = re.findall(r"^memory per rank: (.*)$", log, re.M)  # a few lines of at most ~120 chars
assert lines and all(len(l) <= 120 for l in lines), f"memory lines: {lines}"
line = ", ".join(lines)
for arena in ARENAS:
    total, parts = plans["bf16"][arena]
    want = f"{arena} {total / MiB:.1f} MiB"
    if parts:
        want += " (" + ", ".join(f"{d} {n / MiB:.2f}" for d, n in parts.items())
    assert want in line, f"memory line lacks '{want}': {line}"
print(f"ok: the bf16 run's memory line splits its arenas as --estimate: {line}")

for name, dtype in (("bf16", "bf16"), ("fp32", "fp32")):
    rows = [json.loads(l) for l in open(f"{scratch}/{name}.jsonl")]
    assert len(rows) == 2 and all(r["precision"] == dtype for r in rows), f"{name}: {rows}"
    log = re.sub(r"\x1b\[[0-9;]*m", "", open(f"{scratch}/{name}.log").read())  # mpirun's tty
    steps = re.findall(r"^step +\d+ .*$", log, re.M)
    assert len(steps) == 2 and all(s.endswith(f"  precision {dtype}") for s in steps), steps
    param = "bfloat16" if dtype == "bf16" else "float32"
    assert f"precision: {dtype} compute (training.mixed_precision_param {param})" in log, log
    print(f"ok: the {name} run's startup log, step line and metrics.jsonl name precision {dtype}")
PY
