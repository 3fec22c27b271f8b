"""Writes tests/data/nf4/bnb_nf4.h5, the reference of tests/unit/test_nf4.c: inputs and what
bitsandbytes' quantize_4bit(x, blocksize=64, compress_statistics=True, quant_type="nf4") and
dequantize_4bit make of them on the cpu.

  /tmp/venv-peft/bin/python tests/reference/make_nf4_fixture.py [OUT]

Needs PyPI's bitsandbytes 0.50.2 (with torch and h5py); run once by hand, outside CI, and the
file committed with its line in tests/data/SHA256SUMS. The output is deterministic (fixed
seeds, one torch thread: torch's fp32 mean splits across threads from 32768 absmaxes on).

Each case is a group holding x (the input, flattened; attribute shape), codes (the packed
4-bit codes), absmax_codes (uint8), group_absmax (state2.absmax), offset (1 float) and
dequantized (flattened); the root holds nf4_levels and dynamic_map (bnb's fp32 tables).
Cases are built to pin bitsandbytes' choices, asserted here so that a regenerated file still
pins them: a value on a level midpoint takes the lower level (64x64); full blocks multiply by
the reciprocal of their absmax (64x64), the last partial block divides by it (3x100); the
absmax codes come from quantize_cpu's 65536-point table, not the nearest map value (weights);
the offset is torch's cascade sum, not a running one (partial_group).
"""
import sys

import bitsandbytes
import bitsandbytes.functional as F
import h5py
import numpy as np
import torch

f32 = np.float32
LEVELS = F.get_4bit_type("nf4", device="cpu").numpy()
MIDPOINTS = ((LEVELS[:-1] + LEVELS[1:]) / f32(2)).astype(f32)
DYNAMIC_MAP = F.create_dynamic_map(signed=True).numpy()


def bucketize(v):
    """torch.bucketize(v, MIDPOINTS): the first midpoint >= v."""
    return np.searchsorted(MIDPOINTS, v, side="left")


def scaled_ties(rng, size):
    """A block of `size` (44 to 64) values: its absmax a, the midpoints times a and their
    neighbours, for an a where x * (1 / a) and x / a take different codes."""
    while True:
        a = f32(rng.uniform(0.5, 4))
        m = (MIDPOINTS * a).astype(f32)
        block = np.concatenate([[a], m, np.nextafter(m, f32(9)), np.nextafter(m, f32(-9)),
                                rng.uniform(-a, a, 18).astype(f32)])
        block = np.concatenate([block[:size - 14], block[46:60]]) if size < 64 else block
        if (bucketize(block / a) != bucketize(block * (f32(1) / a))).any():
            return block


def ties_64x64(rng):
    """Normal values, but the first block (absmax 1) holds each midpoint and its neighbours, and
    the second is scaled_ties: a full block multiplies by the reciprocal of its absmax."""
    x = rng.standard_normal((64, 64)).astype(f32)
    up, down = np.nextafter(MIDPOINTS, f32(2)), np.nextafter(MIDPOINTS, f32(-2))
    x[0] = np.concatenate([[f32(1)], MIDPOINTS, up, down, rng.uniform(-1, 1, 18).astype(f32)])
    x[1] = scaled_ties(rng, 64)
    return x


def divide_3x100(rng):
    """Normal values; the last, partial block (44 elements) is scaled_ties: it divides by its
    absmax."""
    x = rng.standard_normal((3, 100)).astype(f32)
    x[2, 56:] = scaled_ties(rng, 44)
    return x


def weights(rng):
    """A bf16 weight matrix as a model holds it: N(0, 0.02) with a few outliers."""
    x = rng.standard_normal(384 * 768).astype(f32) * f32(0.02)
    outliers = rng.integers(0, x.size, 60)
    x[outliers] *= rng.uniform(5, 20, outliers.size).astype(f32)
    return torch.from_numpy(x).to(torch.bfloat16).float().numpy().reshape(384, 768)


def zero_blocks(rng):
    """Zero blocks among normal ones: +0, -0, mixed zeros, and a last partial block of -0
    (whose stored absmax is torch's clamp, 1e-38)."""
    x = (rng.standard_normal(64 * 40 + 17) * 0.02).astype(f32)
    x[64:192] = 0
    x[320:384] = -0.0
    x[640:704:2], x[641:704:2] = 0, -0.0
    x[1000:1003] = -0.0
    x[64 * 40:] = -0.0
    return x


def extremes(rng):
    """Blocks of huge (1e36), subnormal (1e-40) and ordinary values."""
    scale = np.repeat(np.array([1e36, 1e-40, 1.0] * 7, dtype=f32)[:20], 64)
    return (rng.standard_normal(20 * 64) * scale).astype(f32)


def partial_group(rng):
    """516 blocks, so 2 full groups and one of 4; block scales spread over e^+-4, which makes
    the mean depend on the order of the sum."""
    n = 16384 * 2 + 64 * 3 + 5
    scale = np.repeat(np.exp(rng.uniform(-4, 4, (n + 63) // 64)), 64)[:n]
    return (rng.standard_normal(n) * 0.02 * scale).astype(f32)


def cases():
    rng = np.random.default_rng(20240519)
    return {
        "64x64": ties_64x64(rng),
        "3x100": divide_3x100(rng),
        "one": np.array([-1.25], dtype=f32),
        "partial_group": partial_group(rng),
        "weights": weights(rng),
        "zero_blocks": zero_blocks(rng),
        "extremes": extremes(rng),
        "all_zero": np.zeros(100, dtype=f32),
    }


def bnb_nf4(x):
    packed, state = F.quantize_4bit(torch.from_numpy(x), blocksize=64, compress_statistics=True,
                                    quant_type="nf4")
    dequantized = F.dequantize_4bit(packed, state).numpy().reshape(-1)
    # bnb 0.50.2's AVX-512 dequantize reads the wrong absmaxes where shape[-1] is a multiple of 16
    # but not of 64; the flat tensor takes its correct path.
    flat_packed, flat_state = F.quantize_4bit(torch.from_numpy(x.reshape(-1)), blocksize=64,
                                              compress_statistics=True, quant_type="nf4")
    flat = F.dequantize_4bit(flat_packed, flat_state).numpy().reshape(-1)
    assert np.array_equal(flat.view(np.uint32), dequantized.view(np.uint32))
    return {
        "codes": packed.numpy().reshape(-1),
        "absmax_codes": state.absmax.numpy(),
        "group_absmax": state.state2.absmax.numpy(),
        "offset": np.array([state.offset.item()], dtype=f32),
        "dequantized": dequantized,
    }


def check_pins(name, x, out):
    """Asserts that the case pins what its builder meant it to; returns whether its offset
    differs from a running fp32 sum's mean."""
    flat = x.reshape(-1)
    blocks = np.concatenate([flat, np.zeros(-flat.size % 64, f32)]).reshape(-1, 64)
    absmax = np.abs(blocks).max(1)
    if flat.size % 64:
        absmax[-1] = max(absmax[-1], f32(1e-38))
    offset = out["offset"][0]
    running = f32(0)
    for a in absmax:
        running = f32(running + a)
    nibbles = np.stack([out["codes"] >> 4, out["codes"] & 15], 1).reshape(-1)
    if name == "64x64":
        assert (nibbles[1:16] == np.arange(15)).all() and (nibbles[16:31] == np.arange(1, 16)).all()
    if name == "weights":
        inverse = (f32(1) / out["group_absmax"]).astype(f32)
        v = ((absmax - offset) * np.repeat(inverse, 256)[: absmax.size]).astype(f32)
        map_midpoints = ((DYNAMIC_MAP[:-1] + DYNAMIC_MAP[1:]) * f32(0.5)).astype(f32)
        nearest = np.searchsorted(map_midpoints, v, side="left")
        lut_only = int((nearest != out["absmax_codes"]).sum())
        print(f"weights: {lut_only} absmax codes differ from the nearest map value")
        assert lut_only > 0
    return running / f32(absmax.size) != offset


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/nf4/bnb_nf4.h5"
    torch.set_num_threads(1)
    assert bitsandbytes.__version__ == "0.50.2", bitsandbytes.__version__
    with h5py.File(out_path, "w", libver=("earliest", "v108"), track_order=False) as f:
        f.attrs["source"] = (f"bitsandbytes {bitsandbytes.__version__}, "
                             f"torch {torch.__version__}, cpu")
        f.create_dataset("nf4_levels", data=LEVELS, track_times=False)
        f.create_dataset("dynamic_map", data=DYNAMIC_MAP, track_times=False)
        cascade_pinned = []
        for name, x in cases().items():
            out = bnb_nf4(x)
            if check_pins(name, x, out):
                cascade_pinned.append(name)
            group = f.create_group(name)
            for key, value in {"x": x.reshape(-1), **out}.items():
                # One gzip chunk each; the byte shuffle helps the inputs (random mantissas
                # under few exponents), not the dequantized values (16 values a block).
                group.create_dataset(key, data=value, chunks=value.shape, compression="gzip",
                                     compression_opts=9, shuffle=key == "x", track_times=False)
            group["x"].attrs["shape"] = np.array(x.shape, dtype=np.int64)
    print("offsets that a running sum would miss:", ", ".join(cascade_pinned))
    assert "partial_group" in cascade_pinned


if __name__ == "__main__":
    main()
