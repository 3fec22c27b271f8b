#!/usr/bin/env bash
# Semi-synchronous training over dp_replicate (semi_sync.*, parallel/semi_sync.h): replica
# groups of dp_shard 2 (HSDP inside) that take inner steps alone and sync by DiLoCo's outer step.
# - Streaming DiLoCo (2 fragments of the debug model's 8 blocks: the embedding, 6 layers and the
#   head; H 4, a delay of 1 step, alpha 0.5, outer lr and momentum not the defaults): 8 steps within 1e-5 of a float64 PyTorch
#   reference of two replica groups written from the published algorithm
#   (tests/reference/check_train.py's train_semi_sync).
# - A property: with an inner step linear in the gradient (AdamW with eps far above every
#   gradient is SGD with momentum at lr / eps; no weight decay, no clipping), DiLoCo with H 1,
#   outer lr 1 and no momentum is synchronous HSDP: the same losses within 1e-5. (With AdamW's
#   usual eps it is not: the mean of the groups' AdamW steps is not AdamW's step on the mean.)
# - Bytes: H 10 moves exactly 10x fewer bytes over dp_replicate than HSDP (comm counters), the
#   mean per step --estimate predicts.
# - A checkpoint inside a fragment's sync window (its averaged delta in flight, each group's own
#   weights and moments) resumes bit-identically, and under dp_replicate 2 x dp_shard 1 (each
#   group plain DDP) within 1e-5.
# - Bad settings, one line, exit 2.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

P=--parallelism
HSDP=(${SMALL[@]} --training.local_batch_size 2 $P.data_parallel_replicate_degree 2
      $P.data_parallel_shard_degree 2 --lr_scheduler.warmup_steps 3)
STREAMING=(--semi_sync.method streaming_diloco --semi_sync.sync_steps 4 --semi_sync.num_fragments 2
           --semi_sync.fragment_sync_delay 1 --semi_sync.fragment_update_alpha 0.5
           --semi_sync.outer_lr 0.5 --semi_sync.outer_momentum 0.8)
replicate_bytes() { awk '/comm: group dp_replicate/ {print $(NF-3)}' "$SCRATCH/$1.log"; }

# ---- parity and resume -----------------------------------------------------------------------
run=("${HSDP[@]}" "${STREAMING[@]}" --training.steps 8 --training.max_norm 0.5)
train_ranks streaming 4 "${run[@]}" --checkpoint.create_seed_checkpoint
seed=$SCRATCH/streaming/checkpoint/step-0.h5
train_ranks streaming 4 "${run[@]}" --checkpoint.initial_load_path "$seed" --checkpoint.enable \
  --checkpoint.interval 5
$PY tests/reference/check_train.py "$seed" "$SCRATCH/streaming/metrics.jsonl" --dtype float64 \
  --tolerance 1e-5 | tail -1
# After step 5 fragment 0's all-reduce is in flight (it syncs at step 6): its delta is saved.
$PY - "$SCRATCH/streaming/checkpoint/step-5.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    delta = sorted(f["semi_sync/delta"].keys())
    assert "tok_embeddings.weight" in delta and "layers.2.attention.wq.weight" in delta, delta
    assert not any(n.startswith(("layers.3.", "output")) for n in delta), delta
    for name in ("model/output.weight", "optimizer/exp_avg_sq/output.weight"):
        assert "semi_sync/replica_1/" + name in f, name
    assert int(f.attrs["semi_sync.replicas"]) == 2
print(f"ok: step-5.h5 holds fragment 0's delta ({len(delta)} tensors) and replica 1's state")
PY
for layout in same ddp; do
  mkdir -p "$SCRATCH/resumed-$layout/checkpoint"
  cp "$SCRATCH/streaming/checkpoint/step-5.h5" "$SCRATCH/resumed-$layout/checkpoint/"
done
train_ranks resumed-same 4 "${run[@]}" --checkpoint.enable --checkpoint.interval 5
same_metrics "resumed at step 5" "$SCRATCH/streaming/metrics.jsonl" \
  "$SCRATCH/resumed-same/metrics.jsonl" 6 0
train_ranks resumed-ddp 2 "${run[@]}" --training.local_batch_size 4 $P.data_parallel_shard_degree 1 \
  --checkpoint.enable --checkpoint.interval 5
same_metrics "resumed under dp_shard 1" "$SCRATCH/streaming/metrics.jsonl" \
  "$SCRATCH/resumed-ddp/metrics.jsonl" 6 1e-5

# ---- H = 1 is HSDP; H = 10 moves a tenth of its bytes ------------------------------------------
linear=("${HSDP[@]}" --training.steps 10 --training.max_norm 1e9 --optimizer.eps 1e4
        --optimizer.lr 2e3 --optimizer.weight_decay 0)
train_ranks hsdp 4 "${linear[@]}"
train_ranks h1 4 "${linear[@]}" --semi_sync.method diloco --semi_sync.sync_steps 1 \
  --semi_sync.outer_lr 1 --semi_sync.outer_momentum 0
layout_matches "DiLoCo H=1 vs HSDP" "$SCRATCH/hsdp/metrics.jsonl" "$SCRATCH/h1/metrics.jsonl" loss
train_ranks h10 4 "${linear[@]}" --semi_sync.method diloco --semi_sync.sync_steps 10
hsdp=$(replicate_bytes hsdp) h10=$(replicate_bytes h10)
[ "$hsdp" -gt 0 ] && [ "$hsdp" -eq $((10 * h10)) ] ||
  fail "dp_replicate bytes: HSDP $hsdp, DiLoCo H=10 $h10 (not a tenth)"
echo "ok: dp_replicate bytes over 10 steps: HSDP $hsdp, DiLoCo H=10 $h10"
estimated=$($TITAN "${linear[@]}" --semi_sync.method diloco --semi_sync.sync_steps 10 --estimate \
  --world-size 4 | awk '$1 == "dp_replicate" {print $2}')
[ "$estimated" -eq $((h10 / 10)) ] ||
  fail "--estimate: $estimated dp_replicate bytes per step, the run moved $h10 in 10 steps"
echo "ok: --estimate's dp_replicate bytes per step, $estimated, are the run's mean"

# ---- bad settings ----------------------------------------------------------------------------
bad=("${HSDP[@]}" --job.dump_folder "$SCRATCH/bad" --estimate --world-size 4)
expect_user_error "^titan: error: --semi_sync.sync_steps: expects an integer in \[1, 2147483647\], got '0'" \
  $TITAN "${bad[@]}" --semi_sync.method diloco --semi_sync.sync_steps 0
expect_user_error "^titan: error: semi_sync.num_fragments 3 does not divide the model's 8 blocks \(its 6 layers" \
  $TITAN "${bad[@]}" "${STREAMING[@]}" --semi_sync.num_fragments 3 --semi_sync.sync_steps 6
expect_user_error "^titan: error: --semi_sync.sync_steps: semi_sync.sync_steps = 4 does nothing: semi_sync.method is none" \
  $TITAN "${bad[@]}" --semi_sync.sync_steps 4
expect_user_error "semi_sync.fragment_update_alpha = 0.5 is streaming DiLoCo's" \
  $TITAN "${bad[@]}" --semi_sync.method diloco --semi_sync.fragment_update_alpha 0.5
expect_user_error "semi_sync.method = 'diloco' .* needs replica groups to sync" \
  $TITAN "${SMALL[@]}" --semi_sync.method diloco --estimate
expect_user_error "semi_sync.sync_steps = 7 .* must be a multiple of semi_sync.num_fragments = 2" \
  $TITAN "${bad[@]}" "${STREAMING[@]}" --semi_sync.sync_steps 7
expect_user_error "semi_sync.fragment_sync_delay = 2 .* must be less than sync_steps / num_fragments = 2" \
  $TITAN "${bad[@]}" "${STREAMING[@]}" --semi_sync.fragment_sync_delay 2
expect_user_error "^titan: error: --comm.dp_replicate_link_gbps: comm.dp_replicate_link_gbps = 1.0 does nothing: parallelism.data_parallel_replicate_degree is 1" \
  $TITAN "${SMALL[@]}" --comm.dp_replicate_link_gbps 1 --estimate
# DeepSeek's MTP head keeps a copy of the embedding (Param.copy): both must sync together.
expect_user_error "^titan: error: semi_sync.num_fragments 2 puts tok_embeddings.weight's two copies .* in different fragments" \
  $TITAN --config configs/deepseek_v3_debug.yaml --model.tokenizer_path null --model.mtp_layers 1 \
  $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 2 "${STREAMING[@]}" \
  --estimate --world-size 4
expect_job_error "checkpoint .*step-5.h5 was saved with semi_sync.sync_steps 4, this run has 12" \
  mpirun --oversubscribe -np 4 $TITAN "${run[@]}" --semi_sync.sync_steps 12 --checkpoint.enable \
  --job.dump_folder "$SCRATCH/resumed-same" --checkpoint.load_step 5
