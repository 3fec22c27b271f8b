"""titan's FLUX prediction against diffusers' FluxTransformer2DModel loaded with titan's weights.

Where flux_ref.py re-derives torchtitan's math, this runs the implementation most FLUX users run:
diffusers' FluxTransformer2DModel (PyPI), built from the dump's model.* attributes and loaded
with its /model weights renamed by diffusers_names() below (diffusers' own
convert_flux_transformer_checkpoint_to_diffusers and torchtitan's FluxStateDictAdapter spell the
same renaming, but for FLUX.1's width only): qkv and linear1 split into to_q / to_k / to_v
(/ proj_mlp), the final layer's adaLN rows swapped from (shift, scale) to diffusers' (scale,
shift). Its forward is fed what titan's model fed itself: x_t = (1 - t) latents + t noise packed
into patches, the T5 and CLIP encodings, the timestep t in [0, 1] (diffusers multiplies it, and
the guidance, by 1000, as FLUX's time_factor does), img_ids (0, row, column) and zero txt_ids.

One setting differs from titan by construction: the QK RMSNorm's eps, 1e-6 in diffusers (and Black
Forest Labs' FLUX), 1e-5 in torchtitan's QKNorm (nn_modules.RMSNorm.Config) and so in titan.
diffusers' model runs as shipped; --titan-eps sets its QK norms to 1e-5, to show what the
difference alone costs.

usage: python tests/reference/flux_diffusers.py DUMP.h5 [--float64] [--titan-eps]

DUMP.h5 is written by build/tests/dump_flux. Prints the relative L2 and the max abs error of
titan's /output against diffusers' prediction (fp32 by default, --float64 for the model in
float64); exit 1 when the relative L2 error is 1e-5 or more.
"""
import argparse
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flux_ref import FluxArgs, latent_ids, pack_latents  # noqa: E402
from llama_ref import relative_error  # noqa: E402

import diffusers  # noqa: E402
from diffusers import FluxTransformer2DModel  # noqa: E402

TOLERANCE = 1e-5
TITAN_QK_EPS = 1e-5  # models/flux/layers.c QK_NORM_EPS


def diffusers_config(a):
    if a.mlp_ratio != 4.0:
        raise SystemExit(f"diffusers' FLUX has mlp_ratio 4, the dump {a.mlp_ratio}")
    if a.theta != 10000:
        raise SystemExit(f"diffusers' FLUX has RoPE theta 10000, the dump {a.theta}")
    head_dim = a.hidden_size // a.num_heads
    return dict(patch_size=1, in_channels=a.in_channels, out_channels=a.out_channels,
                num_layers=a.depth, num_single_layers=a.depth_single_blocks,
                attention_head_dim=head_dim, num_attention_heads=a.num_heads,
                joint_attention_dim=a.context_in_dim, pooled_projection_dim=a.vec_in_dim,
                guidance_embeds=a.guidance_embed, axes_dims_rope=tuple(a.axes_dim))


def swap_shift_scale(w):
    """Black Forest Labs' final adaLN emits (shift, scale); diffusers' AdaLayerNormContinuous
    reads (scale, shift)."""
    shift, scale = np.split(w, 2, axis=0)
    return np.concatenate([scale, shift], axis=0)


def diffusers_names(w, a):
    """diffusers' state dict from titan's (torchtitan's fully-qualified names), numpy arrays."""
    D, M = a.hidden_size, int(a.hidden_size * a.mlp_ratio)
    out = {}

    def linear(dst, src):
        out[dst + ".weight"] = w.pop(src + ".weight")
        out[dst + ".bias"] = w.pop(src + ".bias")

    def split(dsts, src, sizes):
        """src's rows cut into dsts; a missing bias (qkv_bias false) becomes zeros, since
        diffusers' projections always have one."""
        weight = w.pop(src + ".weight")
        bias = w.pop(src + ".bias", np.zeros(weight.shape[0], weight.dtype))
        cuts = np.cumsum(sizes)[:-1]
        for dst, wp, bp in zip(dsts, np.split(weight, cuts), np.split(bias, cuts)):
            out[dst + ".weight"], out[dst + ".bias"] = wp, bp

    linear("x_embedder", "img_in")
    linear("context_embedder", "txt_in")
    embedders = [("timestep_embedder", "time_in"), ("text_embedder", "vector_in")]
    if a.guidance_embed:
        embedders.append(("guidance_embedder", "guidance_in"))
    for dst, src in embedders:
        linear(f"time_text_embed.{dst}.linear_1", f"{src}.in_layer")
        linear(f"time_text_embed.{dst}.linear_2", f"{src}.out_layer")
    for i in range(a.depth):
        d, s = f"transformer_blocks.{i}", f"double_blocks.{i}"
        for stream, norm, q, k, v, proj, ff, pre in (
                ("img", "norm1", "to_q", "to_k", "to_v", "to_out.0", "ff", ""),
                ("txt", "norm1_context", "add_q_proj", "add_k_proj", "add_v_proj",
                 "to_add_out", "ff_context", "added_")):
            linear(f"{d}.{norm}.linear", f"{s}.{stream}_mod.lin")
            split([f"{d}.attn.{q}", f"{d}.attn.{k}", f"{d}.attn.{v}"], f"{s}.{stream}_attn.qkv",
                  [D, D, D])
            out[f"{d}.attn.norm_{pre}q.weight"] = w.pop(f"{s}.{stream}_attn.norm.query_norm.weight")
            out[f"{d}.attn.norm_{pre}k.weight"] = w.pop(f"{s}.{stream}_attn.norm.key_norm.weight")
            linear(f"{d}.attn.{proj}", f"{s}.{stream}_attn.proj")
            linear(f"{d}.{ff}.net.0.proj", f"{s}.{stream}_mlp.0")
            linear(f"{d}.{ff}.net.2", f"{s}.{stream}_mlp.2")
    for i in range(a.depth_single_blocks):
        d, s = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        linear(f"{d}.norm.linear", f"{s}.modulation.lin")
        split([f"{d}.attn.to_q", f"{d}.attn.to_k", f"{d}.attn.to_v", f"{d}.proj_mlp"],
              f"{s}.linear1", [D, D, D, M])
        out[f"{d}.attn.norm_q.weight"] = w.pop(f"{s}.norm.query_norm.weight")
        out[f"{d}.attn.norm_k.weight"] = w.pop(f"{s}.norm.key_norm.weight")
        linear(f"{d}.proj_out", f"{s}.linear2")
    linear("proj_out", "final_layer.linear")
    out["norm_out.linear.weight"] = swap_shift_scale(w.pop("final_layer.adaLN_modulation.1.weight"))
    out["norm_out.linear.bias"] = swap_shift_scale(w.pop("final_layer.adaLN_modulation.1.bias"))
    if w:
        raise SystemExit(f"titan parameters with no diffusers name: {sorted(w)}")
    return out


def main(argv):
    parser = argparse.ArgumentParser(description="titan's FLUX output vs diffusers'")
    parser.add_argument("dump", help="written by build/tests/dump_flux")
    parser.add_argument("--float64", action="store_true", help="run diffusers in float64")
    parser.add_argument("--titan-eps", action="store_true",
                        help="set diffusers' QK-norm eps (1e-6) to titan's (1e-5)")
    opt = parser.parse_args(argv[1:])
    torch.set_num_threads(os.cpu_count() or 1)
    # quiet its advice against casting with to(), meant for checkpoints keeping modules in fp32
    diffusers.utils.logging.set_verbosity_error()
    dtype = torch.float64 if opt.float64 else torch.float32
    with h5py.File(opt.dump, "r") as dump:
        a = FluxArgs.from_attrs(dump.attrs)
        weights = {name: dump["model"][name][...] for name in dump["model"]}
        batch = {k: torch.from_numpy(v[...]) for k, v in dump["batch"].items()}
        titan = dump["output"][...]
    model = FluxTransformer2DModel(**diffusers_config(a)).eval()
    state = {k: torch.from_numpy(v) for k, v in diffusers_names(weights, a).items()}
    model.load_state_dict(state, strict=True)  # raises on any name or shape diffusers lacks
    if opt.titan_eps:
        for module in model.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.eps = TITAN_QK_EPS
    model = model.to(dtype)

    x, noise, t = batch["latents"], batch["noise"], batch["t"]
    sigmas = t.view(-1, 1, 1, 1)
    h, w_ = x.shape[2:]
    with torch.no_grad():
        pred = model(hidden_states=pack_latents((1 - sigmas) * x + sigmas * noise).to(dtype),
                     encoder_hidden_states=batch["txt"].to(dtype),
                     pooled_projections=batch["clip"].to(dtype), timestep=t.to(dtype),
                     img_ids=latent_ids(1, h, w_)[0].to(dtype),
                     txt_ids=torch.zeros(batch["txt"].shape[1], 3, dtype=dtype),
                     guidance=batch["guidance"].to(dtype) if a.guidance_embed else None,
                     return_dict=False)[0]
    ref = pred.flatten(0, 1).double().numpy()
    rel = relative_error(titan, ref)
    err = np.abs(titan.astype(np.float64) - ref)
    ok = rel < TOLERANCE
    print(f"{'PASS' if ok else 'FAIL'} diffusers {diffusers.__version__} FluxTransformer2DModel "
          f"({'float64' if opt.float64 else 'float32'}, QK-norm eps "
          f"{'1e-5 as titan' if opt.titan_eps else '1e-6 as shipped'}) vs titan: "
          f"{a.hidden_size} wide, {a.num_heads} heads of {a.hidden_size // a.num_heads} "
          f"(RoPE {'/'.join(map(str, a.axes_dim))}), {a.depth}+{a.depth_single_blocks} blocks"
          f"{', guidance_in' if a.guidance_embed else ''}; {ref.shape[0]} tokens x {ref.shape[1]}:"
          f" relative L2 {rel:.3e}, max abs {err.max():.3e} (max |out| {np.abs(ref).max():.2f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
