#!/usr/bin/env bash
# Loss equivalence across parallel layouts (issue "Distributed I"): the debug model, 10 steps,
# fixed seed, global batch 8 (and 2-way gradient accumulation where the layout leaves room for
# it). Each layout is one mpirun; its JSONL losses and grad norms must
# match the 1-rank run's within 1e-5 relative at every step.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

run=(${SMALL[@]} --training.global_batch_size 8 --training.steps 10 --lr_scheduler.warmup_steps 2)
$TITAN "${run[@]}" --job.dump_folder "$SCRATCH/ref" >/dev/null

compare() {  # name, metrics.jsonl: losses and grad norms against the 1-rank run
  $PY - "$1" "$SCRATCH/ref/metrics.jsonl" "$2" <<'PY'
import json, sys
name, ref, got = sys.argv[1], *[[json.loads(l) for l in open(p)] for p in sys.argv[2:]]
assert len(got) == len(ref) == 10, f"{name}: {len(got)} steps logged"
worst = 0.0
for r, g in zip(ref, got):
    for key in ("loss", "grad_norm"):
        err = abs(g[key] - r[key]) / abs(r[key])
        worst = max(worst, err)
        assert err < 1e-5, f"{name}: step {r['step']} {key} {g[key]!r} vs {r[key]!r} ({err:.2e})"
print(f"ok: {name:28s} worst relative error {worst:.2e}")
PY
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
layout dp_replicate=2xdp_shard=2 4 2 $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 2
layout tp=2 2 4 $P.tensor_parallel_degree 2 $P.data_parallel_shard_degree 1
layout tp=4 4 4 $P.tensor_parallel_degree 4 $P.data_parallel_shard_degree 1
layout dp_shard=2xtp=2 4 4 $P.data_parallel_shard_degree 2 $P.tensor_parallel_degree 2
layout tp=2,no-loss-parallel 2 4 $P.tensor_parallel_degree 2 $P.disable_loss_parallel
layout dp_shard=2,AC,reshard-never 2 2 $P.data_parallel_shard_degree 2 \
  --activation_checkpoint.mode full $P.fsdp_reshard_after_forward never
