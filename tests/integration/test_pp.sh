#!/usr/bin/env bash
# Pipeline parallel (issue 11): every schedule, a CSV schedule, and pp composed with FSDP and
# TP train the same model as one rank: loss and grad norm within 1e-5 relative at each of 10
# steps, and the validation loss (forward only through the stages) at steps 5 and 10; FSDP's
# gradients are reduce-scattered once per step, not per microbatch. The activation memory of stage 0 is flat in the microbatch count under 1F1B and grows
# under GPipe. A schedule that needs what the model cannot give is refused in one line. The
# executor's unit test (a chain of one-weight stages) runs on 2 and 4 ranks.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
P=--parallelism
for np in 2 4; do unit_test_on_ranks test_pp_executor "$np"; done
# local batch 8 rows: on one rank in one microbatch, on pp ranks in microbatches of 2 (or 1).
# Validation every 5 steps, forward only through the stages: 4 rows (2 per dp rank under
# dp_shard 2).
run=("${LAYOUT_RUN[@]}")
train_ranks one 1 "${run[@]}"

same_as_one_rank() {  # name, ranks, overrides...
  train_ranks "$1" "$2" "${run[@]}" "${@:3}"
  same_metrics "$1" "$SCRATCH/one/metrics.jsonl" "$SCRATCH/$1/metrics.jsonl" 1 1e-5
}

PP2=($P.pipeline_parallel_degree 2 $P.pipeline_parallel_microbatch_size 2)
for schedule in GPipe 1F1B Interleaved1F1B LoopedBFS InterleavedZeroBubble ZBVZeroBubble DualPipeV; do
  same_as_one_rank "pp=2 $schedule" 2 "${PP2[@]}" $P.pipeline_parallel_schedule $schedule
done
same_as_one_rank "pp=4 Interleaved1F1B (8 stages)" 4 $P.pipeline_parallel_degree 4 \
  $P.pipeline_parallel_microbatch_size 2 $P.pipeline_parallel_schedule Interleaved1F1B
# One layer per stage: 8 stages, 4 per rank (the embedding and the head alone on theirs).
same_as_one_rank "pp=2 Interleaved1F1B, 4 stages per rank" 2 "${PP2[@]}" \
  $P.pipeline_parallel_schedule Interleaved1F1B $P.pipeline_parallel_layers_per_stage 1
# Gradient accumulation: two batches of 4 rows per step, each through the pipeline.
same_as_one_rank "pp=2, 2 accumulation steps" 2 "${PP2[@]}" --training.local_batch_size 4 \
  --training.global_batch_size 8
# Its log says so once: the accumulation steps, then how pp splits each batch.
grep -q "^model: .*; batch 4 x [0-9]* tokens per rank, 2 gradient accumulation steps;" \
  "$SCRATCH/pp=2, 2 accumulation steps.log" &&
  grep -q "^pipeline: 1F1B, each batch of 4 rows in 2 microbatches of 2 rows$" \
    "$SCRATCH/pp=2, 2 accumulation steps.log" ||
  fail "the log's batch lines: $(grep "^model:\|^pipeline:" "$SCRATCH/pp=2, 2 accumulation steps.log")"
# A hand-written CSV (compute only; the sends and receives are added): rank 1 splits its
# backward into I and W and defers the weight parts, which no generator does in this order.
cat >"$SCRATCH/split.csv" <<'CSV'
0F0,0F1,0B0,0F2,0B1,0F3,0B2,0B3
1F0,1I0,1F1,1I1,1W0,1F2,1I2,1W1,1F3,1I3,1W2,1W3
CSV
same_as_one_rank "pp=2 CSV schedule" 2 "${PP2[@]}" \
  $P.pipeline_parallel_schedule_csv "$SCRATCH/split.csv"
# Composed: dp_shard halves the local batch (global 8 rows as on one rank).
for schedule in 1F1B ZBVZeroBubble; do  # ZBV: FSDP with the backward split into I and W
  same_as_one_rank "pp=2 x dp_shard=2 $schedule" 4 $P.pipeline_parallel_degree 2 \
    $P.data_parallel_shard_degree 2 $P.pipeline_parallel_microbatch_size 1 \
    --training.local_batch_size 4 --validation.local_batch_size 2 \
    $P.pipeline_parallel_schedule $schedule
done
same_as_one_rank "pp=2 x tp=2" 4 "${PP2[@]}" $P.tensor_parallel_degree 2 \
  $P.data_parallel_shard_degree 1
same_as_one_rank "pp=2 x dp_shard=2 x tp=2" 8 $P.pipeline_parallel_degree 2 \
  $P.data_parallel_shard_degree 2 $P.tensor_parallel_degree 2 \
  $P.pipeline_parallel_microbatch_size 1 --training.local_batch_size 4 \
  --validation.local_batch_size 2

# FSDP under pp reduce-scatters once per step: from 2 to 4 microbatches, rank 0 (stage 0: the
# embedding and 3 layers, 4 FSDP units) adds 2 x 4 all-gathers per extra microbatch (forward,
# and backward after resharding) and no reduce-scatter.
fsdp_ops() {  # microbatches
  mpirun --oversubscribe -np 4 $TITAN "${run[@]}" --training.steps 1 $P.pipeline_parallel_degree 2 \
    $P.data_parallel_shard_degree 2 $P.pipeline_parallel_microbatch_size 1 \
    --training.local_batch_size "$1" --job.dump_folder "$SCRATCH/ops-$1" 2>&1 |
    sed -n 's/^comm: group fsdp *\([0-9]*\) ops.*/\1/p'
}
o2=$(fsdp_ops 2) o4=$(fsdp_ops 4)
[ -n "$o2" ] && [ $((o4 - o2)) -eq 16 ] ||
  fail "fsdp ops at 2 and 4 microbatches: $o2, $o4 (a reduce-scatter per microbatch adds 8 more)"
echo "ok: fsdp operations at 2 -> 4 microbatches: $o2 -> $o4 (gathers only: reduce-scatter once per step)"

# Activation memory of stage 0 (rank 0's memory line) at 2pp and 8pp microbatches of one row.
activations() {  # schedule, microbatches
  mpirun --oversubscribe -np 2 $TITAN "${run[@]}" --training.steps 1 \
    $P.pipeline_parallel_degree 2 $P.pipeline_parallel_microbatch_size 1 \
    $P.pipeline_parallel_schedule "$1" --training.local_batch_size "$2" \
    --job.dump_folder "$SCRATCH/mem-$1-$2" 2>&1 |
    sed -n 's/.*memory per rank: activations \([0-9.]*\) MiB .*/\1/p'
}
f4=$(activations 1F1B 4) f16=$(activations 1F1B 16) g4=$(activations GPipe 4) g16=$(activations GPipe 16)
[ -n "$f4" ] && [ "$f4" = "$f16" ] || fail "1F1B stage 0 activations ${f4} MiB at 4 microbatches, ${f16} MiB at 16"
$PY -c "import sys; sys.exit(not float('$g16') > 3 * float('$g4'))" ||
  fail "GPipe stage 0 activations do not grow with microbatches: $g4 MiB at 4, $g16 MiB at 16"
echo "ok: stage 0 activations, 4 -> 16 microbatches: 1F1B $f4 -> $f16 MiB, GPipe $g4 -> $g16 MiB"

expect_job_error "model.tie_word_embeddings cannot be trained with pipeline parallel" \
  mpirun --oversubscribe -np 2 $TITAN "${run[@]}" "${PP2[@]}" --model.tie_word_embeddings
expect_job_error "validation.local_batch_size 3 is not a multiple of parallelism.pipeline_parallel_microbatch_size 2" \
  mpirun --oversubscribe -np 2 $TITAN "${run[@]}" "${PP2[@]}" --validation.local_batch_size 3
expect_job_error "pipeline_parallel_layers_per_stage 1 makes 4 stages per rank: pipeline schedule 1F1B runs 1 stages per rank, not 4" \
  mpirun --oversubscribe -np 2 $TITAN "${run[@]}" "${PP2[@]}" $P.pipeline_parallel_layers_per_stage 1
