#!/usr/bin/env bash
# profiling.* (core/profiler.h): a 2-rank FSDP run profiling steps 3-4 of 5 writes one Chrome
# trace per rank that parses as JSON, nests on every track, holds every block's forward and
# backward in each profiled step, the ops, every collective with its bytes and group, and the
# waits; its collectives' bytes and counts per group equal the comm counters over those steps,
# read two ways: by the run itself at the window's edges (the trace's otherData), and from two
# runs without profiling. The memory snapshot of step 4 lists every arena. Profiling changes
# neither the losses nor the communication, and off it writes nothing. trace_breakdown.py's
# classes share the traced steps whole.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

FSDP=(${SMALL[@]} --parallelism.data_parallel_shard_degree 2)
# profile_freq 4, two active steps, no warm-up: steps 3 and 4 traced into iteration_4.
PROFILE=(--profiling.enable_profiling --profiling.profile_freq 4 --profiling.profiler_active 2
         --profiling.profiler_warmup 0 --profiling.enable_memory_snapshot)
train_ranks prof 2 "${FSDP[@]}" --training.steps 5 "${PROFILE[@]}"
train_ranks off5 2 "${FSDP[@]}" --training.steps 5
train_ranks off3 2 "${FSDP[@]}" --training.steps 3

# Off: no trace or snapshot folder; on: the same losses and the same communication.
[ -e "$SCRATCH/off5/profile_traces" ] && fail "profiling off wrote $SCRATCH/off5/profile_traces"
[ -e "$SCRATCH/off5/memory_snapshot" ] && fail "profiling off wrote a memory snapshot"
diff <(losses "$SCRATCH/off5/metrics.jsonl") <(losses "$SCRATCH/prof/metrics.jsonl") ||
  fail "profiling changed the losses"
diff <(grep '^comm: group' "$SCRATCH/off5.log") <(grep '^comm: group' "$SCRATCH/prof.log") ||
  fail "profiling changed the communication"
echo "ok: profiling off writes nothing; on, the losses and comm counters are unchanged"
[ "$(cd "$SCRATCH/prof" && ls -d profile_traces/* memory_snapshot/*)" = \
  "$(printf '%s\n' memory_snapshot/iteration_4 profile_traces/iteration_4)" ] ||
  fail "expected iteration_4 only: $(ls -R "$SCRATCH/prof")"

layers=$(grep -o '[0-9]* layers' "$SCRATCH/prof.log" | head -1 | cut -d' ' -f1)
$PY - "$SCRATCH" "$layers" <<'PY'
import json, re, sys
scratch, layers = sys.argv[1], int(sys.argv[2])

def counters(log):  # rank 0's "comm: group NAME N ops B bytes" lines: {group: (bytes, ops)}
    lines = re.findall(r"^comm: group (\S+)\s+(\d+) ops\s+(\d+) bytes", open(log).read(), re.M)
    return {g: (int(b), int(n)) for g, n, b in lines}

# Every step sends the same (FSDP's gathers and reduce-scatters, the loss and grad-norm
# all-reduces, and after each step but a run's last the preemption check), so what a 5-step
# run sends beyond a 3-step one is what steps 3 and 4 of the profiled run send.
five, three = counters(f"{scratch}/off5.log"), counters(f"{scratch}/off3.log")
steps_3_4 = {g: (five[g][0] - three.get(g, (0, 0))[0], five[g][1] - three.get(g, (0, 0))[1])
             for g in five if five[g] != three.get(g)}
blocks = ["embed"] + [f"transformer.{i}" for i in range(layers)] + ["head"]
OPS = {"matmul", "rmsnorm_forward", "rmsnorm_backward", "rope_forward", "rope_backward",
       "attention_forward", "attention_backward", "swiglu_forward", "swiglu_backward",
       "embedding_forward", "embedding_backward", "cross_entropy_forward",
       "cross_entropy_backward", "adamw_update"}

def check_nesting(rank, events):  # complete events of one track nest or are disjoint
    for tid in {e["tid"] for e in events}:
        stack = []
        for e in sorted((e for e in events if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= e["ts"] + 1e-3:
                stack.pop()
            assert not stack or e["ts"] + e["dur"] <= stack[-1] + 1e-3, \
                f"rank {rank}: {e['name']} at {e['ts']} overlaps its parent on track {tid}"
            stack.append(e["ts"] + e["dur"])

for rank in (0, 1):
    path = f"{scratch}/prof/profile_traces/iteration_4/rank{rank}_trace.json"
    trace = json.load(open(path))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for e in events:
        assert e["pid"] == rank and e["dur"] >= 0 and isinstance(e["tid"], int), e
    check_nesting(rank, events)
    meta = trace["otherData"]
    assert (meta["first_step"], meta["last_step"]) == (3, 4), meta
    steps = {e["args"]["step"]: e for e in events if e["cat"] == "step"}
    assert sorted(steps) == [3, 4], f"rank {rank}: steps {sorted(steps)}"
    for s, step in steps.items():
        inside = [e for e in events
                  if step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"]]
        calls = {(e["args"]["block"], e["args"]["phase"]) for e in inside if e["cat"] == "block"}
        missing = [(b, p) for b in blocks for p in ("forward", "backward") if (b, p) not in calls]
        assert not missing, f"rank {rank} step {s}: no block call {missing}"
        ops = {e["name"] for e in inside if e["cat"] == "op"}
        assert OPS <= ops, f"rank {rank} step {s}: no op {OPS - ops}"
    collectives = [e["args"] for e in events if e["cat"] == "collective"]
    assert all(c["complete"] for c in collectives), f"rank {rank}: a collective in flight"
    traced = {}
    for c in collectives:
        b, n = traced.get(c["group"], (0, 0))
        traced[c["group"]] = (b + c["bytes"], n + 1)
    counted = {g: (v["bytes"], v["ops"]) for g, v in meta["comm"].items()}
    assert traced == counted, f"rank {rank}: trace {traced} != the run's counters {counted}"
    if rank == 0:  # the one whose counters the runs print
        assert traced == steps_3_4, f"trace {traced} != the 5-step minus the 3-step run {steps_3_4}"
    seqs = {(c["group"], c["seq"]) for c in collectives}
    waits = [e["args"] for e in events if e["cat"] == "wait"]
    assert waits and all((w["group"], w["seq"]) in seqs for w in waits), f"rank {rank}: waits"
    print(f"ok: rank {rank}: {len(events)} events; blocks {blocks[0]}..{blocks[-1]} forward and "
          f"backward in steps 3 and 4; {len(collectives)} collectives, {len(waits)} waits; bytes "
          f"per group {dict((g, v[0]) for g, v in traced.items())} = the comm counters")

    snapshots = f"{scratch}/prof/memory_snapshot/iteration_4"
    snap = json.load(open(f"{snapshots}/rank{rank}_memory_snapshot.json"))
    arenas = {a["name"]: a for a in snap["arenas"]}
    assert set(arenas) == {"params", "grads", "optimizer", "activations", "comm", "inputs"}, arenas
    for a in arenas.values():
        for part in ("used", "peak"):
            assert sum(a[part]["by_dtype"].values()) == a[part]["total"] <= a["committed"], a
    # The step carves exactly what the sizing pass counted: its peak is the whole arena.
    assert arenas["activations"]["peak"]["total"] == arenas["activations"]["committed"] > 0
    assert arenas["params"]["used"]["total"] == arenas["params"]["committed"] > 0
    assert snap["committed"] == sum(a["committed"] for a in arenas.values())
    print(f"ok: rank {rank}: memory snapshot of step 4, {len(arenas)} arenas, "
          f"{snap['committed']} bytes committed")
PY

# scripts/trace_breakdown.py (bench_peer.sh's and bench_gpu.sh's step by op class): the classes
# and the gaps share each traced step whole, and the 2-rank FSDP step waits on collectives.
for rank in 0 1; do
  line=$($PY scripts/trace_breakdown.py "$SCRATCH/prof/profile_traces/iteration_4/rank${rank}_trace.json")
  $PY - "$line" <<'PY'
import re, sys
line = sys.argv[1]
parts = dict((k, float(v)) for k, v in re.findall(r"(\S+) (-?[0-9.]+)%", line))
want = ["GEMM", "attention", "norms+elementwise", "casts", "optimizer", "communication", "gaps"]
assert list(parts) == want, line
assert abs(sum(parts.values()) - 100) < 0.5 and min(parts.values()) >= 0, line
assert parts["GEMM"] > 10 and parts["communication"] > 0, line
print(f"ok: trace_breakdown: {line}")
PY
done

# torchtitan's check of the schedule, by key: profile_freq 2 < warmup 3 + active 1.
expect_user_error \
  "profiling.profile_freq = 2 .* must be at least profiling.profiler_warmup \+ profiling.profiler_active = 4" \
  $TITAN "${SMALL[@]}" --profiling.enable_profiling --profiling.profile_freq 2
