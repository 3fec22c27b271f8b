#!/usr/bin/env bash
# Expert parallel's groups and hooks on 2 and 4 ranks (tests/unit/test_ep.c, also a 1-rank
# unit test): the sparse mesh's ep and efsdp groups for every layout of that many ranks, a
# dispatch and combine of tagged rows over the ep group, a checkpoint of expert weights
# saved sharded (ep 2) and loaded on one rank, and back, and a MoE layer's forward and backward
# with its experts split over every rank (2 local experts each fed by 4 ranks at 4) equal to
# the whole layer's.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

for np in 2 4; do unit_test_on_ranks test_ep "$np"; done
echo "test_ep: all passed"
