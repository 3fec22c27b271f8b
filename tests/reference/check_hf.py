"""Checks a Hugging Face export of titan (titan convert --to hf) against titan's own logits.

usage: python check_hf.py HF_DIR DUMP.h5

HF_DIR holds config.json and model.safetensors; DUMP.h5 is build/tests/dump_step's output for
the titan checkpoint the export came from (/tokens, /logits). The weights are read with the
`safetensors` package's numpy API and run through a float64 forward written the way
transformers' modeling_llama.py, modeling_qwen3.py and modeling_qwen3_moe.py are (HF names,
rotate_half RoPE on the two halves of each head, Llama's llama3 rope_scaling, Qwen3's q_norm /
k_norm over each head before RoPE and its own head_dim, Qwen3-MoE's Qwen3MoeSparseMoeBlock with
one tensor per expert), not titan's interleaved pairs: so the check proves the names, the
q/k row (and QK-norm weight) permutation and config.json together. An export of MoE layers
leaves their expert biases behind: DUMP.h5 must then come from a checkpoint without them (the
export converted back). Needs an interpreter with torch, h5py and
safetensors (tests/integration/test_hf.sh makes one). Exit 1 when titan's logits differ from
these by a relative L2 error of 1e-5 or more.
"""
import json
import math
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402  (relative_error, causal_attention: no RoPE or naming in them)

TOLERANCE = 1e-5


def inv_freq(cfg):
    """transformers' default and llama3 rope init (modeling_rope_utils)."""
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    s = cfg.get("rope_scaling")
    if not s:
        return freq
    old, lo, hi = s["original_max_position_embeddings"], s["low_freq_factor"], s["high_freq_factor"]
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > old / lo, freq / s["factor"], freq)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def sparse_moe_block(cfg, w, p, x):
    """Qwen3MoeSparseMoeBlock: softmax router, top k, renormalised when norm_topk_prob, each
    expert's SwiGLU weighted by its routing weight. x (B, T, D)."""
    flat = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(flat @ w[p + "mlp.gate.weight"].T, dim=-1)
    weights, chosen = torch.topk(probs, cfg["num_experts_per_tok"], dim=-1)
    if cfg["norm_topk_prob"]:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(flat)
    for e in range(cfg["num_experts"]):
        token, slot = (chosen == e).nonzero(as_tuple=True)
        q = f"{p}mlp.experts.{e}."
        h = flat[token]
        y = (F.silu(h @ w[q + "gate_proj.weight"].T) * (h @ w[q + "up_proj.weight"].T)) \
            @ w[q + "down_proj.weight"].T
        out = out.index_add(0, token, y * weights[token, slot, None])
    return out.view(x.shape)


def forward(cfg, w, tokens):
    """LlamaForCausalLM's, Qwen3ForCausalLM's or Qwen3MoeForCausalLM's logits (B, T, vocab)
    for tokens (B, T), float64."""
    B, T = tokens.shape
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    qk_norm = cfg["model_type"] in ("qwen3", "qwen3_moe")
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(cfg))
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], cfg["rms_norm_eps"])
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(B, T, nh, hd)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(B, T, nkv, hd)
        if qk_norm:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg["rms_norm_eps"])
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg["rms_norm_eps"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(B, T, nkv, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        attn = llama_ref.causal_attention(q, k, v).transpose(1, 2).reshape(B, T, nh * hd)
        h = h + attn @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], cfg["rms_norm_eps"])
        if cfg["model_type"] == "qwen3_moe":
            h = h + sparse_moe_block(cfg, w, p, x)
            continue
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, w["model.norm.weight"], cfg["rms_norm_eps"])
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return h @ head.T


def main(argv):
    if len(argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[2])
    hf_dir, dump_path = argv[1], argv[2]
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = {k: torch.from_numpy(v.astype(np.float64))
               for k, v in load_file(os.path.join(hf_dir, "model.safetensors")).items()}
    with h5py.File(dump_path, "r") as dump:
        tokens = torch.from_numpy(dump["tokens"][...].astype(np.int64))[:, :-1]
        titan = dump["logits"][...].astype(np.float64)
    ref = forward(cfg, weights, tokens).flatten(0, 1).numpy()
    rel = llama_ref.relative_error(titan, ref)
    ok = titan.shape == ref.shape and rel < TOLERANCE
    print(f"{'PASS' if ok else 'FAIL'} logits of the HF export: relative error {rel:.3e} "
          f"(bound {TOLERANCE:g}), max abs {np.max(np.abs(titan - ref)):.3e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
