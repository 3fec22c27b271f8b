"""titan's host casts (core/float8.h, core/bf16.h) against a reference library, bit for bit.

    check_casts.py DUMP_CASTS SCRATCH_DIR [--torch]

Builds float32 inputs from every class a cast distinguishes, for e4m3fn, e5m2 and bf16 alike:
each representable value and each midpoint between neighbours (and one float either side of
both), the subnormal range, beyond max, infinities, NaNs, +-0, and a seeded sample of random
bit patterns. DUMP_CASTS (build/tests/dump_casts) casts them; the reference does the same:
ml_dtypes (numpy's astype) by default, torch's float8 dtypes with --torch. Non-saturating casts
are the library's own; saturating ones clamp to +-max first, as torchao's to_fp8_saturated
does; the scale is torchao's amax_to_scale, max / clamp(amax, min=1e-12) in float64 rounded to
float32. Every format's codes are decoded on both sides too. Prints one line per comparison and
exits 1 if any differs.
"""
import os
import subprocess
import sys

import numpy as np

EPS = 1e-12  # torchao.float8.float8_utils.EPS
FORMATS = ("e4m3fn", "e5m2")


class MlDtypes:
    def __init__(self):
        import ml_dtypes
        self.name = f"ml_dtypes {ml_dtypes.__version__}"
        self.finfo = lambda fmt: ml_dtypes.finfo(self.dtype[fmt])
        self.dtype = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
                      "bf16": ml_dtypes.bfloat16}

    def max(self, fmt):
        return float(self.finfo(fmt).max)

    def cast(self, x, fmt, saturate=False):
        if saturate:
            x = np.clip(x, -self.max(fmt), self.max(fmt))  # NaN stays NaN
        return x.astype(self.dtype[fmt]).view(np.uint16 if fmt == "bf16" else np.uint8)

    def decode(self, fmt):
        codes = np.arange(65536 if fmt == "bf16" else 256)
        codes = codes.astype(np.uint16 if fmt == "bf16" else np.uint8)
        return codes.view(self.dtype[fmt]).astype(np.float32)

    def scale(self, amax, fmt):
        return (self.max(fmt) / np.maximum(amax.astype(np.float64), EPS)).astype(np.float32)


class Torch:
    def __init__(self):
        import torch
        self.torch = torch
        self.name = f"torch {torch.__version__}"
        self.finfo = lambda fmt: torch.finfo(self.dtype[fmt])
        self.dtype = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
                      "bf16": torch.bfloat16}

    def max(self, fmt):
        return self.finfo(fmt).max

    def cast(self, x, fmt, saturate=False):
        t = self.torch.from_numpy(x)
        if saturate:
            t = t.clamp(min=-self.max(fmt), max=self.max(fmt))
        bits = self.torch.int16 if fmt == "bf16" else self.torch.uint8
        out = t.to(self.dtype[fmt]).view(bits).numpy()
        return out.view(np.uint16) if fmt == "bf16" else out

    def decode(self, fmt):
        torch = self.torch
        if fmt == "bf16":
            codes = torch.arange(65536, dtype=torch.int32).to(torch.int16)
        else:
            codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        return codes.view(self.dtype[fmt]).to(torch.float32).numpy()

    def scale(self, amax, fmt):
        a = self.torch.from_numpy(amax).to(self.torch.float64)
        return (self.max(fmt) / self.torch.clamp(a, min=EPS)).to(self.torch.float32).numpy()


def bits_to_f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def around(values):
    """Each value and the float32 either side of it, both signs."""
    v = values.astype(np.float32)
    near = np.concatenate([v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(0))])
    return np.concatenate([near, -near])


def format_classes(ref, fmt, rng):
    """(class, inputs) around the codes of one format."""
    values = ref.decode(fmt).astype(np.float64)
    finite = np.unique(np.abs(values[np.isfinite(values)]))  # from 0 to max
    past_max = 2 * finite[-1] - finite[-2]  # where the next code would be: the overflow side
    grid = np.append(finite, past_max)
    mids = (grid[:-1] + grid[1:]) / 2  # exact in float32: one bit more than the format
    smallest_normal = float(ref.finfo(fmt).smallest_normal)
    return [
        (f"{fmt} codes", around(grid)),
        (f"{fmt} midpoints", around(mids)),
        (f"{fmt} subnormal range", np.concatenate(
            [s * rng.uniform(0, smallest_normal, 100_000) for s in (1, -1)]).astype(np.float32)),
        (f"{fmt} beyond max", np.concatenate(
            [s * rng.uniform(finite[-1], 4 * past_max, 100_000) for s in (1, -1)]
        ).astype(np.float32)),
    ]


def inputs(ref):
    rng = np.random.default_rng(14)
    classes = []
    for fmt in FORMATS + ("bf16",):
        classes += format_classes(ref, fmt, rng)
    f32 = np.finfo(np.float32)
    nan_payloads = np.concatenate([[0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA00000, 0x7FBFFFFF],
                                   rng.integers(0x7F800001, 0x80000000, 1000)])
    classes += [
        ("+-0, infinities, float32 extremes", np.array(
            [0.0, -0.0, np.inf, -np.inf, f32.max, -f32.max, f32.smallest_normal,
             -f32.smallest_normal, f32.smallest_subnormal, -f32.smallest_subnormal], np.float32)),
        ("NaN payloads, both signs", bits_to_f32(np.concatenate(
            [nan_payloads, nan_payloads | 0x80000000]).astype(np.uint32))),
        ("float32 subnormals", bits_to_f32(rng.integers(0, 1 << 23, 100_000) |
                                           (rng.integers(0, 2, 100_000) << 31))),
        ("random bit patterns", bits_to_f32(rng.integers(0, 1 << 32, 4_000_000))),
        # Random sign and mantissa at exponents 2^-30 .. 2^17: where the float8 casts round.
        ("random in float8 range", bits_to_f32((rng.integers(0, 1 << 32, 1_000_000) & 0x807FFFFF) |
                                               (rng.integers(97, 145, 1_000_000) << 23))),
    ]
    return classes


def compare(what, titan, ref, classes, is_nan):
    """One line: equal bit for bit, or the differences by input class."""
    diff = titan != ref
    if not diff.any():
        print(f"ok: {what}: {len(ref)} equal bit for bit")
        return True
    both_nan = diff & is_nan(titan) & is_nan(ref)
    by_class, start = [], 0
    for name, x in classes:
        n = int(diff[start:start + len(x)].sum())
        if n:
            by_class.append(f"{name} {n}")
        start += len(x)
    first = np.flatnonzero(diff)[:3]
    print(f"FAIL {what}: {int(diff.sum())} of {len(ref)} differ ({int(both_nan.sum())} of them "
          f"NaN on both sides, other bits); by class: {', '.join(by_class) or 'decoded codes'}; "
          f"first at {first.tolist()}: titan {[hex(v) for v in titan[first]]}, "
          f"reference {[hex(v) for v in ref[first]]}")
    return False


def main():
    dump_casts, scratch = sys.argv[1], sys.argv[2]
    ref = Torch() if "--torch" in sys.argv[3:] else MlDtypes()
    with np.errstate(all="ignore"):  # bf16's next value past max is float32's infinity
        classes = inputs(ref)
    x = np.concatenate([c for _, c in classes]).astype(np.float32)
    x.tofile(os.path.join(scratch, "inputs.f32"))
    subprocess.run([dump_casts, os.path.join(scratch, "inputs.f32"), scratch], check=True)
    load = lambda name, dtype: np.fromfile(os.path.join(scratch, name), dtype=dtype)
    print(f"{len(x)} float32 inputs against {ref.name}")

    f32_nan = lambda bits: np.isnan(bits.view(np.float32))
    ok = True
    with np.errstate(all="ignore"):
        for fmt in FORMATS:
            decoded = load(f"decode_{fmt}.f32", np.float32)
            nan_codes = np.flatnonzero(np.isnan(decoded))
            f8_nan = lambda codes: np.isin(codes, nan_codes)
            for sat in (False, True):
                name = f"{fmt}{'_sat' if sat else ''}"
                ok &= compare(f"{fmt} {'saturating' if sat else 'non-saturating'}",
                              load(f"{name}.u8", np.uint8), ref.cast(x, fmt, sat), classes, f8_nan)
            ok &= compare(f"{fmt} scale from amax", load(f"scale_{fmt}.f32", np.uint32),
                          ref.scale(x, fmt).view(np.uint32), classes, f32_nan)
            ok &= compare(f"{fmt} decoded codes", load(f"decode_{fmt}.f32", np.uint32),
                          ref.decode(fmt).view(np.uint32), [], f32_nan)
        bf16_nan = lambda codes: ((codes & 0x7F80) == 0x7F80) & ((codes & 0x7F) != 0)
        ok &= compare("bf16", load("bf16.u16", np.uint16), ref.cast(x, "bf16"), classes, bf16_nan)
        ok &= compare("bf16 decoded codes", load("decode_bf16.f32", np.uint32),
                      ref.decode("bf16").view(np.uint32), [], f32_nan)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
