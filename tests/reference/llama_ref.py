"""Independent PyTorch reference of torchtitan's Llama 3, Qwen3 (dense and MoE) and DeepSeek-V3,
to prove titan correct.

The math mirrors pytorch/torchtitan torchtitan/models/llama3/model/model.py (precompute_freqs_cis,
apply_scaling, apply_rotary_emb, repeat_kv, Attention, FeedForward, TransformerBlock, Transformer),
Qwen3's additions in torchtitan/models/common/attention.py (a head_dim of its own, QK-norm: an
RMSNorm over each head of q and of k before RoPE) and torchtitan/components/lr_scheduler.py
(build_lr_schedulers, linear_warmup_stable_decay); the MoE FFN of Qwen3-MoE from
torchtitan/models/common/moe.py (TokenChoiceTopKRouter, GroupedExperts, MoE with its
expert_bias and the optimizer pre-step hook _update_expert_bias) and DeepSeek V3's
sequence-wise balance loss; DeepSeek-V3's from torchtitan/models/deepseek_v3/model.py (Attention:
multi-head latent attention with its softmax scale), torchtitan/models/common/rope.py
(_yarn_inv_freq), the router's group-limited routing (_get_node_limited_routing_scores) and the
first n_dense_layers blocks' dense FFN.
Written for torch 1.13, which has neither nn.RMSNorm nor F.scaled_dot_product_attention, so both
are spelled out with the same formulas. The model is built from a titan checkpoint's attributes,
never from a flavor table, so the reference cannot silently disagree with titan about the shape.
"""
import glob
import math
import os
from dataclasses import dataclass

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

SHARD_MAGIC = 20240520
SHARD_HEADER_INTS = 256
SHARD_DTYPES = {1: np.uint16, 2: np.uint32}


@dataclass
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    hidden_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_pos: int = 8192
    tie_word_embeddings: bool = False
    head_dim: int = 0  # 0: dim // n_heads
    qk_norm: bool = False
    # MoE: every block's FFN is moe_experts routed experts of width moe_hidden_dim (0: dense)
    moe_experts: int = 0
    moe_top_k: int = 0
    moe_hidden_dim: int = 0
    moe_shared_hidden_dim: int = 0
    moe_score_sigmoid: bool = False
    moe_route_norm: bool = False
    moe_route_scale: float = 1.0
    moe_expert_bias: bool = False
    moe_n_groups: int = 0  # group-limited routing over this many groups (0, 1: off)
    moe_limited_groups: int = 0
    n_dense_layers: int = 0  # the first blocks keep the dense FFN of hidden_dim
    # DeepSeek-V3's multi-head latent attention (mla_kv_lora_rank > 0)
    mla_q_lora_rank: int = 0
    mla_kv_lora_rank: int = 0
    mla_qk_nope_head_dim: int = 0
    mla_qk_rope_head_dim: int = 0
    mla_v_head_dim: int = 0
    mla_mscale: float = 1.0
    mla_norm_eps: float = 0.0  # the latents' RMSNorms' (0: norm_eps)
    # YaRN RoPE scaling (yarn_factor > 1)
    yarn_factor: float = 0.0
    yarn_beta_fast: float = 0.0
    yarn_beta_slow: float = 0.0
    yarn_original_seq_len: int = 0
    mtp_layers: int = 0  # DeepSeek-V3's multi-token prediction modules

    def __post_init__(self):
        self.head_dim = self.head_dim or self.dim // self.n_heads

    @property
    def rope_dim(self):
        """The width RoPE rotates in a head: MLA's rope part, else the head."""
        return self.mla_qk_rope_head_dim if self.mla_kv_lora_rank else self.head_dim

    @classmethod
    def from_attrs(cls, attrs):
        """Reads the `model.*` root attributes of a titan checkpoint."""
        def get(name, kind):
            return kind(attrs["model." + name])

        moe = {}
        if "model.moe_experts" in attrs:  # recorded by MoE models only
            moe = dict(
                moe_experts=get("moe_experts", int), moe_top_k=get("moe_top_k", int),
                moe_hidden_dim=get("moe_hidden_dim", int),
                moe_shared_hidden_dim=get("moe_shared_hidden_dim", int),
                moe_score_sigmoid=bool(get("moe_score_sigmoid", int)),
                moe_route_norm=bool(get("moe_route_norm", int)),
                moe_route_scale=get("moe_route_scale", float),
                moe_expert_bias=bool(get("moe_expert_bias", int)))
            for name in ("moe_n_groups", "moe_limited_groups", "n_dense_layers"):
                if "model." + name in attrs:
                    moe[name] = get(name, int)
        if "model.mla_kv_lora_rank" in attrs:
            for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                         "v_head_dim"):
                moe["mla_" + name] = get("mla_" + name, int)
            moe["mla_mscale"] = get("mla_mscale", float)
            moe["mla_norm_eps"] = get("mla_norm_eps", float)
        if "model.mtp_layers" in attrs:
            moe["mtp_layers"] = get("mtp_layers", int)
        if "model.yarn_factor" in attrs:
            for name in ("factor", "beta_fast", "beta_slow"):
                moe["yarn_" + name] = get("yarn_" + name, float)
            moe["yarn_original_seq_len"] = get("yarn_original_seq_len", int)
        return cls(
            dim=get("dim", int), n_layers=get("n_layers", int), n_heads=get("n_heads", int),
            n_kv_heads=get("n_kv_heads", int), vocab_size=get("vocab_size", int),
            hidden_dim=get("hidden_dim", int) if "model.hidden_dim" in attrs else 0, norm_eps=get("norm_eps", float),
            rope_theta=get("rope_theta", float), rope_scaling=bool(get("rope_scaling", int)),
            rope_scaling_factor=get("rope_scaling_factor", float),
            rope_low_freq_factor=get("rope_low_freq_factor", float),
            rope_high_freq_factor=get("rope_high_freq_factor", float),
            rope_original_max_pos=get("rope_original_max_pos", int),
            tie_word_embeddings=bool(get("tie_word_embeddings", int)),
            # recorded only where they are not Llama 3's (Qwen3's)
            head_dim=get("head_dim", int) if "model.head_dim" in attrs else 0,
            qk_norm=bool(get("qk_norm", int)) if "model.qk_norm" in attrs else False,
            **moe,
        )


def ffn_hidden_dim(dim, multiple_of=256, ffn_dim_multiplier=None):
    """torchtitan FeedForward.__init__ with hidden_dim = 4 * dim."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def apply_rope_scaling(freqs, args):
    """torchtitan apply_scaling: Llama 3.1 long-context frequency scaling, in fp32 like it."""
    factor = args.rope_scaling_factor
    low, high = args.rope_low_freq_factor, args.rope_high_freq_factor
    low_freq_wavelen = args.rope_original_max_pos / low
    high_freq_wavelen = args.rope_original_max_pos / high
    wavelen = 2 * math.pi / freqs
    new_freqs = torch.where(wavelen > low_freq_wavelen, freqs / factor, freqs)
    smooth = (args.rope_original_max_pos / wavelen - low) / (high - low)
    mid = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(mid, (1 - smooth) * new_freqs / factor + smooth * new_freqs, new_freqs)


def apply_yarn(freqs, args, dim):
    """torchtitan _yarn_inv_freq with truncate=True (DeepSeek's), in fp32 like it."""
    def correction_dim(rotations):
        return (dim * math.log(args.yarn_original_seq_len / (rotations * 2 * math.pi))) / (
            2 * math.log(args.rope_theta))
    low = max(math.floor(correction_dim(args.yarn_beta_fast)), 0)
    high = min(math.ceil(correction_dim(args.yarn_beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return freqs / args.yarn_factor * ramp + freqs * (1 - ramp)


def rope_cos_sin(args, seqlen, dtype):
    """cos/sin of torchtitan's precompute_freqs_cis angles (seqlen, rope_dim/2).

    The angles are computed in fp32 exactly as torchtitan does (fp32 freqs, fp32 outer product);
    only then are cos/sin taken and cast, so a float64 reference rotates by torchtitan's angles.
    """
    hd = args.rope_dim
    freqs = 1.0 / (args.rope_theta ** (torch.arange(0, hd, 2)[: hd // 2].float() / hd))
    if args.rope_scaling:
        freqs = apply_rope_scaling(freqs, args)
    if args.yarn_factor > 1:
        freqs = apply_yarn(freqs, args, hd)
    angles = torch.outer(torch.arange(seqlen), freqs).float()
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def apply_rope(x, cos, sin):
    """Complex multiplication of the interleaved pairs (x[..., 2i], x[..., 2i+1]) by e^{i angle}.

    x: (B, T, heads, head_dim); cos, sin: (T, head_dim/2).
    """
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1).flatten(3)


def repeat_kv(x, n_rep):
    """torchtitan repeat_kv: query head h reads kv head h // n_rep."""
    if n_rep == 1:
        return x
    bs, slen, n_kv_heads, head_dim = x.shape
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(
        bs, slen, n_kv_heads * n_rep, head_dim)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        # A model without QK-norm has no q_norm / k_norm parameters at all.
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None

    def forward(self, x, cos, sin):
        bs, seqlen, _ = x.shape
        q = self.wq(x).view(bs, seqlen, self.n_heads, self.head_dim)
        k = self.wk(x).view(bs, seqlen, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(bs, seqlen, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        n_rep = self.n_heads // self.n_kv_heads
        q = q.transpose(1, 2)  # (bs, n_heads, seqlen, head_dim)
        k = repeat_kv(k, n_rep).transpose(1, 2)
        v = repeat_kv(v, n_rep).transpose(1, 2)
        out = causal_attention(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))


class MLA(nn.Module):
    """torchtitan's deepseek_v3 Attention: q from wq, or wq_b(q_norm(wq_a(x))); the latent c and
    the shared rope key k_pe from wkv_a; per-head k_nope and v from wkv_b(kv_norm(c)); softmax
    scale qk^-0.5, times YaRN's mscale^2 when YaRN is on."""
    def __init__(self, args):
        super().__init__()
        self.n_heads, self.args = args.n_heads, args
        R, C = args.mla_q_lora_rank, args.mla_kv_lora_rank
        self.nope, self.rope, self.vd = (args.mla_qk_nope_head_dim, args.mla_qk_rope_head_dim,
                                         args.mla_v_head_dim)
        self.qk = self.nope + self.rope
        if R:
            self.wq_a = nn.Linear(args.dim, R, bias=False)
            self.q_norm = RMSNorm(R, args.mla_norm_eps or args.norm_eps)
            self.wq_b = nn.Linear(R, args.n_heads * self.qk, bias=False)
        else:
            self.wq = nn.Linear(args.dim, args.n_heads * self.qk, bias=False)
        self.wkv_a = nn.Linear(args.dim, C + self.rope, bias=False)
        self.kv_norm = RMSNorm(C, args.mla_norm_eps or args.norm_eps)
        self.wkv_b = nn.Linear(C, args.n_heads * (self.nope + self.vd), bias=False)
        self.wo = nn.Linear(args.n_heads * self.vd, args.dim, bias=False)
        self.scale = self.qk ** -0.5
        if args.yarn_factor > 1:
            mscale = 0.1 * args.mla_mscale * math.log(args.yarn_factor) + 1.0
            self.scale *= mscale * mscale

    def forward(self, x, cos, sin):
        bs, seqlen, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))) if self.args.mla_q_lora_rank else self.wq(x)
        q = q.view(bs, seqlen, self.n_heads, self.qk)
        q_nope, q_pe = torch.split(q, [self.nope, self.rope], dim=-1)
        kv = self.wkv_a(x)
        c, k_pe = torch.split(kv, [self.args.mla_kv_lora_rank, self.rope], dim=-1)
        q = torch.cat([q_nope, apply_rope(q_pe, cos, sin)], dim=-1)
        k_pe = apply_rope(k_pe.unsqueeze(2), cos, sin)
        kv = self.wkv_b(self.kv_norm(c)).view(bs, seqlen, self.n_heads, self.nope + self.vd)
        k_nope, v = torch.split(kv, [self.nope, self.vd], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, self.n_heads, -1)], dim=-1)
        out = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                               self.scale)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))


def causal_attention(q, k, v, scale=None):
    """What torchtitan's sdpa wrapper computes with is_causal=True (scale: 1/sqrt(head dim))."""
    seqlen = q.shape[-2]
    if scale is None:
        scale = 1 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale
    future = torch.ones(seqlen, seqlen, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Router(nn.Module):
    """TokenChoiceTopKRouter's gate; the routing itself is MoE.route."""
    def __init__(self, dim, n_experts):
        super().__init__()
        self.gate = nn.Linear(dim, n_experts, bias=False)


class GroupedExperts(nn.Module):
    """Experts stacked as torchtitan's GroupedExperts: w1, w3 (E, F, D), w2 (E, D, F)."""
    def __init__(self, n_experts, dim, hidden):
        super().__init__()
        self.w1_EFD = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.w2_EDF = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w3_EFD = nn.Parameter(torch.empty(n_experts, hidden, dim))

    def expert(self, e, x):
        """Expert e's SwiGLU FFN on its tokens x (n, D)."""
        return (F.silu(x @ self.w1_EFD[e].T) * (x @ self.w3_EFD[e].T)) @ self.w2_EDF[e].T


class RoutedExperts(nn.Module):
    def __init__(self, n_experts, dim, hidden):
        super().__init__()
        self.inner_experts = GroupedExperts(n_experts, dim, hidden)


class MoE(nn.Module):
    """torchtitan's MoE as Qwen3-MoE uses it: scores = softmax|sigmoid(x Wg^T); each token's
    top k experts by scores + expert_bias (the bias steers the choice only); the chosen scores
    normalised (route_norm: / (sum + 1e-20)) and scaled are the combine weights, applied after
    the experts; plus the shared experts' dense FFN when there are any. The routing runs in
    the reference's dtype (float64 in the step check) where torchtitan runs it in fp32.

    Training state, set by the caller: aux_loss_alpha (DeepSeek V3's sequence-wise balance
    loss, 0: off), whose value the last forward leaves in aux_loss; load (E) accumulates every
    forward's slots per expert until the bias update (update_expert_bias) clears it.
    """
    def __init__(self, args):
        super().__init__()
        self.n_experts, self.top_k = args.moe_experts, args.moe_top_k
        self.sigmoid, self.route_norm = args.moe_score_sigmoid, args.moe_route_norm
        self.route_scale = args.moe_route_scale
        self.n_groups, self.limited_groups = args.moe_n_groups, args.moe_limited_groups
        self.router = Router(args.dim, args.moe_experts)
        self.routed_experts = RoutedExperts(args.moe_experts, args.dim, args.moe_hidden_dim)
        self.shared_experts = FeedForward(args.dim, args.moe_shared_hidden_dim) \
            if args.moe_shared_hidden_dim else None
        # A model without balancing has no bias at all, so no checkpoint name for it.
        if args.moe_expert_bias:
            self.register_buffer("expert_bias_E", torch.zeros(args.moe_experts))
        else:
            self.expert_bias_E = None
        self.aux_loss_alpha, self.aux_loss = 0.0, None
        self.load = torch.zeros(args.moe_experts, dtype=torch.float64)

    def route(self, x):
        """x (N, D) -> scores (N, E), experts (N, k), weights (N, k)."""
        logits = self.router.gate(x)
        scores = torch.sigmoid(logits) if self.sigmoid else torch.softmax(logits, dim=-1)
        select = scores.detach()
        if self.expert_bias_E is not None:
            select = select + self.expert_bias_E.to(select.dtype)
        if self.n_groups > 1:  # only the limited_groups groups of the best top-2 sums compete
            grouped = select.unflatten(-1, (self.n_groups, -1))
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
            keep = torch.topk(group_scores, self.limited_groups, dim=-1).indices
            mask = torch.ones_like(group_scores, dtype=torch.bool).scatter_(-1, keep, False)
            select = grouped.masked_fill(mask.unsqueeze(-1), float("-inf")).flatten(-2)
        experts = torch.topk(select, self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.route_norm:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return scores, experts, weights * self.route_scale

    def balance_loss(self, scores, experts, batch, seqlen):
        """alpha * mean over sequences of sum_i f_i P_i: f_i = E / (k T) * the sequence's slots
        on expert i (no gradient), P_i = the mean over its tokens of s_i / sum_j s_j."""
        E, k = self.n_experts, self.top_k
        probs = (scores / scores.sum(dim=-1, keepdim=True)).view(batch, seqlen, E).mean(dim=1)
        slots = torch.zeros(batch, E, dtype=scores.dtype).scatter_add_(
            1, experts.view(batch, seqlen * k), torch.ones(batch, seqlen * k, dtype=scores.dtype))
        frac = slots * E / (k * seqlen)
        return self.aux_loss_alpha * (frac * probs).sum(dim=-1).mean()

    def forward(self, x):
        bs, seqlen, dim = x.shape
        flat = x.reshape(-1, dim)
        scores, experts, weights = self.route(flat)
        self.load += torch.bincount(experts.flatten(), minlength=self.n_experts).double()
        out = torch.zeros_like(flat)
        for e in range(self.n_experts):
            token, slot = (experts == e).nonzero(as_tuple=True)
            if len(token):  # an expert no token chose contributes nothing
                y = self.routed_experts.inner_experts.expert(e, flat[token])
                out = out.index_add(0, token, y * weights[token, slot, None])
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        if self.aux_loss_alpha > 0:
            self.aux_loss = self.balance_loss(scores, experts, bs, seqlen)
        return out.view(bs, seqlen, dim)

    @torch.no_grad()
    def update_expert_bias(self, coeff):
        """torchtitan's _update_expert_bias as titan computes it (models/moe/balance.c), in
        fp32 like the bias: step = coeff * sign(mean load - load) minus its mean."""
        load = self.load.numpy()
        step = (coeff * np.sign(load.mean() - load)).astype(np.float32)
        step = (step - step.astype(np.float64).mean()).astype(np.float32)
        bias = self.expert_bias_E.numpy().astype(np.float32) + step
        self.expert_bias_E.copy_(torch.from_numpy(bias))
        self.load.zero_()


class TransformerBlock(nn.Module):
    def __init__(self, args, layer_id):
        super().__init__()
        self.attention = MLA(args) if args.mla_kv_lora_rank else Attention(args)
        # The FFN is one or the other: the block has no parameters of the one it lacks.
        moe = args.moe_experts and layer_id >= args.n_dense_layers
        self.moe = MoE(args) if moe else None
        self.feed_forward = None if moe else FeedForward(args.dim, args.hidden_dim)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        ffn = self.moe if self.moe is not None else self.feed_forward
        return h + ffn(self.ffn_norm(h))


class MTPBlock(TransformerBlock):
    """torchtitan's MTPTransformerBlock (DeepSeek-V3 multi-token prediction): the last layer's
    block over eh_proj(cat(enorm(embedding), hnorm(previous output * valid))), its output
    mtp_norm-ed."""
    def __init__(self, args):
        super().__init__(args, args.n_layers - 1)
        self.enorm = RMSNorm(args.dim, args.norm_eps)
        self.hnorm = RMSNorm(args.dim, args.norm_eps)
        self.eh_proj = nn.Linear(2 * args.dim, args.dim, bias=False)
        self.mtp_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, embed, prev, valid, cos, sin):
        prev = prev * valid[..., None]
        h = self.eh_proj(torch.cat([self.enorm(embed), self.hnorm(prev)], dim=-1))
        return self.mtp_norm(super().forward(h, cos, sin))


MASK64 = (1 << 64) - 1


def splitmix64(z):
    """splitmix64's output mixing of uint64 array z (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def rng_key(seed, name):
    """titan's core/rng.c rng_key: FNV-1a of the name mixed with the seed."""
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & MASK64
    mix = lambda z: int(splitmix64(np.array([(z + 0x9E3779B97F4A7C15) & MASK64], np.uint64))[0])
    return mix(h ^ mix(seed))


def dropout_keep(seed, n, p):
    """titan's kernels/dropout.h: which of n elements a pass seeded by seed keeps."""
    with np.errstate(over="ignore"):
        i = np.arange(1, n + 1, dtype=np.uint64)
        z = np.uint64(seed) + i * np.uint64(0x9E3779B97F4A7C15)
        bits = splitmix64(z) >> np.uint64(32)
    threshold = min(float(np.float32(p)) * 4294967296.0, 4294967295.0)
    return torch.from_numpy(bits >= np.uint64(int(threshold)))


class LoRALinear(nn.Module):
    """LoRA's adapted Linear, written from Hu et al. 2021 (eq. 3, with their alpha / r scale):
    y = x W^T + (alpha / r) (drop(x) A^T) B^T, W frozen, A (r, in) and B (out, r) trained,
    drop PEFT's lora_dropout (p) with titan's draw: the elements of x titan keeps, given the
    pass's seed (the model's dropout_seed; 0: none) and this Linear's index among the model's
    (lora_id). Its parameters are named as titan's (weight, lora_a.weight, lora_b.weight)."""
    def __init__(self, base, rank, alpha, dropout=0.0, lora_id=0, model=None):
        super().__init__()
        self.weight = nn.Parameter(base.weight.detach().clone(), requires_grad=False)
        self.lora_a = nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False)
        self.scale = alpha / rank
        self.dropout, self.lora_id = dropout, lora_id
        self.model = [model]  # not a submodule

    def forward(self, x):
        seed = getattr(self.model[0], "dropout_seed", 0)
        if self.dropout > 0 and seed:
            with np.errstate(over="ignore"):
                pass_seed = (seed * 0x9E3779B97F4A7C15 + self.lora_id) & MASK64
            keep = dropout_keep(pass_seed, x.numel(), self.dropout).reshape(x.shape)
            x_in = x * keep.to(x.dtype) / (1.0 - float(np.float32(self.dropout)))
        else:
            x_in = x
        low_rank = F.linear(F.linear(x_in, self.lora_a.weight), self.lora_b.weight)
        return F.linear(x, self.weight) + self.scale * low_rank


def lora_targets(module, targets):
    """PEFT's rule for lora.target_modules: the whole name or its end after a dot; none: all."""
    return not targets or any(module == t or module.endswith("." + t) for t in targets)


# titan's Linears of a dense layer, in its order (lora_id = 7 layer + index; output after).
LAYER_LINEARS = ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                 "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")


def lora_id(model, fqn):
    """The index of Linear fqn among titan's (its dropout's draw), for a dense GQA model."""
    if fqn == "output":
        return len(LAYER_LINEARS) * len(model.layers)
    layer, rest = fqn.split(".", 2)[1:]
    return len(LAYER_LINEARS) * int(layer) + LAYER_LINEARS.index(rest)


def apply_lora(model, lora):
    """model.converters [lora]: each nn.Linear lora.target_modules names becomes a LoRALinear,
    and every parameter but the adapters is frozen."""
    rank, alpha = int(lora["rank"]), float(lora["alpha"])
    dropout = float(lora.get("dropout") or 0.0)
    targets = list(lora.get("target_modules") or [])
    if model.output is None and lora_targets("output", targets):
        raise SystemExit("reference: LoRA on a tied output projection is not modelled")
    if dropout > 0 and (model.moe_layers() or model.args.mla_kv_lora_rank or model.mtp_layers):
        raise SystemExit("reference: LoRA dropout is modelled on dense GQA models only")
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            fqn = f"{parent_name}.{name}" if parent_name else name
            if isinstance(child, nn.Linear) and lora_targets(fqn, targets):
                setattr(parent, name, LoRALinear(child, rank, alpha, dropout,
                                                 lora_id(model, fqn), model))
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_a." in name or ".lora_b." in name)


class Transformer(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, i) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        # A tied model has no `output` parameter at all, so no checkpoint or grad name for it.
        self.output = None if args.tie_word_embeddings else nn.Linear(
            args.dim, args.vocab_size, bias=False)
        self.mtp_layers = nn.ModuleList(MTPBlock(args) for _ in range(args.mtp_layers))
        self.mtp_loss_weight = 0.3  # the run's model.mtp_loss_weight (load_checkpoint)
        self.mtp_logits = []

    def forward(self, tokens):
        """tokens (B, T) int64 -> logits (B, T, vocab); with MTP modules their logits, module k
        predicting token t + k + 1, in mtp_logits."""
        dtype = self.tok_embeddings.weight.dtype
        seqlen = tokens.shape[1]
        cos, sin = rope_cos_sin(self.args, seqlen, dtype)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        self.mtp_logits, prev = [], h
        for k, module in enumerate(self.mtp_layers, 1):  # torchtitan's roll_mtp_sequence
            shifted = torch.zeros_like(tokens)
            shifted[:, :seqlen - k] = tokens[:, k:]
            valid = torch.zeros(tokens.shape, dtype=dtype)
            valid[:, :seqlen - k] = 1
            prev = module(self.tok_embeddings(shifted), prev, valid, cos, sin)
            self.mtp_logits.append(self.project(prev))
        return self.project(self.norm(h))

    def project(self, h):
        """The output projection: the embedding's transpose when tied, else output (a module,
        which LoRA may adapt)."""
        return F.linear(h, self.tok_embeddings.weight) if self.output is None else self.output(h)

    def objective(self, logits, targets):
        """The mean cross-entropy of logits, plus with MTP modules torchtitan's MTPLoss: each
        module's summed cross-entropy over the positions with a target k ahead, over the
        main loss's token count, their mean weighing mtp_loss_weight."""
        loss = cross_entropy(logits, targets)
        if not self.mtp_logits:
            return loss
        mtp = 0
        for k, mtp_logits in enumerate(self.mtp_logits, 1):
            mtp = mtp + F.cross_entropy(mtp_logits[:, :-k].flatten(0, 1),
                                        targets[:, k:].flatten(0, 1), reduction="sum")
        return loss + self.mtp_loss_weight * mtp / targets.numel() / len(self.mtp_logits)

    def moe_layers(self):
        """The MoE layers, the main layers' then the MTP modules'."""
        return [layer.moe for layer in (*self.layers, *self.mtp_layers) if layer.moe is not None]

    def aux_loss(self):
        """The balance losses of the last forward's MoE layers (0 when off)."""
        return sum(m.aux_loss for m in self.moe_layers() if m.aux_loss is not None)

    def configure_moe(self, model_cfg):
        """The run's model.moe_* settings on the MoE layers; returns the bias coefficient."""
        if model_cfg.get("moe_capacity_factor") is not None:
            raise SystemExit("reference: model.moe_capacity_factor (dropped tokens) is not modelled")
        for m in self.moe_layers():
            m.aux_loss_alpha = float(model_cfg.get("moe_aux_loss_alpha") or 0.0)
        coeff = model_cfg.get("moe_load_balance_coeff")
        return float(coeff) if coeff is not None else 0.0

    def init_weights(self, seed):
        """torchtitan's init_weights (depth_init=True), for runs that start without a checkpoint."""
        if self.moe_layers():
            raise SystemExit("reference: init_weights of MoE layers is not modelled")
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.tok_embeddings.weight.normal_(generator=gen)
            for layer_id, layer in enumerate(self.layers):
                std = 0.02 / (2 * (layer_id + 1)) ** 0.5
                attn, ffn = layer.attention, layer.feed_forward
                for w, s in ((attn.wq, 0.02), (attn.wk, 0.02), (attn.wv, 0.02), (attn.wo, std),
                             (ffn.w1, 0.02), (ffn.w2, std), (ffn.w3, std)):
                    trunc_normal(w.weight, s, 2.0, gen)
            if self.output is not None:
                std = self.args.dim ** -0.5
                trunc_normal(self.output.weight, std, 3 * std, gen)


def trunc_normal(t, std, bound, gen):
    """Normal(0, std) resampled outside [-bound, bound] (nn.init.trunc_normal_ has no generator)."""
    t.normal_(0.0, std, generator=gen)
    while True:
        outside = t.abs() > bound
        if not outside.any():
            return
        t[outside] = torch.empty(int(outside.sum())).normal_(0.0, std, generator=gen).to(t.dtype)


def cross_entropy(logits, targets):
    """torchtitan cross_entropy_loss: mean over every token of the batch, in fp32 or wider."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))


def attr_text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def load_checkpoint(path, dtype=torch.float32):
    """A titan HDF5 checkpoint -> (Transformer with its weights, ModelArgs, config dict)."""
    with h5py.File(path, "r") as f:
        args = ModelArgs.from_attrs(f.attrs)
        config = yaml.safe_load(attr_text(f.attrs["config"]))
        model = Transformer(args)
        if "lora" in (config["model"].get("converters") or []):
            apply_lora(model, config["lora"])
        state = {}
        # the parameters, then the MoE layers' expert biases (buffers, never trained)
        for name, param in (*model.named_parameters(), *model.named_buffers()):
            key = "model/" + name
            if key not in f:
                raise SystemExit(f"{path}: missing /{key}")
            if tuple(f[key].shape) != tuple(param.shape):
                raise SystemExit(f"{path}: /{key} has shape {f[key].shape}, "
                                 f"model args say {tuple(param.shape)}")
            state[name] = torch.from_numpy(f[key][...].astype(np.float32))
    model.load_state_dict(state)
    model.mtp_loss_weight = float(config["model"].get("mtp_loss_weight", 0.3))
    return model.to(dtype), args, config


def checkpoint_step(path):
    with h5py.File(path, "r") as f:
        return int(f.attrs["step"])


def load_optimizer_state(path, model):
    """The checkpoint's AdamW moments as {param name: (exp_avg, exp_avg_sq)}, or None if absent
    (a Muon matrix: its momentum as exp_avg, exp_avg_sq None)."""
    with h5py.File(path, "r") as f:
        if "optimizer/exp_avg" not in f:
            return None
        second = f["optimizer/exp_avg_sq"]
        return {name: (torch.from_numpy(f["optimizer/exp_avg/" + name][...]),
                       torch.from_numpy(second[name][...]) if name in second else None)
                for name, p in model.named_parameters() if p.requires_grad}


def read_shard(path):
    """One llm.c token shard: 256 int32 header (magic, version, count), then the tokens."""
    header = np.fromfile(path, dtype="<i4", count=SHARD_HEADER_INTS)
    if len(header) != SHARD_HEADER_INTS or header[0] != SHARD_MAGIC:
        raise SystemExit(f"{path}: not an llm.c token shard (bad magic)")
    if int(header[1]) not in SHARD_DTYPES:
        raise SystemExit(f"{path}: unknown shard version {header[1]}")
    dtype = np.dtype(SHARD_DTYPES[int(header[1])]).newbyteorder("<")
    count = int(header[2])
    tokens = np.fromfile(path, dtype=dtype, count=count, offset=SHARD_HEADER_INTS * 4)
    if len(tokens) != count:
        raise SystemExit(f"{path}: header promises {count} tokens, file holds {len(tokens)}")
    return tokens.astype(np.int64)


def read_tokens(path):
    """A .bin shard, or a directory whose *.bin shards are concatenated in name order."""
    files = sorted(glob.glob(os.path.join(path, "*.bin"))) if os.path.isdir(path) else [path]
    if not files:
        raise SystemExit(f"{path}: no *.bin token shards")
    return np.concatenate([read_shard(p) for p in files])


def window(stream, w, seqlen):
    """Window w of the stream: tokens [w*T, w*T + T + 1), w taken modulo the number of windows."""
    n = (len(stream) - 1) // seqlen
    if n == 0:
        raise SystemExit(f"{len(stream)} tokens cannot fill one window of {seqlen + 1}")
    start = (w % n) * seqlen
    return stream[start:start + seqlen + 1]


def microbatch(stream, step, micro, accum, batch, seqlen):
    """(B, T+1) int64 tokens of microbatch `micro` of 1-based training `step`."""
    first = ((step - 1) * accum + micro) * batch
    rows = [window(stream, first + r, seqlen) for r in range(batch)]
    return torch.from_numpy(np.stack(rows))


def linear_warmup_stable_decay(current_step, warmup_steps, stable_steps, decay_steps,
                               decay_type, min_lr_factor):
    """torchtitan/components/lr_scheduler.py linear_warmup_stable_decay (the min_lr_factor version).

    LambdaLR calls it with the number of updates already taken, so update s (1-based) uses
    current_step = s - 1: warmup gives s / warmup_steps, decay progress is measured from s.
    """
    warmup_stable_steps = warmup_steps + stable_steps
    if current_step < warmup_steps:
        return float((current_step + 1) / warmup_steps)
    if current_step < warmup_stable_steps:
        return 1.0
    progress = float((current_step + 1) - warmup_stable_steps) / decay_steps
    if decay_type == "linear":
        adjustment = 1 - progress
    elif decay_type == "sqrt":
        adjustment = 1 - math.sqrt(progress)
    elif decay_type == "cosine":
        adjustment = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise SystemExit(f"unknown lr_scheduler.decay_type {decay_type!r}")
    return min_lr_factor + (1 - min_lr_factor) * adjustment


def lr_lambda(lr_cfg, training_steps):
    """The LambdaLR multiplier torchtitan's build_lr_schedulers builds from `lr_scheduler`."""
    warmup_steps = min(int(lr_cfg["warmup_steps"]), training_steps)
    if lr_cfg["decay_ratio"] is not None:
        decay_steps = round(training_steps * lr_cfg["decay_ratio"])
        decay_steps = min(decay_steps, training_steps - warmup_steps)
    else:
        decay_steps = training_steps - warmup_steps
    # torchtitan's "virtual last step" (+1) keeps the final update's lr above min_lr_factor * lr.
    stable_steps = training_steps + 1 - warmup_steps - decay_steps

    def multiplier(current_step):
        return linear_warmup_stable_decay(current_step, warmup_steps, stable_steps, decay_steps,
                                          lr_cfg["decay_type"], float(lr_cfg["min_lr_factor"]))
    return multiplier


def relative_error(a, b):
    """||a - b||_2 / ||b||_2 with b the reference (0 when both are exactly zero)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diff, ref = np.linalg.norm(a - b), np.linalg.norm(b)
    if ref == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return float(diff / ref)
