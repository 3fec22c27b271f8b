#!/usr/bin/env bash
# titan's FLUX loaded by diffusers itself: build/tests/dump_flux runs titan's model on seeded
# weights and a seeded batch, tests/reference/flux_diffusers.py renames the weights to
# diffusers' FluxTransformer2DModel, runs its forward on the same inputs, and compares its fp32
# prediction with titan's: relative L2 error under 1e-5, max abs error printed. Three models:
# flux-digits (width 64, RoPE axes 4/6/6), flux-debug (width 1536, FLUX.1's heads of 128 and
# axes 16/56/56, 2 double and 2 single blocks) and flux-debug's width with flux-dev's
# guidance_in (1 + 1 blocks); each as diffusers ships it (QK-norm eps 1e-6) and with titan's
# eps (1e-5, torchtitan's). Not part of `make test`: it needs diffusers (PyPI) and a torch new
# enough for it (nn.RMSNorm), in $VENV (default ~/.cache/titan-flux-venv). When
# ~/.cache/titan-peer-venv exists (torch, from scripts/bench_peer.sh) the new venv borrows its
# packages through a .pth file and adds only diffusers and h5py; otherwise it installs torch.
#
#   bash scripts/check_flux_diffusers.sh   (~2 min on 2 cores once the venv exists; 4 GB of /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-$HOME/.cache/titan-flux-venv}
PEER=${PEER:-$HOME/.cache/titan-peer-venv}
if ! "$VENV/bin/python" -c "import diffusers, h5py, torch" 2>/dev/null; then
  if [ -x "$PEER/bin/python" ]; then
    base=$("$PEER/bin/python" -c "import sys; print(sys.base_prefix)")/bin/python3
    "$base" -m venv "$VENV"
    "$PEER/bin/python" -c "import site; print(site.getsitepackages()[0])" \
      >"$("$VENV/bin/python" -c "import site; print(site.getsitepackages()[0])")/titan-peer.pth"
    "$VENV/bin/pip" install -q diffusers h5py
  else
    /usr/bin/python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch diffusers h5py numpy
  fi
fi
make -s build/tests/dump_flux
SCRATCH=$(mktemp -d /tmp/titan-flux-diffusers.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT

# name: dump_flux's arguments after the flavor (B TXT_LEN LATENT_H LATENT_W [GUIDANCE DEPTH
# DEPTH_SINGLE]); 8x12 latents make a 4x6 patch grid, so RoPE's row and column axes differ.
runs=("flux-digits 2 8 16 16" "flux-debug 2 8 8 12" "flux-debug 2 4 4 6 1 1 1")
status=0
for run in "${runs[@]}"; do
  read -r flavor b l h w extra <<<"$run"
  ./build/tests/dump_flux "$flavor" "$b" "$l" "$h" "$w" "$SCRATCH/dump.h5" $extra >/dev/null
  for eps in "" --titan-eps; do
    "$VENV/bin/python" tests/reference/flux_diffusers.py "$SCRATCH/dump.h5" $eps || status=1
  done
  rm "$SCRATCH/dump.h5"
done
exit $status
