#!/usr/bin/env bash
# `titan --estimate`'s predicted step time on cpu (rates probed now, kernels/device_probe.c)
# against a real run of the same config on the same machine just after: within 30% of the
# measured step (the last logged interval's tokens/s, after the first steps' warm-up), for the
# debug model in bf16 mixed precision (the default) and in fp32, on one rank and on two ranks
# sharing the host. (Float8, emulated on cpu, predicts 0.72-0.80 of its step: not held here.) Timed, so it runs alone. The machines this runs on are shared: their speed
# moves by up to 3x from one minute to the next (a training of the debug model measured 0.21 s
# and 0.41 s a step within the hour), so a pair whose estimate and run straddle such a change is
# measured again, up to three pairs; a model that is wrong fails all three.
# run_all: alone
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

RUN=(--config configs/debug_model.yaml --training.dataset_path "$DATA" --model.tokenizer_path null
     --training.steps 12 --metrics.log_freq 4 --lr_scheduler.warmup_steps 2)

# pair NAME NP ARGS...: the estimate's step time for NP ranks sharing this host, then a run's;
# prints the ratio, and fails unless it is within 30%.
pair() {
  local name=$1 np=$2; shift 2
  local predicted
  $TITAN --estimate "${RUN[@]}" "$@" --world-size "$np" --ranks-per-device "$np" \
    >"$SCRATCH/$name.estimate"
  predicted=$(sed -n 's/^step time: \([^ ]*\) s predicted.*/\1/p' "$SCRATCH/$name.estimate")
  [ -n "$predicted" ] || fail "$name: no predicted step time in $(cat "$SCRATCH/$name.estimate")"
  rm -rf "$SCRATCH/$name"
  if [ "$np" = 1 ]; then
    $TITAN "${RUN[@]}" "$@" --job.dump_folder "$SCRATCH/$name" >"$SCRATCH/$name.log" 2>&1 ||
      fail "$name: $(tail -5 "$SCRATCH/$name.log")"
  else
    train_ranks "$name" "$np" "${RUN[@]}" "$@" >/dev/null
  fi
  $PY - "$SCRATCH/$name" "$predicted" "$name" <<'PY'
import json, sys
folder, predicted, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
last = [json.loads(l) for l in open(f"{folder}/metrics.jsonl") if '"tokens_per_s"' in l][-1]
measured = 4 * 256 / last["tokens_per_s"]  # a rank's batch: local_batch_size 4 x seq_len 256
ratio = predicted / measured
print(f"{name}: predicted {predicted:.4f} s, measured {measured:.4f} s (step {last['step']}), "
      f"ratio {ratio:.2f}")
sys.exit(0 if 0.7 <= ratio <= 1.3 else 1)
PY
}

check() {  # NAME NP ARGS...: a pair within 30%, of at most three
  for attempt in 1 2 3; do pair "$@" && return; done
  fail "$1: three predictions off by more than 30%"
}

check bf16 1
check fp32 1 --training.mixed_precision_param float32
check dp2 2 --parallelism.data_parallel_shard_degree 2
echo "ok: predicted step times within 30% of measured"
