# Shared by the integration tests: paths, a scratch folder, the Austen text as a byte-level
# token shard, and assertions. Sourced, not run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
TITAN=${TITAN:-./titan}  # CI also runs some suites with the CUDA=1 build
PY=/usr/bin/python3  # Debian's interpreter, the one with torch, numpy and h5py
SCRATCH=$(mktemp -d /tmp/titan-test.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
CORPUS=../shared/data/corpus/austen.txt
DATA=$SCRATCH/austen.bin
$TITAN tokenize --tokenizer bytes --out "$DATA" "$CORPUS" >/dev/null

# A small, fast configuration shared by the tests: debug model shapes (vocab 2048), the byte
# shard above (so no tokenizer), short sequences.
SMALL=(--config configs/debug_model.yaml --training.dataset_path "$DATA" --model.tokenizer_path null
       --training.seq_len 64 --training.local_batch_size 4 --metrics.log_freq 1)

fail() { echo "FAIL: $*" >&2; exit 1; }

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

# expect_user_error PATTERN CMD...: CMD must exit 2 printing exactly one stderr line that
# matches the extended regex PATTERN.
expect_user_error() {
  local pattern=$1; shift
  local err rc=0
  err=$("$@" 2>&1 >/dev/null) || rc=$?
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
  local err; err=$(grep '^titan' "$SCRATCH/job.err" || true)
  [ "$rc" -eq 2 ] || fail "expected exit 2, got $rc from: $* ($(cat "$SCRATCH/job.err"))"
  [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "expected one line from: $*, got: $err"
  printf '%s\n' "$err" | grep -Eq -- "$pattern" || fail "'$err' does not match '$pattern'"
  echo "ok: $err"
}

# losses FILE: the loss column of a metrics.jsonl, exactly as written.
losses() { grep -o '"loss": [^,]*' "$1"; }
