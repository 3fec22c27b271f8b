#!/usr/bin/env bash
# A disk that fails a write (issue 30, item 2, beyond the full disk of test_disk_full.sh): on
# build/tests/faultfs, a FUSE file system whose writes past a given byte of a given file fail
# with EIO (or EDQUOT), as a dying disk's would, after the save's space reservation succeeded.
# - A checkpoint write failing at the file's superblock, in its first tensors or near its end,
#   on 1 rank and on 2 (dp_shard 2), sync and async: exit 2 with one line naming the file and
#   the reason, never a hang or a crash. On 2 ranks the write fails on the rank that writes
#   there alone, and both agree once each has written its part. The partial .tmp is removed
#   and step 2's checkpoint still loads whole.
# - A metrics record, a TensorBoard event or a trace failing on one rank of 2: every rank stops
#   after the same step on its own with exit 2 (each rank's status is recorded, so a rank the
#   launcher killed would show), the failing rank prints the one line, and the files hold only
#   whole records.
# It runs beside other tests: its FUSE mount is its own, and a timeout it waits out only ends a
# job sooner or later, never changes its line.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

make -s build/tests/faultfs
BACKING=$SCRATCH/backing MNT=$SCRATCH/mnt
mkdir -p "$BACKING" "$MNT"
FS_PID=

# mount_faulty ERRNO TEXT OFFSET: writes past byte OFFSET of files whose path holds TEXT fail.
mount_faulty() {
  unmount_faulty
  rm -rf "${BACKING:?}"/*
  build/tests/faultfs "$BACKING" "$MNT" "$@" 2>"$SCRATCH/faultfs.err" &
  FS_PID=$!
  for _ in $(seq 100); do mountpoint -q "$MNT" && return; sleep 0.05; done
  if grep -q "fuse: device not found\|/dev/fuse" "$SCRATCH/faultfs.err"; then
    echo "SKIP: test_disk_errors.sh: no FUSE here ($(cat "$SCRATCH/faultfs.err"))"
    exit 0
  fi
  fail "faultfs did not mount: $(cat "$SCRATCH/faultfs.err")"
}
unmount_faulty() {
  if [ -n "$FS_PID" ]; then fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT"; wait "$FS_PID" || true; fi
  FS_PID=
}
trap 'unmount_faulty; rm -rf "$SCRATCH"' EXIT

# Every line of each metrics file is a whole JSON record; prints each file's count of records.
record_counts() {  # files
  $PY - "$@" <<'PY'
import json, sys
for path in sys.argv[1:]:
    text = open(path).read()
    assert text == "" or text.endswith("\n"), f"{path} ends in half a record: {text[-80:]!r}"
    print(len([json.loads(line) for line in text.splitlines()]))
PY
}

run=(${SMALL[@]} --training.steps 4 --lr_scheduler.warmup_steps 2 --checkpoint.enable
     --checkpoint.interval 2)
two=(--parallelism.data_parallel_shard_degree 2)

# ckpt_fails ERRNO OFFSET RANKS MODE REASON REMEDY
ckpt_fails() {
  local errno=$1 offset=$2 np=$3 mode=$4 reason=$5 remedy=$6 par=()
  [ "$np" -eq 2 ] && par=("${two[@]}")
  mount_faulty "$errno" step-4.h5.tmp "$offset"
  local folder=$MNT/run/checkpoint
  expect_job_error "^titan: error: checkpoint: ($reason) writing $folder/step-4\.h5\.tmp \(about [0-9.]+ MB needed, [0-9.]+ MB free\): $remedy or set job\.dump_folder elsewhere$" \
    timeout 60 mpirun -q --oversubscribe -np "$np" $TITAN "${run[@]}" "${par[@]}" \
    --checkpoint.async_mode "$mode" --job.dump_folder "$MNT/run"
  [ "$(ls "$folder")" = step-2.h5 ] || fail "$errno at $offset, $np ranks, $mode: the folder holds $(ls "$folder")"
  checkpoint_loads "$folder/step-2.h5" 2
}

# The file's superblock, its first tensors, and past 20 of its 26 MB.
for offset in 0 1000000 20000000; do
  ckpt_fails EIO "$offset" 1 disabled "input/output error" "check the disk"
  ckpt_fails EIO "$offset" 2 disabled "input/output error" "check the disk"
done
ckpt_fails EIO 1000000 2 async "input/output error" "check the disk"
ckpt_fails EDQUOT 1000000 2 disabled "disk quota exceeded" "free space"

# One rank of two fails a write of its own file (metrics.save_for_all_ranks: every rank logs):
# each rank's exit status is written by a shell around it, which a rank killed by the launcher
# would not reach.
# one_rank_fails TEXT OFFSET PATTERN TITAN_ARGS...
one_rank_fails() {
  local text=$1 offset=$2 pattern=$3; shift 3
  mount_faulty EIO "$text" "$offset"
  rm -f "$SCRATCH"/rc.*
  expect_job_error "$pattern" timeout 60 mpirun -q --oversubscribe -np 2 bash -c \
    '"$@"; rc=$?; echo $rc > "'"$SCRATCH"'/rc.$OMPI_COMM_WORLD_RANK"; exit $rc' _ \
    $TITAN ${SMALL[@]} "${two[@]}" --training.steps 20 --metrics.save_for_all_ranks true \
    --job.dump_folder "$MNT/run" "$@"
  for r in 0 1; do
    [ "$(cat "$SCRATCH/rc.$r" 2>/dev/null)" = 2 ] ||
      fail "$text: rank $r did not stop with exit 2 itself (status: $(cat "$SCRATCH/rc.$r" 2>/dev/null || echo none))"
  done
  echo "ok: both ranks stopped with exit 2"
}

# Rank 1's metrics file fails at its fifth record or so: rank 0 logged the same step, then both stopped.
one_rank_fails metrics_rank1.jsonl 1000 \
  "^titan: error: metrics: input/output error writing $MNT/run/metrics_rank1\.jsonl \(a record of [0-9]+ bytes, [0-9.]+ MB free\): check the disk or set job\.dump_folder elsewhere$"
counts=$(record_counts "$MNT/run/metrics.jsonl" "$MNT/run/metrics_rank1.jsonl" | tr '\n' ' ')
read -r n0 n1 <<<"$counts"
[ "$n0" -eq $((n1 + 1)) ] && [ "$n1" -ge 1 ] ||
  fail "rank 0 logged $n0 records, rank 1 $n1: not stopped after the step rank 1 failed to log"
echo "ok: rank 0 logged $n0 records, rank 1 $n1 (its failed one left out), then both stopped"

# Rank 1's TensorBoard events file, at its first step's flush.
one_rank_fails rank_1/events 200 \
  "^titan: error: tensorboard: input/output error writing $MNT/run/tb/rank_1/events\.out\.tfevents\.[^ ]+: check the disk or set job\.dump_folder elsewhere$" \
  --metrics.enable_tensorboard true
record_counts "$MNT/run/metrics.jsonl" >/dev/null

# Rank 1's trace of steps 1-4: the half file is removed; every rank stops after step 5.
one_rank_fails rank1_trace.json 100 \
  "^titan: error: profiling\.save_traces_folder: input/output error writing $MNT/run/profile_traces/iteration_4/rank1_trace\.json: check the disk or set it elsewhere$" \
  --profiling.enable_profiling true --profiling.profile_freq 4
[ ! -e "$BACKING/run/profile_traces/iteration_4/rank1_trace.json" ] || fail "a partial trace is left"
[ "$(record_counts "$MNT/run/metrics.jsonl")" -eq 5 ] || fail "rank 0 did not stop after step 5"
echo "ok: the partial trace removed, every rank stopped after step 5"
