#!/usr/bin/env bash
# `make finetune`: fine-tunes `make run`'s debug model with LoRA (configs/debug_lora.yaml) on a
# generated instruction set (scripts/finetune_data.py), the loss on the completions only, then
# asks the tuned model, its adapters merged by titan generate, to greet names it never saw in
# training: the greeting's format is what it learned. Runs `make run` first when its
# checkpoint is missing. Run again, it finds its run finished and samples again.
set -euo pipefail
cd "$(dirname "$0")/.."

base=outputs/debug_model/checkpoint/step-150.h5
[ -f "$base" ] || bash scripts/run_default.sh
data=outputs/data/greetings.jsonl
[ -f "$data" ] || /usr/bin/python3 scripts/finetune_data.py "$data"
NPROC=${TITAN_RANKS:-2} ./run_train.sh --config configs/debug_lora.yaml "$@"

dump=outputs/debug_lora
last=$(ls -v "$dump"/checkpoint/step-*.h5 | tail -n 1)
echo
echo "samples from $last (names not in the training set):"
for name in "Anne Darcy" "Colonel Woodhouse" "Miss Wentworth"; do
  prompt=$(printf 'Name: %s\nGreeting:' "$name")
  printf '%s' "$prompt"
  ./titan generate --checkpoint "$last" --tokenizer outputs/data/austen.tiktoken \
    --prompt "$prompt" --max-new-tokens 20 --temperature 0 2>"$dump/generate.log" ||
    { cat "$dump/generate.log"; exit 1; }
  echo
done
