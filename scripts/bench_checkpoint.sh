#!/usr/bin/env bash
# Checkpoint throughput: the `medium` flavor's full training state (model and both AdamW
# moments, float32: 1.18 GB) saved and loaded on 1, 2, 4 and 8 ranks (dp_shard = ranks, mpirun
# --oversubscribe), beside `dd` moving the same bytes on the same disk (write with
# conv=fsync, read with the file evicted from the page cache first): the physical limits.
# Then the async save's stall: what a checkpointing step spends staging the state against a
# step's time (seq 128, global batch 8), and how long the background write took.
#   scripts/bench_checkpoint.sh [FOLDER]   (FOLDER: on the disk to measure; default /tmp)
#   TITAN=path scripts/bench_checkpoint.sh  measures another build (e.g. an older commit's)
# Save: rank 0's time from the start of the save to the end of its last barrier (the file is
# fsynced and renamed), the mean of 3 saves. Load: rank 0's time to read its shards from a
# file evicted from the page cache (dd iflag=nocache), verifying every Fletcher32 checksum.
set -euo pipefail
cd "$(dirname "$0")/.."
TITAN=${TITAN:-./titan}
[ "$TITAN" != ./titan ] || make -s titan
make -s test-data
out=$(mktemp -d "${1:-/tmp}/titan-bench-ckpt.XXXXXX")
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
"$TITAN" tokenize --tokenizer bytes --out "$out/data" build/test-data/corpus/austen.txt >/dev/null
common=(--config configs/debug_model.yaml --model.flavor medium --model.tokenizer_path null
        --training.dataset_path "$out/data" --training.global_batch_size 8
        --lr_scheduler.warmup_steps 2 --checkpoint.enable --checkpoint.last_save_model_only false
        --metrics.log_freq 1)

evict() { dd if="$1" iflag=nocache count=0 status=none; }  # drop its pages from the cache
mean() { awk '{ s += $1; n++ } END { printf "%.1f", s / n }'; }
dd_ms() {  # dd's own timing of its copy
  LC_ALL=C dd "$@" 2>&1 | sed -n 's/.*copied, \([0-9.e-]*\) s,.*/\1/p' | awk '{ print $1 * 1e3 }'
}
gbs() { awk -v b="$1" -v ms="$2" 'BEGIN { printf "%.2f", b / (ms * 1e6) }'; }  # bytes, ms

titan_on() {  # ranks, log, overrides...
  local np=$1 log=$2; shift 2
  mpirun --oversubscribe -np "$np" "$TITAN" "${common[@]}" \
    --parallelism.data_parallel_shard_degree "$np" --training.local_batch_size $((8 / np)) \
    "$@" >"$log" 2>&1 || { tail -n 5 "$log"; exit 1; }
}

printf "%-5s %9s %17s %17s %13s %13s %32s\n" ranks "state MB" "save GB/s (ms)" \
  "load GB/s (ms)" "dd write GB/s" "dd read GB/s" "async ms: stall / step / write"
for np in 1 2 4 8; do
  run=$out/r$np
  titan_on "$np" "$run.save.log" --training.steps 3 --checkpoint.interval 1 \
    --training.seq_len 16 --job.dump_folder "$run"
  bytes=$(/usr/bin/python3 -c '
import sys, h5py
f = h5py.File(sys.argv[1], "r")
sizes = []
f.visititems(lambda n, o: sizes.append(o.nbytes) if isinstance(o, h5py.Dataset) else None)
print(sum(sizes))' "$run/checkpoint/step-2.h5")
  save_ms=$(sed -n 's/.*checkpoint: saved .* in \([0-9.]*\) ms$/\1/p' "$run.save.log" | mean)
  evict "$run/checkpoint/step-2.h5"
  titan_on "$np" "$run.load.log" --training.steps 3 --checkpoint.load_step 2 \
    --training.seq_len 16 --job.dump_folder "$run"
  load_ms=$(sed -n 's/.*checkpoint: resumed from .* in \([0-9.]*\) ms$/\1/p' "$run.load.log")

  mib=$(( (bytes + 1048575) / 1048576 ))
  dd_write=$(dd_ms if=/dev/zero of="$out/dd.bin" bs=1M count=$mib conv=fsync)
  evict "$out/dd.bin"
  dd_read=$(dd_ms if="$out/dd.bin" of=/dev/null bs=1M)
  rm -f "$out/dd.bin"

  # Async: saves at steps 3 and 6; step 3's is the one training runs past (step 6's is the
  # end of training, which waits for it).
  titan_on "$np" "$run.async.log" --training.steps 6 --checkpoint.interval 3 \
    --training.seq_len 128 --checkpoint.async_mode async --job.dump_folder "$run-async"
  n='\([0-9.]*\)'
  stall=$(sed -n "s/.*step 3 staged in $n ms (a step takes $n ms), written in the \
background in $n ms.*/\1 \/ \2 \/ \3/p" "$run.async.log")
  printf "%-5s %9.1f %17s %17s %13s %13s %32s\n" "$np" \
    "$(awk -v b="$bytes" 'BEGIN { print b / 1e6 }')" \
    "$(gbs "$bytes" "$save_ms") ($save_ms)" "$(gbs "$bytes" "$load_ms") ($load_ms)" \
    "$(gbs $((mib * 1048576)) "$dd_write")" "$(gbs $((mib * 1048576)) "$dd_read")" "$stall"
done
