#!/usr/bin/env bash
# Bad input: each case exits 2 with one line naming the file, line/column or key. No crash,
# no hang, no lost checkpoint.
source "$(dirname "$0")/lib.sh"

printf 'training:\n  steps: [1, 2\n' >"$SCRATCH/malformed.yaml"
expect_user_error "malformed.yaml:[0-9]+:[0-9]+: " $TITAN --config "$SCRATCH/malformed.yaml"

printf 'training:\n  stpes: 10\n' >"$SCRATCH/unknown.yaml"
expect_user_error "unknown.yaml:2:3: unknown key 'training.stpes' \(did you mean 'training.steps'\?\)" \
  $TITAN --config "$SCRATCH/unknown.yaml"

printf 'training:\n  steps: ten\n' >"$SCRATCH/type.yaml"
expect_user_error "type.yaml:2:10: training.steps expects an integer, got 'ten'" \
  $TITAN --config "$SCRATCH/type.yaml"

expect_user_error "activation_checkpoint.mode" $TITAN "${SMALL[@]}" --activation_checkpoint.mode sometimes
expect_user_error "unknown option '--training.stpes'" $TITAN "${SMALL[@]}" --training.stpes 3
# Without a GPU (CI, our machines) --device cuda stops before anything is allocated: a cpu-only
# build has no cuda backend, a CUDA=1 build finds no device.
expect_user_error "error: training.device cuda: (this titan was built without it|no CUDA device)" \
  $TITAN "${SMALL[@]}" --device cuda
expect_user_error "training.device.*'tpu'" $TITAN "${SMALL[@]}" --device tpu
# NCCL moves device memory: on cpu comm.backend nccl is refused, not ignored
expect_user_error "^titan: error: comm.backend nccl needs training.device cuda \(NCCL moves device memory\); training.device cpu runs MPI \(comm.backend auto or mpi\)$" \
  $TITAN "${SMALL[@]}" --comm.backend nccl
expect_user_error "expert_tensor_parallel_degree = 2 is not implemented yet" $TITAN "${SMALL[@]}" --parallelism.expert_tensor_parallel_degree 2
# Keys titan has nothing behind yet are refused, not ignored.
expect_user_error "model.print_after_conversion = true is not implemented yet" \
  $TITAN "${SMALL[@]}" --model.print_after_conversion
expect_user_error "checkpoint.export_dtype = 'float16' is not implemented yet" $TITAN "${SMALL[@]}" \
  --checkpoint.last_save_in_hf --checkpoint.export_dtype float16
expect_user_error "parallelism.expert_parallel_degree = 2 must divide dp_shard 1 x cp 1 x tp 1 = 1" \
  $TITAN "${SMALL[@]}" --parallelism.expert_parallel_degree 2
expect_user_error "parallelism.expert_parallel_degree = 2: the model has no routed experts to shard" \
  $TITAN "${SMALL[@]}" --estimate --world-size 2 --parallelism.expert_parallel_degree 2
MOE=(--model.name qwen3 --model.flavor small_moe --estimate)
expect_user_error "parallelism.expert_parallel_degree = 3 must divide the model's 8 experts" \
  $TITAN "${SMALL[@]}" "${MOE[@]}" --world-size 6 --parallelism.expert_parallel_degree 3
expect_user_error "parallelism: pp 1 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 1 = 2 ranks, but the job has 1" \
  $TITAN "${SMALL[@]}" --parallelism.data_parallel_shard_degree 2
# titan's own flags and the implemented values are named; --estimate names the ranks it needs.
expect_user_error "^titan: error: unknown option '--confg' \(did you mean '--config'\?\)$" \
  $TITAN --confg configs/debug_model.yaml
expect_user_error "^titan: error: unknown option '--print-confg' \(did you mean '--print-config'\?\)$" \
  $TITAN "${SMALL[@]}" --print-confg
expect_user_error "^titan: error: unknown option '--estimat' \(did you mean '--estimate'\?\)$" \
  $TITAN "${SMALL[@]}" --estimat
expect_user_error "^titan: error: --optimizer.name: optimizer.name = 'Adam' is not implemented yet \(implemented: AdamW, Muon\)$" \
  $TITAN "${SMALL[@]}" --optimizer.name Adam
expect_user_error "^titan: error: parallelism: 1 ranks cannot be split into pp x dp_replicate x cp x tp = 8 groups to infer data_parallel_shard_degree; try --estimate --world-size 8$" \
  $TITAN --estimate --config configs/llama3_70b.yaml
expect_user_error "must divide dp_shard 1 x cp 1 x tp 1 = 1: .*; try --estimate --world-size 2$" \
  $TITAN "${SMALL[@]}" "${MOE[@]}" --parallelism.expert_parallel_degree 2
expect_user_error "model.flavor 'tiny' is not a llama3 flavor" $TITAN "${SMALL[@]}" --model.flavor tiny
expect_user_error "$SCRATCH/nothing.bin" $TITAN "${SMALL[@]}" --training.dataset_path "$SCRATCH/nothing.bin"
expect_user_error "cannot open config file" $TITAN --config "$SCRATCH/absent.yaml"

# A truncated checkpoint is reported, not loaded and not crashed on.
$TITAN "${SMALL[@]}" --training.steps 2 --checkpoint.enable --checkpoint.interval 2 \
  --job.dump_folder "$SCRATCH/ck" >/dev/null
ckpt=$SCRATCH/ck/checkpoint/step-2.h5
truncate -s $(( $(stat -c %s "$ckpt") / 2 )) "$ckpt"
expect_user_error "checkpoint .*step-2.h5 is truncated or not an HDF5 file" \
  $TITAN "${SMALL[@]}" --training.steps 4 --checkpoint.enable --job.dump_folder "$SCRATCH/ck"
expect_user_error "checkpoint.load_step 7" \
  $TITAN "${SMALL[@]}" --checkpoint.enable --checkpoint.load_step 7 --job.dump_folder "$SCRATCH/ck"

# A diverging run stops at the first non-finite loss, before the update, keeping the
# checkpoint it already wrote (a full one, which a longer run may extend).
$TITAN "${SMALL[@]}" --training.steps 2 --checkpoint.enable --checkpoint.interval 2 \
  --checkpoint.last_save_model_only false --job.dump_folder "$SCRATCH/nan" >/dev/null
DIVERGE=(${SMALL[@]} --training.steps 40 --optimizer.lr 1e30 --lr_scheduler.warmup_steps 0)
expect_user_error "step [0-9]+: loss is (NaN|infinite); stopped before updating the weights \(the latest checkpoint, $SCRATCH/nan/checkpoint/step-2.h5, is intact\)$" \
  $TITAN "${DIVERGE[@]}" --checkpoint.enable --checkpoint.interval 100 --job.dump_folder "$SCRATCH/nan"
[ -f "$SCRATCH/nan/checkpoint/step-2.h5" ] || fail "the NaN run lost the existing checkpoint"
# Without a checkpoint it says so, not that a folder that does not exist is intact.
expect_user_error "step [0-9]+: loss is (NaN|infinite); stopped before updating the weights \(no checkpoint was saved\)$" \
  $TITAN "${DIVERGE[@]}" --job.dump_folder "$SCRATCH/nan-none"

# A warmup longer than the run is cut to the run, as torchtitan does, and said in one warning
# line (debug_model.yaml's warmup_steps 10 over 2 steps: step 1's lr is half the peak, 4e-4).
$TITAN "${SMALL[@]}" --training.steps 2 --job.dump_folder "$SCRATCH/warm" >"$SCRATCH/warm.out" \
  2>"$SCRATCH/warm.err"
[ "$(stderr_of "$SCRATCH/warm.err" | grep -c .)" -eq 1 ] ||
  fail "expected one warning line, got: $(cat "$SCRATCH/warm.err")"
grep -qx "titan: warning: lr_scheduler.warmup_steps = 10 (configs/debug_model.yaml:[0-9]*:[0-9]*) is more than training.steps = 2 (--training.steps): the warmup is cut to 2 steps" \
  "$SCRATCH/warm.err" || fail "no warmup warning: $(cat "$SCRATCH/warm.err")"
grep -q "step *1 .*lr 4.000e-04" "$SCRATCH/warm.out" || fail "step 1's lr is not 4e-4: $(grep step "$SCRATCH/warm.out")"
$TITAN "${SMALL[@]}" --training.steps 2 --lr_scheduler.warmup_steps 2 --job.dump_folder "$SCRATCH/warm2" \
  2>"$SCRATCH/warm2.err" >/dev/null
stderr_of "$SCRATCH/warm2.err" | grep warning && fail "a warning for a warmup that fits"
echo "ok: the warmup cut to the run, with one warning line"

# Every file titan reads whole is a regular file within a size cap: a FIFO would block the read
# forever and /dev/zero never end; a NUL byte would hide the rest of a schedule. Each is one
# line (under a timeout: a hang fails the test).
mkfifo "$SCRATCH/fifo"
printf '0F0,0B0\0garbage\n' >"$SCRATCH/nul.csv"
CSV=(--estimate --world-size 2 "${SMALL[@]}" --parallelism.pipeline_parallel_degree 2
     --parallelism.pipeline_parallel_schedule_csv)
expect_user_error "^titan: error: parallelism.pipeline_parallel_schedule_csv /dev/zero is not a regular file$" \
  timeout 20 $TITAN "${CSV[@]}" /dev/zero
expect_user_error "^titan: error: parallelism.pipeline_parallel_schedule_csv $SCRATCH/fifo is not a regular file$" \
  timeout 20 $TITAN "${CSV[@]}" "$SCRATCH/fifo"
expect_user_error "^titan: error: parallelism.pipeline_parallel_schedule_csv $SCRATCH/nul.csv has a NUL byte at byte 7$" \
  timeout 20 $TITAN "${CSV[@]}" "$SCRATCH/nul.csv"
expect_user_error "^titan: error: $SCRATCH/fifo: config file is not a regular file$" \
  timeout 20 $TITAN --config "$SCRATCH/fifo"
expect_user_error "^titan: error: tokenizer $SCRATCH/fifo is not a regular file$" \
  timeout 20 $TITAN "${SMALL[@]}" --model.tokenizer_path "$SCRATCH/fifo" --job.dump_folder "$SCRATCH/t"
mkdir "$SCRATCH/hf" && mkfifo "$SCRATCH/hf/config.json"
expect_user_error "^titan: error: Hugging Face config $SCRATCH/hf/config.json is not a regular file$" \
  timeout 20 $TITAN convert --to titan "$SCRATCH/hf" "$SCRATCH/x.h5"
echo "ok: FIFOs, devices and NUL bytes where files are read whole: one line each"
