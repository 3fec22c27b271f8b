#!/usr/bin/env bash
# `make run`: the embedded default. Fetches six Jane Austen novels (Debian's r-cran-janeaustenr,
# read as R data), trains a 2048-token BPE tokenizer on them with titan's trainer, and trains
# configs/debug_model.yaml on the text; the loss falls visibly within the first 50 steps.
set -euo pipefail
cd "$(dirname "$0")/.."

corpus=outputs/data/janeaustenr.rdb
tokenizer=outputs/data/austen.tiktoken
bash scripts/fetch_austen.sh "$corpus"
[ -f "$tokenizer" ] || ./titan tokenizer train --vocab-size 2048 --out "$tokenizer" "$corpus"
./titan --config configs/debug_model.yaml "$@"
