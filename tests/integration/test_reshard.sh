#!/usr/bin/env bash
# Distributed checkpoints across layouts (issue 10): a run saves its step-5 checkpoint under
# layout A (every rank writing its shards into one HDF5 file) and goes on to step 10; a second
# run resumes that file under layout B (every rank reading only its own boxes). Steps 6-10 of
# B must equal A's bit for bit when A == B, and within 1e-5 relative otherwise; pipeline
# stages (each pp rank writing only its stages' parameters) resume on 1 rank and back; the 4D
# layout pp 2 x dp_shard 2 x cp 2 x tp 2 (16 ranks) resumes under dp_shard 2, also within 1e-5
# of the 1-rank run. A seed checkpoint written by 4 ranks (dp_shard 2 x tp 2, or pp 2 x
# dp_shard 2) holds the same tensors, bit for bit, as one written by 1 rank, and neither has
# FSDP padding.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# The LR schedule spans training.steps, so both runs are 10-step runs; B starts at step 5.
run=(${SMALL[@]} --training.global_batch_size 8 --training.steps 10 --lr_scheduler.warmup_steps 2
     --checkpoint.enable --checkpoint.interval 5)
P=--parallelism

layout_args() {  # name -> ranks, then the overrides (local batch: global 8 = local x dp)
  case $1 in
    1) echo 1 --training.local_batch_size 8 ;;
    dp_shard=2) echo 2 --training.local_batch_size 4 $P.data_parallel_shard_degree 2 ;;
    dp_shard=4) echo 4 --training.local_batch_size 2 $P.data_parallel_shard_degree 4 ;;
    dp_shard=2xtp=2) echo 4 --training.local_batch_size 4 $P.data_parallel_shard_degree 2 \
      $P.tensor_parallel_degree 2 ;;
    tp=4) echo 4 --training.local_batch_size 8 $P.data_parallel_shard_degree 1 \
      $P.tensor_parallel_degree 4 ;;
    dp_replicate=2xdp_shard=2) echo 4 --training.local_batch_size 2 \
      $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 2 ;;
    pp=2xdp_shard=2) echo 4 --training.local_batch_size 4 $P.pipeline_parallel_degree 2 \
      $P.data_parallel_shard_degree 2 $P.pipeline_parallel_microbatch_size 1 ;;
    pp=2xdp_shard=2xcp=2xtp=2) echo 16 --training.local_batch_size 4 $P.pipeline_parallel_degree 2 \
      $P.data_parallel_shard_degree 2 $P.context_parallel_degree 2 $P.tensor_parallel_degree 2 \
      $P.pipeline_parallel_microbatch_size 1 $P.context_parallel_rotate_method alltoall ;;
  esac
}

train() {  # layout, dump folder
  local spec=($(layout_args "$1"))
  mpirun --oversubscribe -np "${spec[0]}" $TITAN "${run[@]}" "${spec[@]:1}" \
    --job.dump_folder "$2" >"$2.log" 2>&1 || { tail -5 "$2.log"; fail "$1: run failed"; }
}

reshard() {  # layout A, layout B, tolerance (0: bit-identical)
  local a=$SCRATCH/a-$1 b=$SCRATCH/b-$1-to-$2
  [ -d "$a" ] || train "$1" "$a"
  mkdir -p "$b/checkpoint"
  cp "$a/checkpoint/step-5.h5" "$b/checkpoint/"
  train "$2" "$b"
  grep -q "resumed from .*step-5.h5 at step 5" "$b.log" || fail "$1 -> $2 did not resume at step 5"
  same_metrics "$1 -> $2" "$a/metrics.jsonl" "$b/metrics.jsonl" 6 "$3"
}

reshard dp_shard=2xtp=2 dp_shard=2xtp=2 0
reshard 1 dp_shard=4 1e-5
reshard dp_shard=2xtp=2 tp=4 1e-5
reshard dp_replicate=2xdp_shard=2 1 1e-5
reshard pp=2xdp_shard=2 1 1e-5
reshard 1 pp=2xdp_shard=2 1e-5
reshard pp=2xdp_shard=2xcp=2xtp=2 dp_shard=2 1e-5
same_metrics "... -> dp_shard=2 against 1 rank" "$SCRATCH/a-1/metrics.jsonl" \
  "$SCRATCH/b-pp=2xdp_shard=2xcp=2xtp=2-to-dp_shard=2/metrics.jsonl" 6 1e-5

# Seed checkpoints: the same global tensors whoever writes them.
seed() {  # layout, folder
  local spec=($(layout_args "$1"))
  mpirun --oversubscribe -np "${spec[0]}" $TITAN "${run[@]}" "${spec[@]:1}" \
    --checkpoint.create_seed_checkpoint --job.dump_folder "$2" >"$2.log" 2>&1 ||
    { tail -5 "$2.log"; fail "$1: seed checkpoint failed"; }
}
seed 1 "$SCRATCH/seed-1"
seed dp_shard=2xtp=2 "$SCRATCH/seed-4"
seed pp=2xdp_shard=2 "$SCRATCH/seed-pp"
for four in seed-4 seed-pp; do
$PY - "$SCRATCH/seed-1/checkpoint/step-0.h5" "$SCRATCH/$four/checkpoint/step-0.h5" "$four" <<'PY'
import sys, h5py, numpy as np
one, four = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
one.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
other = []
four.visititems(lambda n, o: other.append(n) if isinstance(o, h5py.Dataset) else None)
assert sorted(names) == sorted(other) and names, "the two seed checkpoints hold different datasets"
for n in names:
    a, b = one[n][()], four[n][()]
    assert a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32)), n
    assert four[n].fletcher32, f"{n} has no Fletcher32 checksum"
layout = {"seed-4": "dp_shard 2 x tp 2", "seed-pp": "pp 2 x dp_shard 2"}[sys.argv[3]]
print(f"ok: seed checkpoint by 4 ranks ({layout}) == by 1 rank, {len(names)} tensors, bit for bit")
PY
done
