#!/bin/bash
# Reproduce the torchtitan 0.3.0 CPU peer run (Llama 3 debugmodel, austen text).
#
#   peer_torchtitan.sh [--ranks N] [--threads T] [--compile] [--steps S] [--name NAME] [-- extra torchtitan args]
#
# Defaults: 1 rank, 2 threads, eager, 30 steps, local batch 8 x seq 256.
# --ranks 2 adds --parallelism.data_parallel_shard_degree 2 (FSDP over gloo).
# Outputs in $OUTDIR/NAME (default ./peer_out/tt_<ranks>x<threads>_<eager|compile>):
#   train.log (torchtitan's log), steps.jsonl (rank 0: per-step wall/cpu time,
#   peak RSS, load average), summary printed at the end.
# All CPU patches are in run_tt.py (documented there); the config is
# tt_cpu_config.llama3_debugmodel_cpu (torchtitan's llama3_debugmodel + CPU changes).
# The tokenizer and JSONL documents are make_assets.sh's, in PEER_ASSETS (default
# build/peer/assets); the venv is setup_venv.sh's, in PEER_VENV.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY=${PY:-${PEER_VENV:-$HOME/.cache/titan-peer-venv}/bin/python}
OUTDIR=${OUTDIR:-$PWD/peer_out}
export PEER_ASSETS=$(cd "${PEER_ASSETS:-$HERE/../../build/peer/assets}" && pwd)
RANKS=1; THREADS=2; COMPILE=0; STEPS=30; NAME=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) RANKS=$2; shift 2;;
    --threads) THREADS=$2; shift 2;;
    --compile) COMPILE=1; shift;;
    --steps) STEPS=$2; shift 2;;
    --name) NAME=$2; shift 2;;
    --) shift; break;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
MODE=$([ $COMPILE = 1 ] && echo compile || echo eager)
NAME=${NAME:-tt_${RANKS}x${THREADS}_${MODE}}
D="$OUTDIR/$NAME"; rm -rf "$D"; mkdir -p "$D"


ARGS=(--module tt_cpu_config --config llama3_debugmodel_cpu --training.steps "$STEPS"
      --training.local_batch_size 8 --training.seq_len 256 --dump_folder "$D")
[ "$RANKS" -gt 1 ] && ARGS+=(--parallelism.data_parallel_shard_degree "$RANKS")
[ $COMPILE = 1 ] && ARGS+=(--compile.enable)

export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=$THREADS TT_THREADS=$THREADS TT_STEPLOG="$D/steps.jsonl"
cd "$HERE"
set +e
"$(dirname "$PY")/torchrun" --nproc_per_node "$RANKS" --standalone run_tt.py "${ARGS[@]}" "$@" > "$D/train.log" 2>&1
RC=$?
set -e
echo "rc=$RC log=$D/train.log"
"$PY" "$HERE/summarize.py" tt "$D" "$RANKS" || true
exit $RC
