#!/usr/bin/env bash
# QLoRA (lora.quantize_base: the adapted Linears' frozen weights held as NF4, core/nf4.h,
# bitsandbytes' format, which test_nf4 checks bit for bit) on the debug model:
# - from a base pre-trained for 60 steps, LoRA and QLoRA 50 steps each under bf16 mixed
#   precision: QLoRA's loss at step 50 within 2% of LoRA's;
# - the params arena holds the NF4 blobs in place of the fp32 weights, as --estimate counts;
# - the checkpoint holds each NF4 weight as its blob (/nf4/<fqn>, no fp32 copy); a resume at
#   step 25 continues bit for bit; convert --to hf merges the adapters into the dequantized
#   weights, which stay near the base's, and generate reads the checkpoint;
# - DDP (dp_replicate 2), the pipeline (pp 2, each NF4 weight on its stage), FSDP (dp_shard 2,
#   each blob in byte chunks, gathered per unit), TP 2 (each rank dequantizing its part of the
#   whole blob) and FSDP 2 x TP 2 give one rank's losses; FSDP's and TP's checkpoints hold the
#   one rank's blobs, FSDP resumes the one rank's checkpoint; --estimate counts FSDP's arenas
#   and traffic; semi_sync's replica groups resume on the one blob bit for bit;
# - last_save_in_hf exports as convert --to hf does; LoRA under FSDP loads a QLoRA checkpoint;
# - Llama 3 8B QLoRA rank 16 fits one 24 GB GPU by --estimate;
# - bad settings, one line, exit 2.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

BF16=(--training.mixed_precision_param bfloat16)
$TITAN ${SMALL[@]} "${BF16[@]}" --training.steps 60 --checkpoint.enable --checkpoint.interval 60 \
  --job.dump_folder "$SCRATCH/base" >/dev/null
base=$SCRATCH/base/checkpoint/step-60.h5
LORA=(${SMALL[@]} "${BF16[@]}" --model.converters lora --lora.rank 8 --lora.alpha 16
      --lr_scheduler.warmup_steps 5 --optimizer.lr 2e-3 --checkpoint.initial_load_path "$base")
QLORA=("${LORA[@]}" --lora.quantize_base)

# ---- QLoRA against LoRA --------------------------------------------------------------------------
$TITAN "${LORA[@]}" --training.steps 50 --job.dump_folder "$SCRATCH/lora" >/dev/null
$TITAN "${QLORA[@]}" --training.steps 50 --job.dump_folder "$SCRATCH/qlora" --checkpoint.enable \
  --checkpoint.interval 25 >"$SCRATCH/qlora.log"
grep -q "lora: quantize_base: the 43 adapted weights (.*) held as NF4" "$SCRATCH/qlora.log" ||
  fail "no quantize_base line: $(grep lora: "$SCRATCH/qlora.log")"
$PY - "$SCRATCH/lora/metrics.jsonl" "$SCRATCH/qlora/metrics.jsonl" <<'PY'
import json, sys
lora, qlora = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert len(lora) == len(qlora) == 50, (len(lora), len(qlora))
a, b = lora[-1]["loss"], qlora[-1]["loss"]
assert abs(b - a) <= 0.02 * a, f"QLoRA's step-50 loss {b:.4f}, LoRA's {a:.4f}: more than 2% apart"
assert lora[0]["loss"] != qlora[0]["loss"], "QLoRA's first loss is LoRA's: was the base quantized?"
print(f"ok: QLoRA's step-50 loss {b:.4f} within {100 * abs(b - a) / a:.2f}% of LoRA's {a:.4f}")
PY

# ---- memory: the arenas, as --estimate counts them ---------------------------------------------
$TITAN --estimate "${QLORA[@]}" --training.steps 50 >"$SCRATCH/qlora.estimate"
$TITAN --estimate "${LORA[@]}" --training.steps 50 >"$SCRATCH/lora.estimate"
$PY - "$SCRATCH/qlora.estimate" "$SCRATCH/qlora/run_summary.json" "$SCRATCH/lora.estimate" \
  "$SCRATCH/qlora/checkpoint/step-25.h5" "$SCRATCH/qlora/checkpoint/step-50.h5" <<'PY'
import json, re, sys, h5py
def rows(path):
    return {l.split()[0]: int(l.split()[1]) for l in open(path) if l.startswith("  ") and l.split()[1].isdigit()}
qlora, summary, lora = rows(sys.argv[1]), json.load(open(sys.argv[2])), rows(sys.argv[3])
for arena, got in summary["arena_bytes"].items():
    assert qlora[arena] == got, f"{arena} estimated {qlora[arena]}, allocated {got}"
assert qlora["params"] < lora["params"] * 0.6, (qlora["params"], lora["params"])
plan = re.search(r"^checkpoint: full state (\d+) bytes .* model only (\d+) bytes", open(sys.argv[1]).read(), re.M)
def nbytes(path):
    sizes = []
    h5py.File(path, "r").visititems(lambda n, o: sizes.append(o.nbytes) if isinstance(o, h5py.Dataset) else None)
    return sum(sizes)
assert (int(plan[1]), int(plan[2])) == (nbytes(sys.argv[4]), nbytes(sys.argv[5])), plan[0]
print(f"ok: the QLoRA run's arenas as estimated (params {qlora['params']} bytes, LoRA's "
      f"{lora['params']}), and its checkpoints' {plan[1]} and {plan[2]} bytes")
PY

# ---- checkpoints: the blobs, a bit-identical resume, the readers ----------------------------------
ckpt=$SCRATCH/qlora/checkpoint
$PY - "$ckpt/step-50.h5" "$base" <<'PY'
import sys, h5py, numpy as np
run, base = (h5py.File(p, "r") for p in sys.argv[1:])
blobs = sorted(run["nf4"])
assert len(blobs) == 43, len(blobs)
for name in blobs:
    n = base["model"][name].size
    blocks = -(-n // 64)
    size = 4 * (1 + -(-blocks // 256)) + blocks + (n + 1) // 2
    assert run["nf4"][name].shape == (-(-size // 4),), (name, run["nf4"][name].shape)
    assert name not in run["model"], f"{name} saved in fp32 too"
print(f"ok: the checkpoint holds {len(blobs)} NF4 blobs of bitsandbytes' sizes, no fp32 copies")
PY
mkdir -p "$SCRATCH/resumed/checkpoint"
cp "$ckpt/step-25.h5" "$SCRATCH/resumed/checkpoint/"
$TITAN "${QLORA[@]}" --training.steps 50 --checkpoint.enable --checkpoint.interval 25 \
  --job.dump_folder "$SCRATCH/resumed" >/dev/null
same_metrics "qlora resumed at step 25" "$SCRATCH/qlora/metrics.jsonl" \
  "$SCRATCH/resumed/metrics.jsonl" 26 0
cmp -s <(h5dump -d /nf4/layers.0.attention.wq.weight "$ckpt/step-50.h5" | tail -n +3) \
  <(h5dump -d /nf4/layers.0.attention.wq.weight "$SCRATCH/resumed/checkpoint/step-50.h5" |
    tail -n +3) || fail "the resumed run's NF4 blob differs"

$TITAN convert --to hf --dtype float32 "$ckpt/step-50.h5" "$SCRATCH/hf" |
  grep -q "the LoRA adapters merged" || fail "convert --to hf did not merge the adapters"
$TITAN convert --to hf --dtype float32 "$base" "$SCRATCH/base-hf" >/dev/null
$PY - "$SCRATCH/base-hf" "$SCRATCH/hf" <<'PY'
import json, struct, sys
import numpy as np
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(n)), f.read()
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], "<f4").reshape(v["shape"])
            for k, v in header.items() if k != "__metadata__"}
base, tuned = (tensors(f"{d}/model.safetensors") for d in sys.argv[1:])
w = "model.layers.0.self_attn.q_proj.weight"
err = np.linalg.norm(tuned[w] - base[w]) / np.linalg.norm(base[w])
assert 0 < err < 0.2, f"{w}: the QLoRA export is {err:.3f} from the base"
print(f"ok: convert --to hf merges the adapters into the dequantized weights ({w} {err:.3f} from the base)")
PY
$TITAN generate --checkpoint "$ckpt/step-50.h5" --tokenizer bytes --prompt "It is a truth" \
  --max-new-tokens 8 --temperature 0 \
  >"$SCRATCH/generate.txt" || fail "generate from the QLoRA checkpoint failed"

# ---- layouts (fp32: compared with one rank within 1e-5) ------------------------------------------
short=("${QLORA[@]}" "${FP32[@]}" --training.steps 10)
$TITAN "${short[@]}" --checkpoint.enable --checkpoint.interval 5 --job.dump_folder "$SCRATCH/one" \
  >/dev/null
in_background train_ranks ddp 2 "${short[@]}" --training.local_batch_size 2 \
  --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1
in_background train_ranks pp 2 "${short[@]}" --parallelism.pipeline_parallel_degree 2 \
  --parallelism.data_parallel_shard_degree 1
wait_background
fsdp=("${short[@]}" --training.local_batch_size 2 --parallelism.data_parallel_shard_degree 2)
in_background train_ranks fsdp 2 "${fsdp[@]}" --checkpoint.enable --checkpoint.interval 10
in_background train_ranks tp 2 "${short[@]}" --parallelism.tensor_parallel_degree 2 \
  --parallelism.data_parallel_shard_degree 1 --checkpoint.enable --checkpoint.interval 10
wait_background
train_ranks fsdp_tp 4 "${fsdp[@]}" --parallelism.tensor_parallel_degree 2
for layout in ddp pp fsdp tp fsdp_tp; do
  layout_matches "qlora $layout" "$SCRATCH/one/metrics.jsonl" "$SCRATCH/$layout/metrics.jsonl" \
    loss grad_norm
done
# FSDP's NF4 chunks, written and read: its blobs are the one rank's, and the one rank's step 5
# resumed under FSDP continues as the one rank did.
mkdir -p "$SCRATCH/fsdp_resumed/checkpoint"
cp "$SCRATCH/one/checkpoint/step-5.h5" "$SCRATCH/fsdp_resumed/checkpoint/"
train_ranks fsdp_resumed 2 "${fsdp[@]}" --checkpoint.enable --checkpoint.interval 5
same_metrics "qlora step 5 resumed under fsdp 2" "$SCRATCH/one/metrics.jsonl" \
  "$SCRATCH/fsdp_resumed/metrics.jsonl" 6 1e-5
$PY - "$SCRATCH/one/checkpoint/step-10.h5" "$SCRATCH/fsdp/checkpoint/step-10.h5" \
  "$SCRATCH/tp/checkpoint/step-10.h5" <<'PY'
import sys, h5py, numpy as np
one, *others = (h5py.File(p, "r")["nf4"] for p in sys.argv[1:])
for name, run in zip(("FSDP 2", "TP 2"), others):
    assert sorted(one) == sorted(run) and len(one) == 43, name
    differ = [k for k in one if one[k][...].tobytes() != run[k][...].tobytes()]
    assert not differ, f"{name}'s blobs differ from one rank's: {differ[:3]}"
print(f"ok: FSDP 2's and TP 2's checkpoints hold the one rank's {len(one)} NF4 blobs byte for byte")
PY
# --estimate: the FSDP run's arenas and traffic (the NF4 chunks' all-gathers among them)
OMP_NUM_THREADS=1 $TITAN --estimate --world-size 2 "${fsdp[@]}" >"$SCRATCH/fsdp.estimate"
$PY - "$SCRATCH/fsdp.estimate" "$SCRATCH/fsdp/run_summary.json" <<'PY'
import json, sys
estimate, summary = open(sys.argv[1]).read().splitlines(), json.load(open(sys.argv[2]))
rows = {l.split()[0]: int(l.split()[1]) for l in estimate if l.startswith("  ") and l.split()[1].isdigit()}
for arena, got in summary["arena_bytes"].items():
    assert rows[arena] == got, f"{arena} estimated {rows[arena]}, allocated {got}"
for group, got in summary["comm_bytes"].items():
    assert summary["steps"] * rows.get(group, 0) == got, f"group {group}: sent {got}"
print("ok: --estimate: the FSDP QLoRA run's arenas and traffic")
PY

# Semi-synchronous replica groups share the one blob of each weight: a resume gives every group
# its base back (group 1 included) and continues bit for bit.
diloco=("${short[@]}" --training.local_batch_size 2 --parallelism.data_parallel_replicate_degree 2
        --parallelism.data_parallel_shard_degree 1 --semi_sync.method streaming_diloco
        --semi_sync.sync_steps 4 --semi_sync.num_fragments 2 --semi_sync.fragment_sync_delay 1
        --checkpoint.enable --checkpoint.interval 5)
train_ranks diloco 2 "${diloco[@]}"
mkdir -p "$SCRATCH/diloco_resumed/checkpoint"
cp "$SCRATCH/diloco/checkpoint/step-5.h5" "$SCRATCH/diloco_resumed/checkpoint/"
train_ranks diloco_resumed 2 "${diloco[@]}"
same_metrics "qlora semi_sync resumed at step 5" "$SCRATCH/diloco/metrics.jsonl" \
  "$SCRATCH/diloco_resumed/metrics.jsonl" 6 0

# last_save_in_hf: the Hugging Face folder of the adapters merged into the dequantized weights,
# byte for byte convert --to hf's of the same step.
two=("${QLORA[@]}" --training.steps 2 --lr_scheduler.warmup_steps 1 --checkpoint.enable
     --checkpoint.interval 2)
$TITAN "${two[@]}" --job.dump_folder "$SCRATCH/h5" >/dev/null
$TITAN "${two[@]}" --checkpoint.last_save_in_hf --job.dump_folder "$SCRATCH/hf_last" >/dev/null
$TITAN convert --to hf "$SCRATCH/h5/checkpoint/step-2.h5" "$SCRATCH/hf_converted" >/dev/null
cmp -s "$SCRATCH/hf_last/checkpoint/step-2-hf/model.safetensors" \
  "$SCRATCH/hf_converted/model.safetensors" ||
  fail "last_save_in_hf's export differs from convert --to hf's"
echo "ok: last_save_in_hf exports the merged QLoRA model as convert --to hf does"

# A sharded run without QLoRA takes a QLoRA checkpoint's weights dequantized, each rank its shard.
train_ranks lora_fsdp 2 "${LORA[@]}" --training.steps 2 --lr_scheduler.warmup_steps 1 \
  --training.local_batch_size 2 --parallelism.data_parallel_shard_degree 2 \
  --checkpoint.initial_load_path "$ckpt/step-50.h5"
echo "ok: LoRA under FSDP 2 starts from a QLoRA checkpoint"

# ---- Llama 3 8B on one 24 GB GPU -------------------------------------------------------------
v=$($TITAN --estimate --config configs/llama3_8b.yaml --world-size 1 --device-memory 24GB \
  --parallelism.data_parallel_shard_degree 1 --model.converters lora --lora.rank 16 \
  --lora.quantize_base --activation_checkpoint.mode full | tail -1)
[[ "$v" == "fits: "* ]] || fail "Llama 3 8B QLoRA on 24 GB: $v"
echo "ok: Llama 3 8B QLoRA rank 16 on one 24 GB GPU: $v"

# ---- bad settings --------------------------------------------------------------------------------
expect_user_error 'lora.quantize_base = true does nothing: model.converters has no lora' \
  $TITAN ${SMALL[@]} --lora.quantize_base
expect_user_error 'lora.quantize_base .*choose one' \
  $TITAN "${QLORA[@]}" --model.converters float8,lora
echo "ok: bad QLoRA settings refused in one line"
