#!/usr/bin/env bash
# The cpu GEMM libraries on the GEMMs of one training step of the debug model
# (configs/debug_model.yaml: llama3 debugmodel, batch 4 x seq 256), to choose titan's by
# measurement. Two parts:
# (a) the step's GEMMs exactly as titan calls them: one- and two-step trainings run under
#     build/bench/sgemm_trace.so (tests/bench/sgemm_trace.c, an LD_PRELOAD shim on dnnl_sgemm,
#     titan's fp32 GEMM; attention's tiles run titan's own kernels and are not in it),
#     and the difference of their traces is one step: every call's shape, transposes, leading
#     dimensions, beta, whether it ran inside an OpenMP region (a grouped GEMM's experts, one
#     single-threaded GEMM per thread) and the function that asked (cpu_matmul's caller),
#     counted per step.
# (b) build/bench/bench_gemm (tests/bench/bench_gemm.c) times every one of those GEMMs on each
#     THREADS (default 1 and 2) with OpenBLAS sgemm (titan's until this table chose oneDNN's
#     dnnl_sgemm, still the baseline of the ratios) and sbgemm, BLIS, oneDNN's
#     dnnl_sgemm (titan's) and matmul primitives (f32, bf16; plain, and with B packed once in oneDNN's
#     layout) and libxsmm's JIT kernels (f32, bf16), checks
#     each against a double reference, and prints GFLOP/s per GEMM and library, the
#     step-weighted GEMM time per library and its ratio to OpenBLAS sgemm, and the kernels each
#     library ran. On a cpu with AMX a last table reruns the widest THREADS with oneDNN held to
#     AVX-512 (DNNL_MAX_CPU_ISA=AVX512_CORE_BF16): its bf16 numbers are what a cpu with
#     avx512_bf16 but no AMX gets. OPENBLAS_CORETYPE is left as the environment sets it.
# Other jobs on the machine slow every library alike within a round but make the totals noisy:
# the load average is printed before and after; rerun when it is above the cores.
#   scripts/bench_gemm.sh [THREADS...]
# Installs libblis-openmp-dev, libdnnl-dev and libxsmm-dev (Debian) if missing, through
# scripts/setup.sh (sudo when not root). A benchmark, not part of make test.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=("$@")
if [ $# -eq 0 ]; then threads=(1 2); fi
bash scripts/setup.sh libopenblas-openmp-dev libblis-openmp-dev libdnnl-dev libxsmm-dev
make -s titan test-data
mkdir -p build/bench
openblas=$(pkg-config --variable=libdir openblas | sed 's/openblas-pthread/openblas-openmp/')
blis=/usr/lib/x86_64-linux-gnu/blis-openmp
flags=(-std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O2 -fopenmp $(pkg-config --cflags openblas))
gcc "${flags[@]}" -fPIC -shared tests/bench/sgemm_trace.c -ldl -lpthread \
  -o build/bench/sgemm_trace.so
# OpenBLAS is linked before BLIS, which exports a cblas_sgemm of its own; -isystem keeps
# -Werror off BLIS's header and puts OpenBLAS's cblas.h first.
gcc "${flags[@]}" -isystem /usr/include/x86_64-linux-gnu/blis-openmp tests/bench/bench_gemm.c \
  -L"$openblas" -Wl,-rpath,"$openblas" -lopenblas -L"$blis" -Wl,-rpath,"$blis" -lblis -ldnnl \
  -lxsmm -lxsmmnoblas -lpthread -lrt -ldl -lm -o build/bench/bench_gemm
out=$(mktemp -d /tmp/titan-bench-gemm.XXXXXX)
trap 'rm -rf "$out"' EXIT
./titan tokenize --tokenizer bytes --out "$out/austen.bin" build/test-data/corpus/austen.txt \
  >/dev/null

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "bf16 and AMX flags: $(grep -m1 -o -w 'avx512_bf16\|amx_bf16\|amx_tile' /proc/cpuinfo | xargs)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; load average before:" \
  "$(cut -d' ' -f1-3 /proc/loadavg)"

# steps: a training of that many steps under the trace, leaving $out/trace.<steps>. In fp32,
# where every GEMM is an sgemm: under bf16 mixed precision (the default) the Linears' GEMMs go
# to oneDNN's bf16 matmul, out of the shim's sight.
trace() {
  SGEMM_TRACE="$out/trace.$1" LD_PRELOAD="$PWD/build/bench/sgemm_trace.so" OMP_NUM_THREADS=2 \
    ./titan --config configs/debug_model.yaml --model.tokenizer_path null \
    --training.mixed_precision_param float32 \
    --training.dataset_path "$out/austen.bin" --training.steps "$1" --metrics.log_freq 1 \
    --job.dump_folder "$out/run.$1" >"$out/log.$1" 2>&1 || { tail -n 5 "$out/log.$1"; exit 1; }
}
trace 1
trace 2
# One step's GEMMs, one line each as bench_gemm reads them:
#   caller ta tb m n k lda ldb ldc beta in_parallel calls
# caller: the function holding the return address (titan's symbol table, suffixes such as
# .isra.0 or ._omp_fn.0 cut), or cpu_matmul's own caller; in the order the step first calls them.
nm -n -t d titan | awk '$2 ~ /^[tTwW]$/ { print $1 + 0, $3 }' >"$out/symbols"
awk 'FNR == 1 { file++ }
     file == 1 { addr[++n] = $1; name[n] = $2; next }
     function caller(a,   lo, hi, mid) {
       lo = 1; hi = n
       while (lo < hi) {
         mid = int((lo + hi + 1) / 2)
         if (addr[mid] <= a) lo = mid; else hi = mid - 1
       }
       return name[lo]
     }
     { who = caller($12 + 0); if (who == "cpu_matmul") who = caller($13 + 0)
       sub(/\..*/, "", who)
       key = who " " $1 " " $2 " " $3 " " $4 " " $5 " " $6 " " $7 " " $8 " " $10 " " $11
       if (!(key in calls)) order[key] = ++keys
       calls[key] += file == 3 ? 1 : -1 }
     END { for (k in calls) if (calls[k]) print order[k], k, calls[k] }' \
  "$out/symbols" "$out/trace.1" "$out/trace.2" | sort -n | cut -d' ' -f2- >"$out/shapes"

echo
echo "## (a) the GEMMs of one step: $(awk '{ n += $12 } END { print n }' "$out/shapes") calls"
echo
echo "| caller | tA tB | m n k | lda ldb ldc | beta | in OpenMP | calls/step | GFLOP/step |"
echo "|---|---|---|---|---|---|---|---|"
awk '{ f = 2 * $4 * $5 * $6 * $12 / 1e9; total += f
       printf "| %s | %s %s | %d %d %d | %d %d %d | %s | %s | %d | %.3f |\n", $1,
              $2 ? "T" : "N", $3 ? "T" : "N", $4, $5, $6, $7, $8, $9, $10,
              $11 ? "yes" : "no", $12, f }
     END { printf "\ntotal %.3f GFLOP per step\n", total }' "$out/shapes"

echo
echo "## (b) the libraries"
status=0
for t in "${threads[@]}"; do
  echo
  build/bench/bench_gemm "$t" <"$out/shapes" || status=1
done
head -n 1 "$out/shapes" | ONEDNN_VERBOSE=1 build/bench/bench_gemm 1 >"$out/verbose" 2>&1 || true
echo "oneDNN's cpu: $(grep -m1 'onednn_verbose,info,cpu,isa' "$out/verbose" | cut -d: -f2)"
if grep -q -w amx_bf16 /proc/cpuinfo; then
  echo
  echo "### oneDNN held to AVX-512 (DNNL_MAX_CPU_ISA=AVX512_CORE_BF16): bf16 without AMX"
  DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 build/bench/bench_gemm "${threads[-1]}" <"$out/shapes" ||
    status=1
fi
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
