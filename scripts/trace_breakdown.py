#!/usr/bin/env python3
"""A profiled step's time by op class, from titan's Chrome trace (core/profiler.h): GEMM,
attention, norms and elementwise, casts, optimizer, and the gaps between ops (the host's
issue time: in a profiled step every op is synchronized alone, so the ops do not overlap).
Standard library only (GPU machines have no package registry).

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


def op_class(name):
    for cls, prefixes in CLASSES:
        if name.startswith(prefixes):
            return cls
    return "norms+elementwise"


def main(path):
    events = json.load(open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps = [e for e in events if e.get("ph") == "X" and e.get("cat") == "step"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "op"]
    if not steps:
        sys.exit(f"{path}: no profiled step")
    step = steps[-1]
    begin, end = step["ts"], step["ts"] + step["dur"]
    total = {}
    for e in ops:
        if e["pid"] == step["pid"] and begin <= e["ts"] < end:
            total[op_class(e["name"])] = total.get(op_class(e["name"]), 0) + e["dur"]
    gaps = step["dur"] - sum(total.values())
    order = [c for c, _ in CLASSES[:2]] + ["norms+elementwise"] + [c for c, _ in CLASSES[2:]]
    parts = [f"{c} {100 * total.get(c, 0) / step['dur']:.1f}%" for c in order]
    parts.append(f"gaps {100 * gaps / step['dur']:.1f}%")
    print(f"step {step['dur'] / 1000:.1f} ms: " + ", ".join(parts))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a rank's trace: <dump>/profile_traces/iteration_N/rankR_trace.json")
    main(parser.parse_args().trace)
