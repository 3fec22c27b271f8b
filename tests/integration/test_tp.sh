#!/usr/bin/env bash
# Tensor parallelism over 2 and 4 ranks: tests/unit/test_tp.c (which also runs on 1 rank as a
# unit test) under mpirun, every rank comparing its shards with the 1-rank model.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
for np in 2 4; do unit_test_on_ranks test_tp "$np"; done
