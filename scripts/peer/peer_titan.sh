#!/bin/bash
# titan run matched to peer_torchtitan.sh: same tokenizer ($PEER_ASSETS/austen.tiktoken), same
# JSONL documents, batch 8 x 256 per rank, torchtitan debugmodel's lr schedule
# (warmup 2, decay 0.8 linear, min 0), Llama 3.1 RoPE scaling as torchtitan's debugmodel.
# TITAN (default ./titan) reads configs/ beside it; the assets come from make_assets.sh.
#   peer_titan.sh [--ranks N] [--threads T] [--steps S] [--name NAME] [-- extra titan args]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TITAN=${TITAN:-$PWD/titan}; OUTDIR=${OUTDIR:-$PWD/peer_out}
ASSETS=$(cd "${PEER_ASSETS:-$HERE/../../build/peer/assets}" && pwd)
RANKS=1; THREADS=2; STEPS=30; NAME=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) RANKS=$2; shift 2;; --threads) THREADS=$2; shift 2;;
    --steps) STEPS=$2; shift 2;; --name) NAME=$2; shift 2;;
    --) shift; break;; *) echo "unknown option $1" >&2; exit 2;;
  esac
done
NAME=${NAME:-titan_${RANKS}x${THREADS}}
D="$OUTDIR/$NAME"; rm -rf "$D"; mkdir -p "$D"
ARGS=(--config "$(dirname "$TITAN")/configs/debug_model.yaml"
      --model.tokenizer_path "$ASSETS/austen.tiktoken" --model.rope_scaling true
      --training.dataset_path "$ASSETS/austen_docs/data.jsonl"
      --training.steps "$STEPS" --training.local_batch_size 8 --training.seq_len 256
      --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --job.dump_folder "$D")
export OMP_NUM_THREADS=$THREADS
cd "$(dirname "$TITAN")"
( while sleep 5; do cut -d' ' -f1 /proc/loadavg; done ) > "$D/load.txt" & LP=$!
set +e
if [ "$RANKS" -gt 1 ]; then
  /usr/bin/time -v -o "$D/time.txt" mpirun --allow-run-as-root --oversubscribe -np "$RANKS" \
    -x OMP_NUM_THREADS "$TITAN" "${ARGS[@]}" --parallelism.data_parallel_shard_degree "$RANKS" "$@" > "$D/train.log" 2>&1
else
  /usr/bin/time -v -o "$D/time.txt" "$TITAN" "${ARGS[@]}" "$@" > "$D/train.log" 2>&1
fi
RC=$?
set -e
kill $LP 2>/dev/null || true
echo "rc=$RC log=$D/train.log"
python3 "$HERE/summarize.py" titan "$D" "$RANKS" || true
exit $RC
