"""Independent PyTorch reference of torchtitan's FLUX.1 MMDiT and its rectified-flow loss, to prove
titan's models/flux correct.

The math mirrors pytorch/torchtitan torchtitan/models/flux/model/{layers.py,model.py} (rope,
apply_rope, EmbedND, timestep_embedding, MLPEmbedder, QKNorm, Modulation, DoubleStreamBlock,
SingleStreamBlock, LastLayer, FluxModel.forward), flux/utils.py (pack_latents,
create_position_encoding_for_latents) and flux/trainer.py forward_backward_step (x_t = (1 - t) x +
t noise, target noise - x, MSELoss: the sum of squares over the number of latent elements);
guidance_in is Black Forest Labs' FLUX.1-dev embedder of the guidance scale, summed into vec.
Module names follow torchtitan's, so named_parameters() gives its fully-qualified names. Written
for torch 1.13 (no F.scaled_dot_product_attention: attention is spelled out). The model is built
from the dump's model.* attributes, never from a flavor table.

usage: /usr/bin/python3 tests/reference/flux_ref.py DUMP.h5

DUMP.h5 is written by build/tests/dump_flux. The reference runs in float64 from titan's fp32
weights and batch, except the angles of the sinusoidal timestep (and guidance) embedding, which
torchtitan computes in fp32 (time_factor * t reaches 1000 rad, 5000 for a guidance of 5, so
fp32's rounding of the angle shows in its cosine: it is part of the function) and the reference
rounds as torch does; the measured error is then titan's fp32 error alone. Bound: relative L2
error < 1e-5 on the loss, the prediction and every parameter gradient. Exit 1 on failure.
"""
import math
import os
import sys
from dataclasses import dataclass

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import relative_error  # noqa: E402

TOLERANCE = 1e-5
PATCH = 2


@dataclass
class FluxArgs:
    in_channels: int
    out_channels: int
    vec_in_dim: int
    context_in_dim: int
    hidden_size: int
    mlp_ratio: float
    num_heads: int
    depth: int
    depth_single_blocks: int
    axes_dim: tuple
    theta: float
    qkv_bias: bool
    guidance_embed: bool

    @classmethod
    def from_attrs(cls, attrs):
        def get(name):
            return attrs["model." + name]

        return cls(
            in_channels=int(get("in_channels")), out_channels=int(get("out_channels")),
            vec_in_dim=int(get("vec_in_dim")), context_in_dim=int(get("context_in_dim")),
            hidden_size=int(get("hidden_size")), mlp_ratio=float(get("mlp_ratio")),
            num_heads=int(get("num_heads")), depth=int(get("depth")),
            depth_single_blocks=int(get("depth_single_blocks")),
            axes_dim=tuple(int(get(f"axes_dim_{i}")) for i in range(3)),
            theta=float(get("theta")), qkv_bias=bool(get("qkv_bias")),
            guidance_embed=bool(get("guidance_embed")))


def rope(pos, dim, theta):
    scale = torch.arange(0, dim, 2, dtype=pos.dtype) / dim
    omega = 1.0 / (theta ** scale)
    out = torch.einsum("...n,d->...nd", pos, omega)
    out = torch.stack([torch.cos(out), -torch.sin(out), torch.sin(out), torch.cos(out)], dim=-1)
    return out.reshape(*out.shape[:-1], 2, 2)


def apply_rope(xq, xk, freqs_cis):
    xq_ = xq.reshape(*xq.shape[:-1], -1, 1, 2)
    xk_ = xk.reshape(*xk.shape[:-1], -1, 1, 2)
    xq_out = freqs_cis[..., 0] * xq_[..., 0] + freqs_cis[..., 1] * xq_[..., 1]
    xk_out = freqs_cis[..., 0] * xk_[..., 0] + freqs_cis[..., 1] * xk_[..., 1]
    return xq_out.reshape(*xq.shape), xk_out.reshape(*xk.shape)


def embed_nd(ids, axes_dim, theta):
    """EmbedND: (B, L, 1, hd/2, 2, 2) rotations from ids (B, L, 3)."""
    emb = torch.cat([rope(ids[..., i], axes_dim[i], theta) for i in range(ids.shape[-1])], dim=-3)
    return emb.unsqueeze(2)


def timestep_embedding(t, dim, max_period=10000, time_factor=1000.0):
    """torchtitan's, whose angles are fp32 (t is): each arithmetic step rounded to fp32 as torch
    rounds it (the Python scalars first), exp correctly rounded (torch's vectorised fp32 exp is
    within an ulp, not always the nearest float: one ulp of a frequency moves a 5000-radian
    guidance angle by 3e-4), cos and sin in float64."""
    f32 = torch.float32
    half = dim // 2
    exponent = torch.tensor(-math.log(max_period), dtype=f32) * torch.arange(0, half, dtype=f32)
    freqs = torch.exp((exponent / half).double()).float()
    args = (torch.tensor(time_factor, dtype=f32) * t.float())[:, None] * freqs[None]
    args = args.double()
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def layer_norm(x):
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6)


def attention(q, k, v):
    """Non-causal attention; q, k, v (B, L, H, hd) -> (B, L, H*hd)."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).flatten(2)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class QKNorm(nn.Module):
    def __init__(self, head_dim):
        super().__init__()
        self.query_norm = RMSNorm(head_dim)
        self.key_norm = RMSNorm(head_dim)


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim, hidden):
        super().__init__()
        self.in_layer = nn.Linear(in_dim, hidden)
        self.out_layer = nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.out_layer(F.silu(self.in_layer(x)))


class Modulation(nn.Module):
    def __init__(self, dim, chunks):
        super().__init__()
        self.chunks = chunks
        self.lin = nn.Linear(dim, chunks * dim)

    def forward(self, vec):
        return self.lin(F.silu(vec))[:, None, :].chunk(self.chunks, dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, qkv_bias):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.norm = QKNorm(dim // heads)
        self.proj = nn.Linear(dim, dim)

    def qk(self, x):
        """q, k (normed), v (B, L, H, hd) of x."""
        B, L, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, L, 3, self.heads, -1).permute(2, 0, 1, 3, 4)
        return self.norm.query_norm(q), self.norm.key_norm(k), v


class DoubleStreamBlock(nn.Module):
    def __init__(self, a):
        super().__init__()
        D, M = a.hidden_size, int(a.hidden_size * a.mlp_ratio)
        for stream in ("img", "txt"):
            setattr(self, f"{stream}_mod", Modulation(D, 6))
            setattr(self, f"{stream}_attn", SelfAttention(D, a.num_heads, a.qkv_bias))
            setattr(self, f"{stream}_mlp", nn.Sequential(nn.Linear(D, M),
                                                           nn.GELU(approximate="tanh"),
                                                           nn.Linear(M, D)))

    def forward(self, img, txt, vec, pe):
        i_shift1, i_scale1, i_gate1, i_shift2, i_scale2, i_gate2 = self.img_mod(vec)
        t_shift1, t_scale1, t_gate1, t_shift2, t_scale2, t_gate2 = self.txt_mod(vec)
        iq, ik, iv = self.img_attn.qk((1 + i_scale1) * layer_norm(img) + i_shift1)
        tq, tk, tv = self.txt_attn.qk((1 + t_scale1) * layer_norm(txt) + t_shift1)
        q, k = apply_rope(torch.cat((tq, iq), 1), torch.cat((tk, ik), 1), pe)
        attn = attention(q, k, torch.cat((tv, iv), 1))
        txt_attn, img_attn = attn[:, :txt.shape[1]], attn[:, txt.shape[1]:]
        img = img + i_gate1 * self.img_attn.proj(img_attn)
        img = img + i_gate2 * self.img_mlp((1 + i_scale2) * layer_norm(img) + i_shift2)
        txt = txt + t_gate1 * self.txt_attn.proj(txt_attn)
        txt = txt + t_gate2 * self.txt_mlp((1 + t_scale2) * layer_norm(txt) + t_shift2)
        return img, txt


class SingleStreamBlock(nn.Module):
    def __init__(self, a):
        super().__init__()
        D = a.hidden_size
        self.dim, self.heads, self.mlp = D, a.num_heads, int(D * a.mlp_ratio)
        self.linear1 = nn.Linear(D, 3 * D + self.mlp)
        self.linear2 = nn.Linear(D + self.mlp, D)
        self.norm = QKNorm(D // a.num_heads)
        self.modulation = Modulation(D, 3)

    def forward(self, x, vec, pe):
        shift, scale, gate = self.modulation(vec)
        qkv, mlp = torch.split(self.linear1((1 + scale) * layer_norm(x) + shift),
                               [3 * self.dim, self.mlp], dim=-1)
        B, L, _ = x.shape
        q, k, v = qkv.reshape(B, L, 3, self.heads, -1).permute(2, 0, 1, 3, 4)
        q, k = apply_rope(self.norm.query_norm(q), self.norm.key_norm(k), pe)
        out = self.linear2(torch.cat((attention(q, k, v), F.gelu(mlp, approximate="tanh")), 2))
        return x + gate * out


class LastLayer(nn.Module):
    def __init__(self, a):
        super().__init__()
        D = a.hidden_size
        self.linear = nn.Linear(D, a.out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(D, 2 * D))

    def forward(self, x, vec):
        shift, scale = self.adaLN_modulation(vec).chunk(2, dim=1)
        return self.linear((1 + scale[:, None, :]) * layer_norm(x) + shift[:, None, :])


class Flux(nn.Module):
    def __init__(self, a):
        super().__init__()
        D = a.hidden_size
        self.args = a
        self.img_in = nn.Linear(a.in_channels, D)
        self.time_in = MLPEmbedder(256, D)
        self.vector_in = MLPEmbedder(a.vec_in_dim, D)
        if a.guidance_embed:
            self.guidance_in = MLPEmbedder(256, D)
        self.txt_in = nn.Linear(a.context_in_dim, D)
        self.double_blocks = nn.ModuleList([DoubleStreamBlock(a) for _ in range(a.depth)])
        self.single_blocks = nn.ModuleList([SingleStreamBlock(a)
                                            for _ in range(a.depth_single_blocks)])
        self.final_layer = LastLayer(a)

    def forward(self, img, img_ids, txt, txt_ids, timesteps, y, guidance=None):
        img = self.img_in(img)
        vec = self.time_in(timestep_embedding(timesteps, 256)) + self.vector_in(y)
        if self.args.guidance_embed:
            vec = vec + self.guidance_in(timestep_embedding(guidance, 256))
        txt = self.txt_in(txt)
        pe = embed_nd(torch.cat((txt_ids, img_ids), 1), self.args.axes_dim, self.args.theta)
        for block in self.double_blocks:
            img, txt = block(img, txt, vec, pe)
        x = torch.cat((txt, img), 1)
        for block in self.single_blocks:
            x = block(x, vec, pe)
        return self.final_layer(x[:, txt.shape[1]:], vec)


def pack_latents(x):
    """torchtitan's pack_latents: "b c (h ph) (w pw) -> b (h w) (c ph pw)"."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // PATCH, PATCH, w // PATCH, PATCH).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // PATCH) * (w // PATCH), c * PATCH * PATCH)


def latent_ids(b, h, w):
    """create_position_encoding_for_latents: (0, row, column) of each patch."""
    ids = torch.zeros(h // PATCH, w // PATCH, 3, dtype=torch.float64)
    ids[..., 1] = torch.arange(h // PATCH, dtype=torch.float64)[:, None]
    ids[..., 2] = torch.arange(w // PATCH, dtype=torch.float64)[None, :]
    return ids.reshape(1, -1, 3).repeat(b, 1, 1)


def flow_loss(model, batch):
    """The rectified-flow loss and the prediction (B*N, C) of one batch (float64 tensors)."""
    x, noise, t = batch["latents"], batch["noise"], batch["t"]
    sigmas = t.view(-1, 1, 1, 1)
    latents = pack_latents((1 - sigmas) * x + sigmas * noise)
    target = pack_latents(noise - x)
    b, _, h, w = x.shape
    txt = batch["txt"]
    pred = model(latents, latent_ids(b, h, w), txt, torch.zeros(b, txt.shape[1], 3,
                 dtype=torch.float64), t, batch["clip"], batch.get("guidance"))
    loss = ((pred - target) ** 2).sum() / target.numel()
    return loss, pred.flatten(0, 1)


def load(dump):
    """The model (float64) with the dump's weights, and its batch."""
    model = Flux(FluxArgs.from_attrs(dump.attrs)).double()
    names = {name for name, _ in model.named_parameters()}
    if names != set(dump["model"].keys()):
        raise SystemExit(f"parameters differ: titan only {sorted(set(dump['model']) - names)}, "
                         f"reference only {sorted(names - set(dump['model']))}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(dump["model"][name][...]))
    batch = {k: torch.from_numpy(v[...]).double() for k, v in dump["batch"].items()}
    return model, batch


def compare(name, titan, ref):
    """Prints one line; returns whether the tensor is within the bound."""
    titan = np.asarray(titan, dtype=np.float64)
    if titan.shape != ref.shape:
        print(f"FAIL {name:52s} shape {titan.shape} != reference {ref.shape}")
        return False
    rel = relative_error(titan, ref)
    ok = rel < TOLERANCE
    print(f"{'ok  ' if ok else 'FAIL'} {name:52s} rel {rel:.3e}")
    return ok


def main(argv):
    if len(argv) != 2:
        raise SystemExit("usage: /usr/bin/python3 tests/reference/flux_ref.py DUMP.h5")
    torch.set_num_threads(os.cpu_count() or 1)
    with h5py.File(argv[1], "r") as dump:
        model, batch = load(dump)
        loss, pred = flow_loss(model, batch)
        loss.backward()
        ok = compare("loss", dump["loss"][...].reshape(()), np.float64(loss.item()))
        ok &= compare("output", dump["output"][...], pred.detach().numpy())
        for name, p in model.named_parameters():
            ok &= compare("grad/" + name, dump["grad/" + name][...], p.grad.numpy())
    print("PASS" if ok else "FAIL", f"(bound: relative error < {TOLERANCE:g} vs float64 reference)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
