#!/usr/bin/env bash
# The debug server's cost to training: tokens/s of a 2-rank FSDP run of the debug model with
# comm.enable_debug_server off, on and idle, and on while a client (one Python process) reads
# both ranks' /status and /metrics every second and /flight_recorder and /stacks (which
# interrupts every thread of the rank for its backtrace) every 5 seconds, and that with
# TensorBoard's event files written too (metrics.enable_tensorboard: issue 16's "TensorBoard and
# the debug server on"), in rounds that run the four in turn.
#   scripts/bench_debug_server.sh [ROUNDS] [STEPS]   (default 5 rounds of 40 steps)
# A run's figures: the median of its logged tokens/s (every 5 steps, the first interval left
# out as warm-up), and the CPU seconds (user + system) the job's processes used per step, which
# other load on a shared machine inflates far less than it does wall time. Printed per mode:
# the medians over the rounds, the tokens/s spread (the machine's noise), and the median over
# the rounds of each round's ratio to its own run with the server off (which cancels the slow
# drifts of the machine's load).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s titan test-data
rounds=${1:-5} steps=${2:-40}
out=$(mktemp -d /tmp/titan-bench-debug.XXXXXX)
client=
trap '[ -n "$client" ] && kill "$client" 2>/dev/null; rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
./titan tokenize --tokenizer bytes --out "$out/data" build/test-data/corpus/austen.txt >/dev/null
port=$((30000 + RANDOM % 20000))
run=(--config configs/debug_model.yaml --model.tokenizer_path null --training.dataset_path "$out/data"
     --training.seq_len 128 --training.local_batch_size 4 --training.steps "$steps"
     --metrics.log_freq 5 --parallelism.data_parallel_shard_degree 2)

poll() {  # every page of both ranks, until killed
  /usr/bin/python3 - "$port" <<'PY'
import sys, time, urllib.request
port = int(sys.argv[1])
for i in range(10**9):
    for r in (0, 1):
        pages = ["status", "metrics"] + (["flight_recorder", "stacks"] if i % 5 == 0 else [])
        for page in pages:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port + r}/{page}", timeout=5).read()
            except OSError:
                pass  # not listening yet, or gone
    time.sleep(1)
PY
}

tokens_per_s() {  # metrics.jsonl: the median of its tokens/s after the first interval
  /usr/bin/python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(statistics.median(r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r["step"] > 5))' "$1"
}

for round in $(seq "$rounds"); do
  for mode in off idle polled tb; do
    dir=$out/$mode$round
    flags=()
    [ "$mode" = off ] || flags=(--comm.enable_debug_server --comm.debug_server_port "$port")
    [ "$mode" = tb ] && flags+=(--metrics.enable_tensorboard)
    if [ "$mode" = polled ] || [ "$mode" = tb ]; then poll & client=$!; fi
    cpu=$( { TIMEFORMAT='%U + %S'; time mpirun --oversubscribe -np 2 ./titan "${run[@]}" \
      "${flags[@]}" --job.dump_folder "$dir" >"$dir.log" 2>&1 || { tail -n 5 "$dir.log"; exit 1; }
    } 2>&1 )
    if [ -n "$client" ]; then kill "$client"; wait "$client" 2>/dev/null || true; client=; fi
    echo "$(tokens_per_s "$dir/metrics.jsonl") $(awk "BEGIN { print ($cpu) / $steps }")" >>"$out/$mode"
    read -r tps cps < <(tail -n 1 "$out/$mode")
    printf "round %d %-6s %8.0f tok/s %8.3f CPU s/step\n" "$round" "$mode" "$tps" "$cps"
  done
done
/usr/bin/python3 - "$out" <<'PY'
import statistics, sys
runs = {m: [list(map(float, l.split())) for l in open(f"{sys.argv[1]}/{m}")]
        for m in ("off", "idle", "polled", "tb")}
def paired(m, k):  # the median over the rounds of this round's figure over its "off" run's
    return statistics.median(r[k] / o[k] for r, o in zip(runs[m], runs["off"]))
for m, rows in runs.items():
    tps, cps = [r[0] for r in rows], [r[1] for r in rows]
    med = statistics.median(tps)
    name = "polled + tensorboard" if m == "tb" else m
    print(f"debug server {name:20s}: {med:7.0f} tok/s per device ({min(tps):.0f} .. {max(tps):.0f}, "
          f"{100 * (max(tps) - min(tps)) / med:.0f}% spread), {paired(m, 0):.3f} x off; "
          f"{statistics.median(cps):.3f} CPU s/step, {paired(m, 1):.3f} x off")
PY
