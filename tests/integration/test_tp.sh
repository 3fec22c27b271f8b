#!/usr/bin/env bash
# Tensor parallelism over 2 and 4 ranks: tests/unit/test_tp.c (which also runs on 1 rank as a
# unit test) under mpirun, every rank comparing its shards with the 1-rank model.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
for np in 2 4; do
  out=$(timeout 300 mpirun --oversubscribe -np "$np" build/tests/test_tp 2>&1) ||
    fail "test_tp on $np ranks: $(printf '%s\n' "$out" | tail -n 20)"
  [ "$(printf '%s\n' "$out" | grep -c '\[  PASSED  \]')" -eq "$np" ] ||
    fail "test_tp on $np ranks: not every rank passed: $out"
  echo "ok: test_tp on $np ranks"
done
