#!/usr/bin/env bash
# `make run`: the embedded default. Fetches six Jane Austen novels (Debian's r-cran-janeaustenr,
# read as R data), trains a 2048-token BPE tokenizer on them with titan's trainer, and trains
# configs/debug_model.yaml on the text with FSDP over TITAN_RANKS ranks (default 2) through
# ./run_train.sh; the loss falls visibly within the first 50 steps. It ends the way a user wants
# to see a run: the path of a PNG of its loss, learning rate and throughput (scripts/
# plot_metrics) and a sample of Austen-like text from the model it just trained (its last
# checkpoint, through titan generate). Run again, it finds its run finished (titan says so) and
# shows the plot and a sample again. A Ctrl-C saves a checkpoint (./run_train.sh), and the
# next `make run` resumes from it.
set -euo pipefail
cd "$(dirname "$0")/.."

corpus=outputs/data/janeaustenr.rdb
tokenizer=outputs/data/austen.tiktoken
bash scripts/fetch_austen.sh "$corpus"
[ -f "$tokenizer" ] || ./titan tokenizer train --vocab-size 2048 --out "$tokenizer" "$corpus"
# The run's dump folder: the config's, unless the arguments name another.
dump=outputs/debug_model
args=("$@")
for i in "${!args[@]}"; do
  [ "${args[$i]}" = --job.dump_folder ] && dump=${args[$((i + 1))]}
done
NPROC=${TITAN_RANKS:-2} ./run_train.sh --config configs/debug_model.yaml --checkpoint.enable true "$@"

/usr/bin/python3 scripts/plot_metrics "$dump" -o "$dump/metrics.png" >/dev/null
last=$(ls -v "$dump"/checkpoint/step-*.h5 | tail -n 1)
prompt="It is a truth universally acknowledged"
echo
echo "sample from $last:"
printf "%s" "$prompt"
./titan generate --checkpoint "$last" --tokenizer "$tokenizer" --prompt "$prompt" \
  --max-new-tokens 60 --temperature 0.8 --seed 0
echo
echo "loss, learning rate and tokens/s: $dump/metrics.png"
