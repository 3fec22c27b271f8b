#!/usr/bin/env bash
# The debug server's cost to training: tokens/s of a 2-rank FSDP run of the debug model with
# comm.enable_debug_server off and on, in alternating rounds; while a run with it on trains, a
# client reads every page of both ranks: /status and /metrics five times a second, /flight_recorder
# and /stacks (which interrupts every thread of the rank for its backtrace) once a second.
#   scripts/bench_debug_server.sh [ROUNDS] [STEPS]   (default 5 rounds of 60 steps)
# Each run's figure is the median of its logged tokens/s (every 5 steps, the first interval
# left out as warm-up); each mode's is the median over its rounds, with the rounds' spread (the
# noise of the machine), and the ratio on / off.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s titan
rounds=${1:-5} steps=${2:-60}
out=$(mktemp -d /tmp/titan-bench-debug.XXXXXX)
client=
trap '[ -n "$client" ] && kill "$client" 2>/dev/null; rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
./titan tokenize --tokenizer bytes --out "$out/data" ../shared/data/corpus/austen.txt >/dev/null
port=$((30000 + RANDOM % 20000))
run=(--config configs/debug_model.yaml --model.tokenizer_path null --training.dataset_path "$out/data"
     --training.seq_len 128 --training.local_batch_size 4 --training.steps "$steps"
     --metrics.log_freq 5 --parallelism.data_parallel_shard_degree 2)

poll() {  # every page of both ranks, until killed
  local i=0
  while :; do
    for r in 0 1; do
      local url=http://127.0.0.1:$((port + r))
      curl -s --max-time 5 "$url/status" "$url/metrics" >/dev/null || true
      if [ $((i % 5)) -eq 0 ]; then
        curl -s --max-time 5 "$url/flight_recorder" "$url/stacks" >/dev/null || true
      fi
    done
    i=$((i + 1))
    sleep 0.2
  done
}

tokens_per_s() {  # metrics.jsonl: the median of its tokens/s after the first interval
  /usr/bin/python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(statistics.median(r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r["step"] > 5))' "$1"
}

for round in $(seq "$rounds"); do
  for mode in off on; do
    dir=$out/$mode$round
    flags=()
    if [ "$mode" = on ]; then
      flags=(--comm.enable_debug_server --comm.debug_server_port "$port")
      poll & client=$!
    fi
    mpirun --oversubscribe -np 2 ./titan "${run[@]}" "${flags[@]}" --job.dump_folder "$dir" \
      >"$dir.log" 2>&1 || { tail -n 5 "$dir.log"; exit 1; }
    if [ -n "$client" ]; then kill "$client"; wait "$client" 2>/dev/null || true; client=; fi
    echo "$(tokens_per_s "$dir/metrics.jsonl")" >>"$out/$mode"
    printf "round %d %-3s %8.0f tok/s\n" "$round" "$mode" "$(tail -n 1 "$out/$mode")"
  done
done
/usr/bin/python3 - "$out/off" "$out/on" <<'PY'
import statistics, sys
off, on = ([float(x) for x in open(p)] for p in sys.argv[1:])
for name, v in (("off", off), ("on", on)):
    print(f"debug server {name:3s}: median {statistics.median(v):8.0f} tok/s per device, "
          f"rounds {min(v):.0f} .. {max(v):.0f} ({100 * (max(v) - min(v)) / statistics.median(v):.1f}% spread)")
print(f"on / off: {statistics.median(on) / statistics.median(off):.3f}")
PY
