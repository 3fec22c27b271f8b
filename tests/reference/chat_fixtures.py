"""The tokenizer folders and conversations of tests/integration/test_chat.sh and
scripts/check_chat_transformers.sh:

  chat_fixtures.py LLAMA3_DIR TEMPLATES_DIR OUT [NAME TEMPLATE]

writes under OUT the folders llama3-instruct (Meta's Llama 3 Instruct template, eos_token
<|eot_id|>), qwen3 (Qwen3's template, eos_token <|im_end|>, Llama 3's vocabulary with Qwen3's four
chat tokens added: the vocabulary does not change the rendering) and features (every other
construct of titan's Jinja subset), each a tokenizer.json, tokenizer_config.json and
chat_template.jinja; and the conversations chats.jsonl, qwen3.jsonl (chats plus tool calls) and
features.jsonl. With NAME TEMPLATE, only the folder NAME, a Llama 3 Instruct one whose
chat_template.jinja holds the text TEMPLATE.
"""
import json
import os
import shutil
import sys


def tokenizer_folder(llama3, out, name, eos, added=(), template_file=None, template=None):
    folder = f"{out}/{name}"
    os.makedirs(folder, exist_ok=True)
    if template_file:
        shutil.copy(template_file, f"{folder}/chat_template.jinja")
    else:
        open(f"{folder}/chat_template.jinja", "w").write(template)
    tok = json.load(open(f"{llama3}/tokenizer.json"))
    for k, (text, special) in enumerate(added):
        tok["added_tokens"].append({"id": 128256 + k, "content": text, "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False,
                                    "special": special})
    json.dump(tok, open(f"{folder}/tokenizer.json", "w"))
    config = json.load(open(f"{llama3}/tokenizer_config.json"))
    config.pop("chat_template")
    config["eos_token"] = eos
    config["bos_token"] = None if added else "<|begin_of_text|>"
    json.dump(config, open(f"{folder}/tokenizer_config.json", "w"))


CHATS = [
    [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"},
     {"role": "assistant", "content": " 6\n"}],
    [{"role": "user", "content": "ünïcödé ✓ 日本 \"q\" 'x' \\ \t"},
     {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nok"},
     {"role": "user", "content": "<tool_response>r</tool_response>"},
     {"role": "assistant", "content": "<think>x</think>done", "reasoning_content": "why"}],
]
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "days": 3, "x": [1.5, True, None]}}}]},
    {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "22C"},
    {"role": "assistant", "content": "Sunny, 22C."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
RAW_TOOL_CHAT = [
    TOOL_CHAT[0], {"role": "assistant", "content": "a",
                   "tool_calls": [{"name": "f", "arguments": "{\"raw\": 1}"}]},
    TOOL_CHAT[2], TOOL_CHAT[4]]
FEATURE_CHATS = [
    [{"role": "system", "content": "Talk as a pirate!"},
     {"role": "user", "content": "a banana a day."}, {"role": "assistant", "content": "  Arr  "},
     {"role": "data", "content": {"k": "v", "n": 2}}, {"role": "ignored", "content": "x"},
     {"role": "list", "content": ["a", 1, None]}, {"role": "user", "content": None, "extra": 7},
     {"role": "assistant", "content": "Aye"}, {"role": "x", "content": 1},
     {"role": "assistant", "content": "beyond the break"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "extra": ""}],
]


def write_lines(path, lines):
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


def main(llama3, templates, out, name=None, template=None):
    if name:
        tokenizer_folder(llama3, out, name, "<|eot_id|>", template=template)
        return
    tokenizer_folder(llama3, out, "llama3-instruct", "<|eot_id|>",
                     template_file=f"{templates}/llama3_instruct.jinja")
    tokenizer_folder(llama3, out, "qwen3", "<|im_end|>", template_file=f"{templates}/qwen3.jinja",
                     added=[("<|im_start|>", True), ("<|im_end|>", True), ("<think>", False),
                            ("</think>", False)])
    tokenizer_folder(llama3, out, "features", "<|eot_id|>",
                     template_file=f"{templates}/features.jinja")
    write_lines(f"{out}/chats.jsonl", [{"messages": c} for c in CHATS])
    write_lines(f"{out}/qwen3.jsonl", [{"messages": c} for c in CHATS] +
                [{"messages": TOOL_CHAT, "tools": TOOLS}, {"messages": RAW_TOOL_CHAT},
                 {"messages": CHATS[0], "chat_template_kwargs": {"enable_thinking": False}}])
    write_lines(f"{out}/features.jsonl", [{"messages": c} for c in FEATURE_CHATS])


if __name__ == "__main__":
    main(*sys.argv[1:])
