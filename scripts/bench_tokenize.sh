#!/usr/bin/env bash
# Encode throughput, titan against the tiktoken Python package, in one run on the same machine:
# Jane Austen's novels (4 MB) with Llama 3's tokenizer.model, cut into CHUNKS pieces at line
# ends, on 1 and 2 threads (tiktoken: encode_ordinary, then encode_ordinary_batch on 2 threads).
# Both encode the same chunks, so their token counts must agree. Prints MB/s and the ratios.
#   scripts/bench_tokenize.sh [CHUNKS]
set -euo pipefail
cd "$(dirname "$0")/.."
chunks=${1:-64}
tokenizer=build/test-data/tokenizers/llama3/tokenizer.model
corpus=build/test-data/corpus/austen.txt
make -s build/tests/bench_tokenizer test-data
python3 -c 'import tiktoken' 2>/dev/null || python3 -m pip install --quiet tiktoken

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
titan1=$(build/tests/bench_tokenizer "$tokenizer" "$corpus" 1 "$chunks")
titan2=$(build/tests/bench_tokenizer "$tokenizer" "$corpus" 2 "$chunks")
tiktoken_out=$(python3 - "$tokenizer" "$corpus" "$chunks" <<'EOF'
import sys, time
import tiktoken
from tiktoken.load import load_tiktoken_bpe

CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
path, corpus, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
enc = tiktoken.Encoding(name="llama3", pat_str=CL100K, mergeable_ranks=load_tiktoken_bpe(path),
                        special_tokens={})
data = open(corpus, "rb").read()
# The same cut as tests/reference/bench_tokenizer.c: each chunk ends just after a newline.
chunks, at = [], 0
for i in range(n):
    end = max(len(data) * (i + 1) // n, at)
    nl = data.find(b"\n", end)
    end = nl + 1 if nl >= 0 else len(data)
    chunks.append(data[at:end].decode())
    at = end

def best(f):
    times = []
    for _ in range(3):
        start = time.perf_counter()
        tokens = f()
        times.append(time.perf_counter() - start)
    return len(data) / min(times) / 1e6, tokens

mbs1, tokens = best(lambda: sum(len(enc.encode_ordinary(c)) for c in chunks))
mbs2, _ = best(lambda: sum(map(len, enc.encode_ordinary_batch(chunks, num_threads=2))))
print(f"{mbs1:.2f} {mbs2:.2f} {tokens} {tiktoken.__version__}")
EOF
)
read -r tik1 tik2 tik_tokens tik_version <<<"$tiktoken_out"
mbs() { sed -n 's/^titan MB\/s: \([0-9.]*\).*/\1/p' <<<"$1"; }
tokens() { sed -n 's/.*, \([0-9]*\) tokens,.*/\1/p' <<<"$1"; }
echo "titan    1 thread : $(mbs "$titan1") MB/s   ($titan1)"
echo "titan    2 threads: $(mbs "$titan2") MB/s   ($titan2)"
echo "tiktoken 1 thread : $tik1 MB/s   (tiktoken $tik_version, $tik_tokens tokens)"
echo "tiktoken 2 threads: $tik2 MB/s   (encode_ordinary_batch)"
awk -v a="$(mbs "$titan1")" -v b="$tik1" -v c="$(mbs "$titan2")" -v d="$tik2" \
  'BEGIN { printf "ratio titan / tiktoken: %.2fx (1 thread), %.2fx (2 threads)\n", a / b, c / d }'
if [ "$(tokens "$titan1")" != "$tik_tokens" ]; then
  echo "token counts differ: titan $(tokens "$titan1"), tiktoken $tik_tokens" >&2
  exit 1
fi
