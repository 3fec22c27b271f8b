#!/usr/bin/env bash
# Pipeline parallel throughput: the `small` flavor (4 layers, dim 256, seq 256, global batch 8
# rows) trained with each schedule at pp=2 and pp=4 (8 microbatches of one row, 1 thread per
# rank), against dp_shard at the same rank count (pp=1, local batch 8 / ranks, same global
# batch) and against one rank. Prints the step time, tokens/s in total and per device, and the
# bubble of each schedule: predicted and measured.
#   scripts/bench_pp.sh [STEPS]   (default 40; the first 2 are warmup and not counted)
# Step time: the fastest counted step, from (tokens per device per step / its metrics.jsonl
# tokens_per_s at log_freq 1, which divides a step's tokens over the ranks of a pipeline as
# torchtitan does): the machine is shared, and other jobs only ever slow a step (the load
# averages before and after are printed; on a loaded machine no number is clean).
# Tokens/s: the global batch over the step time; per device: that over the ranks.
# Predicted bubble: `titan --print-schedule --microbatches 8` for the same pp and schedule, the
# idle share of ranks x time under the unit cost model (F=I=W=1, B=2).
# Measured bubble: 1 - ideal / step time, where ideal is the step time of one rank (1 thread)
# training the same 8 one-row microbatches by gradient accumulation, divided among the ranks
# the cores can run at once: min(ranks, cores). Whatever keeps the pipeline from that ideal
# counts: idle slots of the schedule, unequal stages (the embedding and the output share
# stages with layers), sends and receives. "rank 0 waits" is rank 0's own share of training
# time (warmup included) spent blocked in communication, pipeline receives included.
# 4 ranks oversubscribe a 2-core machine (mpirun --oversubscribe): at pp=4 two ranks share
# each core, so an idle rank lends its core to another and a busy one waits for it; the pp=4
# numbers measure that time-sharing as much as the schedule.
# Schedules with 2 stages per rank need 8 stages at pp=4, more than the 4 layers (+ embedding,
# + output) can fill: titan refuses them (checked with `titan --estimate --world-size 4`),
# and the table says n/a with titan's reason.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40}
warmup=2
make -s titan test-data
out=$(mktemp -d /tmp/titan-bench-pp.XXXXXX)
trap 'rm -rf "$out"' EXIT
cores=$(nproc)  # before OMP_NUM_THREADS, which nproc reports instead
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
./titan tokenize --tokenizer bytes --out "$out/data" build/test-data/corpus/austen.txt >/dev/null
seq=256 batch=8 P=--parallelism
model=(--config configs/debug_model.yaml --model.flavor small --model.tokenizer_path null)
common=("${model[@]}" --training.dataset_path "$out/data" --training.seq_len $seq
        --training.global_batch_size $batch --training.steps "$steps"
        --lr_scheduler.warmup_steps 5 --metrics.log_freq 1)

echo "machine: $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"

step_ms() {  # dump folder, tokens rank 0 trains per step: the fastest counted step, in ms
  grep -o '"tokens_per_s": [0-9.e+]*' "$1/metrics.jsonl" | tail -n +$((warmup + 1)) |
    awk -v t="$2" '{ ms = 1e3 * t / $2; if (NR == 1 || ms < min) min = ms } END { printf "%.1f", min }'
}
run() {  # name, ranks, overrides...: the log in $out/name.log, the metrics in $out/name
  local name=$1 np=$2; shift 2
  mpirun --oversubscribe -np "$np" ./titan "${common[@]}" --job.dump_folder "$out/$name" "$@" \
    >"$out/$name.log" 2>&1 || { tail -n 5 "$out/$name.log"; exit 1; }
}
row() {  # ranks, layout, step ms, predicted bubble, measured bubble, rank 0 waits
  local tps; tps=$(awk -v ms="$3" -v t=$((batch * seq)) 'BEGIN { printf "%.0f", t / (ms / 1e3) }')
  printf "%-5s %-28s %9s %11s %13s %9s %9s %12s\n" "$1" "$2" "$3" "$tps" "$((tps / $1))" "$4" "$5" "$6"
}
waits() { local w; w=$(sed -n 's/.*waiting on collectives (\(.*%\)).*/\1/p' "$1"); echo "${w:-0%}"; }

# The reference: one rank, one thread, 8 microbatches of one row accumulated.
run one 1 --training.local_batch_size 1
grep -E "^kernels" "$out/one.log" || true
one_ms=$(step_ms "$out/one" $((batch * seq)))
printf "\n%-5s %-28s %9s %11s %13s %9s %9s %12s\n" ranks layout "step ms" "tokens/s" \
  "tok/s/device" predicted measured "rank 0 waits"
printf "%-5s %-28s %9s %11s %13s %9s %9s %12s\n" "" "" "" "" "" bubble bubble ""
row 1 "1 rank, 8 x 1 row" "$one_ms" - - "$(waits "$out/one.log")"
for np in 2 4; do
  run "dp$np" "$np" $P.data_parallel_shard_degree "$np" --training.local_batch_size $((batch / np))
  row "$np" "dp_shard=$np" "$(step_ms "$out/dp$np" $((batch * seq / np)))" - - "$(waits "$out/dp$np.log")"
  for schedule in GPipe 1F1B Interleaved1F1B LoopedBFS InterleavedZeroBubble ZBVZeroBubble DualPipeV; do
    pp=($P.pipeline_parallel_degree "$np" $P.pipeline_parallel_schedule "$schedule")
    predicted=$(./titan "${model[@]}" "${pp[@]}" --print-schedule --microbatches $batch |
                sed -n 's/^bubble: \([0-9.]*\) .*/\1/p')
    pp+=($P.pipeline_parallel_microbatch_size 1 --training.local_batch_size $batch)
    name="pp$np-$schedule"
    # titan's plan check on one process, as mpirun may lose rank 0's line when it aborts.
    if refused=$(./titan "${model[@]}" "${pp[@]}" --estimate --world-size "$np" 2>&1 >/dev/null); then
      run "$name" "$np" "${pp[@]}"
      ms=$(step_ms "$out/$name" $((batch * seq / np)))
      measured=$(awk -v one="$one_ms" -v ms="$ms" -v n=$((np < cores ? np : cores)) \
                 'BEGIN { printf "%.4f", 1 - one / n / ms }')
      row "$np" "pp=$np $schedule" "$ms" "$predicted" "$measured" "$(waits "$out/$name.log")"
    else
      printf "%-5s %-28s %9s %11s %13s %9s  n/a: %s\n" "$np" "pp=$np $schedule" - - - \
        "$predicted" "${refused#titan: error: }"
    fi
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
