#!/usr/bin/env bash
# Semi-synchronous training against synchronous HSDP over a slow link between the replica
# groups: the debug model on Austen, 4 ranks as 2 replica groups of dp_shard 2 (HSDP 2x2),
# 4 x 128 tokens per rank a step, the same data and seed in every run:
#   HSDP            the gradients all-reduced over dp_replicate every step
#   DiLoCo H=10     semi_sync.method diloco, sync_steps 10, torchtitan's outer SGD (lr 0.7,
#                   Nesterov momentum 0.9)
#   ... averaging   the same with outer lr 1 and no momentum: the groups' weights averaged
#   DiLoCo H=50     sync_steps 50
#   streaming       streaming_diloco, 4 fragments of the 8 blocks, sync_steps 48 (a fragment
#                   every 12 steps), fragment_sync_delay 4, fragment_update_alpha 0.5
#   scripts/bench_semi_sync.sh [STEPS] [LATENCY_MS] [GBPS] [ROUNDS]   (default 300 50 1 3)
# Loss: each run trains STEPS steps; the training loss at STEPS/3, 2 STEPS/3 and STEPS (the
# mean of the 10 steps ending there, one step's loss being noisy) is at equal tokens in every
# run. Bytes: over dp_replicate per step (comm counters / steps).
# Speed: over a simulated link (comm.dp_replicate_link_latency_ms and _gbps: every collective
# over dp_replicate completes no sooner than the latency plus its bytes at that bandwidth after
# it starts; the groups here share one machine's memory), each run trains 55 steps and its
# tokens/s per device is over steps 6-55 (every method syncs in them: HSDP each step, H=10 five
# times, H=50 once, streaming 4 fragments), sync steps included. The machine's speed drifts by
# 25% over minutes, so the runs take turns in ROUNDS rounds and each keeps its best; HSDP
# without the link is the ceiling.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300} latency=${2:-50} gbps=${3:-1} rounds=${4:-3}
make -s titan test-data
out=$(mktemp -d /tmp/titan-bench-semi-sync.XXXXXX)
trap 'rm -rf "$out"' EXIT
cores=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
./titan tokenize --tokenizer bytes --out "$out/data" build/test-data/corpus/austen.txt >/dev/null
P=--parallelism
common=(--config configs/debug_model.yaml --model.tokenizer_path null
        --training.dataset_path "$out/data" --training.seq_len 128 --training.local_batch_size 4
        --lr_scheduler.warmup_steps 20 --metrics.log_freq 1
        $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 2)
link=(--comm.dp_replicate_link_latency_ms "$latency" --comm.dp_replicate_link_gbps "$gbps")
names=("HSDP" "DiLoCo H=10" "DiLoCo H=10, averaging" "DiLoCo H=50" "streaming H=48, 4 fragments")
methods=("" "--semi_sync.method diloco --semi_sync.sync_steps 10"
         "--semi_sync.method diloco --semi_sync.sync_steps 10 --semi_sync.outer_lr 1 --semi_sync.outer_momentum 0"
         "--semi_sync.method diloco --semi_sync.sync_steps 50"
         "--semi_sync.method streaming_diloco --semi_sync.sync_steps 48 --semi_sync.num_fragments 4 --semi_sync.fragment_sync_delay 4 --semi_sync.fragment_update_alpha 0.5")

echo "machine: $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "debug model, 4 ranks = dp_replicate 2 x dp_shard 2, 4 x 128 tokens per rank a step;" \
  "the link between the groups: ${latency} ms + the bytes at ${gbps} Gbit/s per collective"
run() {  # dump folder name, steps, overrides...
  local name=$1 n=$2; shift 2
  mpirun --oversubscribe -np 4 ./titan "${common[@]}" --training.steps "$n" \
    --job.dump_folder "$out/$name" "$@" >"$out/$name.log" 2>&1 ||
    { tail -n 5 "$out/$name.log"; exit 1; }
}
# tokens/s per device over steps 6..55 of a speed run: the steps' tokens over their time.
speed() {
  /usr/bin/python3 -c 'import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r and r["step"] > 5]
print(round(len(rows) / sum(1 / r["tokens_per_s"] for r in rows)))' "$1/metrics.jsonl"
}

declare -A best
for round in $(seq "$rounds"); do
  for i in "${!names[@]}"; do
    # shellcheck disable=SC2086
    run "speed-$i" 55 "${link[@]}" ${methods[$i]}
    tps=$(speed "$out/speed-$i")
    [ "${best[$i]:-0}" -ge "$tps" ] || best[$i]=$tps
  done
  run speed-free 55
  tps=$(speed "$out/speed-free")
  [ "${best[free]:-0}" -ge "$tps" ] || best[free]=$tps
done

printf "\n%-28s %14s %10s %9s %9s %9s\n" run "dp_rep B/step" "tok/s/dev" \
  "loss@$((steps / 3))" "loss@$((2 * steps / 3))" "loss@$steps"
for i in "${!names[@]}"; do
  # shellcheck disable=SC2086
  run "loss-$i" "$steps" ${methods[$i]}
  bytes=$(awk '/comm: group dp_replicate/ {print $(NF-3)}' "$out/loss-$i.log")
  /usr/bin/python3 - "${names[$i]}" "$out/loss-$i/metrics.jsonl" "$steps" "$bytes" \
    "${best[$i]}" <<'PY'
import json, sys
name, path, steps, replicate_bytes, tps = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5])
rows = {r["step"]: r for r in map(json.loads, open(path)) if "loss" in r}
window = lambda end: sum(rows[s]["loss"] for s in range(end - 9, end + 1)) / 10
print(f"{name:28s} {replicate_bytes / steps:14.0f} {tps:10d} "
      f"{window(steps // 3):9.4f} {window(2 * steps // 3):9.4f} {window(steps):9.4f}")
PY
done
printf "%-28s %14s %10s\n" "HSDP without the link" "" "${best[free]}"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
