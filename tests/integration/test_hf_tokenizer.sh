#!/usr/bin/env bash
# The tokenizer of a Hugging Face export: a run trained with a titan-trained tiktoken tokenizer,
# exported (convert --to hf, and the trainer's checkpoint.last_save_in_hf), gives a
# tokenizer.json byte for byte what scripts/peer/hf_tokenizer.py writes for the same rank file,
# with tokenizer_config.json (hf_tokenizer.py's and model_input_names), generation_config.json
# and config.json's BOS/EOS ids; the `tokenizers` package (PyPI) encodes texts with it to
# titan's own ids (`titan tokenize`); a tokenizer.json is copied as it is; a byte-level run
# or one whose stored tokenizer is gone exports none and says so; a named --tokenizer that is
# missing is refused in one line.
source "$(dirname "$0")/lib.sh"

TOK=$SCRATCH/austen.tiktoken
$TITAN tokenizer train --vocab-size 2048 --out "$TOK" "$CORPUS" >/dev/null
$TITAN tokenize --tokenizer "$TOK" --out "$SCRATCH/tok.bin" "$CORPUS" >/dev/null
run=(${SMALL[@]} --training.dataset_path "$SCRATCH/tok.bin" --model.tokenizer_path "$TOK"
     --training.steps 2 --checkpoint.enable --checkpoint.interval 2)
$TITAN "${run[@]}" --job.dump_folder "$SCRATCH/run" >/dev/null
$TITAN "${run[@]}" --checkpoint.last_save_in_hf --job.dump_folder "$SCRATCH/last" \
  >"$SCRATCH/last.log"
grep -q "checkpoint: saved .*step-2-hf (Hugging Face, float32) with tokenizer.json (tiktoken" \
  "$SCRATCH/last.log" || fail "last_save_in_hf: no tokenizer in its log line"

OUT=$SCRATCH/hf
$TITAN convert --to hf "$SCRATCH/run/checkpoint/step-2.h5" "$OUT" >"$SCRATCH/convert.log"
grep -q "config.json and tokenizer.json (tiktoken $TOK), generation_config.json$" \
  "$SCRATCH/convert.log" || fail "convert's line: $(cat "$SCRATCH/convert.log")"
$PY scripts/peer/hf_tokenizer.py "$TOK" "$SCRATCH/peer"
# Meta's Llama 3 tokenizer.model and cl100k (special ids with holes between them), for below.
VEC=build/test-data/tokenizers
ckpt=$SCRATCH/run/checkpoint/step-2.h5
$TITAN convert --to hf --tokenizer $VEC/llama3/tokenizer.model "$ckpt" "$SCRATCH/llama3" >/dev/null
$TITAN convert --to hf --tokenizer $VEC/cl100k_base.tiktoken "$ckpt" "$SCRATCH/cl100k" >/dev/null
for dir in "$OUT" "$SCRATCH/last/checkpoint/step-2-hf"; do
  cmp "$SCRATCH/peer/tokenizer.json" "$dir/tokenizer.json" ||
    fail "$dir/tokenizer.json differs from hf_tokenizer.py's"
  # hf_tokenizer.py's keys, and model_input_names for generate(**tokenizer(text))
  $PY -c "import json, sys; a, b = (json.load(open(p)) for p in sys.argv[1:]); \
    assert b.pop('model_input_names') == ['input_ids', 'attention_mask'] and a == b, (a, b)" \
    "$SCRATCH/peer/tokenizer_config.json" "$dir/tokenizer_config.json" ||
    fail "$dir/tokenizer_config.json is not hf_tokenizer.py's"
done
$PY - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
tok, cfg, gen, config = (json.load(open(f"{d}/{n}.json")) for n in
                         ("tokenizer", "tokenizer_config", "generation_config", "config"))
ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
bos, eos = ids[cfg["bos_token"]], ids[cfg["eos_token"]]
assert (bos, eos) == (2046, 2047) and len(tok["model"]["vocab"]) == 2046, (bos, eos)
assert (gen["bos_token_id"], gen["eos_token_id"]) == (bos, eos), gen
assert (config["bos_token_id"], config["eos_token_id"]) == (bos, eos), config
print(f"ok: BOS {bos} and EOS {eos} in tokenizer_config, generation_config and config.json")
PY

# The ids: Hugging Face's `tokenizers` in a venv next to the build (as test_hf.sh installs
# safetensors) against titan's shards of each text, one document each (BOS ... EOS).
texts=("It is a truth universally acknowledged, that a single man in possession of a good
fortune, must be in want of a wife."
       $'Mr. Bennet\'s   reply:\n\n\t"I\'LL see 1234567 of them!"  \r\n  ok  '
       "naïve café — “quotes”, 日本語 and 🙂 emoji; x²+y² = 3.14159")
for i in "${!texts[@]}"; do
  printf '%s' "${texts[$i]}" >"$SCRATCH/text$i.txt"
done
head -c 20000 "$CORPUS" >"$SCRATCH/text3.txt"
for i in 0 1 2 3; do
  $TITAN tokenize --tokenizer "$TOK" --out "$SCRATCH/text$i" "$SCRATCH/text$i.txt" >/dev/null
done
VENV=build/venv-tokenizers
if ! $VENV/bin/python -c "import tokenizers" 2>/dev/null; then
  $PY -m venv --system-site-packages "$VENV" &&
    $VENV/bin/pip install -q tokenizers >"$SCRATCH/pip.log" 2>&1 ||
    { echo "SKIP ids check: cannot install tokenizers from PyPI: $(tail -n 1 "$SCRATCH/pip.log")"
      exit 0; }
fi
$VENV/bin/python - "$OUT/tokenizer.json" "$SCRATCH" 4 <<'PY'
import sys
import numpy as np
from tokenizers import Tokenizer
tok, scratch, n = Tokenizer.from_file(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for i in range(n):
    text = open(f"{scratch}/text{i}.txt", encoding="utf-8", newline="").read()
    raw = open(f"{scratch}/text{i}/shard_000000.bin", "rb").read()
    magic, version, count = np.frombuffer(raw[:12], dtype="<i4")
    assert magic == 20240520 and version in (1, 2), (magic, version)
    titan = np.frombuffer(raw[1024:], dtype="<u2" if version == 1 else "<u4").tolist()
    assert len(titan) == count, (len(titan), count)
    assert titan[0] == 2046 and titan[-1] == 2047, titan[:3]
    hf = tok.encode(text).ids
    assert hf == titan[1:-1], f"text {i}: tokenizers {hf[:20]}... != titan {titan[1:21]}..."
    assert tok.decode(hf) == text, f"text {i} does not decode back"
print(f"ok: tokenizers encodes {n} texts to titan's ids and decodes them back")
PY
$VENV/bin/python - "$SCRATCH" $VEC/vectors <<'PY'
import json, sys
from tokenizers import Tokenizer
scratch, vectors = sys.argv[1:]
for name, vec, eos in (("llama3", "llama3", 128001), ("cl100k", "cl100k_base", 100257)):
    tok = Tokenizer.from_file(f"{scratch}/{name}/tokenizer.json")
    assert tok.token_to_id(tok.id_to_token(eos)) == eos and tok.id_to_token(eos).startswith("<|e")
    cases = [json.loads(l) for l in open(f"{vectors}/{vec}.jsonl")]
    # tiktoken reads special tokens in text as text; Hugging Face as the special token
    cases = [c for c in cases if "<|" not in c["text"]]
    bad = [c["text"] for c in cases if tok.encode(c["text"]).ids != c["ids"]]
    assert not bad, f"{name}: {len(bad)} of {len(cases)} differ, first {bad[0]!r}"
    print(f"ok: {name}'s export encodes {len(cases)} test vectors to tiktoken's ids, EOS {eos}")
PY

# Llama 3's tokenizer.model converts to Meta's own tokenizer.json (vocabulary, merges, pattern,
# special tokens); cl100k keeps its special ids across its holes, and both encode the test
# vectors (tests/data) to tiktoken's ids.
$PY - "$SCRATCH/llama3/tokenizer.json" $VEC/llama3/tokenizer.json <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
def merges(t):  # tokenizers >= 0.20 writes pairs, older ones "a b" strings
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in t["model"]["merges"]]
assert a["model"]["vocab"] == b["model"]["vocab"], "vocabulary"
assert merges(a) == merges(b), "merges"
assert [(t["id"], t["content"]) for t in a["added_tokens"]] == \
    [(t["id"], t["content"]) for t in b["added_tokens"]], "special tokens"
split = lambda t: t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
assert split(a) == split(b), "pattern"
print(f"ok: Llama 3's tokenizer.model exports as Meta's tokenizer.json ({len(merges(a))} merges)")
PY

# A tokenizer.json is copied (with the tokenizer_config.json beside it); a byte-level run
# has none; a missing --tokenizer is refused.
$TITAN convert --to hf --tokenizer "$OUT/tokenizer.json" \
  "$SCRATCH/run/checkpoint/step-2.h5" "$SCRATCH/copied" >/dev/null
cmp "$OUT/tokenizer.json" "$SCRATCH/copied/tokenizer.json" || fail "tokenizer.json not copied"
cmp "$OUT/tokenizer_config.json" "$SCRATCH/copied/tokenizer_config.json" ||
  fail "tokenizer_config.json not copied"
grep -q '"eos_token_id": 2047' "$SCRATCH/copied/generation_config.json" ||
  fail "the copied tokenizer's EOS is not in generation_config.json"
$TITAN ${SMALL[@]} --training.steps 1 --checkpoint.enable --checkpoint.interval 1 \
  --job.dump_folder "$SCRATCH/bytes" >/dev/null
$TITAN convert --to hf "$SCRATCH/bytes/checkpoint/step-1.h5" "$SCRATCH/bytes-hf" \
  >"$SCRATCH/bytes.log"
grep -q "config.json and no tokenizer (the run's data is pre-tokenized shards)$" \
  "$SCRATCH/bytes.log" ||
  fail "byte-level export's line: $(cat "$SCRATCH/bytes.log")"
[ -e "$SCRATCH/bytes-hf/tokenizer.json" ] && fail "a byte-level run exported a tokenizer.json"
expect_user_error "^titan: error: --tokenizer $SCRATCH/nothing.tiktoken: No such file" \
  $TITAN convert --to hf --tokenizer "$SCRATCH/nothing.tiktoken" \
  "$SCRATCH/run/checkpoint/step-2.h5" "$SCRATCH/x"
# The stored model.tokenizer_path gone (the checkpoint moved): the export goes on without it.
mv "$TOK" "$SCRATCH/moved.tiktoken"
$TITAN convert --to hf "$SCRATCH/run/checkpoint/step-2.h5" "$SCRATCH/gone" >"$SCRATCH/gone.log"
grep -q "config.json and no tokenizer (tokenizer $TOK: No such file or directory)$" \
  "$SCRATCH/gone.log" || fail "export without the stored tokenizer: $(cat "$SCRATCH/gone.log")"
[ -e "$SCRATCH/gone/tokenizer.json" ] && fail "a tokenizer.json from a tokenizer that is gone"
echo "ok: tokenizer.json copied, none for a byte-level run or a stored tokenizer that is gone, a"\
  "missing --tokenizer refused"
