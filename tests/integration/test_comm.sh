#!/usr/bin/env bash
# parallel/comm on four MPI ranks (oversubscribing the cores): every collective's values and
# byte counts (build/tests/test_comm, which run_all.sh also runs on one rank), also through the
# host-staged backend (parallel/comm_staged.c), then the flight
# recorder: a SIGUSR1 to one rank dumps its trace with the pending operation, and a rank that
# skips a collective makes the others time out and abort the job instead of hanging.
# run_all: alone (tests/run_all.sh): it times signals and timeouts
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BIN=build/tests/test_comm
[ -x "$BIN" ] || { echo "FAIL: $BIN is not built (make $BIN)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI containers run as root
MPIRUN=(mpirun -np 4 --oversubscribe)
SCRATCH=$(mktemp -d /tmp/titan-comm.XXXXXX)
job=  # the background mpirun, ended if a check fails while it runs
trap '[ -z "$job" ] || kill "$job" 2>/dev/null; rm -rf "$SCRATCH"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# wait_for SECONDS CONDITION...: polls CONDITION every 0.1 s.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do [ "$SECONDS" -lt "$deadline" ] || return 1; sleep 0.1; done
}

"${MPIRUN[@]}" "$BIN"
echo "ok: collectives on 4 ranks"
# The same through the host-staged backend (comm.backend: mpi on a GPU), the cpu backend's
# upload and download its copies.
"${MPIRUN[@]}" "$BIN" staged
echo "ok: collectives on 4 ranks, staged through host buffers"

# SIGUSR1: rank 1 sits in an all-reduce the others have not joined; its dump must name it.
"${MPIRUN[@]}" "$BIN" sigusr1 "$SCRATCH" 2>"$SCRATCH/usr1.err" &
job=$!
wait_for 10 test -s "$SCRATCH/pid" || fail "rank 1 never wrote its pid"
kill -USR1 "$(cat "$SCRATCH/pid")"
wait_for 10 grep -q "rank 1: flight recorder (SIGUSR1)" "$SCRATCH/usr1.err" \
  || fail "no dump after SIGUSR1: $(cat "$SCRATCH/usr1.err")"
touch "$SCRATCH/go"
rc=0
wait "$job" || rc=$?
job=
[ "$rc" -eq 0 ] || fail "the SIGUSR1 run failed: $(cat "$SCRATCH/usr1.err")"
grep -Eq "rank 1:   seq [0-9]+ all_reduce on group world, 4 bytes, .*PENDING" "$SCRATCH/usr1.err" \
  || fail "the dump does not show the pending all-reduce: $(cat "$SCRATCH/usr1.err")"
echo "ok: SIGUSR1 dump"

# Timeout: with comm timeout 2 s, rank 0 stops before an all-reduce; the job must end non-zero
# well within 10 s, and the waiting ranks must say which collective timed out.
start=$SECONDS
rc=0
timeout 30 "${MPIRUN[@]}" "$BIN" timeout 2>"$SCRATCH/timeout.err" || rc=$?
elapsed=$((SECONDS - start))
[ "$rc" -ne 0 ] || fail "the timed-out job exited 0"
[ "$rc" -ne 124 ] || fail "the timed-out job hung until killed"
[ "$elapsed" -le 10 ] || fail "the timed-out job took $elapsed s"
line='^titan: rank [123]: collective all_reduce on group world \(seq [0-9]+, 4 bytes\) did not complete within 2 s$'
grep -Eq "$line" "$SCRATCH/timeout.err" || fail "no timeout line: $(cat "$SCRATCH/timeout.err")"
grep -q "flight recorder (timeout)" "$SCRATCH/timeout.err" || fail "no dump on timeout"
echo "ok: timeout after $elapsed s (exit $rc)"
