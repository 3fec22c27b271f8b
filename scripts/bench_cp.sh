#!/usr/bin/env bash
# Context parallel: the `small` flavor (4 layers, dim 256, 8 heads, 4 kv heads) on one sequence
# of SEQ tokens per step (global batch 1 row: the same global tokens for every layout), at
# cp=1 (one rank), cp=2 and cp=4 (the sequence split over 2 or 4 ranks, 1 thread each), with
# both rotate methods. Prints a markdown table: step time, tokens/s in total and per rank,
# activation memory per rank, K/V bytes per step, rank 0's share of training time blocked on
# K/V traffic, one layer's K/V time alone and under compute, and the share hidden.
#   scripts/bench_cp.sh [STEPS] [SEQ]   (default 8 and 2048; the first step is warmup)
# Step time: the fastest counted step, from (tokens per rank per step: SEQ / cp) / its
# metrics.jsonl tokens_per_s at log_freq 1: the machine is shared, and other jobs only ever slow
# a step (the load averages before and after are printed). Tokens/s: SEQ over the step time.
# Activations: the run's "memory per rank" line (the arena, CP's attention workspace included).
# Blocked in training: rank 0's share of training time spent waiting on K/V traffic (its
# end-of-run "cp:" line, parallel/cp's wait_seconds). It also counts waiting for a slower peer:
# ranks share the cores with other jobs (and with each other at cp=4 on 2 cores), and whatever
# delays one rank anywhere in a step shows up as the other's wait at the next K/V exchange.
# Hidden: the share of the K/V traffic's time that compute hides, 1 - under compute / alone,
# measured apart from that skew by build/tests/bench_cp_ring (tests/reference/bench_cp_ring.c):
# it drives the real Cp hooks on the same cp ranks with the same K/V shapes for steps x layers
# attention forward + backward pairs, each after a barrier (a peer's late start is not
# counted), its kernels wrapped in timers. A pair's communication time is its wall time less
# its time in kernels: the time in the comm calls, starts included. "alone": the attention
# kernels skipped, so every message is sent, received and waited on in the training run's order
# with nothing to overlap it (the traffic's own time); "under compute": with them (what the
# chunks did not hide). Every transfer starts and ends inside a hook call, so the attention
# chunks are all the compute that could hide it. Both are rank 0's least time over the pairs
# (other jobs only ever add to it). The script checks that the replay sent exactly the bytes
# the training run's K/V line reports. allgather's collectives block, so it hides nothing by
# construction; hidden below 0 means time that is not the transfers' (skew left within a pair,
# when ranks time-share cores), so on a loaded machine no number here is clean. Expect little
# hidden on the cpu backend even on a quiet one: Open MPI's shared-memory transport moves a
# large message as one copy (CMA) that the receiver makes inside an MPI call, so nothing moves
# while a rank computes (a 2-rank isend/irecv of 4 MiB with 20 ms of compute between post and
# wait spent no less time in MPI calls than with none). The ring tests its transfers between
# chunk pairs, so that copy happens early instead of at the wait, but it is still the rank's
# own time: the overlap needs a transport that progresses on its own, as NCCL's does.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8} seq=${2:-2048}
warmup=1 layers=4 heads=8 kv_heads=4 head_dim=32  # models/llama3/args.c's small
make -s titan build/tests/bench_cp_ring test-data
out=$(mktemp -d /tmp/titan-bench-cp.XXXXXX)
trap 'rm -rf "$out"' EXIT
cores=$(nproc)  # before OMP_NUM_THREADS, which nproc reports instead
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
./titan tokenize --tokenizer bytes --out "$out/data" build/test-data/corpus/austen.txt >/dev/null
P=--parallelism
common=(--config configs/debug_model.yaml --model.flavor small --model.tokenizer_path null
        --training.dataset_path "$out/data" --training.seq_len "$seq" --training.local_batch_size 1
        --training.global_batch_size 1 --training.steps "$steps" --lr_scheduler.warmup_steps 2
        --metrics.log_freq 1)

echo "machine: $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"

run() {  # name, ranks, overrides...: the log in $out/name.log, the metrics in $out/name
  local name=$1 np=$2; shift 2
  mpirun --oversubscribe -np "$np" ./titan "${common[@]}" --job.dump_folder "$out/$name" "$@" \
    >"$out/$name.log" 2>&1 || { tail -n 5 "$out/$name.log"; exit 1; }
}
step_ms() {  # dump folder, tokens rank 0 trains per step: the fastest counted step, in ms
  grep -o '"tokens_per_s": [0-9.e+]*' "$1/metrics.jsonl" | tail -n +$((warmup + 1)) |
    awk -v t="$2" '{ ms = 1e3 * t / $2; if (NR == 1 || ms < min) min = ms } END { printf "%.1f", min }'
}
activations() { sed -n 's/^memory per rank:.* activations \([0-9.]*\) MiB (.*/\1/p' "$1"; }
row() {  # cp, rotate, step ms, activations, K/V MiB per step, blocked share, alone, under, hidden
  local tps; tps=$(awk -v ms="$3" -v t="$seq" 'BEGIN { printf "%.0f", t / (ms / 1e3) }')
  printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n" "$1" "$2" "$3" "$tps" \
    "$((tps / $1))" "$4" "$5" "$6" "$7" "$8" "$9"
}

run cp1 1
grep -E "^kernels" "$out/cp1.log" || true
echo
echo "| cp | rotate | step ms | tokens/s | tokens/s per rank | activations MiB per rank |" \
  "K/V MiB per step | blocked in training | K/V ms per layer alone | K/V ms per layer" \
  "under compute (of ms) | hidden |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
row 1 - "$(step_ms "$out/cp1" "$seq")" "$(activations "$out/cp1.log")" - - - - -
for cp in 2 4; do
  for rotate in allgather alltoall; do
    name=cp$cp-$rotate
    run "$name" "$cp" $P.context_parallel_degree "$cp" $P.context_parallel_rotate_method "$rotate"
    sent=$(sed -n 's/^cp: .*, \([0-9.]*\) MiB sent, .*/\1/p' "$out/$name.log")
    share=$(sed -n 's/^cp: .* s blocked on them (\([0-9.]*%\) of training)/\1/p' "$out/$name.log")
    mpirun --oversubscribe -np "$cp" build/tests/bench_cp_ring "$rotate" 1 "$seq" $heads \
      $kv_heads $head_dim $((steps * layers)) >"$out/$name.ring"
    # "alone: M MiB sent in N pairs; communication per pair: A ms alone, C ms under compute of W ms"
    read -r replayed alone under wall < <(grep -o '[0-9.]* \(MiB sent\|ms\)' "$out/$name.ring" |
                                          cut -d' ' -f1 | xargs)
    [ "$replayed" = "$sent" ] ||
      { echo "$name: the replay sent $replayed MiB, the training run $sent"; exit 1; }
    row "$cp" "$rotate" "$(step_ms "$out/$name" $((seq / cp)))" "$(activations "$out/$name.log")" \
      "$(awk -v s="$sent" -v n="$steps" 'BEGIN { printf "%.1f", s / n }')" "$share" "$alone" \
      "$under (of $wall)" "$(awk -v u="$under" -v a="$alone" 'BEGIN { printf "%.2f", 1 - u / a }')"
  done
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
