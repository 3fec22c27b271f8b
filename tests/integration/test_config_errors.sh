#!/usr/bin/env bash
# Config values a user can write but the trainer cannot hold are refused as they are read: exit
# 2 with one line naming the flag or file:line:col, never a truncated value, an internal error
# or a multi-line message.
source "$(dirname "$0")/lib.sh"

R=(--config configs/debug_model.yaml --training.dataset_path "$DATA" --model.tokenizer_path null
   --training.seq_len 64 --training.local_batch_size 2 --training.steps 1)

# Integers beyond the int the trainer keeps them in (they used to train with batch 2, seq_len
# 1, a 0-step schedule, or report "got -1").
while IFS='|' read -r key value range; do
  expect_user_error "^titan: error: --$key: expects an integer in \\[$range\\], got '$value'\$" \
    $TITAN "${R[@]}" "--$key" "$value"
done <<'CASES'
training.local_batch_size|4294967298|1, 2147483647
training.seq_len|4294967297|1, 2147483646
training.steps|4294967296|0, 2147483646
parallelism.tensor_parallel_degree|9223372036854775807|1, 2147483647
training.seq_len|9223372036854775807|1, 2147483646
comm.trace_buf_size|4294967295|0, 1048576
CASES
expect_user_error "^titan: error: --world-size expects an integer in \[1, 2147483647\], got '4294967297'$" \
  $TITAN --estimate --world-size 4294967297 --config configs/debug_model.yaml
# Tokens per microbatch index the activations with an int: both keys are named, with origins.
expect_user_error "^titan: error: training.local_batch_size = 1000000000 \(--training.local_batch_size\) x training.seq_len = 64 \(--training.seq_len\) = 64000000000 tokens per microbatch, more than 2147483647$" \
  $TITAN "${R[@]}" --training.local_batch_size 1000000000
printf 'training:\n  seq_len: 4294967297\n' >"$SCRATCH/seq_len.yaml"
expect_user_error "^titan: error: $SCRATCH/seq_len.yaml:2:12: training.seq_len expects an integer in \[1, 2147483646\], got '4294967297'$" \
  $TITAN --config "$SCRATCH/seq_len.yaml"

# The null sentinel is no value a user can write (it used to train 0 steps with exit 0).
expect_user_error "^titan: error: --training.steps: expects an integer in \[0, 2147483646\], got '-9223372036854775808'$" \
  $TITAN "${R[@]}" --training.steps -9223372036854775808
printf 'training:\n  seed: -9223372036854775808\n' >"$SCRATCH/sentinel.yaml"
expect_user_error "sentinel.yaml:2:9: training.seed expects an integer in \[-9223372036854775807, 9223372036854775807\]" \
  $TITAN --config "$SCRATCH/sentinel.yaml" --print-config

# Values holding newlines are echoed quoted and escaped, on one line.
printf 'training:\n  steps: "a\\nb"\n' >"$SCRATCH/newline.yaml"
expect_user_error "newline.yaml:2:10: training.steps expects an integer, got 'a\\\\nb'$" \
  $TITAN --config "$SCRATCH/newline.yaml"
printf 'training:\n  steps: |\n    1\n    2\n' >"$SCRATCH/block.yaml"
expect_user_error "block.yaml:2:10: training.steps expects an integer, got '1\\\\n2\\\\n'$" \
  $TITAN --config "$SCRATCH/block.yaml"
expect_user_error "unknown option '--training.st\\\\neps'" $TITAN "${R[@]}" $'--training.st\neps' 3

# Checks made after reading name where the value came from: file:line:col or the flag.
printf 'parallelism:\n  expert_tensor_parallel_degree: 2\n' >"$SCRATCH/ep.yaml"
expect_user_error "^titan: error: $SCRATCH/ep.yaml:2:34: parallelism.expert_tensor_parallel_degree = 2 is not implemented yet \(implemented: 1\)$" \
  $TITAN --config "$SCRATCH/ep.yaml"
expect_user_error "^titan: error: --checkpoint.keep_latest_k: checkpoint.keep_latest_k = 1 must be 0" \
  $TITAN "${R[@]}" --checkpoint.keep_latest_k 1

# Choices known when the config is read are checked then, before --print-config prints it:
# the model registry's architectures and their flavors.
expect_user_error "^titan: error: --model.name: model.name = 'gpt_oss' is not implemented yet \(models: llama3, qwen3, deepseek_v3, flux\)$" \
  $TITAN "${R[@]}" --model.name gpt_oss --print-config
printf 'model:\n  name: gpt_oss\n' >"$SCRATCH/name.yaml"
expect_user_error "^titan: error: $SCRATCH/name.yaml:2:9: model.name = 'gpt_oss' is not implemented yet" \
  $TITAN --config "$SCRATCH/name.yaml" --print-config
expect_user_error "^titan: error: --model.flavor: model.flavor 'nope' is not a llama3 flavor \(known: debugmodel," \
  $TITAN "${R[@]}" --model.flavor nope --print-config
printf 'model:\n  flavor: nope\n' >"$SCRATCH/flavor.yaml"
expect_user_error "^titan: error: $SCRATCH/flavor.yaml:2:11: model.flavor 'nope' is not a llama3 flavor" \
  $TITAN --config "$SCRATCH/flavor.yaml" --print-config
expect_user_error "activation_checkpoint.selective_ac_option: expects op or an integer in \[1, 2147483647\], got 'sometimes'" \
  $TITAN "${R[@]}" --activation_checkpoint.selective_ac_option sometimes --print-config

# torchtitan's named datasets (c4, ...): titan has no registry of them and reads dataset_path, so
# a name other than the default would be ignored; the default, written out, is accepted.
for split in training validation; do
  expect_user_error "^titan: error: --$split.dataset: $split.dataset = 'c4' does nothing: titan has no named datasets and reads the files $split.dataset_path names\$" \
    $TITAN "${R[@]}" "--$split.dataset" c4 --print-config
done
printf 'training:\n  dataset: c4\n' >"$SCRATCH/dataset.yaml"
expect_user_error "^titan: error: $SCRATCH/dataset.yaml:2:12: training.dataset = 'c4' does nothing" \
  $TITAN --config "$SCRATCH/dataset.yaml" --print-config
$TITAN "${R[@]}" --training.dataset c4_test --validation.dataset c4_validation --print-config \
  >/dev/null || fail "the default dataset names, written out, were refused"

# Too deep or too large: refused before libyaml builds it (100,000 levels used to take 25 s).
{ printf 'training:\n  steps: '; head -c 100000 /dev/zero | tr '\0' '['; echo; } >"$SCRATCH/deep.yaml"
start=$(date +%s%N)
expect_user_error "^titan: error: $SCRATCH/deep.yaml:2:12: nested more than 4 levels deep" \
  $TITAN --config "$SCRATCH/deep.yaml"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$ms" -lt 1000 ] || fail "the deep config took $ms ms to refuse"
{ echo 'training:'; head -c 1100000 /dev/zero | tr '\0' '#'; echo; } >"$SCRATCH/big.yaml"
expect_user_error "^titan: error: $SCRATCH/big.yaml: larger than the 1048576 bytes a config may have$" \
  $TITAN --config "$SCRATCH/big.yaml"
echo "ok: config errors"
# The MoE keys act on MoE layers only: on a dense model each is refused by name.
for key in model.moe_load_balance_coeff model.moe_aux_loss_alpha model.moe_capacity_factor; do
  expect_user_error "^titan: error: --$key: $key does nothing: model llama3 debugmodel has no MoE layers$" \
    $TITAN "${R[@]}" "--$key" 0.5
done
expect_user_error "^titan: error: --model.moe_capacity_factor: expects a number > 0, got '0'$" \
  $TITAN "${R[@]}" --model.moe_capacity_factor 0
