#!/usr/bin/env bash
# titan's LoRA adapter loaded by PEFT itself: trains the debug model's small flavor (grouped-
# query attention: wq and wk's rows are permuted for HF) with LoRA on wq, wk, wv, w2 and the
# output projection for 10 steps from a seed, exports the seed's weights as the base
# (convert --to hf: B is zero at the seed, so nothing merges) and the trained adapters
# (convert --to peft), loads the base with AutoModelForCausalLM and the adapter with
# PeftModel.from_pretrained, and compares the fp32 logits on a batch of the Austen text with
# titan's on the LoRA checkpoint (build/tests/dump_step): relative L2 error under 1e-5. Not
# part of `make test`: it installs torch, transformers and peft from PyPI (about 6 GB) into
# $VENV (default build/venv-peft).
#
#   bash scripts/check_peft.sh
set -euo pipefail
cd "$(dirname "$0")/.."
make -s titan build/tests/dump_step test-data
VENV=${VENV:-build/venv-peft}
if ! "$VENV/bin/python" -c "import transformers, peft, safetensors, h5py" 2>/dev/null; then
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch transformers peft safetensors h5py numpy
fi
SCRATCH=$(mktemp -d /tmp/titan-peft.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
./titan tokenize --tokenizer bytes --out "$SCRATCH/austen.bin" build/test-data/corpus/austen.txt >/dev/null
run=(--config configs/debug_model.yaml --training.dataset_path "$SCRATCH/austen.bin"
     --model.tokenizer_path null --training.seq_len 64 --training.local_batch_size 4
     --model.flavor small --training.mixed_precision_param float32 --training.steps 10
     --optimizer.lr 1e-2 --model.converters lora --lora.rank 4 --lora.alpha 8
     --lora.target_modules wq,wk,wv,w2,output --job.dump_folder "$SCRATCH/run")
./titan "${run[@]}" --checkpoint.create_seed_checkpoint >/dev/null 2>&1
./titan "${run[@]}" --checkpoint.initial_load_path "$SCRATCH/run/checkpoint/step-0.h5" \
  --checkpoint.enable --checkpoint.interval 10 >/dev/null 2>&1
./titan convert --to hf "$SCRATCH/run/checkpoint/step-0.h5" "$SCRATCH/base" >/dev/null
./titan convert --to peft "$SCRATCH/run/checkpoint/step-10.h5" "$SCRATCH/adapter" >/dev/null
./build/tests/dump_step "$SCRATCH/run/checkpoint/step-10.h5" "$SCRATCH/austen.bin" 2 64 \
  "$SCRATCH/dump.h5" >/dev/null
"$VENV/bin/python" - "$SCRATCH/base" "$SCRATCH/adapter" "$SCRATCH/dump.h5" <<'PY'
import sys, h5py, numpy as np, torch
from transformers import AutoModelForCausalLM
from peft import PeftModel
base, adapter, dump = sys.argv[1:]
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32), adapter)
model.eval()
with h5py.File(dump, "r") as f:
    tokens, titan = f["tokens"][...].astype(np.int64), f["logits"][...].astype(np.float64)
with torch.no_grad():
    logits = model(torch.from_numpy(tokens[:, :-1])).logits.double().flatten(0, 1).numpy()
err = np.linalg.norm(logits - titan) / np.linalg.norm(titan)
print(f"PEFT on titan's base and adapter vs titan: relative L2 {err:.2e}, max abs {np.abs(logits - titan).max():.2e}")
assert err < 1e-5, "PEFT's logits differ from titan's"
PY
echo "PASS: PEFT loads titan's LoRA adapter onto the exported base and gives titan's logits"
