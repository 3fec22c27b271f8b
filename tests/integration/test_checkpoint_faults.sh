#!/usr/bin/env bash
# Checkpoint faults (issue 10, "Integrity"): a damaged or foreign checkpoint is refused in one
# line, exit 2, before training, and the failed run leaves every file of the checkpoint folder
# as it was; a rank killed (SIGKILL) at random moments during saves never leaves a partial file
# under a checkpoint's name, keep_latest_k never takes the newest complete one, each restart
# resumes from the newest complete one, and the chain of killed and resumed runs ends with the
# uninterrupted run's losses bit for bit.
# run_all: alone (tests/run_all.sh): it times signals and timeouts
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
started=$SECONDS

# The damage, done with h5py as a user (or a disk) would: flip FILE DATASET [CHUNK] flips the
# byte in the middle of the dataset's chunk as stored (the first, or CHUNK; Fletcher32's 4
# bytes end it); rechunk FILE DATASET stores the dataset in two chunks of rows, as another
# writer may.
cat >"$SCRATCH/damage.py" <<'PY'
import sys, h5py, numpy as np
op, path, *args = sys.argv[1:]
if op == "flip":
    with h5py.File(path, "r") as f:
        chunk = f[args[0]].id.get_chunk_info(int(args[1]) if len(args) > 1 else 0)
    with open(path, "r+b") as raw:
        raw.seek(chunk.byte_offset + (chunk.size - 4) // 2)
        byte = raw.read(1)[0]
        raw.seek(-1, 1)
        raw.write(bytes([byte ^ 0xFF]))
    sys.exit()
with h5py.File(path, "r+") as f:
    if op == "delete":
        del f[args[0]]
    elif op == "reshape":  # the same name, the transposed shape
        shape = f[args[0]].shape[::-1]
        del f[args[0]]
        f.create_dataset(args[0], shape, "<f4", chunks=shape, fletcher32=True)
    elif op == "rechunk":
        data = f[args[0]][()]
        del f[args[0]]
        f.create_dataset(args[0], data=data, chunks=(len(data) // 2, *data.shape[1:]),
                         fletcher32=True)
    elif op == "int":
        f.attrs.modify(args[0], np.int64(int(args[1])))
    elif op == "real":
        f.attrs.modify(args[0], np.float64(args[1]))
    else:
        sys.exit(f"unknown damage {op}")
PY

# Every complete step file of FOLDER read whole (HDF5 verifies each chunk's Fletcher32), its
# step attribute its name's; prints the newest step (-1: none) and the count.
cat >"$SCRATCH/verify.py" <<'PY'
import sys, os, re, h5py
steps = []
for name in os.listdir(sys.argv[1]):
    m = re.fullmatch(r"step-(\d+)\.h5", name)
    if not m:
        continue
    with h5py.File(os.path.join(sys.argv[1], name), "r") as f:
        assert f.attrs["step"] == int(m[1]), name
        f.visititems(lambda n, o: o[()] if isinstance(o, h5py.Dataset) else None)
    steps.append(int(m[1]))
print(max(steps, default=-1), len(steps))
PY

# snapshot FOLDER: every file's name, size, mtime (ns) and inode: a file rewritten, replaced,
# removed or added shows.
snapshot() { (cd "$1" && find . -printf '%p %s %T@ %i\n' | sort); }

# The checkpoints the damage starts from: step-1 and step-2 hold the full state, step-3 (the
# last step) the model only, as torchtitan's last_save_model_only. The small flavor
# throughout: 50 MB of full state, quicker to copy and to save than the debug model's 75.
run=(${SMALL[@]} --model.flavor small --training.steps 3 --checkpoint.enable --checkpoint.interval 1)
$TITAN "${run[@]}" --job.dump_folder "$SCRATCH/base" >/dev/null
BASE=$SCRATCH/base/checkpoint

# damaged NAME: a run folder holding base's full step-1 (linked: it must stay untouched) and a
# copy of its step-2, the newest, which the case then damages. Prints step-2's path.
damaged() {
  mkdir -p "$SCRATCH/$1/checkpoint"
  ln "$BASE/step-1.h5" "$SCRATCH/$1/checkpoint/"
  cp "$BASE/step-2.h5" "$SCRATCH/$1/checkpoint/"
  echo "$SCRATCH/$1/checkpoint/step-2.h5"
}

# refused NAME PATTERN [LAUNCHER...] -- ARGS...: resuming the folder of case NAME exits 2 with
# one line matching PATTERN, and changes nothing in the folder.
refused() {
  local name=$1 pattern=$2 launcher=(); shift 2
  while [ "$1" != -- ]; do launcher+=("$1"); shift; done; shift
  local before; before=$(snapshot "$SCRATCH/$name/checkpoint")
  local cmd=($TITAN "${run[@]}" --job.dump_folder "$SCRATCH/$name" "$@")
  if [ ${#launcher[@]} -eq 0 ]; then expect_user_error "$pattern" "${cmd[@]}"
  else expect_job_error "$pattern" "${launcher[@]}" "${cmd[@]}"; fi
  [ "$(snapshot "$SCRATCH/$name/checkpoint")" = "$before" ] ||
    fail "$name: the refused run changed the checkpoint folder"
}

# 1. A flipped byte in a tensor's stored data, small and large, model and AdamW moments.
for dset in model/norm.weight model/tok_embeddings.weight model/layers.3.feed_forward.w2.weight \
            optimizer/exp_avg/layers.0.attention.wk.weight optimizer/exp_avg_sq/output.weight; do
  name=flip-${dset//\//-}
  $PY "$SCRATCH/damage.py" flip "$(damaged "$name")" "$dset"
  refused "$name" "^titan: error: checkpoint .*/$name/checkpoint/step-2.h5: /$dset fails its Fletcher32 checksum" --
done
# Two ranks (each reading its FSDP half of the corrupt chunk): rank 0's line, exit 2.
two_ranks=(mpirun --oversubscribe -np 2)
name=flip-2-ranks
$PY "$SCRATCH/damage.py" flip "$(damaged "$name")" model/output.weight
refused "$name" "step-2.h5: /model/output.weight fails its Fletcher32 checksum" "${two_ranks[@]}" --
# A corrupt chunk that one rank alone reads (FSDP gives rank 1 the second half of the rows,
# here the second chunk): the job still stops with the line, once.
name=flip-rank-1
$PY "$SCRATCH/damage.py" rechunk "$(damaged "$name")" model/tok_embeddings.weight
$PY "$SCRATCH/damage.py" flip "$SCRATCH/$name/checkpoint/step-2.h5" model/tok_embeddings.weight 1
refused "$name" "step-2.h5: /model/tok_embeddings.weight fails its Fletcher32 checksum" "${two_ranks[@]}" --

# 2. Files cut short, damaged or foreign.
file=$(damaged truncated)
truncate -s $(($(stat -c %s "$file") / 2)) "$file"
refused truncated "checkpoint .*/truncated/checkpoint/step-2.h5 is truncated or not an HDF5 file" --
truncate -s -1 "$(damaged truncated-1-byte)"
refused truncated-1-byte "truncated-1-byte/checkpoint/step-2.h5 is truncated or not an HDF5 file" --
for dset in model/layers.3.feed_forward.w2.weight optimizer/exp_avg_sq/layers.0.attention.wv.weight; do
  name=deleted-${dset//\//-}
  $PY "$SCRATCH/damage.py" delete "$(damaged "$name")" "$dset"
  refused "$name" "checkpoint .*/$name/checkpoint/step-2.h5 has no dataset /$dset$" --
done
$PY "$SCRATCH/damage.py" reshape "$(damaged reshaped)" model/layers.1.feed_forward.w1.weight
refused reshaped "reshaped/checkpoint/step-2.h5: /model/layers.1.feed_forward.w1.weight has shape \(256, 768\) but the model expects \(768, 256\)" --
# Without /optimizer the file looks like a model-only save: refused, not an AdamW reset.
$PY "$SCRATCH/damage.py" delete "$(damaged no-optimizer)" optimizer
refused no-optimizer "no-optimizer/checkpoint/step-2.h5 holds the model only" --
damaged flavor >/dev/null
refused flavor "flavor/checkpoint/step-2.h5 was written with model.n_layers 4, this run has 6" -- \
  --model.flavor debugmodel
$PY "$SCRATCH/damage.py" real "$(damaged rope-theta)" model.rope_theta 10000
refused rope-theta "rope-theta/checkpoint/step-2.h5 was written with model.rope_theta 10000, this run has 500000" --
damaged tied >/dev/null
refused tied "tied/checkpoint/step-2.h5 was written with model.tie_word_embeddings 0, this run has 1" -- \
  --model.tie_word_embeddings true
damaged seq-len >/dev/null
refused seq-len "seq-len/checkpoint/step-2.h5 was written with training.seq_len 64, this run has 32" -- \
  --training.seq_len 32
$PY "$SCRATCH/damage.py" int "$(damaged step-2-40)" step $((1 << 40))
refused step-2-40 "step-2-40/checkpoint/step-2.h5: attribute step is 1099511627776, outside \[0, " --
$PY "$SCRATCH/damage.py" int "$(damaged step-renamed)" step 1
refused step-renamed "step-renamed/checkpoint/step-2.h5 records step 1, not the 2 of its name" --
$PY "$SCRATCH/damage.py" int "$(damaged windows)" data_windows_consumed -3
refused windows "windows/checkpoint/step-2.h5: attribute data_windows_consumed is -3, outside \[0, " --

# A model-only final checkpoint extended by more steps: refused, then accepted with consent
# (AdamW restarts from zero moments) and trained on.
damaged model-only >/dev/null
ln "$BASE/step-3.h5" "$SCRATCH/model-only/checkpoint/"
refused model-only "model-only/checkpoint/step-3.h5 holds the model only .* add optimizer to checkpoint.exclude_from_loading" -- \
  --training.steps 5
$TITAN "${run[@]}" --job.dump_folder "$SCRATCH/model-only" --training.steps 5 \
  --checkpoint.exclude_from_loading optimizer >"$SCRATCH/model-only.log" ||
  fail "the consented model-only resume failed"
grep -q "resumed from .*/model-only/checkpoint/step-3.h5 at step 3" "$SCRATCH/model-only.log" ||
  fail "the consented model-only resume did not start at step 3"
[ "$(grep -c '"step": [45], "loss"' "$SCRATCH/model-only/metrics.jsonl")" -eq 2 ] ||
  fail "the consented model-only resume did not train steps 4 and 5"
echo "ok: a model-only step-3 resumed with checkpoint.exclude_from_loading optimizer trained to step 5"
echo "ok: damage cases in $((SECONDS - started)) s"

# 3. SIGKILL of one rank (drawn at random) of a 2-rank job at a random moment of a save, 20
# times; each restart is the next victim, so every one of them must resume from the newest
# complete checkpoint the kill before it left, never from a step-N.h5.tmp. Every step saves
# the small flavor (50 MB with AdamW, ~30 ms of a ~250 ms step). The victim is the first or (at
# random) the second save after the resume; odd kills land the moment its .tmp is seen (always
# inside the save, so restarts do meet stale .tmp files), even ones a random fraction of the
# last save's measured duration later, so the checkpoints advance by one every other kill.
# 4. keep_latest_k 2 deletes as the kills land: the newest complete checkpoint must survive
# every kill. mpirun ends the surviving rank at once (by default it waits 1 s after each
# signal).
STEPS=40
MPIRUN=(mpirun --oversubscribe -np 2 --mca odls_base_sigkill_timeout 0)
kill_run=(${run[@]} --training.steps $STEPS --checkpoint.keep_latest_k 2 --job.dump_folder "$SCRATCH/killed")
FOLDER=$SCRATCH/killed/checkpoint
"${MPIRUN[@]}" $TITAN "${kill_run[@]}" --checkpoint.enable false --job.dump_folder "$SCRATCH/whole" \
  >/dev/null || fail "the uninterrupted run failed"
kill_started=$SECONDS

# rank_pid LAUNCHER RANK: the pid of that rank of the mpirun job LAUNCHER.
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" &&
      { echo "$p"; return 0; }
  done
  return 1
}
# saved N / saving N: whether this run has published / begun the save of step N (the file
# under its name / also its .tmp newer than the run).
saved() { [ -f "$FOLDER/step-$1.h5" ]; }
saving() { [ "$FOLDER/step-$1.h5.tmp" -nt "$SCRATCH/start" ] || saved "$1"; }
# abort MESSAGE: fail, ending the job first.
abort() { kill -9 "$launcher" $(pgrep -P "$launcher") 2>/dev/null || true; fail "$@"; }
# until_job CMD...: polls CMD every 5 ms (a save lasts ~30 ms) while the job runs (30 s at
# most); fails if it never holds.
until_job() {
  for _ in $(seq 6000); do
    "$@" && return 0
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.005
  done
  abort "kill $kill: '$*' never held: $(grep titan "$log")"
}
now_us() { echo "${EPOCHREALTIME/./}"; }

newest=-1 save_us=0 cut_saves=0 stale_met=0
for kill in $(seq 20); do
  log=$SCRATCH/killed-$kill.out
  touch "$SCRATCH/start"
  ls "$FOLDER"/*.tmp >/dev/null 2>&1 && stale_met=$((stale_met + 1))
  "${MPIRUN[@]}" $TITAN "${kill_run[@]}" >"$log" 2>&1 &
  launcher=$!
  first=$((newest < 0 ? 1 : newest + 1))
  target=$first
  [ $((first + 1)) -lt $STEPS ] || fail "kill $kill: the checkpoints reached step $newest: raise STEPS"
  if [ $save_us -eq 0 ] || [ $((RANDOM % 2)) -eq 1 ]; then  # time the first save, kill in the next
    until_job saving $first
    begun=$(now_us)
    until_job saved $first
    save_us=$(($(now_us) - begun + 1000))
    target=$((first + 1))
  fi
  rank=$((RANDOM % 2))  # the victim's pid found now: the kill itself is one builtin
  until_job rank_pid $launcher $rank >/dev/null
  pid=$(rank_pid $launcher $rank)
  until_job saving $target
  if [ $((kill % 2)) -eq 0 ]; then
    delay=$(((RANDOM << 15 | RANDOM) % save_us))
    sleep "$((delay / 1000000)).$(printf %06d $((delay % 1000000)))"
  fi
  kill -9 "$pid"
  wait $launcher && fail "kill $kill: the job ended before the kill (steps too few for the kills)"
  # The job ended by the kill alone, having resumed from the newest checkpoint the kill before
  # left (the first started afresh).
  ! grep -E '^titan: (error|internal error)' "$log" || fail "kill $kill: the job failed on its own"
  [ $newest -lt 0 ] || grep -Eq "^checkpoint: resumed from $FOLDER/step-$newest.h5 at step $newest in [0-9.]+ ms$" "$log" ||
    fail "kill $kill: the run did not resume from step-$newest.h5: $(grep resumed "$log")"
  ls "$FOLDER"/*.tmp >/dev/null 2>&1 && cut_saves=$((cut_saves + 1))
  read -r latest count < <($PY "$SCRATCH/verify.py" "$FOLDER") ||
    fail "kill $kill: a checkpoint does not read whole: $(ls "$FOLDER")"
  # keep_latest_k 2 prunes after each published save: a kill between the publish and the
  # prune leaves one file more, never fewer than the newest.
  [ "$latest" -ge "$newest" ] && [ "$count" -le 3 ] ||
    fail "kill $kill (rank $rank): newest complete step $latest after $newest, $count kept: $(ls "$FOLDER")"
  newest=$latest
done
[ $newest -ge 2 ] || fail "20 kills and the checkpoints never advanced past step $newest"
[ $stale_met -ge 1 ] || fail "no restart met a stale .tmp: the kills never landed in a save"
echo "ok: 20 SIGKILLs in $((SECONDS - kill_started)) s, $cut_saves leaving a save's .tmp, $stale_met restarts past one: every step file read whole, every restart from the newest"

# The same job once more, undisturbed: it resumes from the newest, saves every step on both
# ranks (rank 0 deleting what keep_latest_k drops), ends with the two newest and no .tmp
# left, and its losses are the uninterrupted run's, bit for bit.
"${MPIRUN[@]}" $TITAN "${kill_run[@]}" >"$SCRATCH/last.out" 2>&1 ||
  fail "the last resume failed: $(grep titan "$SCRATCH/last.out")"
grep -Eq "^checkpoint: resumed from $FOLDER/step-$newest.h5 at step $newest in [0-9.]+ ms$" "$SCRATCH/last.out" ||
  fail "the last run did not resume from step-$newest.h5: $(grep resumed "$SCRATCH/last.out")"
[ "$(ls "$FOLDER" | xargs)" = "step-$((STEPS - 1)).h5 step-$STEPS.h5" ] ||
  fail "keep_latest_k 2 left: $(ls "$FOLDER" | xargs)"
diff <(losses "$SCRATCH/whole/metrics.jsonl") <(losses "$SCRATCH/killed/metrics.jsonl") ||
  fail "after 20 kills and restarts the losses differ from the uninterrupted run's"
echo "ok: resumed from step $newest to step $STEPS, losses of all $STEPS steps equal the uninterrupted run's"
echo "ok: all cases in $((SECONDS - started)) s"
