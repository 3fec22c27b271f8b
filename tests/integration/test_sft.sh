#!/usr/bin/env bash
# Supervised fine-tuning data (data/dataset.h's DocParts): a .jsonl of TRL's prompt-completion
# examples (600 sums, "Question: what is a plus b?\nAnswer:" -> " c") under a BPE tokenizer
# trained on them, packed with document masking; the loss trains on the completions only
# (test_dataset checks the mask token by token, test_loss_mask the masked loss against PyTorch).
# - The loss is the mean over the step's trained targets wherever they fall: one rank with a
#   batch of 4 rows, FSDP over 2 ranks of 2 rows, 2 accumulated microbatches of 2 rows, PP 2,
#   CP 2 and TP 2 give the same losses and grad norms within 1e-5 (a per-rank or
#   per-microbatch mean would not: the ranks' rows hold different numbers of trained targets).
# - The startup line counts the documents, the trained share and those longer than a window.
# - Validation's loss is the mean over the trained targets too: the same on one rank and on
#   FSDP's two.
# - A DeepSeek-V3 model with an MTP module trains on it (the mask shifted with the targets).
# - Bad input, one line, exit 2: a conversation ("messages") under a tokenizer without a chat
#   template, an example without its completion, `titan tokenize` of a supervised dataset.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

$PY - "$SCRATCH/sums.jsonl" <<'PY'
import json, random, sys
r = random.Random(0)
with open(sys.argv[1], "w") as f:
    for _ in range(600):
        a, b = r.randint(0, 50), r.randint(0, 50)
        f.write(json.dumps({"prompt": f"Question: what is {a} plus {b}?\nAnswer:",
                            "completion": f" {a + b}"}) + "\n")
PY
$TITAN tokenizer train --vocab-size 512 --out "$SCRATCH/sums.tiktoken" "$SCRATCH/sums.jsonl" \
  >/dev/null
SFT=(--config configs/debug_model.yaml --training.dataset_path "$SCRATCH/sums.jsonl"
     --model.tokenizer_path "$SCRATCH/sums.tiktoken" --training.document_masking
     --training.seq_len 64 --training.local_batch_size 4 --training.steps 10
     --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 "${FP32[@]}")
P=--parallelism
$TITAN "${SFT[@]}" --job.dump_folder "$SCRATCH/one" >"$SCRATCH/one.log"
grep -q "data: 600 documents, [0-9.]*% of the tokens trained (completions, assistant turns); 0 longer than a window of 65 tokens" \
  "$SCRATCH/one.log" || fail "no examples line: $(grep data: "$SCRATCH/one.log")"
in_background train_ranks fsdp 2 "${SFT[@]}" $P.data_parallel_shard_degree 2 \
  --training.local_batch_size 2
in_background train_ranks pp 2 "${SFT[@]}" $P.pipeline_parallel_degree 2
wait_background
in_background train_ranks cp 2 "${SFT[@]}" $P.context_parallel_degree 2
in_background train_ranks tp 2 "${SFT[@]}" $P.tensor_parallel_degree 2
wait_background
$TITAN "${SFT[@]}" --training.local_batch_size 2 --training.global_batch_size 4 \
  --job.dump_folder "$SCRATCH/accum" >/dev/null
for run in fsdp pp cp tp accum; do
  layout_matches "sft $run" "$SCRATCH/one/metrics.jsonl" "$SCRATCH/$run/metrics.jsonl" loss grad_norm
done

# DeepSeek-V3 with an MTP module (whose sequences are one document each: no document
# masking): its targets and loss mask shifted one more position.
train_ranks mtp 1 "${SFT[@]}" --model.name deepseek_v3 --model.flavor small \
  --model.mtp_layers 1 --training.steps 2 --training.document_masking false
[ "$(losses "$SCRATCH/mtp/metrics.jsonl" | wc -l)" -eq 2 ] || fail "the MTP model did not train"

VAL=(--validation.enable --validation.dataset_path "$SCRATCH/sums.jsonl" --validation.freq 2
     --validation.steps 3 --validation.seq_len 64 --validation.local_batch_size 2)
$TITAN "${SFT[@]}" "${VAL[@]}" --training.steps 2 --job.dump_folder "$SCRATCH/val-one" >/dev/null
train_ranks val-fsdp 2 "${SFT[@]}" "${VAL[@]}" --training.steps 2 $P.data_parallel_shard_degree 2 \
  --training.local_batch_size 2 --validation.local_batch_size 1
$PY - "$SCRATCH/val-one/metrics.jsonl" "$SCRATCH/val-fsdp/metrics.jsonl" <<'PY'
import json, sys
one, fsdp = ([json.loads(l)["validation_loss"] for l in open(p) if "validation_loss" in l] for p in sys.argv[1:])
assert len(one) == len(fsdp) == 1 and abs(one[0] - fsdp[0]) <= 1e-5 * one[0], (one, fsdp)
print(f"ok: validation's loss over the trained targets: {one[0]:.6f} on one rank and on FSDP's two")
PY

printf '{"messages": [{"role": "user", "content": "hi"}]}\n' >"$SCRATCH/chat.jsonl"
expect_user_error 'chat.jsonl:1: a conversation \("messages"\) is rendered by the tokenizer.s chat template: there is no chat template beside tokenizer' \
  $TITAN "${SFT[@]}" --training.dataset_path "$SCRATCH/chat.jsonl"
printf '{"prompt": "1 + 1 ="}\n' >"$SCRATCH/half.jsonl"
expect_user_error 'half.jsonl:1: no "text" field \(nor "prompt" and "completion", strings, nor "messages"\)' \
  $TITAN "${SFT[@]}" --training.dataset_path "$SCRATCH/half.jsonl"
expect_user_error 'supervised examples \("prompt" and "completion", or "messages"\) are tokenized when training starts' \
  $TITAN tokenize --tokenizer "$SCRATCH/sums.tiktoken" --out "$SCRATCH/shards" "$SCRATCH/sums.jsonl"
