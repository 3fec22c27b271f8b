#!/usr/bin/env bash
# titan's Hugging Face exports loaded by transformers itself: trains small models a few steps,
# exports them (titan convert --to hf), loads each folder with AutoModelForCausalLM (config.json
# picks LlamaForCausalLM or Qwen3ForCausalLM) and compares its fp32 logits on a batch of the
# Austen text with titan's (build/tests/dump_step): relative L2 error under 1e-5, max abs error
# printed. Llama 3: grouped-query attention, and RoPE scaling with tied embeddings; Qwen3:
# QK-norm and head_dim != dim / n_heads, untied and tied; Qwen3-MoE (small_moe, loaded as
# Qwen3MoeForCausalLM), whose titan logits are those of its checkpoint converted back from the
# export: HF has no expert biases, so the export leaves the trained ones behind. Then the
# tokenizer: a run trained with a titan-trained BPE, exported, loaded with AutoTokenizer, greedy
# generate gives `titan generate`'s ids. Not part of `make test`: it installs
# torch and transformers from PyPI (about 6 GB) into $VENV (default build/venv-transformers),
# since Qwen3 needs transformers >= 4.51, which needs a newer torch than Debian's.
#
#   bash scripts/check_hf_transformers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
make -s titan build/tests/dump_step test-data
VENV=${VENV:-build/venv-transformers}
if ! "$VENV/bin/python" -c "import transformers, safetensors, h5py" 2>/dev/null; then
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch "transformers>=4.51" safetensors h5py numpy
fi
SCRATCH=$(mktemp -d /tmp/titan-hf.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
./titan tokenize --tokenizer bytes --out "$SCRATCH/austen.bin" build/test-data/corpus/austen.txt >/dev/null
run=(--config configs/debug_model.yaml --training.dataset_path "$SCRATCH/austen.bin"
     --model.tokenizer_path null --training.seq_len 64 --training.local_batch_size 4
     --model.flavor small --training.steps 3 --checkpoint.enable --checkpoint.interval 3)
./titan "${run[@]}" --job.dump_folder "$SCRATCH/gqa" >/dev/null
./titan "${run[@]}" --model.rope_scaling --model.tie_word_embeddings --job.dump_folder "$SCRATCH/tied" >/dev/null
./titan "${run[@]}" --model.name qwen3 --job.dump_folder "$SCRATCH/qwen3" >/dev/null
./titan "${run[@]}" --model.name qwen3 --model.tie_word_embeddings --job.dump_folder "$SCRATCH/qwen3-tied" >/dev/null
./titan "${run[@]}" --model.name qwen3 --model.flavor small_moe --job.dump_folder "$SCRATCH/qwen3-moe" >/dev/null

for name in gqa tied qwen3 qwen3-tied qwen3-moe; do
  ckpt=$SCRATCH/$name/checkpoint/step-3.h5
  ./titan convert --to hf "$ckpt" "$SCRATCH/$name-hf" >/dev/null 2>&1
  if [ "$name" = qwen3-moe ]; then
    ./titan convert --to titan "$SCRATCH/$name-hf" "$SCRATCH/$name-back.h5" >/dev/null
    ckpt=$SCRATCH/$name-back.h5
  fi
  ./build/tests/dump_step "$ckpt" "$SCRATCH/austen.bin" 4 64 "$SCRATCH/$name-dump.h5" >/dev/null
  $VENV/bin/python - "$SCRATCH/$name-hf" "$SCRATCH/$name-dump.h5" "$name" <<'PY'
import sys
import h5py, numpy as np, torch, transformers
from transformers import AutoModelForCausalLM
hf_dir, dump, name = sys.argv[1:]
model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
with h5py.File(dump, "r") as f:
    tokens = torch.from_numpy(f["tokens"][...].astype(np.int64))[:, :-1]
    titan = f["logits"][...].astype(np.float64)
with torch.no_grad():
    ref = model(tokens).logits.flatten(0, 1).double().numpy()
rel = np.linalg.norm(titan - ref) / np.linalg.norm(ref)
ok = rel < 1e-5
print(f"{'PASS' if ok else 'FAIL'} {name}: transformers {transformers.__version__} "
      f"{type(model).__name__} vs titan logits ({titan.shape[0]} tokens x {titan.shape[1]}): "
      f"relative L2 {rel:.3e}, max abs {np.max(np.abs(titan - ref)):.3e}, "
      f"max |logit| {np.max(np.abs(ref)):.2f}")
sys.exit(0 if ok else 1)
PY
done

# The tokenizer end to end: a run trained with a titan-trained BPE, exported with its tokenizer,
# loaded with AutoTokenizer and AutoModelForCausalLM: greedy generate from a prompt that starts
# with BOS (as titan's documents and `titan generate` do) gives titan generate's ids.
tok=$SCRATCH/austen.tiktoken
./titan tokenizer train --vocab-size 2048 --out "$tok" build/test-data/corpus/austen.txt >/dev/null
./titan tokenize --tokenizer "$tok" --out "$SCRATCH/bpe" build/test-data/corpus/austen.txt \
  >/dev/null
./titan "${run[@]}" --training.dataset_path "$SCRATCH/bpe" --model.tokenizer_path "$tok" \
  --job.dump_folder "$SCRATCH/bpe-run" >/dev/null
./titan convert --to hf "$SCRATCH/bpe-run/checkpoint/step-3.h5" "$SCRATCH/bpe-hf" >/dev/null
prompt="It is a truth universally acknowledged"
titan_ids=$(./titan generate --checkpoint "$SCRATCH/bpe-run/checkpoint/step-3.h5" \
  --tokenizer "$tok" --prompt "$prompt" --max-new-tokens 8 --temperature 0 --ids 2>/dev/null | tail -n 1)
$VENV/bin/python - "$SCRATCH/bpe-hf" "$prompt" "$titan_ids" <<'PY'
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
hf_dir, prompt, titan = sys.argv[1], sys.argv[2], [int(i) for i in sys.argv[3].split()]
tok = AutoTokenizer.from_pretrained(hf_dir)
model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
inputs = tok(tok.bos_token + prompt, return_tensors="pt")
out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
ids = out[0, inputs["input_ids"].shape[1]:].tolist()
ok = ids == titan and inputs["input_ids"][0, 0].item() == tok.bos_token_id
print(f"{'PASS' if ok else 'FAIL'} tokenizer: AutoTokenizer + generate gives {ids} "
      f"({tok.decode(ids)!r}); titan generate {titan}")
sys.exit(0 if ok else 1)
PY
