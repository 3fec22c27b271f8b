"""Greedy decoding in the PyTorch reference, against titan's ids.

    generate_ref.py MODEL TITAN_IDS_FILE [NEW_TOKENS]

MODEL is a llama2.c .bin (karpathy/llama2.c's legacy format: 7 int32 header, then fp32 weights
in run.c's memory_map_weights order) or a titan HDF5 checkpoint, loaded into llama_ref's
Transformer. It decodes greedily from the prompt [1] (llama2.c's BOS) for NEW_TOKENS tokens
(default 200) with a full forward over the whole sequence at every step (no KV cache: an
independent check of titan's), in float64, and compares with the space-separated ids in
TITAN_IDS_FILE (what `titan generate --prompt-ids 1 --temperature 0 --ids` prints). Exits 1 at
the first mismatch, printing where and how close the reference's two top logits were.
"""
import sys

import h5py
import numpy as np
import torch

from llama_ref import ModelArgs, Transformer, load_checkpoint

PROMPT = [1]
DEFAULT_NEW_TOKENS = 200
TITAN_MAX_CONTEXT = 2048  # titan generate's default context for its own checkpoints
LAYER_TENSORS = ("attention_norm", "attention.wq", "attention.wk", "attention.wv",
                 "attention.wo", "ffn_norm", "feed_forward.w1", "feed_forward.w2",
                 "feed_forward.w3")


def load_llama2c(path):
    """A llama2.c .bin -> (Transformer with its weights, seq_len)."""
    header = np.fromfile(path, dtype="<i4", count=7)
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = (int(x) for x in header)
    args = ModelArgs(dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                     vocab_size=abs(vocab), hidden_dim=hidden, norm_eps=1e-5, rope_theta=10000.0,
                     tie_word_embeddings=vocab > 0)
    model = Transformer(args)
    params = dict(model.named_parameters())
    data = np.fromfile(path, dtype="<f4", offset=7 * 4)
    at = 0

    def take(name, shape_from=None):
        nonlocal at
        shape = tuple(params[shape_from or name].shape)
        n = int(np.prod(shape))
        if at + n > len(data):
            raise SystemExit(f"{path}: ends inside {name}")
        with torch.no_grad():
            params[name].copy_(torch.from_numpy(data[at:at + n].reshape(shape)))
        at += n

    take("tok_embeddings.weight")
    for tensor in LAYER_TENSORS:
        for i in range(n_layers):
            take(f"layers.{i}.{tensor}.weight")
    take("norm.weight")
    at += seq_len * args.head_dim  # the legacy freq_cis_real and freq_cis_imag tables
    if vocab < 0:
        take("output.weight")
    if at != len(data):
        raise SystemExit(f"{path}: {len(data) - at} floats left over after the weights")
    return model.double(), seq_len


def load_model(path):
    """(Transformer, the context titan generate allows it) for either checkpoint format."""
    if h5py.is_hdf5(path):
        return load_checkpoint(path, torch.float64)[0], TITAN_MAX_CONTEXT
    return load_llama2c(path)


def greedy(model, prompt, n_new):
    """Ids and, per step, the gap between the best and second-best logit."""
    ids, gaps = list(prompt), []
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor([ids]))[0, -1]
            top = torch.topk(logits, 2).values
            gaps.append(float(top[0] - top[1]))
            ids.append(int(torch.argmax(logits)))  # the first maximum: titan's lowest id on ties
    return ids[len(prompt):], gaps


def main():
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    model, context = load_model(sys.argv[1])
    titan = [int(x) for x in open(sys.argv[2]).read().split()]
    n_new = int(sys.argv[3]) if len(sys.argv) == 4 else DEFAULT_NEW_TOKENS
    want, gaps = greedy(model, PROMPT, min(n_new, context - len(PROMPT)))
    for i, (got, ref) in enumerate(zip(titan, want)):
        if got != ref:
            print(f"token {i}: titan {got}, reference {ref} (reference's top-2 logit gap "
                  f"{gaps[i]:.3g}); equal before it")
            sys.exit(1)
    if len(titan) != len(want):
        print(f"titan gave {len(titan)} ids, the reference {len(want)}; the first "
              f"{min(len(titan), len(want))} agree")
        sys.exit(1)
    print(f"generate_ref: {len(want)} greedy tokens equal (smallest top-2 gap {min(gaps):.3g})")


if __name__ == "__main__":
    main()
