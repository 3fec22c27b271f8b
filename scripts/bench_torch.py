"""Training throughput of the PyTorch reference (fp32, eager, CPU), the baseline for titan.

usage: /usr/bin/python3 scripts/bench_torch.py --dim 256 --n-layers 4 --n-heads 8 --n-kv-heads 4
           --vocab 2048 --seq 256 --batch 8 --steps 20 --warmup 3 --threads 2 [--data SHARD]

Prints `torch tokens/s: X  step ms: Y`, measured over the steps after the warmup ones.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
import llama_ref  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    for name, default in (("dim", 256), ("n-layers", 4), ("n-heads", 8), ("n-kv-heads", 4),
                          ("vocab", 2048), ("seq", 256), ("batch", 8), ("steps", 20),
                          ("warmup", 3), ("threads", 2)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--data", help="llm.c token shard; random tokens when absent")
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be at least 1: the timed steps")
    return args


def batch_source(args):
    """step -> (B, T+1) tokens: the shard's windows in titan's order, or uniform random tokens."""
    if args.data:
        stream = llama_ref.read_tokens(args.data)
        return lambda step: llama_ref.microbatch(stream, step, 0, 1, args.batch, args.seq)
    gen = torch.Generator().manual_seed(0)
    return lambda step: torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    model_args = llama_ref.ModelArgs(
        dim=args.dim, n_layers=args.n_layers, n_heads=args.n_heads, n_kv_heads=args.n_kv_heads,
        vocab_size=args.vocab, hidden_dim=llama_ref.ffn_hidden_dim(args.dim))
    model = llama_ref.Transformer(model_args)
    model.init_weights(seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, weight_decay=0.1)
    next_batch = batch_source(args)
    start = None
    for step in range(1, args.warmup + args.steps + 1):
        if step == args.warmup + 1:
            start = time.perf_counter()
        tokens = next_batch(step)
        optimizer.zero_grad(set_to_none=True)
        llama_ref.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    elapsed = time.perf_counter() - start
    tokens_per_s = args.steps * args.batch * args.seq / elapsed
    print(f"torch tokens/s: {tokens_per_s:.1f}  step ms: {1000 * elapsed / args.steps:.1f}")


if __name__ == "__main__":
    main()
