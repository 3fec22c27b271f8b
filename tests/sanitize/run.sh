#!/usr/bin/env bash
# `make sanitize`: the unit tests and short trainings (tokenize the Austen text, then 3 steps of
# the debug model, writing TensorBoard events too, on 1 rank, on 2 ranks with FSDP and on 2
# pipeline stages, context and expert parallel on 2 ranks, and the bad-input test's refusals)
# under AddressSanitizer and UndefinedBehaviorSanitizer, as built by `make SANITIZE=1` in
# build/sanitize. Any sanitizer report fails the run (env.sh); each step prints one line with
# its time.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/sanitize/env.sh
BUILD=build/sanitize
TITAN=$BUILD/titan
LOGS=$BUILD/logs
mkdir -p "$LOGS"
SCRATCH=$(mktemp -d /tmp/titan-sanitize.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

failed=0
step() {  # name, command...: its output in $LOGS/name.log, shown when it fails
  local name=$1; shift
  local start=$SECONDS
  if "$@" >"$LOGS/$name.log" 2>&1; then
    echo "sanitize: $name ok ($((SECONDS - start)) s)"
  else
    echo "sanitize: $name FAILED ($((SECONDS - start)) s)"
    grep -A40 -m1 -E "ERROR: |runtime error:" "$LOGS/$name.log" || tail -n 30 "$LOGS/$name.log"
    failed=1
  fi
}

# The unit tests that start MPI unwind fully, so that lsan.supp recognises OpenMPI's leaks.
for t in "$BUILD"/tests/test_*; do
  case $t in
    */test_blocked_shard|*/test_comm|*/test_cp|*/test_ep|*/test_fsdp|*/test_pp_executor|*/test_tp) step "$(basename "$t")" env "$MPI_UNWIND" "$t" ;;
    *) step "$(basename "$t")" "$t" ;;
  esac
done
DATA=$SCRATCH/austen.bin
step tokenize "$TITAN" tokenize --tokenizer bytes --out "$DATA" build/test-data/corpus/austen.txt
TRAIN=(--config configs/debug_model.yaml --training.dataset_path "$DATA"
       --model.tokenizer_path null --training.seq_len 64 --training.local_batch_size 2
       --training.steps 3 --metrics.log_freq 1 --metrics.enable_tensorboard
       --job.dump_folder "$SCRATCH/out")
export "$MPI_UNWIND"
step train_1_rank env OMP_NUM_THREADS=2 "$TITAN" "${TRAIN[@]}"
step train_2_ranks mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x ASAN_OPTIONS \
  -x UBSAN_OPTIONS -x LSAN_OPTIONS -x OMPI_MCA_mca_base_component_disable_dlclose \
  "$TITAN" "${TRAIN[@]}"
# The pipeline executor's regions and messages: a zero-bubble schedule (split backward, a V's
# local hand-offs) with validation (forward only), on 2 ranks.
step train_pipeline mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x ASAN_OPTIONS \
  -x UBSAN_OPTIONS -x LSAN_OPTIONS -x OMPI_MCA_mca_base_component_disable_dlclose \
  "$TITAN" "${TRAIN[@]}" --training.local_batch_size 4 --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_schedule ZBVZeroBubble --validation.enable \
  --validation.dataset_path "$DATA" --validation.freq 2 --validation.steps 1 \
  --validation.seq_len 64 --validation.local_batch_size 4
# Context parallel's chunk copies and ring buffers: cp 2 (the ring) on 2 ranks, the same
# hooks test_cp runs on one.
step train_context_parallel mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x ASAN_OPTIONS \
  -x UBSAN_OPTIONS -x LSAN_OPTIONS -x OMPI_MCA_mca_base_component_disable_dlclose \
  "$TITAN" "${TRAIN[@]}" --parallelism.context_parallel_degree 2 \
  --parallelism.context_parallel_rotate_method alltoall
# Expert parallel's sort, counts exchange, all-to-all of rows and regroup buffers (carved at
# the receive bound): Qwen3's small MoE with ep 2 on 2 ranks.
step train_expert_parallel mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x ASAN_OPTIONS \
  -x UBSAN_OPTIONS -x LSAN_OPTIONS -x OMPI_MCA_mca_base_component_disable_dlclose \
  "$TITAN" "${TRAIN[@]}" --model.name qwen3 --model.flavor small_moe \
  --parallelism.expert_parallel_degree 2
step bad_input env TITAN="$TITAN" bash tests/integration/test_bad_input.sh
exit "$failed"
