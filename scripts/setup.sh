#!/usr/bin/env bash
# Installs the Debian packages titan's build, tests and benchmarks need, or the ones named.
# Idempotent: does nothing when everything is present, so `make test` / `make run` can call it
# every time.
set -euo pipefail

PACKAGES=(
  build-essential pkg-config
  libopenmpi-dev openmpi-bin          # launch, bootstrap, CPU collectives; mpicc
  libdnnl-dev                         # CPU bf16 GEMMs (oneDNN) for mixed precision
  libyaml-dev                         # configs
  libhdf5-openmpi-dev hdf5-tools      # checkpoints (HDF5, MPI build), h5dump
  libpcre2-dev                        # tokenizers' pre-tokenization regexes
  libjansson-dev                      # tokenizer.json, encoder.json, JSONL datasets
  zlib1g-dev                          # .jsonl.gz datasets, R data files
  libpng-dev                          # FLUX sample grids
  libmicrohttpd-dev libdw-dev curl    # the debug server: HTTP, stack symbols; its test's client
  libcmocka-dev                       # unit tests
  libfuse3-dev fuse3                  # test_disk_errors.sh's fault-injecting file system
  clang-14 libclang-rt-14-dev libomp-14-dev   # `make fuzz`: libFuzzer, its sanitizers, OpenMP
  python3-torch python3-numpy python3-h5py python3-yaml   # the PyTorch reference tests
  python3-jinja2                      # test_chat: chat templates as transformers renders them
  python3-sklearn                     # the bundled 8x8 digits of scripts/flux_preprocess.py
  python3-venv                        # test_tensorboard's venv of PyPI's tensorboard (its reader)
  python3-matplotlib                  # scripts/plot_metrics
  slurm-wlm munge                     # the one-node Slurm cluster of tests/integration/slurm.sh
)

# With arguments, installs those packages instead (scripts/bench_gemm.sh's GEMM libraries).
if [ $# -gt 0 ]; then PACKAGES=("$@"); fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
