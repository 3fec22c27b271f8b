#!/usr/bin/env python3
"""A profiled step's time by op class, from titan's Chrome trace (core/profiler.h): GEMM,
attention, norms and elementwise, casts, optimizer (AdamW, the average, the grad norm's sums),
communication (the step thread blocked on a collective), and the gaps between them (the host's
own time: the loop, the blocks' bookkeeping, the data; on cuda also each op's launch, since a
profiled op is synchronized alone, so ops never overlap). With several profiled steps, their
mean. Standard library only (GPU machines have no package registry).

Usage: scripts/trace_breakdown.py TRACE.json  ->  one line, e.g.
  step 812.3 ms: GEMM 61.2%, attention 12.0%, norms+elementwise 9.1%, casts 8.4%, ...
"""
import argparse
import json
import sys

CLASSES = [  # (class, op-name prefixes), first match wins
    ("GEMM", ("matmul", "grouped_matmul")),
    ("attention", ("attention_",)),
    ("casts", ("to_bf16", "from_bf16", "float8_")),
    ("optimizer", ("adamw_", "ema_", "sum_squares")),
]
ORDER = ["GEMM", "attention", "norms+elementwise", "casts", "optimizer", "communication"]


def op_class(event):
    if event["cat"] == "wait":
        return "communication"
    for cls, prefixes in CLASSES:
        if event["name"].startswith(prefixes):
            return cls
    return "norms+elementwise"


def main(path):
    events = json.load(open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps = [e for e in events if e.get("ph") == "X" and e.get("cat") == "step"]
    timed = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("op", "wait")]
    if not steps:
        sys.exit(f"{path}: no profiled step")
    total, step_time = {}, 0.0
    for step in steps:
        begin, end = step["ts"], step["ts"] + step["dur"]
        step_time += step["dur"]
        for e in timed:
            if e["pid"] == step["pid"] and e.get("tid") == step.get("tid") and begin <= e["ts"] < end:
                total[op_class(e)] = total.get(op_class(e), 0) + e["dur"]
    gaps = step_time - sum(total.values())
    parts = [f"{c} {100 * total.get(c, 0) / step_time:.1f}%" for c in ORDER]
    parts.append(f"gaps {100 * gaps / step_time:.1f}%")
    print(f"step {step_time / len(steps) / 1000:.1f} ms: " + ", ".join(parts))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a rank's trace: <dump>/profile_traces/iteration_N/rankR_trace.json")
    main(parser.parse_args().trace)
