#!/usr/bin/env bash
# FSDP and HSDP against the 1-rank model (tests/unit/test_fsdp.c) on 2, 3 (padded shards) and
# 4 ranks, and on 4 ranks as 2 replicas of 2 shards; each run checks params, grads, loss, grad
# norm and communication volume itself and exits non-zero on any difference.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
TEST=build/tests/test_fsdp
[ -x "$TEST" ] || fail "$TEST is not built (make check builds it)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One thread per rank: the ranks already share the cores.
run_layout() {  # ranks, dp_replicate
  local out
  out=$(mpirun --oversubscribe -np "$1" -x OMP_NUM_THREADS=1 "$TEST" "$2" 2>&1) ||
    fail "$1 ranks, dp_replicate $2: $out"
  printf '%s\n' "$out" | tail -n 1
}
run_layout 2 1
run_layout 3 1
run_layout 4 1
run_layout 4 2
