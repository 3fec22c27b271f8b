#!/usr/bin/env bash
# Runs every test: the cmocka unit tests (build/tests/test_*) and the integration tests
# (tests/integration/test_*.sh, which drive the titan binary and the PyTorch reference).
# Ends with one line "N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."

passed=0
failed=0
failures=()
run() {  # name, command...
  local name=$1; shift
  local start=$SECONDS
  if "$@" >"build/test-logs/$name.log" 2>&1; then
    passed=$((passed + 1)); echo "PASS $name ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1)); failures+=("$name"); echo "FAIL $name ($((SECONDS - start)) s)"
    tail -n 30 "build/test-logs/$name.log" | sed 's/^/    /'
  fi
}

mkdir -p build/test-logs/unit build/test-logs/integration
for t in build/tests/test_*; do run "unit/$(basename "$t")" "$t"; done
for t in tests/integration/test_*.sh; do run "integration/$(basename "$t" .sh)" bash "$t"; done

[ ${#failures[@]} -gt 0 ] && echo "failed: ${failures[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
