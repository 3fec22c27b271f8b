#!/usr/bin/env bash
# Muon (optimizer.name Muon): the matrices optimizer.muon_pattern names take Muon's update
# (momentum, Newton-Schulz orthogonalization, the shape's lr), the other parameters AdamW.
# - 20 steps equal a float64 PyTorch reference of the same update, written from the published
#   algorithm (tests/reference/check_train.py --dtype float64), within 1e-5: Qwen3's small
#   (wide and tall matrices) and small_moe (each expert of its stacked weights a matrix of its
#   own). (The debug model's 20 steps pass too, but its reference's float64 Newton-Schulz
#   takes 70 s.)
# - The debug model's layouts within 1e-5 of the 1-rank run: FSDP, TP and both (each matrix
#   gathered whole and orthogonalized by one rank of those cutting it, in turn) and pp (whole
#   on each rank); Qwen3 small_moe's under ep 2 x dp_shard 2 (whole experts); a checkpoint (Muon's momentum as exp_avg) saved on one rank resumes under
#   dp_shard 2 x tp 2; another optimizer's state is refused.
# - Bad settings, one line, exit 2: a pattern matching a 1-D parameter, matching none, not a
#   regular expression; a Muon key under AdamW; a resume under another pattern; an expert
#   stack efsdp cuts (and, in test_flux_train, a fused weight tp cuts in blocks).
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

MUON=(--optimizer.name Muon --optimizer.lr 0.01)

# ---- parity ----------------------------------------------------------------------------------
run=("${SMALL[@]}" "${MUON[@]}" --training.steps 20 --training.local_batch_size 2
     --training.global_batch_size 2 --lr_scheduler.warmup_steps 5 --lr_scheduler.decay_type cosine
     --training.max_norm 0.5)
parity() {  # name, overrides...: 20 steps from a seed checkpoint against the reference
  local name=$1; shift
  $TITAN "${run[@]}" "$@" --job.dump_folder "$SCRATCH/$name" --checkpoint.create_seed_checkpoint \
    >/dev/null
  local seed=$SCRATCH/$name/checkpoint/step-0.h5
  $TITAN "${run[@]}" "$@" --job.dump_folder "$SCRATCH/$name" --checkpoint.initial_load_path "$seed" \
    >/dev/null
  $PY tests/reference/check_train.py "$seed" "$SCRATCH/$name/metrics.jsonl" --dtype float64 \
    --tolerance 1e-5 | tail -1
}
parity small --model.name qwen3 --model.flavor small
parity small_moe --model.name qwen3 --model.flavor small_moe

# ---- layouts and resume ----------------------------------------------------------------------
lrun=("${SMALL[@]}" "${MUON[@]}" --training.global_batch_size 8 --training.steps 10
      --lr_scheduler.warmup_steps 2)
$TITAN "${lrun[@]}" --training.local_batch_size 8 --job.dump_folder "$SCRATCH/ref" \
  --checkpoint.enable --checkpoint.interval 5 >/dev/null
P=--parallelism
layout() {  # name, ranks, local batch, overrides...: against the 1-rank run
  local name=$1 np=$2 local_batch=$3; shift 3
  train_ranks "$name" "$np" "${lrun[@]}" --training.local_batch_size "$local_batch" "$@"
  layout_matches "$name" "$SCRATCH/${REF_RUN:-ref}/metrics.jsonl" "$SCRATCH/$name/metrics.jsonl" \
    loss grad_norm
}
layout dp_shard=2 2 4 $P.data_parallel_shard_degree 2
layout tp=2 2 8 $P.tensor_parallel_degree 2 $P.data_parallel_shard_degree 1
layout dp_shard=2xtp=2 4 4 $P.data_parallel_shard_degree 2 $P.tensor_parallel_degree 2
layout pp=2 2 8 $P.pipeline_parallel_degree 2 $P.pipeline_parallel_microbatch_size 2 \
  $P.data_parallel_shard_degree 1
# Expert parallel keeps each expert whole on its rank while FSDP cuts the dense matrices.
MOE=(--model.name qwen3 --model.flavor small_moe)
$TITAN "${lrun[@]}" "${MOE[@]}" --training.local_batch_size 8 --job.dump_folder "$SCRATCH/moe-ref" \
  >/dev/null
REF_RUN=moe-ref layout moe,ep=2xdp_shard=2 2 4 "${MOE[@]}" $P.data_parallel_shard_degree 2 \
  $P.expert_parallel_degree 2

mkdir -p "$SCRATCH/resumed/checkpoint"
cp "$SCRATCH/ref/checkpoint/step-5.h5" "$SCRATCH/resumed/checkpoint/"
train_ranks resumed 4 "${lrun[@]}" --training.local_batch_size 4 $P.data_parallel_shard_degree 2 \
  $P.tensor_parallel_degree 2 --checkpoint.enable --checkpoint.interval 5
grep -q "resumed from .*step-5.h5 at step 5" "$SCRATCH/resumed.log" || fail "did not resume at step 5"
same_metrics "1 rank -> dp_shard=2xtp=2" "$SCRATCH/ref/metrics.jsonl" \
  "$SCRATCH/resumed/metrics.jsonl" 6 1e-5
# Muon's momentum sits where AdamW's exp_avg does: another optimizer's state is refused.
mkdir -p "$SCRATCH/adamw/checkpoint"
cp "$SCRATCH/ref/checkpoint/step-5.h5" "$SCRATCH/adamw/checkpoint/"
expect_user_error "holds the state of optimizer.name Muon, this run has AdamW" \
  $TITAN "${SMALL[@]}" --training.global_batch_size 8 --training.local_batch_size 8 \
  --training.steps 10 --checkpoint.enable --job.dump_folder "$SCRATCH/adamw"

# ---- bad settings ----------------------------------------------------------------------------
expect_user_error "^titan: error: --optimizer.muon_pattern: optimizer.muon_pattern matches layers.0.attention_norm.weight, a 1-D parameter" \
  $TITAN "${lrun[@]}" --optimizer.muon_pattern 'norm' --job.dump_folder "$SCRATCH/bad"
expect_user_error "^titan: error: --optimizer.muon_pattern: optimizer.muon_pattern matches no parameter of this model" \
  $TITAN "${lrun[@]}" --optimizer.muon_pattern 'nothing' --job.dump_folder "$SCRATCH/bad"
expect_user_error "^titan: error: --optimizer.muon_pattern: optimizer.muon_pattern is not a regular expression: missing closing parenthesis" \
  $TITAN "${lrun[@]}" --optimizer.muon_pattern '(wq' --job.dump_folder "$SCRATCH/bad"
expect_user_error "^titan: error: optimizer.name Muon cannot gather layers.0.moe.routed_experts.inner_experts.w1_EFD whole: it is an expert weight FSDP shards over efsdp" \
  $TITAN "${lrun[@]}" "${MOE[@]}" --estimate --world-size 4 $P.data_parallel_shard_degree 4 \
  $P.expert_parallel_degree 2 --training.global_batch_size 16
expect_user_error "holds the state of optimizer.muon_pattern .*, this run has wq" \
  $TITAN "${lrun[@]}" --training.local_batch_size 8 --optimizer.muon_pattern wq \
  --checkpoint.enable --job.dump_folder "$SCRATCH/adamw"
expect_user_error "^titan: error: --optimizer.ns_steps: optimizer.ns_steps acts on optimizer.name Muon only; this run's optimizer is AdamW" \
  $TITAN "${SMALL[@]}" --optimizer.ns_steps 3 --job.dump_folder "$SCRATCH/bad"
