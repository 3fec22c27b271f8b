#!/usr/bin/env bash
# Conversations (data/chat.h): JSONL "messages" rendered by the tokenizer's chat template
# (data/jinja.h), the loss on the assistant's turns only.
# - Meta's Llama 3 Instruct template, Qwen3's (tests/data/chat_templates, from their
#   tokenizer_config.json) and one holding every other construct of titan's Jinja subset
#   ({% generation %} blocks included) render as Jinja2 renders them in transformers'
#   environment, the trained spans follow data/chat.h's rule and the token stream spells the
#   conversations with each added token whole, trained exactly where it overlaps a span, each
#   conversation one document (tests/reference/check_chat.py on the folders and conversations
#   of tests/reference/chat_fixtures.py). scripts/check_chat_transformers.sh checks the same
#   against transformers itself (ids, assistant masks), outside CI.
# - Training reads them: the startup line counts conversations, not turns, under document
#   masking (an instruct EOS ends turns, not documents); `generate --chat` prompts the trained
#   checkpoint with a message in the template.
# - Bad input, one line, exit 2: a template outside the subset, an error the template raises,
#   a conversation without an assistant turn or a role, chat_template_kwargs not an object, a
#   config's chat_template neither a string nor a named list, generate --chat without a text
#   prompt, a multi-turn conversation whose turns the rule cannot find (Meta's base Llama 3
#   template, which always appends a generation prompt).
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
RENDER=build/tests/render_chat
LLAMA3=build/test-data/tokenizers/llama3
TEMPLATES=build/test-data/chat_templates

$PY tests/reference/chat_fixtures.py "$LLAMA3" "$TEMPLATES" "$SCRATCH"
for case in llama3-instruct:chats qwen3:qwen3 features:features; do
  dir=$SCRATCH/${case%%:*}
  $RENDER "$dir" "$SCRATCH/${case#*:}.jsonl" >"$SCRATCH/${case%%:*}.out" ||
    fail "render_chat ${case%%:*} failed"
  $PY tests/reference/check_chat.py "$dir" "$SCRATCH/${case#*:}.jsonl" "$SCRATCH/${case%%:*}.out" |
    sed "s/^ok:/ok: ${case%%:*}:/" || fail "${case%%:*}: titan differs from Jinja2"
done

# Training on the conversations: the debug model, Llama 3 Instruct's template.
CHAT=(--config configs/debug_model.yaml --training.dataset_path "$SCRATCH/chats.jsonl"
      --model.tokenizer_path "$SCRATCH/llama3-instruct" --training.document_masking
      --training.seq_len 64 --training.local_batch_size 2 --training.steps 2
      --metrics.log_freq 1 "${FP32[@]}")
$TITAN "${CHAT[@]}" --job.dump_folder "$SCRATCH/train" --checkpoint.enable \
  --checkpoint.interval 2 >"$SCRATCH/train.log" ||
  fail "training on conversations failed: $(tail -3 "$SCRATCH/train.log")"
grep -q "data: 3 documents, [0-9.]*% of the tokens trained (completions, assistant turns); 0 longer than a window of 65 tokens" \
  "$SCRATCH/train.log" || fail "no conversations line: $(grep data: "$SCRATCH/train.log")"
[ "$(losses "$SCRATCH/train/metrics.jsonl" | wc -l)" -eq 2 ] || fail "no 2 steps trained"
echo "ok: trained on 3 conversations (their 5 assistant turns) under document masking"

# generate --chat: the user's message in the template up to its generation prompt, the 12 ids
# <|begin_of_text|><|start_header_id|> user <|end_header_id|> \n\n Hi there <|eot_id|>
# <|start_header_id|> assistant <|end_header_id|> \n\n (render_chat's first conversation's
# first 12), then the reply.
$TITAN generate --checkpoint "$SCRATCH/train/checkpoint/step-2.h5" --tokenizer \
  "$SCRATCH/llama3-instruct" --chat --prompt "Hi there" --temperature 0 --max-new-tokens 3 \
  --ids >"$SCRATCH/reply.txt" 2>"$SCRATCH/reply.err" || fail "generate --chat: $(cat "$SCRATCH/reply.err")"
grep -q "^generate: 12 prompt + [1-3] new tokens" "$SCRATCH/reply.err" ||
  fail "generate --chat's prompt: $(cat "$SCRATCH/reply.err")"
echo "ok: generate --chat renders the message with the template's generation prompt (12 ids)"
expect_user_error "--chat: the tokenizer has no chat template" \
  $TITAN generate --checkpoint "$SCRATCH/train/checkpoint/step-2.h5" --tokenizer bytes --chat \
  --prompt hi

bad() {  # bad NAME TEMPLATE JSONL_LINE PATTERN: Llama 3 Instruct's template where TEMPLATE is ''
  $PY tests/reference/chat_fixtures.py "$LLAMA3" "$TEMPLATES" "$SCRATCH" "$1" \
    "${2:-$(cat "$TEMPLATES/llama3_instruct.jinja")}"
  printf '%s\n' "$3" >"$SCRATCH/$1.jsonl"
  expect_user_error "$4" $TITAN "${CHAT[@]}" --model.tokenizer_path "$SCRATCH/$1" \
    --training.dataset_path "$SCRATCH/$1.jsonl"
}
HI='{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
bad macro '{% macro m() %}{% endmacro %}' "$HI" \
  "chat_template.jinja:1:4: '\{% macro %\}' is not in titan's chat-template subset"
bad filter '{{ messages | map(attribute="role") }}' "$HI" \
  "chat_template.jinja:1:13: filter 'map' is not in titan's chat-template subset"
bad raise "{% if messages[0].role == 'user' %}{{ raise_exception('System first') }}{% endif %}" "$HI" \
  'raise.jsonl:1: .*chat_template.jinja:1:[0-9]+: the chat template raised: System first'
bad no-assistant "" '{"messages": [{"role": "user", "content": "hi"}]}' \
  'no-assistant.jsonl:1: the conversation has no assistant turn to train on'
bad no-role "" '{"messages": [{"content": "hi"}]}' 'no-role.jsonl:1: message 0 has no "role"'
bad kwargs "" '{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": 1}' \
  'kwargs.jsonl:1: "chat_template_kwargs" must be an object'
# tokenizer_config.json's chat_template neither a string nor a list with a "default".
mkdir -p "$SCRATCH/number" && cp "$LLAMA3/tokenizer.json" "$SCRATCH/number/"
$PY -c 'import json, sys; c = json.load(open(sys.argv[1])); c["chat_template"] = 5
json.dump(c, open(sys.argv[2], "w"))' "$LLAMA3/tokenizer_config.json" "$SCRATCH/number/tokenizer_config.json"
expect_user_error 'chats.jsonl:1: .*tokenizer_config.json has a chat_template that is neither a string nor a list with a "default"' \
  $TITAN "${CHAT[@]}" --model.tokenizer_path "$SCRATCH/number" --training.dataset_path "$SCRATCH/chats.jsonl"
expect_user_error '--chat needs --prompt' \
  $TITAN generate --checkpoint "$SCRATCH/train/checkpoint/step-2.h5" --chat --prompt-ids 1,2
mkdir -p "$SCRATCH/base" && cp "$LLAMA3"/tokenizer.json "$LLAMA3"/tokenizer_config.json "$SCRATCH/base/"
printf '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}\n' \
  >"$SCRATCH/base.jsonl"
expect_user_error 'base.jsonl:1: message 1 \(assistant\): its end is neither the tokenizer.s eos_token nor' \
  $TITAN "${CHAT[@]}" --model.tokenizer_path "$SCRATCH/base" --training.dataset_path "$SCRATCH/base.jsonl"
