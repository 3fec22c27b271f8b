#!/usr/bin/env bash
# The blocked Shard on 2 and 4 ranks (tests/unit/test_blocked_shard.c, also a 1-rank unit
# test): a fused weight cut part by part over tp 2 (and FSDP over 2 more ranks) saved by every
# rank as a union of hyperslabs and loaded on one rank, and back.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

for np in 2 4; do unit_test_on_ranks test_blocked_shard "$np"; done
echo "test_blocked_shard: all passed"
