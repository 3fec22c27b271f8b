#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS_PER_TARGET] [NAME...]: builds the libFuzzer targets (`make fuzz`),
# fills build/fuzz/corpus/NAME with the seeds tests/fuzz/NAME.seeds lists (kept between runs,
# so a longer campaign starts where the last one stopped), and runs each target (all, or the
# NAMEs given: config, gpt2, ...) for that many seconds, as many at a time as there are cores;
# a minute in all, split across the targets, by default. What a target finds (crash-*, leak-*, timeout-*, oom-*) lands in
# build/fuzz/findings/NAME. Prints one line per target; exits 1 on any finding. FUZZ_ARGS
# adds libFuzzer flags (e.g. -max_len=8192: the real tokenizer seeds are megabytes, so a
# campaign on the small ones below mutates far more inputs per second).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s -j"$(nproc)" fuzz titan test-data

names=("${@:2}")
[ ${#names[@]} -gt 0 ] || names=($(ls tests/fuzz/fuzz_*.c | sed 's|tests/fuzz/fuzz_||; s|\.c$||'))
seconds=${1:-$(( 60 / ${#names[@]} > 0 ? 60 / ${#names[@]} : 1 ))}

# shard seeds are real shard files: the target takes a shard without its header's zero padding
# (see fuzz_shard.c), so each is cut to that form. One comes from tokenizing a little text.
shard_seed() {  # file -> stdout
  head -c 12 "$1"
  tail -c +$((256 * 4 + 1)) "$1"
}
mkdir -p build/fuzz/seeds
head -c 3000 build/test-data/corpus/austen.txt >build/fuzz/seeds/austen.txt
# A chat template with a conversation for fuzz_jinja (its "#vars" part).
{ cat build/test-data/chat_templates/qwen3.jinja; printf '\n#vars\n%s\n' \
  '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>a</think>b", "tool_calls": [{"name": "f", "arguments": {"x": 1}}]}], "add_generation_prompt": true}'
} >build/fuzz/seeds/chat.jinja
rm -rf build/fuzz/seeds/austen
./titan tokenize --tokenizer bytes --out build/fuzz/seeds/austen build/fuzz/seeds/austen.txt \
  >/dev/null

# Small tokenizers cut from the real ones, as seeds that load in microseconds: the first 600
# ranks of Llama 3's tiktoken file (contiguous, all 256 bytes among them), and GPT-2's first
# 400 merges with the encoder's ids they reach.
head -n 600 build/test-data/tokenizers/llama3/tokenizer.model >build/fuzz/seeds/small.tiktoken
mkdir -p build/fuzz/seeds/gpt2-small
/usr/bin/python3 - build/test-data/tokenizers/gpt2 build/fuzz/seeds/gpt2-small 400 <<'PY'
import json, sys
src, dst, merges = sys.argv[1], sys.argv[2], int(sys.argv[3])
encoder = json.load(open(f"{src}/encoder.json", encoding="utf-8"))
json.dump({k: v for k, v in encoder.items() if v < 256 + merges},
          open(f"{dst}/encoder.json", "w", encoding="utf-8"), ensure_ascii=False)
lines = open(f"{src}/vocab.bpe", encoding="utf-8").read().split("\n")
open(f"{dst}/vocab.bpe", "w", encoding="utf-8").write("\n".join(lines[:1 + merges]) + "\n")
PY

# Issue 30's readers: a small safetensors file (an F32 and a BF16 tensor), Llama's and
# Qwen3-MoE's config.json, schedule CSVs (compute only, and with sends and receives), and
# descriptions of FLUX shards (fuzz_flux_shard.c: the digits' shapes, and a 2^30 x 2^26 latent).
/usr/bin/python3 - build/fuzz/seeds <<'PY'
import json, struct, sys
out = sys.argv[1]
header = {"__metadata__": {"format": "pt"},
          "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
          "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}}
text = json.dumps(header).encode()
open(f"{out}/small.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + bytes(22))
llama = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 768,
         "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 4,
         "vocab_size": 2048, "max_position_embeddings": 64, "rope_theta": 500000,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
json.dump(llama, open(f"{out}/llama.json", "w"))
qwen3 = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 768,
         "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 64, "vocab_size": 2048, "max_position_embeddings": 64, "num_experts": 8,
         "num_experts_per_tok": 2, "moe_intermediate_size": 128, "norm_topk_prob": True,
         "tie_word_embeddings": True}
json.dump(qwen3, open(f"{out}/qwen3_moe.json", "w"))
open(f"{out}/compute.csv", "w").write("0F0,0F1,,0B0,0B1\n,1F0,1B0,1F1,1B1\n")
open(f"{out}/comms.csv", "w").write(
    "0UNSHARD,0F0,0SEND_F0,0RECV_B0,0I0,0W0,0RESHARD\n1RECV_F0,1F0,1B0,1SEND_B0\n")
small = lambda v: struct.pack("<Q", v << 2)                 # fuzz_flux_shard.c's scale 0
huge = lambda v: struct.pack("<Q", (v << 2) | 3)            # its scale 3: up to 2^40
def shard(latents, t5, clip, size):
    return (small(8) + b"\0" + b"".join(latents) + b"\0" + b"".join(t5) + b"\0" +
            b"".join(clip) + struct.pack("<qq", *size))
open(f"{out}/digits.flux", "wb").write(
    shard([small(1), small(16), small(16)], [small(8), small(64)], [small(32)], (16, 16)))
open(f"{out}/huge.flux", "wb").write(
    shard([small(2), huge(2**30), huge(2**26)], [small(8), small(64)], [small(32)], (16, 16)))
PY

# A folder listed in a .seeds file is one seed: its files joined in name order (GPT-2's
# encoder.json then vocab.bpe, as fuzz_gpt2.c splits them).
seeds_prepare() {  # name
  local corpus=build/fuzz/corpus/$1 entry out
  mkdir -p "$corpus"
  while read -r entry; do
    [ -n "$entry" ] || continue
    out=$corpus/seed-$(basename "$entry")
    if [ -d "$entry" ]; then cat "$entry"/* >"$out"
    elif [ "$1" = shard ]; then shard_seed "$entry" >"$out"
    else cp "$entry" "$out"
    fi
  done <"tests/fuzz/$1.seeds"
}

# The config target reads command-line overrides after "#args" (fuzz_config.c): one seed has
# some, of each kind (a key and its value, key=value, a bare boolean flag).
config_args_seed() {
  mkdir -p build/fuzz/corpus/config
  { cat configs/debug_model.yaml
    echo "#args --training.steps 7 --training.seq_len=128 --training.deterministic"
  } >build/fuzz/corpus/config/seed-args
}

source tests/sanitize/env.sh  # the same leak suppressions as `make sanitize`
for name in "${names[@]}"; do
  [ -x "build/fuzz/fuzz_$name" ] || { echo "fuzz: no target $name"; exit 2; }
done

# fuzz_target NAME: runs one target, its line (and a finding's report) in build/fuzz/NAME.result.
fuzz_target() {
  local name=$1 findings=build/fuzz/findings/$1 log=build/fuzz/$1.log rc=0
  seeds_prepare "$name"
  [ "$name" != config ] || config_args_seed
  mkdir -p "$findings"
  touch "build/fuzz/$name.started"  # findings newer than it are this run's; older ones stay
  "build/fuzz/fuzz_$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 ${FUZZ_ARGS:-} \
    -print_final_stats=1 -artifact_prefix="$findings/" "build/fuzz/corpus/$name" >"$log" 2>&1 \
    || rc=$?
  local execs rate artifacts
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  artifacts=$(find "$findings" -newer "build/fuzz/$name.started" -regextype egrep \
                -regex '.*/(crash|leak|timeout|oom)-[^/]*' | wc -l)
  if [ "$rc" -ne 0 ] || [ "$artifacts" -gt 0 ]; then
    { echo "$name: ${execs:-?} execs, ${rate:-?} exec/s, FINDING (exit $rc, $artifacts in $findings; log $log)"
      grep -m1 -A20 -E "ERROR: |runtime error:|fuzz: " "$log" | sed 's/^/    /' || tail -n 20 "$log"
    } >"build/fuzz/$name.result"
  else
    echo "$name: $execs execs, $rate exec/s, no finding" >"build/fuzz/$name.result"
  fi
}

# The targets as many at a time as there are cores (libFuzzer runs one thread), then their
# lines in order.
for name in "${names[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  rm -f "build/fuzz/$name.result"
  fuzz_target "$name" &
done
wait
found=0
for name in "${names[@]}"; do
  cat "build/fuzz/$name.result" 2>/dev/null || echo "$name: no result (the script failed)"
  grep -q "no finding$" "build/fuzz/$name.result" 2>/dev/null || found=1
done
exit "$found"
