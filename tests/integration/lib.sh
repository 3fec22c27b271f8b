# Shared by the integration tests: paths, a scratch folder, the Austen text as a byte-level
# token shard, and assertions. Sourced, not run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
TITAN=${TITAN:-./titan}  # CI also runs some suites with the CUDA=1 build
PY=/usr/bin/python3  # Debian's interpreter, the one with torch, numpy and h5py
SCRATCH=$(mktemp -d /tmp/titan-test.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
make -s test-data  # the test data in build/test-data (tests/data/README.md), when not there yet
CORPUS=build/test-data/corpus/austen.txt
DATA=$SCRATCH/austen.bin
$TITAN tokenize --tokenizer bytes --out "$DATA" "$CORPUS" >/dev/null

# A small, fast configuration shared by the tests: debug model shapes (vocab 2048), the byte
# shard above (so no tokenizer), short sequences; fp32 compute, since the tests built on it
# compare numerics exactly or within fp32 tolerances (PyTorch parity, layouts against one rank,
# bit-identical resumes); test_bf16.sh checks the default bf16 mixed precision against it.
FP32=(--training.mixed_precision_param float32)
SMALL=(--config configs/debug_model.yaml --training.dataset_path "$DATA" --model.tokenizer_path null
       --training.seq_len 64 --training.local_batch_size 4 --metrics.log_freq 1 "${FP32[@]}")

fail() { echo "FAIL: $*" >&2; exit 1; }

# The layout tests' run (test_pp, test_cp): 10 steps of 8 rows of seq_len 64 on one rank,
# validation at steps 5 and 10 on 2 batches of 4 rows.
LAYOUT_RUN=(${SMALL[@]} --training.local_batch_size 8 --training.global_batch_size -1
            --training.steps 10 --lr_scheduler.warmup_steps 2 --validation.enable
            --validation.dataset_path "$DATA" --validation.freq 5 --validation.steps 2
            --validation.seq_len 64 --validation.local_batch_size 4)

# train_ranks NAME NP ARGS...: $TITAN on NP ranks with ARGS, its dump folder $SCRATCH/NAME and
# its output $SCRATCH/NAME.log; a run that fails (or outlives 10 minutes) fails the test with
# the end of its log.
train_ranks() {
  local name=$1 np=$2; shift 2
  timeout 600 mpirun --oversubscribe -np "$np" $TITAN "$@" --job.dump_folder "$SCRATCH/$name" \
    >"$SCRATCH/$name.log" 2>&1 || { tail -5 "$SCRATCH/$name.log"; fail "$name: run failed"; }
}

# in_background CMD...: CMD (a train_ranks, say) in the background; wait_background waits for
# every one started and fails the test if any failed (train_ranks has shown its log's end).
# For runs of one thread each, two side by side on two cores.
BACKGROUND=()
in_background() { "$@" & BACKGROUND+=($!); }
wait_background() {
  local pid failed=0
  for pid in "${BACKGROUND[@]}"; do wait "$pid" || failed=1; done
  BACKGROUND=()
  [ "$failed" -eq 0 ] || fail "a run in the background failed"
}

# unit_test_on_ranks NAME NP: the cmocka test build/tests/NAME (which also runs on one rank as
# a plain unit test) on NP MPI ranks, one thread each: every rank must pass.
unit_test_on_ranks() {
  local name=$1 np=$2 out
  out=$(timeout 300 mpirun --oversubscribe -np "$np" -x OMP_NUM_THREADS=1 "build/tests/$name" 2>&1) ||
    fail "$name on $np ranks: $(printf '%s\n' "$out" | tail -n 20)"
  [ "$(printf '%s\n' "$out" | grep -c '\[  PASSED  \]')" -eq "$np" ] ||
    fail "$name on $np ranks: not every rank passed: $out"
  echo "ok: $name on $np ranks"
}

# stderr_of FILE: a run's stderr FILE without the warning of an MFU above 100%, which depends
# on how busy the machine was while the cpu measured its peak (train/loop.c), not on the run:
# for the tests that count a run's warnings.
stderr_of() { grep -v '^titan: warning: MFU [0-9]*% is above 100%' "$1" || true; }

# expect_user_error PATTERN CMD...: CMD must exit 2 printing exactly one stderr line that
# matches the extended regex PATTERN, besides the run's warnings (`titan: warning:` lines, such
# as a warmup cut to a short run's length, said before the error).
expect_user_error() {
  local pattern=$1; shift
  local err rc=0
  err=$("$@" 2>&1 >/dev/null) || rc=$?
  err=$(printf '%s\n' "$err" | grep -v '^titan: warning: ' || true)
  [ "$rc" -eq 2 ] || fail "expected exit 2, got $rc from: $* ($err)"
  [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "expected one line from: $*, got: $err"
  printf '%s\n' "$err" | grep -Eq -- "$pattern" || fail "'$err' does not match '$pattern'"
  echo "ok: $err"
}

# expect_job_error PATTERN CMD...: expect_user_error for an mpirun job, whose stderr also
# holds mpirun's banner about the ranks' exit: one titan line, from rank 0.
expect_job_error() {
  local pattern=$1 rc=0; shift
  "$@" >/dev/null 2>"$SCRATCH/job.err" || rc=$?
  local err; err=$(grep '^titan' "$SCRATCH/job.err" | grep -v '^titan: warning: ' || true)
  [ "$rc" -eq 2 ] || fail "expected exit 2, got $rc from: $* ($(cat "$SCRATCH/job.err"))"
  [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "expected one line from: $*, got: $err"
  printf '%s\n' "$err" | grep -Eq -- "$pattern" || fail "'$err' does not match '$pattern'"
  echo "ok: $err"
}

# checkpoint_loads FILE STEP: the checkpoint FILE of step STEP is whole: every dataset reads
# with h5py (HDF5 checks each chunk's Fletcher32).
checkpoint_loads() {
  $PY - "$1" "$2" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    names = []
    f.visit(names.append)
    for n in names:
        if isinstance(f[n], h5py.Dataset):
            f[n][()]
    assert f.attrs["step"] == int(sys.argv[2]), f.attrs["step"]
print(f"ok: {sys.argv[1]} loads whole")
PY
}

# losses FILE: the loss column of a metrics.jsonl, exactly as written.
losses() { grep -o '"loss": [^,]*' "$1"; }

# layout_matches NAME REFERENCE RUN KEY...: two metrics.jsonl of 10 steps each (a 1-rank run's and
# a layout's), every KEY within 1e-5 relative at every step.
layout_matches() {
  $PY - "$@" <<'PY'
import json, sys
name, keys = sys.argv[1], sys.argv[4:]
ref, got = [[json.loads(l) for l in open(p)] for p in sys.argv[2:4]]
assert len(got) == len(ref) == 10, f"{name}: {len(got)} steps logged"
worst = 0.0
for r, g in zip(ref, got):
    for key in keys:
        err = abs(g[key] - r[key]) / abs(r[key])
        worst = max(worst, err)
        assert err < 1e-5, f"{name}: step {r['step']} {key} {g[key]!r} vs {r[key]!r} ({err:.2e})"
print(f"ok: {name:28s} worst relative error {worst:.2e}")
PY
}

# same_metrics NAME REFERENCE RUN FIRST TOLERANCE: two metrics.jsonl, step by step. RUN logged
# the steps (and validations) REFERENCE did from step FIRST on (a resumed run starts later),
# and its loss, grad norm and validation loss are within TOLERANCE relative of REFERENCE's at
# each (0: bit-identical).
same_metrics() {
  $PY - "$@" <<'PY'
import json, sys
name, first, tolerance = sys.argv[1], int(sys.argv[4]), float(sys.argv[5])
ref, run = [[json.loads(l) for l in open(p)] for p in sys.argv[2:4]]
def steps(records, key, since=0):
    return [r["step"] for r in records if key in r and r["step"] >= since]
for key in ("loss", "validation_loss"):
    assert steps(run, key) == steps(ref, key, first), \
        f"{name}: {key} at steps {steps(run, key)}, the reference from {first} at {steps(ref, key, first)}"
trained = steps(run, "loss")
assert trained, f"{name}: no training step logged"
expected = {(r["step"], k): v for r in ref for k, v in r.items()}
worst = 0.0
for r in run:
    for key in ("loss", "grad_norm", "validation_loss"):
        if key not in r:
            continue
        want = expected[r["step"], key]
        err = abs(r[key] - want) / abs(want)
        worst = max(worst, err)
        assert err <= tolerance, f"{name}: step {r['step']} {key} {r[key]!r} vs {want!r}"
validations = steps(run, "validation_loss")
also = f" and validations at {validations}" if validations else ""
print(f"ok: {name:45s} steps {trained[0]}-{trained[-1]}{also}, worst relative difference {worst:.1e}")
PY
}

# same_losses NAME REFERENCE RUN: two metrics.jsonl of the same steps whose losses are equal bit
# for bit and grad norms within 1e-12 (a layout sums its grad norm's squares, in double, over
# its own shards).
same_losses() {
  [ "$(losses "$2")" = "$(losses "$3")" ] || fail "$1: losses differ: $(diff <(losses "$2") <(losses "$3") | head -4)"
  same_metrics "$1" "$2" "$3" 1 1e-12
}
