#!/usr/bin/env bash
# Loss equivalence across parallel layouts (issue "Distributed I"): the debug model, 10 steps,
# fixed seed, global batch 8 (and 2-way gradient accumulation where the layout leaves room for
# it). Each layout is one mpirun; its JSONL losses and grad norms must
# match the 1-rank run's within 1e-5 relative at every step.
# Impossible layouts (tp not dividing the heads, a mesh larger than the job, a batch that does
# not split over dp, tied embeddings under FSDP) exit 2 with one line before anything is
# allocated.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

run=(${SMALL[@]} --training.global_batch_size 8 --training.steps 10 --lr_scheduler.warmup_steps 2)
$TITAN "${run[@]}" --job.dump_folder "$SCRATCH/ref" >/dev/null

compare() {  # name, metrics.jsonl: losses and grad norms (with $MOE_KEYS set, expert loads and
             # balance losses too) against the 1-rank run ($REF_RUN's)
  layout_matches "$1" "$SCRATCH/${REF_RUN:-ref}/metrics.jsonl" "$2" loss grad_norm \
    ${MOE_KEYS:+expert_load_max expert_load_mean aux_loss}
}

layout() {  # name, ranks, local batch (global 8 = local x dp x accumulation), overrides...
  local name=$1 np=$2 local_batch=$3; shift 3
  mpirun --oversubscribe -np "$np" $TITAN "${run[@]}" --training.local_batch_size "$local_batch" \
    --job.dump_folder "$SCRATCH/$name" "$@" \
    >"$SCRATCH/$name.log" 2>&1 || { tail -5 "$SCRATCH/$name.log"; fail "$name: mpirun failed"; }
  compare "$name" "$SCRATCH/$name/metrics.jsonl"
}

P=--parallelism
layout dp_shard=2 2 4 $P.data_parallel_shard_degree 2
layout dp_shard=4 4 2 $P.data_parallel_shard_degree 4
# dp_shard 4 adds the same four microbatches as one rank accumulating them, in the same order
# (a block's grads apart, then added; the reduce-scatter in rank order): bit for bit.
$TITAN "${run[@]}" --training.local_batch_size 2 --job.dump_folder "$SCRATCH/ref-accum4" >/dev/null
same_losses "dp_shard=4 = 1 rank x 4 microbatches" "$SCRATCH/ref-accum4/metrics.jsonl" \
  "$SCRATCH/dp_shard=4/metrics.jsonl"
layout dp_replicate=2xdp_shard=2 4 2 $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 2
layout tp=2 2 4 $P.tensor_parallel_degree 2 $P.data_parallel_shard_degree 1
layout tp=4 4 4 $P.tensor_parallel_degree 4 $P.data_parallel_shard_degree 1
layout dp_shard=2xtp=2 4 4 $P.data_parallel_shard_degree 2 $P.tensor_parallel_degree 2
layout tp=2,no-loss-parallel 2 4 $P.tensor_parallel_degree 2 $P.disable_loss_parallel
layout ddp=2,accumulation 2 2 $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 1
layout dp_shard=2,AC,reshard-never 2 2 $P.data_parallel_shard_degree 2 \
  --activation_checkpoint.mode full $P.fsdp_reshard_after_forward never

# Qwen3's small (QK-norm weights replicated over tp, heads wider than dim / n_heads) under tp
# and FSDP against its own 1-rank run.
qwen3=(--model.name qwen3 --model.flavor small)
$TITAN "${run[@]}" "${qwen3[@]}" --job.dump_folder "$SCRATCH/qwen3-ref" >/dev/null
REF_RUN=qwen3-ref layout qwen3,tp=2 2 4 $P.tensor_parallel_degree 2 $P.data_parallel_shard_degree 1 \
  "${qwen3[@]}"
REF_RUN=qwen3-ref layout qwen3,dp_shard=2 2 4 $P.data_parallel_shard_degree 2 "${qwen3[@]}"

# Qwen3's MoE (small_moe: 8 experts, top 2), with the balance loss: the router and experts run on
# each tp rank's rows, replicated, their grads summed over tp; FSDP shards them; a pipeline
# splits the layers (the expert load and the balance loss summed over the stages); with
# activation checkpointing the recompute counts nothing twice. Losses, grad norms, expert loads
# and balance losses match the 1-rank run.
moe=(--model.name qwen3 --model.flavor small_moe --model.moe_aux_loss_alpha 0.01)
$TITAN "${run[@]}" "${moe[@]}" --job.dump_folder "$SCRATCH/moe-ref" >/dev/null
MOE_KEYS=1 REF_RUN=moe-ref layout moe,tp=2,AC 2 4 $P.tensor_parallel_degree 2 \
  $P.data_parallel_shard_degree 1 --activation_checkpoint.mode full "${moe[@]}"
MOE_KEYS=1 REF_RUN=moe-ref layout moe,dp_shard=2 2 4 $P.data_parallel_shard_degree 2 "${moe[@]}"
MOE_KEYS=1 REF_RUN=moe-ref layout moe,pp=2 2 8 $P.pipeline_parallel_degree 2 \
  $P.pipeline_parallel_microbatch_size 2 $P.data_parallel_shard_degree 1 "${moe[@]}"
# Expert parallel: each rank runs E / ep experts on the rows every rank routes to them (the
# all-to-all dispatch and combine), alone, with FSDP over efsdp, on tp's sequence-parallel rows,
# in a pipeline stage, and recomputed under activation checkpointing.
E=$P.expert_parallel_degree
MOE_KEYS=1 REF_RUN=moe-ref layout moe,ep=2 2 4 $P.data_parallel_shard_degree 2 $E 2 "${moe[@]}"
MOE_KEYS=1 REF_RUN=moe-ref layout moe,ep=4 4 2 $P.data_parallel_shard_degree 4 $E 4 "${moe[@]}"
MOE_KEYS=1 REF_RUN=moe-ref layout moe,ep=2xefsdp=2 4 2 $P.data_parallel_shard_degree 4 $E 2 \
  "${moe[@]}"
MOE_KEYS=1 REF_RUN=moe-ref layout moe,ep=2xtp=2 2 4 $P.tensor_parallel_degree 2 \
  $P.data_parallel_shard_degree 1 $E 2 "${moe[@]}"
MOE_KEYS=1 REF_RUN=moe-ref layout moe,dp_shard=2xtp=2xep=2 4 4 $P.tensor_parallel_degree 2 \
  $P.data_parallel_shard_degree 2 $E 2 "${moe[@]}"
MOE_KEYS=1 REF_RUN=moe-ref layout moe,ep=2,AC 2 4 $P.data_parallel_shard_degree 2 $E 2 \
  --activation_checkpoint.mode full "${moe[@]}"
MOE_KEYS=1 REF_RUN=moe-ref layout moe,pp=2xep=2 4 4 $P.pipeline_parallel_degree 2 \
  $P.pipeline_parallel_microbatch_size 2 $P.data_parallel_shard_degree 2 $E 2 "${moe[@]}"

# Impossible layouts stop before allocation with one line (from rank 0 only), exit code 2.
impossible() {  # pattern, ranks, overrides...
  local pattern=$1 np=$2 rc=0; shift 2
  mpirun --oversubscribe -np "$np" $TITAN "${run[@]}" --job.dump_folder "$SCRATCH/bad" "$@" \
    >/dev/null 2>"$SCRATCH/bad.err" || rc=$?
  [ "$rc" -eq 2 ] || fail "expected exit 2, got $rc for $*"
  [ "$(grep -c '^titan: error:' "$SCRATCH/bad.err")" -eq 1 ] || fail "not one error line: $(cat "$SCRATCH/bad.err")"
  grep -Eq "$pattern" "$SCRATCH/bad.err" || fail "$(grep '^titan' "$SCRATCH/bad.err") does not match $pattern"
  echo "ok: $(grep '^titan: error:' "$SCRATCH/bad.err")"
}
impossible "tensor_parallel_degree 3 does not divide model n_heads \(16\)" 3 $P.tensor_parallel_degree 3 $P.data_parallel_shard_degree 1
impossible "= 4 ranks, but the job has 2" 2 $P.data_parallel_shard_degree 2 $P.tensor_parallel_degree 2
impossible "global_batch_size 8 is not a multiple of local_batch_size 4 x dp 4" 4 \
  --training.local_batch_size 4 $P.data_parallel_shard_degree 4
impossible "tie_word_embeddings cannot be trained with FSDP" 2 --model.tie_word_embeddings true \
  --training.local_batch_size 4 $P.data_parallel_shard_degree 2
