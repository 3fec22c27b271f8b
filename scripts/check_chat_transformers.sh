#!/usr/bin/env bash
# titan's conversations against transformers itself: for tests/reference/chat_fixtures.py's
# Llama 3 Instruct and Qwen3 folders, tokenizer.apply_chat_template's text and ids equal what
# titan renders and trains on (build/tests/render_chat); for a template with {% generation %}
# blocks, its return_assistant_tokens_mask equals titan's trained tokens. Not part of
# `make test`: it installs transformers from PyPI into $VENV (default build/venv-chat); CI's
# test_chat checks the same against Jinja2 alone.
#
#   bash scripts/check_chat_transformers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/tests/render_chat test-data
VENV=${VENV:-build/venv-chat}
if ! "$VENV/bin/python" -c "import transformers, jinja2" 2>/dev/null; then
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q transformers jinja2
fi
SCRATCH=$(mktemp -d /tmp/titan-chat.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
FIXTURES=(build/test-data/tokenizers/llama3 build/test-data/chat_templates "$SCRATCH")
/usr/bin/python3 tests/reference/chat_fixtures.py "${FIXTURES[@]}"
/usr/bin/python3 tests/reference/chat_fixtures.py "${FIXTURES[@]}" generation \
  "{{ bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}<|start_header_id|>assistant<|end_header_id|>

{% generation %}{{ m.content | trim }}<|eot_id|>{% endgeneration %}{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"
for case in llama3-instruct:chats qwen3:qwen3 generation:chats; do
  name=${case%%:*} data=$SCRATCH/${case#*:}.jsonl
  build/tests/render_chat "$SCRATCH/$name" "$data" >"$SCRATCH/$name.out"
  "$VENV/bin/python" - "$SCRATCH/$name" "$data" "$SCRATCH/$name.out" <<'PY'
import json, re, sys
from transformers import AutoTokenizer
folder, conversations, rendered = sys.argv[1:]
tok = AutoTokenizer.from_pretrained(folder)
titan = [json.loads(l) for l in open(rendered)]
generation = re.search(r"{%-?\s*generation", tok.chat_template) is not None
ids, mask = [], []
for line, got in zip(open(conversations), titan):
    c = json.loads(line)
    kw = {"tools": c.get("tools"), **c.get("chat_template_kwargs", {})}
    text = tok.apply_chat_template(c["messages"], tokenize=False, **kw)
    assert text == got["text"], (text, got["text"])
    enc = tok.apply_chat_template(c["messages"], tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=generation, **kw)
    ids += list(enc["input_ids"])
    mask += list(enc["assistant_masks"]) if generation else []
assert ids == titan[-1]["ids"], "ids differ"
if generation:
    assert mask == [f & 1 for f in titan[-1]["flags"]], "assistant masks differ"
print(f"ok: {folder.rsplit('/', 1)[-1]}: apply_chat_template's text and {len(ids)} ids equal "
      f"titan's" + (f", its assistant mask ({sum(mask)} tokens) titan's trained tokens"
                    if generation else ""))
PY
done
