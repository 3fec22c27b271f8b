#!/usr/bin/env bash
# titan against the real torchtitan on this cpu (scripts/peer: torchtitan 0.3.0, torch
# 2.15, the same debug model, tokenizer, documents and batch 8 x 256 per rank), as issue 14
# measures it: ROUNDS back-to-back rounds of torchtitan compiled, titan fp32 and titan bf16
# (training.mixed_precision_param), then per setup the median tokens/s (steady state, steps
# 4-30) and peak RSS, and titan's ratios to torchtitan of the same round; then titan's step by
# op class in each precision (a profiled run apiece); first the cpu's kind and ISA, and one
# core's fp32 multiply-add peak and, with avx512_bf16, its vdpbf16ps one
# (tests/bench/fma_peak.c). titan is built with NATIVE=1 (-O3 -march=native, as the peer's
# compiled kernels are for this cpu).
#   scripts/bench_peer.sh [RANKS [THREADS [ROUNDS]]]     (default 1 2 3)
# Needs the peer's venv (scripts/peer/setup_venv.sh) and a quiet machine: the ratios are
# only meaningful when nothing else runs.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-1}; THREADS=${2:-2}; ROUNDS=${3:-3}
PEER=$PWD/scripts/peer
OUT=$(mktemp -d /tmp/titan-bench-peer.XXXXXX)
make -s -j"$(nproc)" NATIVE=1 TITAN=build/native/titan build/native/titan
bash "$PEER/make_assets.sh" >/dev/null
# peer_titan.sh reads configs/ beside the binary.
mkdir -p "$OUT/bin" && cp build/native/titan "$OUT/bin/titan" && ln -s "$PWD/configs" "$OUT/bin/configs"
export OUTDIR=$OUT OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
isa=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|avx512f|avx512_bf16|amx_tile|amx_bf16' | tr '\n' ' ')
# The family and model number tell generations apart where the name does not (a VM may report
# only "AMD EPYC": family 25 is Zen 3 and 4, 26 Zen 5).
cpuinfo() { grep -m1 "^$1" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'; }
family=$(cpuinfo 'cpu family'); model=$(cpuinfo 'model\s*:')
echo "cpu: $(cpuinfo 'model name') (family $family, model $model); ISA: ${isa% }"
# The hardware's limit beside the peer: titan's GEMMs' GFLOP/s over the step's GEMM time
# (the profile below) against this.
gcc -std=c11 -D_GNU_SOURCE -O2 -march=native -ffp-contract=fast tests/bench/fma_peak.c \
  -o "$OUT/fma_peak" && "$OUT/fma_peak"
for round in $(seq "$ROUNDS"); do
  bash "$PEER/peer_torchtitan.sh" --ranks "$RANKS" --threads "$THREADS" --compile \
    --name "tt.$round" > "$OUT/tt.$round.json" 2>"$OUT/tt.$round.err"
  for p in float32 bfloat16; do
    TITAN=$OUT/bin/titan bash "$PEER/peer_titan.sh" --ranks "$RANKS" --threads "$THREADS" \
      --name "$p.$round" -- --training.mixed_precision_param "$p" > "$OUT/$p.$round.json"
  done
  grep -m1 '^kernels:' "$OUT/bfloat16.$round/train.log" > "$OUT/kernels.txt"
done
cat "$OUT/kernels.txt"
# Where titan's step goes: one more run per precision with steps 21-30 traced
# (profiling.*), each rank's mean traced step by op class (scripts/trace_breakdown.py).
for p in float32 bfloat16; do
  TITAN=$OUT/bin/titan bash "$PEER/peer_titan.sh" --ranks "$RANKS" --threads "$THREADS" \
    --name "profile.$p" -- --training.mixed_precision_param "$p" --profiling.enable_profiling \
    --profiling.profile_freq 30 --profiling.profiler_active 10 >/dev/null
  for trace in "$OUT/profile.$p"/profile_traces/iteration_30/rank*_trace.json; do
    rank=$(basename "$trace" _trace.json)
    echo "titan $p $rank, $(/usr/bin/python3 scripts/trace_breakdown.py "$trace")"
  done
done
/usr/bin/python3 - "$OUT" "$ROUNDS" "$RANKS" "$THREADS" <<'PY'
import json, statistics, sys
out, rounds, ranks, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def summary(name, r):
    lines = [l for l in open(f"{out}/{name}.{r}.json") if l.startswith("{")]
    return json.loads(lines[-1])
setups = [("tt", "torchtitan compiled"), ("float32", "titan fp32"), ("bfloat16", "titan bf16")]
runs = {k: [summary(k, r) for r in range(1, rounds + 1)] for k, _ in setups}
print(f"{ranks} rank(s) x {threads} thread(s), {rounds} rounds, medians:")
print(f"{'setup':22s} {'tokens/s':>10s} {'x torchtitan':>13s} {'peak RSS MiB':>13s}  loss@30")
for key, label in setups:
    tok = statistics.median(r["tok_s_median"] for r in runs[key])
    ratio = statistics.median(r["tok_s_median"] / t["tok_s_median"]
                              for r, t in zip(runs[key], runs["tt"]))
    rss = statistics.median(r.get("peak_rss_MiB_max_rank", float("nan")) for r in runs[key])
    loss = runs[key][-1]["loss"].get("30")
    print(f"{label:22s} {tok:10.0f} {ratio:12.2f}x {rss:13.0f}  {loss}")
PY
