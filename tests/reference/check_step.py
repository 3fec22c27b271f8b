"""Checks one titan forward/backward step against the PyTorch reference.

usage: /usr/bin/python3 tests/reference/check_step.py CKPT.h5 DUMP.h5

DUMP.h5 is written by build/tests/dump_step: /tokens (B, T+1) int32, /loss (1,) float64,
/logits (B*T, vocab) fp32 and /grad/<fqn> fp32 for every parameter trained (under LoRA the
adapters); with a loss mask, /mask (B, T), whose 0s are targets the loss ignores (the
reference's ignore_index). The reference runs in float64 from the checkpoint's fp32 weights,
so its own rounding is ~1e-15 and the measured error is titan's fp32 error alone; the bound (relative L2 error < 1e-5 on loss, logits and every
gradient) is then a statement about titan, not about two fp32 summation orders. A MoE model's
expert biases are buffers: titan's gradient for them must be exactly zero. Exit 1 on failure.
"""
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402

TOLERANCE = 1e-5


def reference_step(ckpt_path, tokens, mask=None):
    """float64 loss, logits (B*T, vocab), {fqn: grad} and the buffers' names for tokens
    (B, T+1); mask (B, T): 0 where the target is ignored (-100, torch's ignore_index)."""
    model, _, _ = llama_ref.load_checkpoint(ckpt_path, dtype=torch.float64)
    inputs, targets = tokens[:, :-1], tokens[:, 1:].clone()
    if mask is not None:
        targets[mask == 0] = -100
    logits = model(inputs)
    loss = model.objective(logits, targets)
    loss.backward()
    grads = {name: p.grad.numpy() for name, p in model.named_parameters() if p.requires_grad}
    empty = [int((m.load == 0).sum()) for m in model.moe_layers()]
    if any(empty):
        print(f"experts no token chose, per MoE layer: {empty}")
    buffers = {name for name, _ in model.named_buffers()}
    return loss.item(), logits.detach().flatten(0, 1).numpy(), grads, buffers


def compare(name, titan, ref):
    """Prints one line; returns whether the tensor is within the bound."""
    titan = np.asarray(titan, dtype=np.float64)
    if titan.shape != ref.shape:
        print(f"FAIL {name:48s} shape {titan.shape} != reference {ref.shape}")
        return False
    rel = llama_ref.relative_error(titan, ref)
    max_abs = float(np.max(np.abs(titan - ref))) if titan.size else 0.0
    ok = rel < TOLERANCE
    print(f"{'ok  ' if ok else 'FAIL'} {name:48s} rel {rel:.3e}  max abs {max_abs:.3e}")
    return ok


def main(argv):
    if len(argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[2])
    ckpt_path, dump_path = argv[1], argv[2]
    with h5py.File(dump_path, "r") as dump:
        tokens = torch.from_numpy(dump["tokens"][...].astype(np.int64))
        mask = torch.from_numpy(dump["mask"][...]) if "mask" in dump else None
        loss, logits, grads, buffers = reference_step(ckpt_path, tokens, mask)
        ok = compare("loss", dump["loss"][...].reshape(()), np.float64(loss))
        ok &= compare("logits", dump["logits"][...], logits)
        dumped = set(dump["grad"].keys()) if "grad" in dump else set()
        for name, ref in grads.items():
            if name not in dumped:
                print(f"FAIL grad/{name:43s} missing from {dump_path}")
                ok = False
                continue
            ok &= compare("grad/" + name, dump["grad/" + name][...], ref)
        for name in sorted(dumped - set(grads)):
            if name in buffers and not np.any(dump["grad/" + name][...]):
                print(f"ok   grad/{name:43s} zero (a buffer)")
                continue
            print(f"FAIL grad/{name:43s} is not a parameter of the model")
            ok = False
    print("PASS" if ok else "FAIL", f"(bound: relative error < {TOLERANCE:g} vs float64 reference)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
