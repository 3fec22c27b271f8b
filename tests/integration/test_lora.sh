#!/usr/bin/env bash
# LoRA (model.converters: [lora], models/lora.h) on the debug model, rank 4, alpha 8, on wq, wv,
# w2 and the output projection:
# - 20 steps within 1e-5 of a float64 PyTorch reference written from the LoRA paper's formula
#   (llama_ref.LoRALinear; check_train.py), and one step's adapter gradients, at step 10 where
#   B is no longer zero, within 1e-5 (check_step.py); with lora.dropout 0.3, 8 steps within
#   1e-5 of the reference drawing the same dropped elements;
# - the base weights bit-equal to the seed's after 20 steps, and optimizer state for the
#   adapters only;
# - convert --to hf merges the adapters (W + alpha / rank B A): the export, read back, gives
#   the adapted model's logits within 1e-5; convert --to peft's adapter on the base's export is
#   the merged export, tensor by tensor;
# - FSDP (dp_shard 2) and TP 2 (adapters placed after their weight) within 1e-5 of one rank;
#   --estimate's arenas, traffic and checkpoint bytes equal the runs';
# - a resume from step 10 gives the same losses bit for bit;
# - a pre-training checkpoint without adapters loads as the base (adapters from their init);
# - bad settings, one line, exit 2.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

LORA=(${SMALL[@]} --model.converters lora --lora.rank 4 --lora.alpha 8
      --lora.target_modules wq,wv,w2,output --lr_scheduler.warmup_steps 3 --optimizer.lr 1e-2)
run=("${LORA[@]}" --training.steps 20 --job.dump_folder "$SCRATCH/run")

# ---- parity with the reference, and what stays frozen ------------------------------------------
$TITAN "${run[@]}" --checkpoint.create_seed_checkpoint >/dev/null
seed=$SCRATCH/run/checkpoint/step-0.h5
$TITAN "${run[@]}" --checkpoint.initial_load_path "$seed" --checkpoint.enable \
  --checkpoint.interval 10 >"$SCRATCH/run.log"
grep -q "lora: rank 4, alpha 8 on 19 linears" "$SCRATCH/run.log" ||
  fail "no lora line naming 19 linears: $(grep lora: "$SCRATCH/run.log")"
$PY tests/reference/check_train.py "$seed" "$SCRATCH/run/metrics.jsonl" --dtype float64 \
  --tolerance 1e-5 | tail -1
./build/tests/dump_step "$SCRATCH/run/checkpoint/step-10.h5" "$DATA" 2 64 "$SCRATCH/dump.h5" \
  >/dev/null
$PY tests/reference/check_step.py "$SCRATCH/run/checkpoint/step-10.h5" "$SCRATCH/dump.h5" | tail -1
$PY - "$seed" "$SCRATCH/run/checkpoint/step-10.h5" "$SCRATCH/run/checkpoint/step-20.h5" <<'PY'
import sys, h5py, numpy as np
seed, mid, last = (h5py.File(p, "r") for p in sys.argv[1:])
base = [k for k in seed["model"] if ".lora_" not in k]
adapters = [k for k in seed["model"] if ".lora_" in k]
assert len(adapters) == 38, len(adapters)
changed = [k for k in base if not np.array_equal(seed["model"][k][...], last["model"][k][...])]
assert not changed, f"base weights changed: {changed}"
assert all(not np.array_equal(seed["model"][k][...], last["model"][k][...]) for k in adapters)
assert sorted(mid["optimizer/exp_avg"]) == sorted(adapters), "optimizer state beyond the adapters"
print(f"ok: {len(base)} base tensors bit-equal after 20 steps; moments for the adapters only")
PY

# lora.dropout 0.3 (PEFT's lora_dropout): 8 steps within 1e-5 of the reference drawing the
# elements titan drops (kernels/dropout.h's hash of the step's seed and the Linear's index).
drop=("${LORA[@]}" --lora.dropout 0.3 --training.steps 8 --job.dump_folder "$SCRATCH/drop")
$TITAN "${drop[@]}" --checkpoint.create_seed_checkpoint >/dev/null 2>&1
$TITAN "${drop[@]}" --checkpoint.initial_load_path "$SCRATCH/drop/checkpoint/step-0.h5" >/dev/null
$PY tests/reference/check_train.py "$SCRATCH/drop/checkpoint/step-0.h5" \
  "$SCRATCH/drop/metrics.jsonl" --dtype float64 --tolerance 1e-5 | tail -1

# ---- merged at export: the adapted model's logits ------------------------------------------------
$TITAN convert --to hf --dtype float32 "$SCRATCH/run/checkpoint/step-20.h5" "$SCRATCH/hf" |
  grep -q "the LoRA adapters merged" || fail "convert --to hf did not merge the adapters"
$TITAN convert --to titan "$SCRATCH/hf" "$SCRATCH/merged.h5" >/dev/null
for ckpt in run/checkpoint/step-20 merged; do
  ./build/tests/dump_step "$SCRATCH/$ckpt.h5" "$DATA" 2 64 "$SCRATCH/${ckpt//\//_}.dump.h5" \
    >/dev/null
done
$PY - "$SCRATCH/run_checkpoint_step-20.dump.h5" "$SCRATCH/merged.dump.h5" <<'PY'
import sys, h5py, numpy as np
adapted, merged = (h5py.File(p, "r")["logits"][...].astype(np.float64) for p in sys.argv[1:])
err = np.linalg.norm(merged - adapted) / np.linalg.norm(adapted)
assert err < 1e-5, f"merged weights' logits {err:.2e} from the adapted model's"
print(f"ok: the merged export's logits within {err:.1e} of the adapted model's")
PY

# PEFT's adapter (convert --to peft): on the base's export (the seed's: B is zero there),
# W + alpha / rank B A is the merged export's every weight, names and HF's row order included.
$TITAN convert --to hf --dtype float32 "$seed" "$SCRATCH/base-hf" >/dev/null
$TITAN convert --to peft "$SCRATCH/run/checkpoint/step-20.h5" "$SCRATCH/peft" >/dev/null
$PY - "$SCRATCH/base-hf" "$SCRATCH/hf" "$SCRATCH/peft" <<'PY'
import json, struct, sys
import numpy as np
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(n)), f.read()
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], "<f4").reshape(v["shape"])
            for k, v in header.items() if k != "__metadata__"}
base, merged = (tensors(f"{d}/model.safetensors") for d in sys.argv[1:3])
adapter, config = tensors(f"{sys.argv[3]}/adapter_model.safetensors"), json.load(open(f"{sys.argv[3]}/adapter_config.json"))
assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8.0), config
want = [f"model.layers.{i}.{m}" for i in range(6) for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")]
assert sorted(config["target_modules"]) == sorted(want + ["lm_head"]), config
worst, adapted = 0.0, 0
for name, w in merged.items():
    key = "base_model.model." + name[:-len(".weight")]
    want = base[name].astype(np.float64)
    if key + ".lora_A.weight" in adapter:
        a, b = adapter[key + ".lora_A.weight"], adapter[key + ".lora_B.weight"]
        want = want + 2.0 * b.astype(np.float64) @ a.astype(np.float64)
        adapted += 1
    worst = max(worst, float(np.abs(w - want).max() / np.abs(want).max()))
assert adapted == 19 and len(adapter) == 38 and worst < 1e-6, (adapted, len(adapter), worst)
print(f"ok: PEFT's adapter on the base export gives the merged export, {adapted} weights within {worst:.1e}")
PY

# ---- layouts and resume --------------------------------------------------------------------------
short=("${LORA[@]}" --training.steps 10 --checkpoint.initial_load_path "$seed")
in_background train_ranks fsdp 2 "${short[@]}" --parallelism.data_parallel_shard_degree 2 \
  --training.local_batch_size 2
in_background train_ranks tp 2 "${short[@]}" --parallelism.tensor_parallel_degree 2
wait_background
OMP_NUM_THREADS=2 $TITAN "${short[@]}" --job.dump_folder "$SCRATCH/one" >/dev/null
for layout in fsdp tp; do
  layout_matches "lora $layout 2" "$SCRATCH/one/metrics.jsonl" "$SCRATCH/$layout/metrics.jsonl" \
    loss grad_norm
done
# --estimate (at the run's one thread per rank: the attention's scratch is per thread): the FSDP
# run's arenas and traffic, and the checkpoint files' bytes (moments for the
# adapters only), as the runs had them.
OMP_NUM_THREADS=1 $TITAN --estimate --world-size 2 "${short[@]}" \
  --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2 >"$SCRATCH/fsdp.estimate"
$TITAN --estimate "${run[@]}" >"$SCRATCH/run.estimate"
$PY - "$SCRATCH/fsdp.estimate" "$SCRATCH/fsdp/run_summary.json" "$SCRATCH/run.estimate" \
  "$SCRATCH/run/checkpoint/step-10.h5" "$SCRATCH/run/checkpoint/step-20.h5" <<'PY'
import json, re, sys, h5py
estimate, summary = open(sys.argv[1]).read().splitlines(), json.load(open(sys.argv[2]))
rows = {l.split()[0]: int(l.split()[1]) for l in estimate if l.startswith("  ") and l.split()[1].isdigit()}
for arena, got in summary["arena_bytes"].items():
    assert rows[arena] == got, f"{arena} estimated {rows[arena]}, allocated {got}"
for group, got in summary["comm_bytes"].items():
    assert summary["steps"] * rows.get(group, 0) == got, f"group {group}: sent {got}"
plan = re.search(r"^checkpoint: full state (\d+) bytes .* model only (\d+) bytes", open(sys.argv[3]).read(), re.M)
def nbytes(path):
    sizes = []
    h5py.File(path, "r").visititems(lambda n, o: sizes.append(o.nbytes) if isinstance(o, h5py.Dataset) else None)
    return sum(sizes)
assert (int(plan[1]), int(plan[2])) == (nbytes(sys.argv[4]), nbytes(sys.argv[5])), plan[0]
print(f"ok: --estimate: the LoRA run's arenas and traffic, and its checkpoints' {plan[1]} and {plan[2]} bytes")
PY

mkdir -p "$SCRATCH/resumed/checkpoint"
cp "$SCRATCH/run/checkpoint/step-10.h5" "$SCRATCH/resumed/checkpoint/"
$TITAN "${LORA[@]}" --training.steps 20 --checkpoint.enable --job.dump_folder "$SCRATCH/resumed" \
  >/dev/null
same_metrics "lora resumed at step 10" "$SCRATCH/run/metrics.jsonl" \
  "$SCRATCH/resumed/metrics.jsonl" 11 0

# A float8 base (model.converters [float8, lora]): its GEMMs rowwise float8, the adapters'
# at the backend's precision.
train_ranks float8 1 "${LORA[@]}" --model.converters float8,lora --float8.recipe_name rowwise \
  --training.steps 3
grep -aq "float8: rowwise recipe on 43 linears" "$SCRATCH/float8.log" &&
  [ "$(losses "$SCRATCH/float8/metrics.jsonl" | wc -l)" -eq 3 ] ||
  fail "float8 with lora: $(grep -a 'float8:\|error' "$SCRATCH/float8.log")"
echo "ok: LoRA over a rowwise float8 base trains"

# ---- a base model without adapters ---------------------------------------------------------------
$TITAN ${SMALL[@]} --training.steps 2 --job.dump_folder "$SCRATCH/base" --checkpoint.enable \
  --checkpoint.interval 2 >/dev/null
$TITAN "${LORA[@]}" --training.steps 2 --job.dump_folder "$SCRATCH/tuned" \
  --checkpoint.initial_load_path "$SCRATCH/base/checkpoint/step-2.h5" >"$SCRATCH/tuned.log"
grep -q "checkpoint: base weights from .*step-2.h5; LoRA adapters initialised" \
  "$SCRATCH/tuned.log" ||
  fail "the base checkpoint did not load as the base: $(grep checkpoint: "$SCRATCH/tuned.log")"
echo "ok: a checkpoint without adapters loads as the base"

# ---- bad settings --------------------------------------------------------------------------------
expect_user_error 'lora.rank = 4 does nothing: model.converters has no lora' \
  $TITAN ${SMALL[@]} --lora.rank 4
expect_user_error 'lora.target_modules entry wz names no Linear of model llama3 debugmodel' \
  $TITAN "${LORA[@]}" --lora.target_modules wq,wz
expect_user_error 'model.converters = \[lora, lora\] names a converter twice' \
  $TITAN "${LORA[@]}" --model.converters lora,lora
expect_user_error 'model.converters = \[mx\] is not implemented yet \(implemented: float8, lora\)' \
  $TITAN ${SMALL[@]} --model.converters mx
expect_user_error "lora.target_modules adapts output, which is the embedding's transpose in this tied model" \
  $TITAN "${LORA[@]}" --lora.target_modules wq,output --model.tie_word_embeddings
expect_user_error 'model flux adds no LoRA adapters' \
  $TITAN --config configs/flux_debug.yaml --model.converters lora --training.steps 1 \
  --job.dump_folder "$SCRATCH/flux"
expect_user_error 'convert --to peft: checkpoint .*step-2.h5 is not a LoRA run.s' \
  $TITAN convert --to peft "$SCRATCH/base/checkpoint/step-2.h5" "$SCRATCH/not-lora"
