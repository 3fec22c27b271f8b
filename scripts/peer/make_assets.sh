#!/usr/bin/env bash
# The peer's inputs, made from the repository's own test data (build/test-data) and titan, into
# PEER_ASSETS (default build/peer/assets), where peer_titan.sh and peer_torchtitan.sh read them:
#   austen_docs/data.jsonl  the Austen text in 74 documents of 1,000 lines (torchtitan's c4_test
#                           JSONL loader reads a folder of them)
#   austen.tiktoken         a 2,048-id BPE (2,046 ranks + BOS/EOS) from titan's `tokenizer train`
#   austen_tok/             the same BPE in Hugging Face form (hf_tokenizer.py), for torchtitan
# Each file is checked against the hashes below, those of the assets every published peer
# figure was measured on: a change in titan's BPE trainer or the corpus shows here.
#   scripts/peer/make_assets.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${PEER_ASSETS:-build/peer/assets}
make -s titan test-data
mkdir -p "$out/austen_docs"
/usr/bin/python3 - build/test-data/corpus/austen.txt "$out/austen_docs/data.jsonl" <<'PY'
import json, sys
lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for i in range(0, len(lines), 1000):
        f.write(json.dumps({"text": "\n".join(lines[i:i + 1000])}) + "\n")
PY
./titan tokenizer train --vocab-size 2048 --out "$out/austen.tiktoken" \
  build/test-data/corpus/austen.txt >/dev/null
/usr/bin/python3 scripts/peer/hf_tokenizer.py "$out/austen.tiktoken" "$out/austen_tok"
(cd "$out" && sha256sum --quiet --strict -c) <<'SUMS'
49197ee9c91b8dd5c76912c546b46eb14cdbea736e2cf6aa53208ce8d6c2e992  austen_docs/data.jsonl
691a0f2329115ba25ca1d9fddd7644b42c7ad5e1844b7573e24e14931e47c98c  austen.tiktoken
d0a88c6840dc7bbe609247d623855ac7adf0a44ab5e62d7a4a2fb0ff3ec17f73  austen_tok/tokenizer.json
d9c973e3f27b9dc1b24de188b425674027a1c1814718a3f2fe2cc24682df1914  austen_tok/tokenizer_config.json
SUMS
echo "peer assets: $out"
