"""Writes a titan .tiktoken BPE as a Hugging Face tokenizer folder (tokenizer.json,
tokenizer_config.json), the form torchtitan's HuggingFaceTokenizer loads.

    python3 scripts/peer/hf_tokenizer.py austen.tiktoken OUT_DIR

titan's `convert --to hf` writes the same tokenizer.json byte for byte (data/tokenizer_hf.c).

The ranks become a byte-level BPE vocabulary (GPT-2's byte-to-unicode map) and its merges are
recovered from the ranks as transformers' TikTokenConverter does: every split of a token into
two tokens of the vocabulary, ordered by the token's rank, then by the parts' ranks. The
pre-tokenizer is cl100k's regex, titan's; the two special tokens follow the ranks (BOS, EOS).
"""
import base64
import json
import os
import sys

CL100K_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>"]


def byte_to_unicode():
    """GPT-2's map of the 256 bytes onto printable characters."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
                 list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def merges_of(ranks):
    merges = []
    for token, rank in ranks.items():
        splits = [(token[:i], token[i:]) for i in range(1, len(token))
                  if token[:i] in ranks and token[i:] in ranks]
        merges += [(l, r, rank) for l, r in sorted(splits, key=lambda s: (ranks[s[0]], ranks[s[1]]))]
    return sorted(merges, key=lambda m: m[2])


def main(tiktoken_path, out_dir):
    ranks = {}
    for line in open(tiktoken_path):
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    chars = byte_to_unicode()
    text = lambda token: "".join(chars[b] for b in token)
    added = [{"id": len(ranks) + i, "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": CL100K_REGEX}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {text(t): r for t, r in ranks.items()},
                  "merges": [[text(l), text(r)] for l, r, _ in merges_of(ranks)]},
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    config = {"bos_token": SPECIALS[0], "eos_token": SPECIALS[1], "add_bos_token": False,
              "add_eos_token": False, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__.strip())
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    main(*sys.argv[1:])
