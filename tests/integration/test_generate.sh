#!/usr/bin/env bash
# titan generate on llama2.c's stories260K and on a titan checkpoint: greedy ids equal the
# PyTorch reference's, which re-runs the whole sequence at every step (no KV cache); sampling
# with a seed is reproducible and differs from greedy; bad input exits 2 with one line.
source "$(dirname "$0")/lib.sh"

MODEL=../shared/data/models/stories260K.bin
GEN=($TITAN generate --checkpoint "$MODEL" --prompt-ids 1 --max-new-tokens 200)

"${GEN[@]}" --temperature 0 --ids >"$SCRATCH/greedy.txt" 2>"$SCRATCH/greedy.err"
grep -Eq "^generate: 1 prompt \+ 200 new tokens, .* tokens/s\)$" "$SCRATCH/greedy.err" ||
  fail "no timing line on stderr: $(cat "$SCRATCH/greedy.err")"
(cd tests/reference && $PY generate_ref.py "../../$MODEL" "$SCRATCH/greedy.txt") ||
  fail "greedy generation differs from the PyTorch reference"

"${GEN[@]}" --temperature 0.8 --top-p 0.9 --seed 7 --ids >"$SCRATCH/sampled1.txt" 2>/dev/null
"${GEN[@]}" --temperature 0.8 --top-p 0.9 --seed 7 --ids >"$SCRATCH/sampled2.txt" 2>/dev/null
"${GEN[@]}" --temperature 0.8 --top-p 0.9 --seed 8 --ids >"$SCRATCH/sampled3.txt" 2>/dev/null
cmp -s "$SCRATCH/sampled1.txt" "$SCRATCH/sampled2.txt" || fail "two runs with --seed 7 differ"
cmp -s "$SCRATCH/sampled1.txt" "$SCRATCH/greedy.txt" && fail "sampled output equals greedy"
cmp -s "$SCRATCH/sampled1.txt" "$SCRATCH/sampled3.txt" && fail "--seed 7 and --seed 8 agree"
[ "$(wc -w <"$SCRATCH/sampled1.txt")" -eq 200 ] || fail "sampling did not give 200 ids"
echo "ok: greedy matches the reference; sampling is reproducible per seed"

# A titan checkpoint (model from its attributes) decodes as the reference does too; a few
# tokens only, as a barely trained model's top logits can be close enough to swap on rounding.
$TITAN "${SMALL[@]}" --training.steps 2 --checkpoint.enable --checkpoint.interval 2 \
  --job.dump_folder "$SCRATCH/run" >/dev/null
CKPT=$SCRATCH/run/checkpoint/step-2.h5
$TITAN generate --checkpoint "$CKPT" --prompt-ids 1 --max-new-tokens 20 --temperature 0 --ids \
  >"$SCRATCH/titan_ckpt.txt" 2>/dev/null
(cd tests/reference && $PY generate_ref.py "$CKPT" "$SCRATCH/titan_ckpt.txt" 20) ||
  fail "greedy generation from a titan checkpoint differs from the PyTorch reference"

# With a tokenizer the text prompt is encoded and the continuation streamed as text: the bytes
# of the ids --ids prints (the bytes tokenizer's ids are the bytes themselves).
TEXT=($TITAN generate --checkpoint "$CKPT" --tokenizer bytes --max-new-tokens 30 --temperature 0)
"${TEXT[@]}" --prompt "It is a truth" --ids >"$SCRATCH/text_ids.txt" 2>/dev/null
"${TEXT[@]}" --prompt "It is a truth" >"$SCRATCH/text.txt" 2>/dev/null
$PY -c 'import sys; ids = open(sys.argv[1]).read().split()
sys.exit(open(sys.argv[2], "rb").read() != bytes(map(int, ids)) + b"\n")' \
  "$SCRATCH/text_ids.txt" "$SCRATCH/text.txt" || fail "streamed text is not the ids' bytes"
"${TEXT[@]}" --prompt-ids "$(printf 'It is a truth' | od -An -tu1 | xargs | tr ' ' ,)" --ids \
  2>/dev/null | cmp -s - "$SCRATCH/text_ids.txt" || fail "--prompt and its --prompt-ids differ"
echo "ok: text mode streams the ids' bytes"

# The context bounds prompt + continuation: 2 prompt ids in a context of 5 leave 3 tokens.
[ "$($TITAN generate --checkpoint "$MODEL" --prompt-ids 1,300 --max-context 5 --temperature 0 \
      2>/dev/null | wc -w)" -eq 3 ] || fail "--max-context 5 did not stop after 3 new tokens"

expect_user_error "cannot open checkpoint .*absent.bin" \
  $TITAN generate --checkpoint "$SCRATCH/absent.bin" --prompt-ids 1
head -c 100000 "$MODEL" >"$SCRATCH/truncated.bin"
expect_user_error "checkpoint .*truncated.bin has 100000 bytes; its header implies 1056540" \
  $TITAN generate --checkpoint "$SCRATCH/truncated.bin" --prompt-ids 1
head -c 20 "$MODEL" >"$SCRATCH/short.bin"
expect_user_error "short.bin is not a llama2.c checkpoint" \
  $TITAN generate --checkpoint "$SCRATCH/short.bin" --prompt-ids 1
head -c 4096 /dev/zero >"$SCRATCH/zeros.bin"
expect_user_error "zeros.bin is not a llama2.c checkpoint" \
  $TITAN generate --checkpoint "$SCRATCH/zeros.bin" --prompt-ids 1
expect_user_error "--prompt needs --tokenizer" \
  $TITAN generate --checkpoint "$MODEL" --prompt "Once upon a time"
expect_user_error "prompt token 512 is outside the vocabulary" \
  $TITAN generate --checkpoint "$MODEL" --prompt-ids 1,512
expect_user_error "--prompt-ids expects comma-separated token ids" \
  $TITAN generate --checkpoint "$MODEL" --prompt-ids 1,,2
expect_user_error "--top-p expects a number in" \
  $TITAN generate --checkpoint "$MODEL" --prompt-ids 1 --top-p 1.5
expect_user_error "--seed needs a value" $TITAN generate --checkpoint "$MODEL" --prompt-ids 1 --seed
expect_user_error "unknown option '--temp'" \
  $TITAN generate --checkpoint "$MODEL" --prompt-ids 1 --temp 1
