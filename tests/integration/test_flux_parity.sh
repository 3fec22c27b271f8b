#!/usr/bin/env bash
# FLUX parity with PyTorch (tests/reference/flux_ref.py): titan's flux-debug (2 double and 2
# single blocks of width 1536) on seeded weights (torchtitan's init plus noise, so no gate is
# shut) and a seeded batch of 2 samples, 8 T5 tokens and 8x12 latents (a 4x6 patch grid, so
# RoPE's row and column axes differ), gives the float64 reference's rectified-flow loss,
# prediction and every parameter gradient within 1e-5 relative. A second, shorter run adds
# flux-dev's guidance_in at the same width (1 double, 1 single block, a 2x3 grid).
source "$(dirname "$0")/lib.sh"

./build/tests/dump_flux flux-debug 2 8 8 12 "$SCRATCH/flux.h5"
$PY tests/reference/flux_ref.py "$SCRATCH/flux.h5" | tail -1
rm "$SCRATCH/flux.h5"

./build/tests/dump_flux flux-debug 2 4 4 6 "$SCRATCH/guidance.h5" 1 1 1
out=$($PY tests/reference/flux_ref.py "$SCRATCH/guidance.h5") || { echo "$out"; fail "guidance"; }
grep -q "grad/guidance_in.out_layer.weight" <<<"$out" || fail "the guidance run has no guidance_in"
tail -1 <<<"$out"
