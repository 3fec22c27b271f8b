#!/usr/bin/env bash
# Runs every test: the cmocka unit tests (build/tests/test_*) and the integration tests
# (tests/integration/test_*.sh, which drive the titan binary and the PyTorch reference).
# Ends with one line "N passed, N failed"; exits non-zero if anything failed.
#
# TEST_JOBS tests at a time (default: the cores). Most of a test's time is one-thread runs,
# process start-ups and Python, so two at a time keep two cores busy; a test whose file has a
# line `# run_all: alone` (it times signals, or drives a service such as Slurm) runs after the
# others, by itself. Each test's output is build/test-logs/NAME.log, shown in part on failure.
set -uo pipefail
cd "$(dirname "$0")/.."

jobs=${TEST_JOBS:-$(nproc)}
results=build/test-logs/results
rm -rf build/test-logs
mkdir -p build/test-logs/unit build/test-logs/integration "$results"

run() {  # name, command...: its line (and on failure its log's end) printed at once
  local name=$1; shift
  local start=$SECONDS out
  if "$@" >"build/test-logs/$name.log" 2>&1; then
    out="PASS $name ($((SECONDS - start)) s)"
  else
    out="FAIL $name ($((SECONDS - start)) s)"$'\n'$(tail -n 30 "build/test-logs/$name.log" | sed 's/^/    /')
  fi
  printf '%s\n' "$out"
  printf '%s\n' "${out%% *}" >"$results/${name//\//.}"
}

pooled() {  # name, command...: run in the background, at most $jobs at a time
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  run "$@" &
}

alone=()
for t in build/tests/test_*; do pooled "unit/$(basename "$t")" "$t"; done
for t in tests/integration/test_*.sh; do
  if grep -q '^# run_all: alone' "$t"; then alone+=("$t"); continue; fi
  pooled "integration/$(basename "$t" .sh)" bash "$t"
done
wait
for t in "${alone[@]}"; do run "integration/$(basename "$t" .sh)" bash "$t"; done

passed=$(grep -lx PASS "$results"/* | wc -l)
failures=$(grep -lx FAIL "$results"/* | xargs -r -n1 basename | tr . / | xargs)
failed=$(grep -lx FAIL "$results"/* | wc -l)
[ "$failed" -gt 0 ] && echo "failed: $failures"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
