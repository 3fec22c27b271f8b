#!/usr/bin/env bash
# `titan --estimate`: prints per-rank arenas, FLOPs and communication per step for the 8B, 70B
# and 405B configs on thousands of ranks without MPI, equal to closed forms of the flavors'
# parameter, gradient, optimizer and FSDP buffer sizes and FLOPs; and for the debug model its
# numbers equal what a real run allocates and sends (run_summary.json: every arena's bytes, and
# each group's bytes = steps x the estimate's per-step bytes), for a 2D layout, for HSDP with
# activation checkpointing and gradient accumulation, and for plain DDP.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# The big flavors' arenas and FLOPs against closed forms from the flavor's dims
# (tests/reference/estimate_ref.py: parameter count, FSDP x TP shards, AdamW's two moments).
for spec in 8b:8B:64:8 70b:70B:512:8 405b:405B:2048:8; do
  IFS=: read -r name flavor ranks tp <<<"$spec"
  $TITAN --estimate --config configs/llama3_$name.yaml --world-size "$ranks" \
    --parallelism.tensor_parallel_degree "$tp" >"$SCRATCH/$name.txt"
  for row in params grads optimizer activations comm total fsdp tp "FLOPs per step"; do
    grep -q "^  $row" "$SCRATCH/$name.txt" || fail "$name estimate has no '$row' row"
  done
  head -1 "$SCRATCH/$name.txt"
  (cd tests/reference &&
    $PY estimate_ref.py "$flavor" "$ranks" "$tp" 8192 1 "$SCRATCH/$name.txt") ||
    fail "$name estimate differs from the closed forms"
done

check() {  # name, ranks, overrides...: estimate vs a 3-step real run
  local name=$1 np=$2; shift 2
  local args=(${SMALL[@]} --training.steps 3 "$@")
  $TITAN --estimate --world-size "$np" "${args[@]}" >"$SCRATCH/$name.estimate"
  mpirun --oversubscribe -np "$np" $TITAN "${args[@]}" --job.dump_folder "$SCRATCH/$name" \
    >"$SCRATCH/$name.log" 2>&1 || { tail -5 "$SCRATCH/$name.log"; fail "$name: run failed"; }
  $PY - "$name" "$SCRATCH/$name.estimate" "$SCRATCH/$name/run_summary.json" <<'PY'
import json, sys
name, estimate, summary = sys.argv[1], open(sys.argv[2]).read().splitlines(), json.load(open(sys.argv[3]))
rows = {l.split()[0]: int(l.split()[1]) for l in estimate if l.startswith("  ") and l.split()[1].isdigit()}
for arena, got in summary["arena_bytes"].items():
    assert rows[arena] == got, f"{name}: {arena} estimated {rows[arena]}, allocated {got}"
for group, got in summary["comm_bytes"].items():
    want = summary["steps"] * rows.get(group, 0)
    assert want == got, f"{name}: group {group}: estimated {want} bytes, sent {got}"
print(f"ok: {name}: arenas and per-group traffic equal the estimate")
PY
}

P=--parallelism
check dp_shard=2xtp=2 4 $P.data_parallel_shard_degree 2 $P.tensor_parallel_degree 2
check hsdp+ac+accum 4 --training.local_batch_size 2 --training.global_batch_size 16 \
  $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 2 --activation_checkpoint.mode full

# Plain DDP (dp_replicate 2 on an fsdp group of one) runs no FSDP: its fsdp group sends nothing
# (check's per-group comparison: the estimate has no fsdp row) and it holds no full-parameter
# slots beyond the model itself: its params arena is the 1-rank run's.
check ddp+accum 2 --training.global_batch_size 16 $P.data_parallel_replicate_degree 2 \
  $P.data_parallel_shard_degree 1
! grep -q "^  fsdp" "$SCRATCH/ddp+accum.estimate" || fail "DDP estimate has FSDP traffic"
$TITAN --estimate --world-size 1 "${SMALL[@]}" >"$SCRATCH/one.estimate"
[ "$(grep '^  params' "$SCRATCH/one.estimate")" = "$(grep '^  params' "$SCRATCH/ddp+accum.estimate")" ] ||
  fail "DDP params arena differs from one rank's: $(grep '^  params' "$SCRATCH/ddp+accum.estimate")"
echo "ok: DDP holds the 1-rank params arena and runs no FSDP collective"
