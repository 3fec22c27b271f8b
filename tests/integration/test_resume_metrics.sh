#!/usr/bin/env bash
# A resumed run keeps its history: metrics.jsonl keeps the rows up to the checkpoint's step
# (byte for byte), drops the rows after it (and a row a crash cut short) and appends the
# resumed steps, whose losses equal the uninterrupted run's bit for bit; a fresh run starts a
# new file. A checkpoint whose progress attributes are out of range is the user's input:
# exit 2, one line naming the file and the attribute.
source "$(dirname "$0")/lib.sh"

run=(${SMALL[@]} --training.steps 10 --checkpoint.enable --checkpoint.interval 5
     --validation.enable --validation.dataset_path "$DATA" --validation.freq 3
     --validation.steps 2 --validation.local_batch_size 2 --validation.seq_len 64
     --job.dump_folder "$SCRATCH/run")
$TITAN "${run[@]}" >/dev/null
metrics=$SCRATCH/run/metrics.jsonl
cp "$metrics" "$SCRATCH/uninterrupted.jsonl"
printf '{"step": 4, "loss": 1.2' >>"$metrics"  # a row cut by a crash
$TITAN "${run[@]}" --checkpoint.load_step 5 >"$SCRATCH/resume.log"
grep -q "resumed from .*step-5.h5 at step 5" "$SCRATCH/resume.log" || fail "did not resume at step 5"

steps() { grep -v validation_loss "$1" | grep -o '"step": [0-9]*' | cut -d' ' -f2 | xargs; }
[ "$(steps "$metrics")" = "$(seq 1 10 | xargs)" ] ||
  fail "training rows after resume: $(steps "$metrics"), expected 1..10 once each"
[ "$(grep validation_loss "$metrics" | grep -o '"step": [0-9]*' | cut -d' ' -f2 | xargs)" = "3 6 9" ] ||
  fail "validation rows after resume: $(grep validation_loss "$metrics")"
# The history before the checkpoint is the first run's own bytes; the resumed rows repeat its
# losses exactly.
kept=$(grep -c -E '"step": [1-5],' "$SCRATCH/uninterrupted.jsonl")
cmp <(head -n "$kept" "$SCRATCH/uninterrupted.jsonl") <(head -n "$kept" "$metrics") ||
  fail "the rows up to step 5 changed"
diff <(losses "$SCRATCH/uninterrupted.jsonl") <(losses "$metrics") ||
  fail "the resumed losses differ from the uninterrupted run's"
grep -q '1.2$' "$metrics" && fail "the cut row survived"
echo "ok: resume kept steps 1..5, rewrote 6..10 with the same losses"

# A fresh run (no checkpoint loaded) in the same folder starts a new file.
$TITAN "${SMALL[@]}" --training.steps 2 --job.dump_folder "$SCRATCH/run" >/dev/null
[ "$(steps "$metrics")" = "1 2" ] || fail "a fresh run kept old rows: $(steps "$metrics")"
echo "ok: a fresh run starts a new metrics.jsonl"

# Out-of-range progress attributes in a checkpoint file.
bad_attr() {  # ATTR VALUE
  mkdir -p "$SCRATCH/bad_$1/checkpoint"
  cp "$SCRATCH/run/checkpoint/step-5.h5" "$SCRATCH/bad_$1/checkpoint/"
  $PY -c 'import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f: f.attrs[sys.argv[2]] = np.int64(sys.argv[3])' \
    "$SCRATCH/bad_$1/checkpoint/step-5.h5" "$1" "$2"
  expect_user_error "step-5.h5: attribute $1 is $2, outside \[0, [0-9]+\]" \
    $TITAN "${run[@]}" --job.dump_folder "$SCRATCH/bad_$1"
}
bad_attr data_windows_consumed -1
bad_attr data_windows_consumed 9223372036854775807
bad_attr step -3
bad_attr step 4294967296
bad_attr optimizer_step -1

# The model's shape attributes, which `titan generate` reads, are input too: a dim beyond an
# int was truncated before.
ckpt=$SCRATCH/bad_dim/checkpoint/step-5.h5
mkdir -p "$(dirname "$ckpt")"
cp "$SCRATCH/run/checkpoint/step-5.h5" "$ckpt"
$PY -c 'import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f: f.attrs["model.dim"] = np.int64(2**32 + 64)' "$ckpt"
expect_user_error "step-5.h5: attribute model.dim is 4294967360, outside \[1, 2147483647\]" \
  $TITAN generate --checkpoint "$ckpt" --prompt-ids 1 --max-new-tokens 1
