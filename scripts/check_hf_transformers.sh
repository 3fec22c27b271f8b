#!/usr/bin/env bash
# titan's Hugging Face export loaded by transformers itself: trains the `small` model (grouped-
# query attention) a few steps, exports it (titan convert --to hf), loads the folder with
# LlamaForCausalLM.from_pretrained and compares its fp32 logits on a batch of the Austen text
# with titan's (build/tests/dump_step): relative L2 error under 1e-5, max abs error printed.
# The RoPE-scaled, tied-embedding variant is checked too. Not part of `make test`: it installs
# transformers from PyPI into build/venv-transformers, on top of Debian's interpreter so that
# its torch 1.13 is used (transformers 4.44 is the last line of releases that accepts it).
#
#   bash scripts/check_hf_transformers.sh   (after make and make build/tests/dump_step)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build/venv-transformers
TRANSFORMERS=${TRANSFORMERS:-transformers==4.44.2}
if ! $VENV/bin/python -c "import transformers" 2>/dev/null; then
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
  $VENV/bin/pip install -q "$TRANSFORMERS"
fi
SCRATCH=$(mktemp -d /tmp/titan-hf.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
./titan tokenize --tokenizer bytes --out "$SCRATCH/austen.bin" ../shared/data/corpus/austen.txt >/dev/null
run=(--config configs/debug_model.yaml --training.dataset_path "$SCRATCH/austen.bin"
     --model.tokenizer_path null --training.seq_len 64 --training.local_batch_size 4
     --model.flavor small --training.steps 3 --checkpoint.enable --checkpoint.interval 3)
./titan "${run[@]}" --job.dump_folder "$SCRATCH/gqa" >/dev/null
./titan "${run[@]}" --model.rope_scaling --model.tie_word_embeddings --job.dump_folder "$SCRATCH/tied" >/dev/null

for name in gqa tied; do
  ckpt=$SCRATCH/$name/checkpoint/step-3.h5
  ./titan convert --to hf "$ckpt" "$SCRATCH/$name-hf" >/dev/null
  ./build/tests/dump_step "$ckpt" "$SCRATCH/austen.bin" 4 64 "$SCRATCH/$name-dump.h5" >/dev/null
  $VENV/bin/python - "$SCRATCH/$name-hf" "$SCRATCH/$name-dump.h5" "$name" <<'PY'
import sys
import h5py, numpy as np, torch, transformers
from transformers import LlamaForCausalLM
hf_dir, dump, name = sys.argv[1:]
model = LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
with h5py.File(dump, "r") as f:
    tokens = torch.from_numpy(f["tokens"][...].astype(np.int64))[:, :-1]
    titan = f["logits"][...].astype(np.float64)
with torch.no_grad():
    ref = model(tokens).logits.flatten(0, 1).double().numpy()
rel = np.linalg.norm(titan - ref) / np.linalg.norm(ref)
ok = rel < 1e-5
print(f"{'PASS' if ok else 'FAIL'} {name}: transformers {transformers.__version__} "
      f"LlamaForCausalLM vs titan logits ({titan.shape[0]} tokens x {titan.shape[1]}): "
      f"relative L2 {rel:.3e}, max abs {np.max(np.abs(titan - ref)):.3e}, "
      f"max |logit| {np.max(np.abs(ref)):.2f}")
sys.exit(0 if ok else 1)
PY
done
