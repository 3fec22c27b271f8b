#!/usr/bin/env bash
# Out of memory is a message, not a kill: before allocating its arenas, a run whose arenas (plus
# a 5% margin) exceed the memory free to each rank exits 2 at once with one line giving both
# figures and the closest fix; ranks of one node split its free host memory between them.
# run_all: alone (tests/run_all.sh): it reads the host's free memory and times a refusal
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

free_gib() { awk '/^MemAvailable:/ {print $2 / 1048576}' /proc/meminfo; }
NEEDS='out of memory: this run needs [0-9.]+ GiB per rank \(params [0-9.]+, grads [0-9.]+, optimizer [0-9.]+, activations [0-9.]+, comm [0-9.]+ GiB\) plus a 5% margin, but [0-9.]+ GiB of host memory is free per rank \(1 rank on this node\)'

# 70B's weights, gradients and AdamW moments alone are over 1 TiB: shard them over more ranks.
started=$SECONDS
expect_user_error "$NEEDS; try more ranks with FSDP" \
  $TITAN "${SMALL[@]}" --model.flavor 70B --job.dump_folder "$SCRATCH/70b"
[ $((SECONDS - started)) -le 10 ] || fail "the refusal took $((SECONDS - started)) s"
[ -e "$SCRATCH/70b/metrics.jsonl" ] && fail "the refused run started training"

# The 1B flavor (22.7 GiB of arenas) on a machine with less memory than that (this 23 GiB
# one): killed by the kernel before the check, now refused.
need_1b=$($TITAN --estimate "${SMALL[@]}" --model.flavor 1B | awk '$1 == "total" {print $2 / 2^30}')
if awk -v n="$need_1b" -v f="$(free_gib)" 'BEGIN {exit !(n * 1.05 > f)}'; then
  expect_user_error "$NEEDS; try more ranks with FSDP" \
    $TITAN "${SMALL[@]}" --model.flavor 1B --job.dump_folder "$SCRATCH/1b"
fi

# Batches sized from this machine's free memory: one whose activations take 1.5x of it, which
# activation checkpointing brings to about a third, then one 3x over with checkpointing on.
per_row() {  # activation GiB per batch row under the given AC mode, at seq_len 2048
  $TITAN --estimate "${SMALL[@]}" --training.seq_len 2048 --training.local_batch_size 64 \
    --activation_checkpoint.mode "$1" | awk '$1 == "activations" {print $2 / 2^30 / 64}'
}
rows() { awk -v f="$(free_gib)" -v r="$1" -v x="$2" 'BEGIN {printf "%d", x * f / r + 1}'; }
batch=$(rows "$(per_row none)" 1.5)
expect_user_error "$NEEDS; try activation_checkpoint.mode full \(activations [0-9.]+ GiB -> [0-9.]+ GiB\)" \
  $TITAN "${SMALL[@]}" --training.seq_len 2048 --training.local_batch_size "$batch" \
  --activation_checkpoint.mode none --job.dump_folder "$SCRATCH/ac"
batch=$(rows "$(per_row full)" 3)
expect_user_error "$NEEDS; try a smaller training.local_batch_size \(activations are [0-9.]+ GiB\)" \
  $TITAN "${SMALL[@]}" --training.seq_len 2048 --training.local_batch_size "$batch" \
  --activation_checkpoint.mode full --job.dump_folder "$SCRATCH/batch"

# Two ranks on this node: each gets half of its free memory (within the noise of other jobs).
free_per_rank() { grep -o 'fit the [0-9.]* GiB' "$1" | grep -o '[0-9.]*'; }
$TITAN "${SMALL[@]}" --training.steps 1 --job.dump_folder "$SCRATCH/one" >"$SCRATCH/one.log"
mpirun --oversubscribe -np 2 $TITAN "${SMALL[@]}" --training.steps 1 \
  --parallelism.data_parallel_shard_degree 2 --job.dump_folder "$SCRATCH/two" >"$SCRATCH/two.log"
grep -q "(2 ranks on this node)" "$SCRATCH/two.log" || fail "no 2-rank memory check: $(cat "$SCRATCH/two.log")"
one=$(free_per_rank "$SCRATCH/one.log") two=$(free_per_rank "$SCRATCH/two.log")
awk -v a="$one" -v b="$two" 'BEGIN {exit !(b < 0.7 * a)}' ||
  fail "2 ranks each counted $two GiB free, 1 rank $one GiB: the node's memory counted twice"
echo "ok: free memory per rank: $one GiB alone, $two GiB with 2 ranks on the node"
# A refusal on several ranks is still one line (rank 0's), every rank exiting 2.
rc=0
mpirun --oversubscribe -np 2 $TITAN "${SMALL[@]}" --model.flavor 70B \
  --parallelism.data_parallel_shard_degree 2 --job.dump_folder "$SCRATCH/70b2" \
  >/dev/null 2>"$SCRATCH/70b2.err" || rc=$?
[ "$rc" -eq 2 ] || fail "expected exit 2 from 2 ranks, got $rc: $(cat "$SCRATCH/70b2.err")"
[ "$(grep -c '^titan: error: out of memory' "$SCRATCH/70b2.err")" -eq 1 ] ||
  fail "not one error line: $(cat "$SCRATCH/70b2.err")"
grep -q "(2 ranks on this node); try more ranks with FSDP" "$SCRATCH/70b2.err" ||
  fail "$(cat "$SCRATCH/70b2.err")"
echo "ok: $(grep "^titan: error:" "$SCRATCH/70b2.err")"
