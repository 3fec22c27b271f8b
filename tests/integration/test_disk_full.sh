#!/usr/bin/env bash
# A full disk (issue 30, item 2): on a small tmpfs as job.dump_folder, a checkpoint save that
# does not fit stops the run on 1 rank and on 2 (dp_shard 2), sync and async, with exit 2 and
# one line naming the file and the bytes needed, never exit 3 or a hang (each run is under
# `timeout`); the partial step-N.h5.tmp is removed, the earlier checkpoint stays whole and
# loadable, and metrics.jsonl and the TensorBoard events hold only whole records. A folder too
# small for metrics.jsonl alone (checkpoints off), for TensorBoard events or for a trace stops
# the same way, with no half record or half file left.
# run_all: alone (tests/run_all.sh): it mounts tmpfs folders
SELF=$(realpath "$0")
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# A tmpfs needs root (CI's container runs as root) or a user namespace (then the test runs
# again inside one); without either it cannot make a disk fill, and says so.
MNT=$SCRATCH/mnt
mkdir -p "$MNT"
# In a user namespace this user is root, whose Open MPI session folder in /tmp is not its own.
[ -z "${DISK_FULL_NAMESPACE:-}" ] || export OMPI_MCA_orte_tmpdir_base=$SCRATCH
if ! mount -t tmpfs -o size=100m tmpfs "$MNT" 2>/dev/null; then
  if [ -z "${DISK_FULL_NAMESPACE:-}" ] && unshare -rm true 2>/dev/null; then
    rm -rf "$SCRATCH"  # exec skips lib.sh's trap; the namespace run makes its own
    DISK_FULL_NAMESPACE=1 exec unshare -rm bash "$SELF"
  fi
  echo "SKIP: test_disk_full.sh: cannot mount a tmpfs (not root, no user namespaces)"
  exit 0
fi
trap 'umount "$MNT" 2>/dev/null; rm -rf "$SCRATCH"' EXIT

# The debug model's full checkpoint is 71 MiB: step 2's fits in 100 MiB, step 4's does not.
run=(${SMALL[@]} --training.steps 8 --lr_scheduler.warmup_steps 2 --checkpoint.enable
     --checkpoint.interval 2 --metrics.enable_tensorboard true)

# Every line of the metrics file is a whole JSON record, and the TensorBoard events file is
# whole records (length, its CRC, data, its CRC) up to its last byte.
whole_records() {  # dump folder
  $PY - "$1" <<'PY'
import glob, json, struct, sys
folder = sys.argv[1]
text = open(f"{folder}/metrics.jsonl").read()
assert text.endswith("\n"), f"{folder}/metrics.jsonl ends in half a record: {text[-80:]!r}"
rows = [json.loads(line) for line in text.splitlines()]
for path in glob.glob(f"{folder}/tb/events.out.tfevents.*"):
    data, at, n = open(path, "rb").read(), 0, 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        at += 12 + length + 4
        n += 1
    assert at == len(data), f"{path} ends in half a record ({len(data)} bytes)"
print(f"ok: {folder}: {len(rows)} whole metrics records, events files whole")
PY
}

full_disk() {  # ranks, async_mode
  local np=$1 mode=$2 name=ckpt-$1-$2 par=()
  [ "$np" -eq 2 ] && par=(--parallelism.data_parallel_shard_degree 2)
  local dump=$MNT/$name folder=$MNT/$name/checkpoint
  expect_job_error "^titan: error: checkpoint: no space left on device writing $folder/step-4\.h5\.tmp \(about [0-9.]+ MB needed, [0-9.]+ MB free\): free space or set job\.dump_folder elsewhere$" \
    timeout 60 mpirun --oversubscribe -np "$np" $TITAN "${run[@]}" "${par[@]}" \
    --checkpoint.async_mode "$mode" --job.dump_folder "$dump"
  [ ! -e "$folder/step-4.h5.tmp" ] || fail "$name: the partial $folder/step-4.h5.tmp is left"
  [ "$(ls "$folder")" = step-2.h5 ] || fail "$name: the folder holds $(ls "$folder")"
  checkpoint_loads "$folder/step-2.h5" 2
  whole_records "$dump"
  rm -rf "$dump"
}

full_disk 1 disabled
full_disk 2 disabled
full_disk 1 async
full_disk 2 async

# metrics.jsonl alone fills an 8 KiB tmpfs within 40 steps (about 250 bytes a record).
umount "$MNT"
mount -t tmpfs -o size=8k tmpfs "$MNT"
expect_user_error "^titan: error: metrics: no space left on device writing $MNT/metrics/metrics\.jsonl \(a record of [0-9]+ bytes, [0-9.]+ MB free\): free space or set job\.dump_folder elsewhere$" \
  timeout 60 $TITAN ${SMALL[@]} --training.steps 40 --job.dump_folder "$MNT/metrics"
whole_records "$MNT/metrics"

# The TensorBoard events file fills it first when it is on: cut back to its last whole flush.
rm -rf "$MNT/metrics"
expect_user_error "^titan: error: tensorboard: no space left on device writing $MNT/tb/tb/events\.out\.tfevents\.[^ ]+: free space or set job\.dump_folder elsewhere$" \
  timeout 60 $TITAN ${SMALL[@]} --training.steps 40 --metrics.enable_tensorboard true \
  --job.dump_folder "$MNT/tb"
whole_records "$MNT/tb"

# A trace that does not fit is removed, not left half written.
rm -rf "$MNT/tb"
expect_user_error "^titan: error: profiling\.save_traces_folder: no space left on device writing $MNT/trace/profile_traces/iteration_4/rank0_trace\.json: free space or set it elsewhere$" \
  timeout 60 $TITAN ${SMALL[@]} --training.steps 8 --profiling.enable_profiling true \
  --profiling.profile_freq 4 --job.dump_folder "$MNT/trace"
[ -z "$(find "$MNT/trace/profile_traces" -type f)" ] || fail "a partial trace is left"
whole_records "$MNT/trace"
