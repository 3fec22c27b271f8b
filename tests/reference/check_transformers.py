"""Checks a Hugging Face export of titan against transformers itself (once, outside CI: it needs
torch and transformers, several GB, which CI does not install).

usage: python check_transformers.py HF_DIR DUMP.h5

HF_DIR is `titan convert --to hf`'s output; DUMP.h5 build/tests/dump_step's for the titan
checkpoint of the same weights (/tokens, /logits). transformers' AutoModelForCausalLM loads
HF_DIR in float64 (experts run eagerly: its grouped GEMM has no float64) and its logits must be
titan's within a relative L2 error of 1e-5. Run for DeepSeek-V3 (DeepseekV3ForCausalLM) with
transformers 5.25 and torch 2.15 (docs/hf.md has the result).
"""
import sys

import h5py
import numpy as np
import torch
from transformers import AutoModelForCausalLM

TOLERANCE = 1e-5


def main(argv):
    if len(argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[3])
    model = AutoModelForCausalLM.from_pretrained(argv[1], dtype=torch.float64,
                                                 experts_implementation="eager")
    with h5py.File(argv[2], "r") as f:
        tokens = torch.from_numpy(f["tokens"][...].astype(np.int64))[:, :-1]
        titan = f["logits"][...].astype(np.float64)
    with torch.no_grad():
        ref = model(tokens).logits.flatten(0, 1).double().numpy()
    rel = float(np.linalg.norm(titan - ref) / np.linalg.norm(ref))
    ok = rel <= TOLERANCE
    print(f"{'PASS' if ok else 'FAIL'} {type(model).__name__} on the export: relative L2 "
          f"{rel:.3e} (bound {TOLERANCE:g}), max abs {np.max(np.abs(titan - ref)):.3e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
