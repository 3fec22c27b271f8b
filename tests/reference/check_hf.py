"""Checks a Hugging Face export of titan (titan convert --to hf) against titan's own logits.

usage: python check_hf.py HF_DIR DUMP.h5

HF_DIR holds config.json and model.safetensors; DUMP.h5 is build/tests/dump_step's output for
the titan checkpoint the export came from (/tokens, /logits). The weights are read with the
`safetensors` package's numpy API and run through a float64 forward written the way
transformers' modeling_llama.py, modeling_qwen3.py and modeling_qwen3_moe.py are (HF names,
rotate_half RoPE on the two halves of each head, Llama's llama3 rope_scaling, Qwen3's q_norm /
k_norm over each head before RoPE and its own head_dim, Qwen3-MoE's Qwen3MoeSparseMoeBlock with
one tensor per expert), not titan's interleaved pairs: so the check proves the names, the
q/k row (and QK-norm weight) permutation and config.json together. DeepSeek-V3's as
modeling_deepseek_v3.py runs it (DeepseekV3Attention with rope_interleave: the pairs turned
into halves at run time; YaRN's inv_freq and attention factor as modeling_rope_utils computes
them; DeepseekV3TopkRouter's sigmoid, correction bias, groups and scaling; shared experts). An export of MoE layers
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


def yarn_inv_freq(cfg, dim):
    """transformers' _compute_yarn_parameters (truncate, DeepSeek's factor from
    max_position_embeddings / original_max_position_embeddings) and its attention_factor."""
    s, base = cfg["rope_scaling"], cfg["rope_theta"]
    original = s["original_max_position_embeddings"]
    factor = cfg["max_position_embeddings"] / original

    def get_mscale(scale, mscale=1):
        return 0.1 * mscale * math.log(scale) + 1.0 if scale > 1 else 1.0
    attention_factor = get_mscale(factor, s["mscale"]) / get_mscale(factor, s["mscale_all_dim"])

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))
    low = max(math.floor(correction_dim(s["beta_fast"])), 0)
    high = min(math.ceil(correction_dim(s["beta_slow"])), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation = 1 - ramp
    inv = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv, attention_factor


def deepseek_router(cfg, w, p, flat):
    """DeepseekV3TopkRouter: sigmoid scores; the choice by scores + e_score_correction_bias
    within the topk_group groups of the best top-2 sums (the others masked to 0); the weights
    the chosen scores, normalised (norm_topk_prob) and times routed_scaling_factor."""
    E, G = cfg["n_routed_experts"], cfg["n_group"]
    scores = torch.sigmoid(flat @ w[p + "mlp.gate.weight"].T)
    choice = scores + w[p + "mlp.gate.e_score_correction_bias"][None]
    group_scores = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=cfg["topk_group"], dim=-1)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
    choice = choice.masked_fill(~score_mask.bool(), 0.0)
    chosen = torch.topk(choice, k=cfg["num_experts_per_tok"], dim=-1)[1]
    weights = scores.gather(1, chosen)
    if cfg["norm_topk_prob"]:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return chosen, weights * cfg["routed_scaling_factor"]


def swiglu(w, p, x):
    return (F.silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) \
        @ w[p + "down_proj.weight"].T


def deepseek_moe(cfg, w, p, x):
    """DeepseekV3MoE: the routed experts weighted by the router, plus the shared experts."""
    flat = x.reshape(-1, x.shape[-1])
    chosen, weights = deepseek_router(cfg, w, p, flat)
    out = torch.zeros_like(flat)
    for e in range(cfg["n_routed_experts"]):
        token, slot = (chosen == e).nonzero(as_tuple=True)
        y = swiglu(w, f"{p}mlp.experts.{e}.", flat[token])
        out = out.index_add(0, token, y * weights[token, slot, None])
    return (out + swiglu(w, p + "mlp.shared_experts.", flat)).view(x.shape)


def deinterleave(x):
    """apply_rotary_pos_emb_interleave's view: interleaved pairs to two halves."""
    b, h, s, d = x.shape
    return x.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)


def deepseek_attention(cfg, w, p, x, cos, sin):
    """DeepseekV3Attention (rope_interleave) on x (B, T, D), float64."""
    B, T, _ = x.shape
    nh, nope, rope, vd = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"],
                          cfg["qk_rope_head_dim"], cfg["v_head_dim"])
    eps, C = 1e-6, cfg["kv_lora_rank"]  # q_a_layernorm's and kv_a_layernorm's (not rms_norm_eps)
    if cfg["q_lora_rank"]:
        qa = rms_norm(x @ w[p + "self_attn.q_a_proj.weight"].T,
                      w[p + "self_attn.q_a_layernorm.weight"], eps)
        q = qa @ w[p + "self_attn.q_b_proj.weight"].T
    else:
        q = x @ w[p + "self_attn.q_proj.weight"].T
    q = q.view(B, T, nh, nope + rope).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [nope, rope], dim=-1)
    kv = x @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T
    k_pass, k_rot = torch.split(kv, [C, rope], dim=-1)
    k_pass = (rms_norm(k_pass, w[p + "self_attn.kv_a_layernorm.weight"], eps)
              @ w[p + "self_attn.kv_b_proj.weight"].T).view(B, T, nh, nope + vd).transpose(1, 2)
    k_pass, v = torch.split(k_pass, [nope, vd], dim=-1)
    k_rot = k_rot.view(B, 1, T, rope)
    q_rot, k_rot = deinterleave(q_rot), deinterleave(k_rot)
    q_rot = q_rot * cos + rotate_half(q_rot) * sin
    k_rot = (k_rot * cos + rotate_half(k_rot) * sin).expand(*k_pass.shape[:-1], -1)
    q, k = torch.cat((q_pass, q_rot), dim=-1), torch.cat((k_pass, k_rot), dim=-1)
    scale = (nope + rope) ** -0.5
    if cfg.get("rope_scaling"):
        m = 0.1 * cfg["rope_scaling"]["mscale_all_dim"] * math.log(cfg["rope_scaling"]["factor"]) + 1
        scale *= m * m
    out = llama_ref.causal_attention(q, k, v, scale).transpose(1, 2).reshape(B, T, nh * vd)
    return out @ w[p + "self_attn.o_proj.weight"].T


def forward_deepseek(cfg, w, tokens):
    """DeepseekV3ForCausalLM's logits (B, T, vocab) for tokens (B, T), float64."""
    T = tokens.shape[1]
    rope = cfg["qk_rope_head_dim"]
    if cfg.get("rope_scaling"):
        inv, attention_factor = yarn_inv_freq(cfg, rope)
    else:
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, rope, 2, dtype=torch.float64) / rope))
        attention_factor = 1.0
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos()[None, None] * attention_factor, emb.sin()[None, None] * attention_factor
    eps = cfg["rms_norm_eps"]
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        h = h + deepseek_attention(cfg, w, p, x, cos, sin)
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + (deepseek_moe(cfg, w, p, x) if i >= cfg["first_k_dense_replace"]
                 else swiglu(w, p + "mlp.", x))
    return rms_norm(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


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
    run = forward_deepseek if cfg["model_type"] == "deepseek_v3" else forward
    ref = run(cfg, weights, tokens).flatten(0, 1).numpy()
    rel = llama_ref.relative_error(titan, ref)
    ok = titan.shape == ref.shape and rel < TOLERANCE
    print(f"{'PASS' if ok else 'FAIL'} logits of the HF export: relative error {rel:.3e} "
          f"(bound {TOLERANCE:g}), max abs {np.max(np.abs(titan - ref)):.3e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
