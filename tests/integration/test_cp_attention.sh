#!/usr/bin/env bash
# Context parallel's attention hooks over 2 and 4 ranks: tests/unit/test_cp.c (which also runs
# on 1 rank as a unit test) under mpirun, every rank comparing its out, lse, dq, dk and dv with
# the kernel on the whole sequences, for both rotate methods and both masks.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for np in 2 4; do unit_test_on_ranks test_cp "$np"; done
