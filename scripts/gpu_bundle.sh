#!/usr/bin/env bash
# titan for a GPU machine that has the CUDA toolkit, cuDNN and NCCL but none of titan's host
# libraries (no Open MPI, HDF5, OpenBLAS, oneDNN, ...) and no package registry to fetch them from.
#
#   scripts/gpu_bundle.sh pack     here (same nvcc major as there): builds `make CUDA=1 gpu` and
#                                  writes .gpu/: the binaries, the Debian packages (.debs) of
#                                  every host library they load, resolved with ldd and dpkg -S,
#                                  and FLUX's digits (data/digits) for the layouts test.
#   scripts/gpu_bundle.sh unpack   there, in the repository root: extracts the .debs under
#                                  /tmp/titan-root (never into /: the machine's own libraries stay
#                                  as they are) and installs ./titan and build/cuda/tests/* as
#                                  wrappers that point the loader at those libraries and at the
#                                  machine's own CUDA libraries, and .gpu/path/mpirun, Open MPI's
#                                  launcher for the multi-rank layouts of one GPU
#                                  (tests/gpu/test_layouts_cuda.sh). scripts/gpu_check.sh calls
#                                  this instead of building when .gpu/ exists.
#
# Libraries the GPU machine's image already has newer versions of (glibc, libstdc++, libgcc) and
# the CUDA libraries (cuBLAS(Lt), cuDNN, NCCL, the runtime: hundreds of MB, and theirs match its
# driver) are not packed. A lone titan runs Open MPI as an isolated singleton (no mpirun); the
# packed mpirun (orterun, relocated by OPAL_PREFIX) starts several ranks on the one node.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=.gpu
ROOT=/tmp/titan-root
BINARIES=(titan tests/test_cuda_ops)  # under build/cuda
MPIRUN=/usr/bin/orterun                # Open MPI's launcher (mpirun), from openmpi-bin
CUDA_SONAMES=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2)
SYSTEM_PACKAGES=" libc6 libgcc-s1 libstdc++6 "

pack() {
  make -j"$(nproc)" CUDA=1 TITAN=build/cuda/titan gpu >/dev/null
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/debs"
  grep -qxF "/$BUNDLE/" .git/info/exclude 2>/dev/null || echo "/$BUNDLE/" >>.git/info/exclude
  local packages=(openmpi-bin openmpi-common) lib path package programs=()
  for bin in "${BINARIES[@]}"; do
    cp "build/cuda/$bin" "$BUNDLE/bin/"
    programs+=("build/cuda/$bin")
  done
  for bin in "${programs[@]}" "$MPIRUN"; do
    for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'); do
      case $lib in /usr/local/cuda*) continue ;; esac
      # dpkg knows a library by its real path or, for merged /usr, by its /usr path.
      path=$(readlink -f "$lib")
      package=$(dpkg -S "$path" 2>/dev/null || dpkg -S "/usr$path" 2>/dev/null ||
                dpkg -S "$lib" 2>/dev/null) || { echo "no package owns $lib" >&2; exit 1; }
      package=${package%%:*}
      case $SYSTEM_PACKAGES in *" $package "*) continue ;; esac
      packages+=("$package")
    done
  done
  # Open MPI's components are plugins it loads at MPI_Init; PMIx is theirs.
  packages+=(libpmix2)
  mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
  (cd "$BUNDLE/debs" && apt-get download "${packages[@]}" >/dev/null 2>&1) || {
    echo "apt-get download failed for: ${packages[*]}" >&2; exit 1; }
  # FLUX's digits for tests/gpu/test_layouts_cuda.sh: the GPU machine has no scikit-learn.
  /usr/bin/python3 scripts/flux_preprocess.py --digits --out "$BUNDLE/data/digits" >/dev/null
  echo "packed $BUNDLE: ${BINARIES[*]}, ${#packages[@]} packages and FLUX's digits" \
    "($(du -sh "$BUNDLE" | cut -f1))"
}

# wrapper PATH REAL: a script at PATH that runs REAL with the bundle's loader environment.
wrapper() {
  mkdir -p "$(dirname "$1")"
  rm -f "$1"
  cat >"$1" <<EOF
#!/bin/sh
export LD_LIBRARY_PATH="$LIB_PATH\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export OPAL_PREFIX="$ROOT/usr" OMPI_MCA_ess_singleton_isolated=1 \
       OMPI_MCA_mca_base_component_show_load_errors=0
exec "$2" "\$@"
EOF
  chmod +x "$1"
}

unpack() {
  [ -d "$BUNDLE/debs" ] || { echo "no $BUNDLE: run scripts/gpu_bundle.sh pack first" >&2; exit 1; }
  rm -rf "$ROOT"
  mkdir -p "$ROOT"
  for deb in "$BUNDLE"/debs/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
  local dirs=() soname found
  mapfile -t dirs < <(find "$ROOT" -name 'lib*.so*' -not -path '*/openmpi3/*' -not -path '*/share/*' -printf '%h\n' |
                      sort -u)
  for soname in "${CUDA_SONAMES[@]}"; do
    found=$(find /usr/local /opt /usr/lib -name "$soname" -print -quit 2>/dev/null) || true
    [ -n "$found" ] || { echo "this machine has no $soname" >&2; exit 1; }
    dirs+=("$(dirname "$found")")
  done
  LIB_PATH=$(printf '%s\n' "${dirs[@]}" | awk '!seen[$0]++' | paste -sd:)
  wrapper ./titan "$PWD/$BUNDLE/bin/titan"
  wrapper build/cuda/tests/test_cuda_ops "$PWD/$BUNDLE/bin/test_cuda_ops"
  wrapper "$BUNDLE/path/mpirun" "$ROOT$MPIRUN"
  echo "unpacked $(ls "$BUNDLE"/debs | wc -l) packages under $ROOT; CUDA libraries from:"
  printf '  %s\n' "${dirs[@]: -${#CUDA_SONAMES[@]}}"
}

case ${1:-} in
  pack) pack ;;
  unpack) unpack ;;
  *) echo "usage: scripts/gpu_bundle.sh pack|unpack" >&2; exit 2 ;;
esac
