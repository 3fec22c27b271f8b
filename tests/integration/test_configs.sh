#!/usr/bin/env bash
# The configs titan ships (configs/*.yaml), one per model family and size: each prints its
# resolved config (its model and flavor, read back the same) and plans with --estimate on the
# ranks it is written for, which the table below names (a new config without a row fails);
# the debug ones train on the data `make run` leaves in outputs/data (debug_model.yaml's paths)
# and run a step as written, on the ranks their comments promise: qwen3_debug's DDP and
# qwen3_moe_debug's expert parallel on `mpirun -np 2` (flux_debug needs real-image shards,
# flux_digits trains in test_flux_train).
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# config|model|flavor|--estimate's world size (the layout's degrees need it)
TABLE='debug_model|llama3|debugmodel|2
debug_lora|llama3|debugmodel|2
llama3_8b|llama3|8B|8
llama3_70b|llama3|70B|64
llama3_405b|llama3|405B|512
qwen3_debug|qwen3|debugmodel|2
qwen3_moe_debug|qwen3|debugmodel_moe|2
qwen3_0.6b|qwen3|0.6B|8
qwen3_8b|qwen3|8B|8
qwen3_32b|qwen3|32B|8
qwen3_30b_a3b|qwen3|30B-A3B|8
deepseek_v3_debug|deepseek_v3|debugmodel|2
deepseek_v3_671b|deepseek_v3|671B|2048
flux_digits|flux|flux-digits|2
flux_debug|flux|flux-debug|2'

# job.config_file (the file read) and job.print_config (how it was asked for) differ by design
same() { diff <(grep -Ev '^  (config_file|print_config):' "$1") <(grep -Ev '^  (config_file|print_config):' "$2"); }
for c in configs/*.yaml; do
  name=$(basename "$c" .yaml)
  row=$(printf '%s\n' "$TABLE" | grep "^$name|") || fail "$c has no row in test_configs' table"
  IFS='|' read -r _ model flavor world <<<"$row"
  $TITAN --config "$c" --print-config >"$SCRATCH/$name.yaml" || fail "$c: --print-config failed"
  grep -q "^  name: \"$model\"" "$SCRATCH/$name.yaml" || fail "$c does not train $model"
  grep -q "^  flavor: \"$flavor\"" "$SCRATCH/$name.yaml" || fail "$c is not flavor $flavor"
  $TITAN --config "$SCRATCH/$name.yaml" --print-config >"$SCRATCH/$name.again.yaml"
  same "$SCRATCH/$name.yaml" "$SCRATCH/$name.again.yaml" >/dev/null ||
    fail "$c: its printed config does not read back the same"
  $TITAN --estimate --world-size "$world" --config "$c" >"$SCRATCH/$name.estimate" 2>&1 ||
    fail "$c: --estimate --world-size $world failed: $(tail -1 "$SCRATCH/$name.estimate")"
  grep -q "^estimate: $model $flavor on $world ranks" "$SCRATCH/$name.estimate" ||
    fail "$c: the estimate does not plan $model $flavor on $world ranks"
  grep -q "^  total " "$SCRATCH/$name.estimate" || fail "$c: the estimate has no total"
  echo "ok: $c: $model $flavor, --print-config, --estimate --world-size $world"
done

# The debug configs read what `make run` writes, as debug_model.yaml does.
paths() { grep -E '^  (dataset_path|tokenizer_path):' "$SCRATCH/$1.yaml"; }
for name in qwen3_debug qwen3_moe_debug deepseek_v3_debug; do
  [ "$(paths "$name")" = "$(paths debug_model)" ] ||
    fail "configs/$name.yaml does not read debug_model.yaml's data: $(paths "$name")"
done

# A step of each debug config as written, on the byte shard (no tokenizer) and short rows.
SHORT=(--training.dataset_path "$DATA" --model.tokenizer_path null --training.seq_len 64
       --training.local_batch_size 2 "${FP32[@]}" --metrics.log_freq 1)
train_ranks qwen3_debug 2 --config configs/qwen3_debug.yaml "${SHORT[@]}" --training.steps 2
grep -aq "dp_replicate 2" "$SCRATCH/qwen3_debug.log" || fail "qwen3_debug did not replicate over 2 ranks"
train_ranks qwen3_moe_debug 2 --config configs/qwen3_moe_debug.yaml "${SHORT[@]}" --training.steps 1
grep -aq "ep 2" "$SCRATCH/qwen3_moe_debug.log" || fail "qwen3_moe_debug did not shard its experts over 2 ranks"
train_ranks deepseek_v3_debug 2 --config configs/deepseek_v3_debug.yaml "${SHORT[@]}" --training.steps 1
grep -aq "ep 2" "$SCRATCH/deepseek_v3_debug.log" ||
  fail "deepseek_v3_debug did not shard its experts over 2 ranks"
# debug_lora's base is make run's checkpoint: a step from the seed, its adapters trained.
train_ranks debug_lora 2 --config configs/debug_lora.yaml "${SHORT[@]}" --training.steps 1 \
  --checkpoint.initial_load_path null --checkpoint.enable false --training.document_masking false
grep -aq "lora: rank 8, alpha 16 on 43 linears" "$SCRATCH/debug_lora.log" ||
  fail "debug_lora did not adapt every Linear"
for name in qwen3_debug qwen3_moe_debug deepseek_v3_debug debug_lora; do
  [ -n "$(losses "$SCRATCH/$name/metrics.jsonl")" ] || fail "$name logged no loss"
done
echo "ok: qwen3_debug (DDP), qwen3_moe_debug and deepseek_v3_debug (ep 2) train on 2 ranks"
