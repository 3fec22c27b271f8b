#!/usr/bin/env bash
# titan generate on llama2.c's stories260K and on a titan checkpoint: greedy ids equal the
# PyTorch reference's, which re-runs the whole sequence at every step (no KV cache); sampling
# with a seed is reproducible and differs from greedy; the nucleus (--top-p) draws each id as
# often as its renormalised probability on a model with a known distribution; bad input (a
# --device that is unknown or not built among it) exits 2 with one line.
source "$(dirname "$0")/lib.sh"

MODEL=build/test-data/models/stories260K.bin
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

# The nucleus sampler on a model whose next-token distribution is known and never changes: no
# layer weights (the blocks add nothing), every id embedded as the same unit vector e0, and an
# untied output whose column 0 gives id v the logit log p[v] (all other ids -30), so each step
# draws from p = (0.5, 0.3, 0.15, 0.05) at temperature 1. Over 1000 draws, top-p 0.7 keeps
# {0, 1} (0.8 > 0.7) renormalised to (0.625, 0.375); 0.9 keeps {0, 1, 2}; 1 keeps all four.
$PY - "$SCRATCH/nucleus.bin" <<'PYEOF'
import sys
import numpy as np
dim, hidden, layers, vocab, seq_len = 8, 8, 1, 8, 1024
p = [0.5, 0.3, 0.15, 0.05]
floats = []
def add(shape, fill=0.0):
    floats.append(np.full(shape, fill, dtype="<f4"))
emb = np.zeros((vocab, dim), dtype="<f4"); emb[:, 0] = 1
floats.append(emb)
for shape in [(dim,), (dim, dim), (dim, dim), (dim, dim), (dim, dim), (dim,), (hidden, dim),
              (dim, hidden), (hidden, dim)]:
    add((layers,) + shape, 1.0 if len(shape) == 1 else 0.0)  # norms 1, matrices 0
add((dim,), 1.0)                      # final norm
add((seq_len * dim,))                 # legacy RoPE tables (unused)
# rmsnorm(e0) = e0 * sqrt(dim) (up to eps), so column 0 / sqrt(dim) is the logit.
out = np.zeros((vocab, dim), dtype="<f4")
out[:, 0] = [np.log(x) for x in p] + [-30.0] * (vocab - len(p))
out[:, 0] /= np.sqrt(dim)
floats.append(out)
with open(sys.argv[1], "wb") as f:
    np.array([dim, hidden, layers, 1, 1, -vocab, seq_len], dtype="<i4").tofile(f)
    for x in floats:
        x.tofile(f)
PYEOF
nucleus() {  # top_p: the counts of ids 0..7 in 1000 draws
  $TITAN generate --checkpoint "$SCRATCH/nucleus.bin" --prompt-ids 0 --max-new-tokens 1000 \
    --temperature 1 --top-p "$1" --seed 3 --ids 2>/dev/null |
    $PY -c 'import sys; ids = [int(x) for x in sys.stdin.read().split()]
assert len(ids) == 1000, len(ids); print(" ".join(str(ids.count(v)) for v in range(8)))'
}
# check_counts TOP_P FRACTIONS...: each id within 0.05 (3 standard deviations) of its fraction,
# and no id drawn outside the nucleus.
check_counts() {
  local top_p=$1; shift
  local counts; counts=$(nucleus "$top_p")
  $PY -c 'import sys; got = [int(x) / 1000 for x in sys.argv[1].split()]
want = [float(x) for x in sys.argv[2:]] + [0.0] * (8 - len(sys.argv[2:]))
sys.exit(any(abs(g - w) > 0.05 or (w == 0) != (g == 0) for g, w in zip(got, want)))' \
    "$counts" "$@" || fail "--top-p $top_p: id counts $counts, want fractions $*"
  echo "ok: --top-p $top_p draws ids 0..7 $counts times (want fractions $*)"
}
check_counts 0.7 0.625 0.375
check_counts 0.9 0.5263 0.3158 0.1579
check_counts 1 0.5 0.3 0.15 0.05

# A titan checkpoint (model from its attributes) decodes as the reference does too; a few
# tokens only, as a barely trained model's top logits can be close enough to swap on rounding.
$TITAN "${SMALL[@]}" --training.steps 2 --checkpoint.enable --checkpoint.interval 2 \
  --job.dump_folder "$SCRATCH/run" >/dev/null
CKPT=$SCRATCH/run/checkpoint/step-2.h5
$TITAN generate --checkpoint "$CKPT" --prompt-ids 1 --max-new-tokens 20 --temperature 0 --ids \
  >"$SCRATCH/titan_ckpt.txt" 2>/dev/null
(cd tests/reference && $PY generate_ref.py "$CKPT" "$SCRATCH/titan_ckpt.txt" 20) ||
  fail "greedy generation from a titan checkpoint differs from the PyTorch reference"

# The same for Qwen3 (the KV-cache decode through QK-norm, heads wider than dim / n_heads).
$TITAN "${SMALL[@]}" --model.name qwen3 --model.flavor small --training.steps 2 --checkpoint.enable \
  --checkpoint.interval 2 --job.dump_folder "$SCRATCH/qwen3" >/dev/null
$TITAN generate --checkpoint "$SCRATCH/qwen3/checkpoint/step-2.h5" --prompt-ids 1 \
  --max-new-tokens 20 --temperature 0 --ids >"$SCRATCH/qwen3_ckpt.txt" 2>/dev/null
(cd tests/reference && $PY generate_ref.py "$SCRATCH/qwen3/checkpoint/step-2.h5" \
  "$SCRATCH/qwen3_ckpt.txt" 20) ||
  fail "greedy generation from a qwen3 checkpoint differs from the PyTorch reference"

# Qwen3's MoE: generate takes the MoE shape from the checkpoint's attributes and decodes through
# the layer's router (expert bias included) and experts; the reference's greedy ids agree.
$TITAN "${SMALL[@]}" --model.name qwen3 --model.flavor small_moe --training.steps 2 \
  --checkpoint.enable --checkpoint.interval 2 --job.dump_folder "$SCRATCH/moe" >/dev/null
$TITAN generate --checkpoint "$SCRATCH/moe/checkpoint/step-2.h5" --prompt-ids 1 \
  --max-new-tokens 20 --temperature 0 --ids >"$SCRATCH/moe_ckpt.txt" 2>"$SCRATCH/moe_ckpt.err" ||
  fail "generate from a qwen3 MoE checkpoint failed: $(cat "$SCRATCH/moe_ckpt.err")"
(cd tests/reference && $PY generate_ref.py "$SCRATCH/moe/checkpoint/step-2.h5" \
  "$SCRATCH/moe_ckpt.txt" 20) ||
  fail "greedy generation from a qwen3 MoE checkpoint differs from the PyTorch reference"
echo "ok: a qwen3 MoE checkpoint generates the reference's greedy ids"

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
# --device: an unknown backend, and cuda in a build without it (CI's CUDA=1 build has no GPU:
# then "no CUDA device"), one line each; cpu, the default, named gives the same ids.
expect_user_error "^titan: error: --device expects cpu or cuda, got 'tpu'$" \
  $TITAN generate --checkpoint "$MODEL" --prompt-ids 1 --device tpu
expect_user_error "^titan: error: --device cuda: (this titan was built without it|no CUDA device)" \
  $TITAN generate --checkpoint "$MODEL" --prompt-ids 1 --device cuda
[ "$($TITAN generate --checkpoint "$MODEL" --prompt-ids 1,300 --max-new-tokens 8 --temperature 0 \
      --device cpu 2>/dev/null)" = "$($TITAN generate --checkpoint "$MODEL" --prompt-ids 1,300 \
      --max-new-tokens 8 --temperature 0 2>/dev/null)" ] || fail "--device cpu changed the ids"
