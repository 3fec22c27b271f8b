#!/usr/bin/env bash
# Bad data input: each case exits 2 with one line naming the file (and line). Invalid UTF-8 in a
# corpus is not an error: it is tokenized by byte fallback (each invalid byte its own token) and
# trained on (tests/unit/test_tokenizer.c checks that such text decodes back to its bytes).
source "$(dirname "$0")/lib.sh"

TOK=build/test-data/tokenizers/llama3/tokenizer.model
printf 'Some text.\n' >"$SCRATCH/doc.txt"
run=(${SMALL[@]} --training.steps 1 --job.dump_folder "$SCRATCH/run")

expect_user_error "$SCRATCH/absent.model" $TITAN "${run[@]}" --model.tokenizer_path "$SCRATCH/absent.model"
printf '{"model": {"type": "BPE",\n  "vocab": {"a": 0,}\n' >"$SCRATCH/tokenizer.json"
expect_user_error "tokenizer.json: invalid JSON at line 2, column [0-9]+" $TITAN "${run[@]}" --model.tokenizer_path "$SCRATCH/tokenizer.json"

: >"$SCRATCH/empty.txt"
expect_user_error "dataset .*empty.txt holds no documents" $TITAN "${run[@]}" \
  --model.tokenizer_path bytes --training.dataset_path "$SCRATCH/empty.txt"
printf '{"text": "one"}\n{"text": "two"}\n{"title": "three"}\n' >"$SCRATCH/docs.jsonl"
expect_user_error "docs.jsonl:3: no \"text\" field" $TITAN "${run[@]}" \
  --model.tokenizer_path bytes --training.dataset_path "$SCRATCH/docs.jsonl"
expect_user_error "training.dataset_path .*doc.txt is text: set model.tokenizer_path" \
  $TITAN "${run[@]}" --training.dataset_path "$SCRATCH/doc.txt"
# A path that is not there is named as missing (not taken for text that needs a tokenizer).
expect_user_error "^titan: error: training.dataset_path .*absent.bin: No such file or directory$" \
  $TITAN "${run[@]}" --training.dataset_path "$SCRATCH/absent.bin"
expect_user_error "tokenizer .*doc.txt:1: not a \"<base64> <rank>\" line" \
  $TITAN tokenize --tokenizer "$SCRATCH/doc.txt" --out "$SCRATCH/x" "$SCRATCH/doc.txt"
# A rank file that lost a line (rank 299) is refused at that line, not read as a vocabulary
# with a hole in it.
sed 300d "$TOK" >"$SCRATCH/gap.model"
expect_user_error "tokenizer .*gap.model:300: rank 300 where 299 was expected" \
  $TITAN "${run[@]}" --model.tokenizer_path "$SCRATCH/gap.model" --training.dataset_path "$SCRATCH/doc.txt"

# A llama2.c header whose shape is too large for the file's byte count to be an int64 is no
# header (computing that count overflowed before).
$PY -c 'import struct, sys; sys.stdout.buffer.write(struct.pack("7i", *[1 << 20] * 3, *[1 << 19] * 2, *[1 << 20] * 2))' \
  >"$SCRATCH/huge.bin"
expect_user_error "huge.bin is not a llama2.c checkpoint" \
  $TITAN generate --checkpoint "$SCRATCH/huge.bin" --prompt-ids 1

# Llama 3 ids do not fit the debug model's 2048-token vocabulary.
$TITAN tokenize --tokenizer "$TOK" --out "$SCRATCH/llama3" "$CORPUS" >/dev/null
expect_user_error "token id [0-9]+ is outside the model's vocabulary of 2048" \
  $TITAN "${run[@]}" --training.dataset_path "$SCRATCH/llama3"

# Invalid UTF-8: byte fallback. Tokenized, each invalid byte is its own single-byte token and
# the ids decode (by the rank file, read here independently) to the document's bytes exactly,
# between BOS and EOS; training reads the same tokens and gets a finite loss.
printf 'caf\xc3 na\xefve \xff\xfe text %.0s' $(seq 200) >"$SCRATCH/bad_utf8.txt"
$TITAN tokenize --tokenizer "$TOK" --out "$SCRATCH/bad" "$SCRATCH/bad_utf8.txt" >/dev/null
out=$($TITAN "${run[@]}" --model.tokenizer_path "$TOK" --model.flavor small --training.dataset_path "$SCRATCH/bad_utf8.txt" \
  --training.seq_len 32 --job.dump_folder "$SCRATCH/bad_run") || fail "training on invalid UTF-8 failed"
trained=$(printf '%s\n' "$out" | sed -n 's/^data: .*, \([0-9]*\) tokens$/\1/p')
$PY - "$SCRATCH/bad/shard_000000.bin" "$SCRATCH/bad_utf8.txt" "$TOK" "$trained" \
  "$SCRATCH/bad_run/metrics.jsonl" <<'PY'
import base64, json, math, sys
sys.path.insert(0, "tests/reference")
import llama_ref
shard, text_path, tok, trained, metrics = sys.argv[1:]
ids = [int(i) for i in llama_ref.read_tokens(shard)]
text = open(text_path, "rb").read()
vocab = [base64.b64decode(line.split()[0]) for line in open(tok)]
assert ids[0] == 128000 and ids[-1] == 128001, "document not wrapped in BOS/EOS"
assert b"".join(vocab[i] for i in ids[1:-1]) == text, "the ids do not decode to the text"
for byte in b"\xc3\xef\xff\xfe":
    assert ids.count(vocab.index(bytes([byte]))) == 200, f"byte {byte:#x} is not its own token"
assert int(trained) == len(ids), f"training read {trained} tokens, tokenize wrote {len(ids)}"
loss = json.loads(open(metrics).readline())["loss"]
assert math.isfinite(loss), f"loss {loss}"
print("ok: invalid UTF-8 tokenized to", len(ids), "ids by byte fallback; loss", loss)
PY
echo "ok: data errors"
