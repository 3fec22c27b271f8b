"""Checks titan's conversations (tests/reference/render_chat.c's output) against Jinja2.

  check_chat.py TOKENIZER_DIR CONVERSATIONS.jsonl RENDER_CHAT_OUTPUT

The chat template beside the tokenizer (chat_template.jinja) is rendered by Jinja2 in the
environment transformers' apply_chat_template builds (trim_blocks, lstrip_blocks, loop controls,
its tojson and raise_exception); {% generation %} blocks are call blocks, as its
AssistantTracker compiles them, whose output markers give the spans. The assistant spans follow
data/chat.h's rule, written here from its words. Then the token stream: its tokens' bytes (from tokenizer.json's byte-level vocabulary) spell the conversations
back to back, every added token's text is that one token, a token is trained exactly when it
overlaps a span, and only each conversation's last token ends a document.
"""
import json
import re
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

GEN_START, GEN_END = "\x01", "\x02"


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, Generation])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


class Generation(jinja2.ext.Extension):
    """{% generation %}: a call block, as transformers' AssistantTracker compiles it (its own
    scope), whose output is wrapped in markers that give the spans."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_mark")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _mark(self, caller):
        return GEN_START + caller() + GEN_END


SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                "mask_token")


def specials_of(config):
    """transformers' special_tokens_map: the keys set in tokenizer_config.json, as text."""
    out = {}
    for key in SPECIAL_KEYS:
        v = config.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            out[key] = v
    return out


def bytes_of(text, end):
    return len(text[:end].encode())


def spans_of(template, line, specials, generation):
    eos = specials.get("eos_token")

    def render(turns, prompt):  # as apply_chat_template calls it
        return template.render(messages=line["messages"][:turns], tools=line.get("tools"),
                               documents=None, add_generation_prompt=prompt,
                               **{**specials, **line.get("chat_template_kwargs", {})})

    n = len(line["messages"])
    full = render(n, False)
    if generation:
        text, spans, start = "", [], None
        for c in full:
            if c == GEN_START:
                start = len(text.encode())
            elif c == GEN_END:
                if len(text.encode()) > start:
                    spans.append([start, len(text.encode())])
            else:
                text += c
        return text, spans
    spans = []
    for i, m in enumerate(line["messages"]):
        if m["role"] != "assistant":
            continue
        before = render(i, True)
        assert full.startswith(before), f"message {i}: not a prefix"
        hit = full.find(eos, len(before)) if eos else -1
        if hit >= 0:
            spans.append([bytes_of(full, len(before)), bytes_of(full, hit + len(eos))])
            continue
        upto = render(i + 1, False)
        assert full.startswith(upto) and len(upto) > len(before), f"message {i}: no end"
        spans.append([bytes_of(full, len(before)), bytes_of(full, len(upto))])
    return full, spans


def vocabulary(folder):
    """Each id's bytes: the byte-level vocabulary decoded (GPT-2's byte to unicode map), the
    added tokens as their text; and the added tokens' texts."""
    tokenizer = json.load(open(f"{folder}/tokenizer.json"))
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
                 list(range(ord("®"), ord("ÿ") + 1)))
    codes, extra = {b: b for b in printable}, 0
    for b in range(256):
        if b not in codes:
            codes[b], extra = 256 + extra, extra + 1
    byte_of = {chr(c): b for b, c in codes.items()}
    spelled = {i: bytes(byte_of[c] for c in t) for t, i in tokenizer["model"]["vocab"].items()}
    added = {a["content"].encode(): a["id"] for a in tokenizer["added_tokens"]}
    spelled.update({i: t for t, i in added.items()})
    return spelled, added


def main(folder, conversations, rendered):
    config = json.load(open(f"{folder}/tokenizer_config.json"))
    specials = specials_of(config)
    source = open(f"{folder}/chat_template.jinja").read()
    generation = re.search(r"{%-?\s*generation", source) is not None
    template = environment().from_string(source)
    lines = [json.loads(l) for l in open(conversations)]
    outputs = [json.loads(l) for l in open(rendered)]
    assert len(outputs) == len(lines) + 1, (len(outputs), len(lines))
    texts = []
    for number, (line, got) in enumerate(zip(lines, outputs), 1):
        text, spans = spans_of(template, line, specials, generation)
        assert "error" not in got, f"line {number}: titan: {got['error']}"
        assert got["text"] == text, f"line {number}:\n titan  {got['text']!r}\n jinja2 {text!r}"
        assert got["spans"] == spans, f"line {number}: spans {got['spans']} != {spans}"
        texts.append((text.encode(), spans))
    spelled, added = vocabulary(folder)
    ids, flags = outputs[-1]["ids"], outputs[-1]["flags"]
    at = 0
    for text, spans in texts:
        offset, ends = 0, []
        while offset < len(text):
            token = spelled[ids[at]]
            assert text.startswith(token, offset), f"token {at} does not spell the text"
            for t in added:  # an added token's text is always that one token
                assert not (text.startswith(t, offset) and len(t) > len(token)), (at, t)
            overlaps = any(s < offset + len(token) and offset < e for s, e in spans)
            assert flags[at] & 1 == overlaps, f"token {at}: trained {flags[at] & 1}"
            ends.append(flags[at] & 2)
            offset, at = offset + len(token), at + 1
        assert offset == len(text) and ends[-1] and not any(ends[:-1]), "document ends"
    assert at == len(ids), f"{len(ids) - at} tokens beyond the conversations"
    trained = sum(f & 1 for f in flags)
    print(f"ok: {len(lines)} conversations rendered as Jinja2 does, {len(spans_all(texts))} "
          f"assistant spans, {len(ids)} tokens ({trained} trained) spelling them")


def spans_all(texts):
    return [s for _, spans in texts for s in spans]


if __name__ == "__main__":
    main(*sys.argv[1:])
