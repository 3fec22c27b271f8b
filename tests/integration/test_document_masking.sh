#!/usr/bin/env bash
# Document masking (training.document_masking, torchtitan's block_causal mask): on windows
# packing several documents (a JSONL of the corpus's paragraphs, each ended by the tokenizer's
# end-of-text token) attention stays within each document. The masked run trains differently
# from the causal one (the mask acts), and under context parallel (cp 2, both rotate methods,
# and cp 4) it trains and validates as the masked 1-rank run: loss and grad norm within 1e-5
# relative at every step, validation loss at steps 5 and 10 too. Validation batches carry their
# document ids: at lr 0 the masked validation of the first training batch gives step 1's loss.
# Without an end-of-text token to end documents the key is refused in one line.
# (That a document's logits equal those of a run on it alone is tests/unit/test_model.c's.)
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
P=--parallelism
head -c 200000 "$CORPUS" >"$SCRATCH/austen.txt"
$TITAN tokenizer train --vocab-size 512 --out "$SCRATCH/tok.tiktoken" "$SCRATCH/austen.txt" >/dev/null
$PY - "$SCRATCH/austen.txt" "$SCRATCH/docs.jsonl" <<'PY'
import json, sys
paragraphs = [p.strip() for p in open(sys.argv[1]).read().split("\n\n") if p.strip()]
with open(sys.argv[2], "w") as f:
    for p in paragraphs:
        f.write(json.dumps({"text": p}) + "\n")
PY
$TITAN tokenize --tokenizer "$SCRATCH/tok.tiktoken" --out "$SCRATCH/docs.bin" "$SCRATCH/docs.jsonl" >/dev/null
run=(--config configs/debug_model.yaml --training.dataset_path "$SCRATCH/docs.bin"
     --model.tokenizer_path "$SCRATCH/tok.tiktoken" --training.seq_len 128
     --training.local_batch_size 2 --training.steps 10 --lr_scheduler.warmup_steps 2
     --metrics.log_freq 1 "${FP32[@]}" --validation.enable --validation.dataset_path "$SCRATCH/docs.bin"
     --validation.freq 5 --validation.steps 2 --validation.seq_len 128 --validation.local_batch_size 2)

compare() {  # name, reference, mode (same | differs)
  $PY - "$1" "$SCRATCH/$2/metrics.jsonl" "$SCRATCH/$1/metrics.jsonl" "$3" <<'PY'
import json, sys
name, ref, run, mode = sys.argv[1:5]
a, b = [[json.loads(l) for l in open(p) if '"loss"' in l] for p in (ref, run)]
assert [r["step"] for r in b] == list(range(1, 11)), f"{name}: steps"
worst = max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(a, b) for k in ("loss", "grad_norm"))
va, vb = [[json.loads(l) for l in open(p) if '"validation_loss"' in l] for p in (ref, run)]
assert [r["step"] for r in vb] == [5, 10], f"{name}: validation steps {[r['step'] for r in vb]}"
val = max(abs(x["validation_loss"] - y["validation_loss"]) / x["validation_loss"]
          for x, y in zip(va, vb))
if mode == "same":
    assert val <= 1e-5, f"{name}: validation differs from the masked 1-rank run's by {val:.1e}"
if mode == "same":
    assert worst <= 1e-5, f"{name}: differs from the masked 1-rank run by {worst:.1e}"
    print(f"ok: {name:34s} the masked 1-rank run to {worst:.1e} at 10 steps, validation {val:.1e}")
else:
    assert worst > 1e-4, f"{name}: the mask changed nothing ({worst:.1e})"
    print(f"ok: {name:34s} differs from causal attention by up to {worst:.1e}")
PY
}

train_ranks causal 1 "${run[@]}"
train_ranks masked 1 "${run[@]}" --training.document_masking
compare masked causal differs
# Validation's batches are masked by document as training's: with the weights left as they are
# (lr 0), validating on the training data's first batch gives the loss of training step 1.
train_ranks val-lr0 1 "${run[@]}" --training.document_masking --optimizer.lr 0 --training.steps 1 \
  --validation.freq 1 --validation.steps 1
$PY - "$SCRATCH/val-lr0/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r["loss"] for r in rows if "loss" in r][0]
val = [r["validation_loss"] for r in rows if "validation_loss" in r][0]
assert abs(val - train) <= 1e-6 * train, f"masked validation {val} is not step 1's loss {train}"
print(f"ok: masked validation at lr 0 is step 1's loss ({val:.6f})")
PY
train_ranks cp2-allgather 2 "${run[@]}" --training.document_masking $P.context_parallel_degree 2
compare cp2-allgather masked same
train_ranks cp2-alltoall 2 "${run[@]}" --training.document_masking $P.context_parallel_degree 2 \
  $P.context_parallel_rotate_method alltoall
compare cp2-alltoall masked same
train_ranks cp4-alltoall 4 "${run[@]}" --training.document_masking $P.context_parallel_degree 4 \
  $P.context_parallel_rotate_method alltoall
compare cp4-alltoall masked same

expect_user_error "^titan: error: training.document_masking: documents end at the tokenizer's end-of-text token, and model.tokenizer_path is not set$" \
  $TITAN "${SMALL[@]}" --training.document_masking
