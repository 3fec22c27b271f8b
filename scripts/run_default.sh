#!/usr/bin/env bash
# `make run`: the embedded default. Fetches six Jane Austen novels (Debian's r-cran-janeaustenr,
# read as R data), trains a 2048-token BPE tokenizer on them with titan's trainer, and trains
# configs/debug_model.yaml on the text with FSDP over TITAN_RANKS ranks (default 2, one OpenMP
# thread each); the loss falls visibly within the first 50 steps.
set -euo pipefail
cd "$(dirname "$0")/.."

corpus=outputs/data/janeaustenr.rdb
tokenizer=outputs/data/austen.tiktoken
bash scripts/fetch_austen.sh "$corpus"
[ -f "$tokenizer" ] || ./titan tokenizer train --vocab-size 2048 --out "$tokenizer" "$corpus"
ranks=${TITAN_RANKS:-2}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 ))} \
  mpirun --oversubscribe -np "$ranks" -x OMP_NUM_THREADS ./titan --config configs/debug_model.yaml "$@"
