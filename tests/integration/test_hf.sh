#!/usr/bin/env bash
# Hugging Face interop: titan -> HF -> titan gives back every tensor bit for bit (grouped-query
# `small`, and Llama 3.1 RoPE scaling with tied embeddings); a bfloat16 export holds each weight
# rounded to nearest even; the export read by the `safetensors` package and run the way
# transformers runs LlamaForCausalLM (rotate_half RoPE) gives titan's logits within 1e-5; and
# checkpoint.last_save_in_hf (with export_dtype) / initial_load_in_hf write and read the same
# weights as the HDF5 checkpoints. Qwen3ForCausalLM the same way: a trained qwen3 `small`
# (QK-norm, its own head_dim) and a tied one round-trip bit for bit, and their exports give
# titan's logits run the way transformers runs Qwen3 (q_norm / k_norm before rotate_half).
# Qwen3MoeForCausalLM (small_moe, one tensor per expert): a seed checkpoint round-trips bit for
# bit; a trained one too but for its expert biases, which HF has no tensor for (the export
# drops them, warning, and an import starts them at zero); its export gives the logits of the
# checkpoint without them run the way transformers runs Qwen3-MoE; a run starting from the HF
# folder trains as one starting from the HDF5 file; layers without experts are refused.
source "$(dirname "$0")/lib.sh"

run=(${SMALL[@]} --model.flavor small --training.steps 3 --checkpoint.enable
     --checkpoint.interval 3)
$TITAN "${run[@]}" --job.dump_folder "$SCRATCH/gqa" >/dev/null
$TITAN "${run[@]}" --model.rope_scaling --model.tie_word_embeddings \
  --checkpoint.create_seed_checkpoint --job.dump_folder "$SCRATCH/tied" >/dev/null
$TITAN "${run[@]}" --model.name qwen3 --job.dump_folder "$SCRATCH/qwen3" >/dev/null
$TITAN "${run[@]}" --model.name qwen3 --model.tie_word_embeddings --job.dump_folder \
  "$SCRATCH/qwen3-tied" >/dev/null
$TITAN "${run[@]}" --model.name qwen3 --model.flavor small_moe --job.dump_folder "$SCRATCH/moe" \
  >/dev/null
$TITAN "${run[@]}" --model.name qwen3 --model.flavor small_moe --checkpoint.create_seed_checkpoint \
  --job.dump_folder "$SCRATCH/moe-seed" >/dev/null
gqa=$SCRATCH/gqa/checkpoint/step-3.h5
tied=$SCRATCH/tied/checkpoint/step-0.h5
qwen3=$SCRATCH/qwen3/checkpoint/step-3.h5
qwen3_tied=$SCRATCH/qwen3-tied/checkpoint/step-3.h5
moe=$SCRATCH/moe/checkpoint/step-3.h5
moe_seed=$SCRATCH/moe-seed/checkpoint/step-0.h5

# same_model A.h5 B.h5 [bf16]: B's /model tensors and model.* attributes are A's bit for bit
# (with bf16: A's fp32 values rounded to bfloat16, nearest even).
same_model() {
  $PY - "$@" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
bf16 = len(sys.argv) > 3
def round_bf16(x):
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)
assert sorted(a["model"]) == sorted(b["model"]), "different tensors"
for name in a["model"]:
    x, y = a["model"][name][...], b["model"][name][...]
    want = round_bf16(x) if bf16 else x
    assert y.dtype == np.float32 and y.shape == want.shape, name
    assert y.tobytes() == want.tobytes(), f"{name} differs"
for k in a.attrs:
    if k.startswith("model."):
        assert a.attrs[k] == b.attrs[k], k
print(f"ok: {len(a['model'])} tensors of {sys.argv[2]} {'rounded to bf16 from' if bf16 else 'identical to'} {sys.argv[1]}")
PY
}

for ckpt in "$gqa" "$tied" "$qwen3" "$qwen3_tied" "$moe_seed"; do
  name=$(basename "$(dirname "$(dirname "$ckpt")")")
  $TITAN convert --to hf "$ckpt" "$SCRATCH/$name-hf" >/dev/null
  $TITAN convert --to titan "$SCRATCH/$name-hf" "$SCRATCH/$name-back.h5" >/dev/null
  same_model "$ckpt" "$SCRATCH/$name-back.h5"
done
$TITAN convert --to hf "$moe" "$SCRATCH/moe-hf" 2>"$SCRATCH/moe-export.log" >/dev/null
grep -q "warning: Hugging Face export: the MoE expert biases (max |bias| [0-9.e-]*) are dropped" \
  "$SCRATCH/moe-export.log" || fail "no warning for the dropped expert biases"
$TITAN convert --to titan "$SCRATCH/moe-hf" "$SCRATCH/moe-back.h5" >/dev/null
$PY - "$moe" "$SCRATCH/moe-back.h5" "$SCRATCH/moe-hf/config.json" <<'PY'
import json, sys, h5py, numpy as np
a, b = (h5py.File(p, "r")["model"] for p in sys.argv[1:3])
assert sorted(a) == sorted(b), "different tensors"
biases = [n for n in a if n.endswith("expert_bias_E")]
assert len(biases) == 2 and all(np.any(a[n][...]) for n in biases), "trained biases are zero"
assert all(not np.any(b[n][...]) for n in biases), "imported biases are not zero"
for n in a:
    assert n in biases or a[n][...].tobytes() == b[n][...].tobytes(), f"{n} differs"
c = json.load(open(sys.argv[3]))
assert c["model_type"] == "qwen3_moe" and c["architectures"] == ["Qwen3MoeForCausalLM"], c
assert (c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]) == (8, 2, 64), c
assert c["norm_topk_prob"] and c["decoder_sparse_step"] == 1 and c["mlp_only_layers"] == [], c
print(f"ok: {len(a) - 2} tensors of the trained MoE back bit for bit, its 2 expert biases zero")
PY
$PY -c "import json, sys; c = json.load(open(sys.argv[1])); assert c['num_key_value_heads'] == 4 \
  and c['rope_scaling'] is None and not c['tie_word_embeddings'] and c['max_position_embeddings'] == 64" \
  "$SCRATCH/gqa-hf/config.json" || fail "config.json of the small model"
$PY -c "import json, sys; c = json.load(open(sys.argv[1])); assert c['model_type'] == 'qwen3' \
  and c['architectures'] == ['Qwen3ForCausalLM'] and c['head_dim'] == 32 and c['hidden_size'] == 64 \
  and not c['tie_word_embeddings']" "$SCRATCH/qwen3-hf/config.json" || fail "config.json of qwen3 small"
[ -z "$($PY -c 'import json, sys; print(json.load(open(sys.argv[1]))["rope_scaling"] or "")' \
  "$SCRATCH/tied-hf/config.json")" ] && fail "config.json lost rope_scaling"

$TITAN convert --to hf --dtype bfloat16 "$gqa" "$SCRATCH/bf16-hf" >/dev/null
[ "$(stat -c %s "$SCRATCH/bf16-hf/model.safetensors")" -lt \
  "$(stat -c %s "$SCRATCH/gqa-hf/model.safetensors")" ] || fail "bfloat16 export is not smaller"
$TITAN convert --to titan "$SCRATCH/bf16-hf" "$SCRATCH/bf16-back.h5" >/dev/null
same_model "$gqa" "$SCRATCH/bf16-back.h5" bf16

# The trainer's keys: the last save as HF in export_dtype bfloat16 holds what step-3.h5 holds
# (runs are deterministic) rounded to bfloat16, and a run starting from an HF folder trains
# exactly as one starting from the HDF5 file.
$TITAN "${run[@]}" --checkpoint.last_save_in_hf --checkpoint.export_dtype bfloat16 \
  --job.dump_folder "$SCRATCH/last" >/dev/null
[ -f "$SCRATCH/last/checkpoint/step-3-hf/model.safetensors" ] || fail "no step-3-hf export"
[ -f "$SCRATCH/last/checkpoint/step-3.h5" ] && fail "step-3.h5 written as well as step-3-hf"
$TITAN convert --to titan "$SCRATCH/last/checkpoint/step-3-hf" "$SCRATCH/last-back.h5" >/dev/null
same_model "$gqa" "$SCRATCH/last-back.h5" bf16
start=(${SMALL[@]} --model.flavor small --training.steps 2)
$TITAN "${start[@]}" --checkpoint.initial_load_path "$gqa" --job.dump_folder "$SCRATCH/from-h5" >/dev/null
$TITAN "${start[@]}" --checkpoint.initial_load_path "$SCRATCH/gqa-hf" --checkpoint.initial_load_in_hf \
  --job.dump_folder "$SCRATCH/from-hf" >/dev/null
diff <(losses "$SCRATCH/from-h5/metrics.jsonl") <(losses "$SCRATCH/from-hf/metrics.jsonl") ||
  fail "training from the HF export differs from training from the HDF5 checkpoint"
moe_start=(${start[@]} --model.name qwen3 --model.flavor small_moe)
$TITAN "${moe_start[@]}" --checkpoint.initial_load_path "$moe_seed" \
  --job.dump_folder "$SCRATCH/moe-from-h5" >/dev/null
$TITAN "${moe_start[@]}" --checkpoint.initial_load_path "$SCRATCH/moe-seed-hf" \
  --checkpoint.initial_load_in_hf --job.dump_folder "$SCRATCH/moe-from-hf" >/dev/null
diff <(losses "$SCRATCH/moe-from-h5/metrics.jsonl") <(losses "$SCRATCH/moe-from-hf/metrics.jsonl") ||
  fail "training the MoE from its HF export differs from training from the HDF5 checkpoint"
echo "ok: initial_load_in_hf trains as initial_load_path on the HDF5 file (dense and MoE)"

# On several ranks (dp_shard 2 x tp 2, the same global batch): each rank keeps its shards of
# the HF tensors, and the last save in HF holds the whole tensors (each rank wrote its shards;
# rank 0 converted them).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe -np 4 -x OMP_NUM_THREADS=1 $TITAN "${start[@]}" \
  --training.local_batch_size 2 --parallelism.data_parallel_shard_degree 2 \
  --parallelism.tensor_parallel_degree 2 \
  --checkpoint.initial_load_path "$SCRATCH/gqa-hf" --checkpoint.initial_load_in_hf \
  --checkpoint.enable --checkpoint.last_save_in_hf --job.dump_folder "$SCRATCH/from-hf-4" \
  >"$SCRATCH/from-hf-4.log" 2>&1 || { tail -5 "$SCRATCH/from-hf-4.log"; fail "4-rank HF run failed"; }
$PY - "$SCRATCH/from-hf/metrics.jsonl" "$SCRATCH/from-hf-4/metrics.jsonl" <<'PY'
import json, sys
one, four = [[json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:]]
assert len(one) == len(four) == 2 and all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(one, four)), (one, four)
PY
[ -f "$SCRATCH/from-hf-4/checkpoint/step-2.h5" ] && fail "4 ranks: step-2.h5 left beside step-2-hf"
$TITAN "${start[@]}" --checkpoint.initial_load_path "$SCRATCH/gqa-hf" --checkpoint.initial_load_in_hf \
  --checkpoint.enable --checkpoint.last_save_in_hf --job.dump_folder "$SCRATCH/from-hf-1" >/dev/null
$TITAN convert --to titan "$SCRATCH/from-hf-1/checkpoint/step-2-hf" "$SCRATCH/hf-1.h5" >/dev/null
$TITAN convert --to titan "$SCRATCH/from-hf-4/checkpoint/step-2-hf" "$SCRATCH/hf-4.h5" >/dev/null
$PY - "$SCRATCH/hf-1.h5" "$SCRATCH/hf-4.h5" <<'PY'
import sys, h5py, numpy as np
one, four = (h5py.File(p, "r")["model"] for p in sys.argv[1:])
assert sorted(one) == sorted(four)
worst = max(float(np.max(np.abs(one[n][()] - four[n][()]))) for n in one)
assert worst < 1e-4, f"4-rank HF export differs from the 1-rank one by {worst}"
PY
echo "ok: initial_load_in_hf and last_save_in_hf on 4 ranks (dp_shard 2 x tp 2) match 1 rank"

expect_user_error "last_save_in_hf = true .* needs checkpoint.last_save_model_only" \
  $TITAN "${run[@]}" --checkpoint.last_save_in_hf --checkpoint.last_save_model_only false
expect_user_error "export_dtype = 'bfloat16' .* applies to the Hugging Face export" \
  $TITAN "${run[@]}" --checkpoint.export_dtype bfloat16
expect_user_error "checkpoint.initial_load_path .*/gqa-hf/config.json describes another model: model.n_layers 4 there, 6 in this run" \
  $TITAN "${start[@]}" --model.flavor debugmodel --checkpoint.initial_load_path "$SCRATCH/gqa-hf" \
  --checkpoint.initial_load_in_hf
mkdir "$SCRATCH/cut" && cp "$SCRATCH/gqa-hf/config.json" "$SCRATCH/cut/"
head -c 1000 "$SCRATCH/gqa-hf/model.safetensors" >"$SCRATCH/cut/model.safetensors"
expect_user_error "safetensors .*cut/model.safetensors: header length [0-9]+ does not fit the file's 1000 bytes" \
  $TITAN convert --to titan "$SCRATCH/cut" "$SCRATCH/x.h5"
expect_user_error "^titan: error: Hugging Face config: unable to open .*/x.h5/config.json" \
  $TITAN convert --to titan "$SCRATCH/x.h5" "$SCRATCH/y.h5"
expect_user_error "^titan: error: --to expects hf, titan or peft, got 'gguf'$" $TITAN convert --to gguf a b
# A checkpoint whose config attribute does not parse has no model shapes to export: refused,
# not exported with the defaults' (a 2048-token context where the run trained 64).
cp "$gqa" "$SCRATCH/garbled.h5"
$PY -c 'import h5py, sys; h5py.File(sys.argv[1], "a").attrs["config"] = "model: [\x01 garbage"' \
  "$SCRATCH/garbled.h5"
expect_user_error "^titan: error: checkpoint $SCRATCH/garbled.h5: attribute config: control characters are not allowed \(at byte 8\)$" \
  $TITAN convert --to hf "$SCRATCH/garbled.h5" "$SCRATCH/garbled-hf"
# The safetensors format's rules, as Hugging Face's reader checks them: the tensors tile the
# data section (no hole, no trailing bytes: a file cannot carry a second content unseen) and
# __metadata__ maps strings to strings; the file is a regular one (a FIFO would block the
# read); a NaN or infinity is converted but said, naming the tensor.
$PY - "$SCRATCH/gqa-hf" "$SCRATCH" <<'PY'
import json, os, shutil, struct, sys
src, scratch = sys.argv[1], sys.argv[2]
blob = open(f"{src}/model.safetensors", "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
def variant(name, header, data):
    os.makedirs(f"{scratch}/{name}")
    shutil.copy(f"{src}/config.json", f"{scratch}/{name}/")
    text = json.dumps(header).encode()
    open(f"{scratch}/{name}/model.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + data)
variant("trailing", header, data + bytes(16))
shifted = {k: v if k == "__metadata__" else dict(v, data_offsets=[o + 8 for o in v["data_offsets"]])
           for k, v in header.items()}
variant("hole", shifted, bytes(8) + data)
variant("metadata", dict(header, __metadata__={"format": 1}), data)
first = min((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__")
nan = bytearray(data)
nan[first[0]:first[0] + 4] = struct.pack("<f", float("nan"))
variant("nan", header, bytes(nan))
PY
for kind in fifo folder; do
  mkdir "$SCRATCH/$kind" && cp "$SCRATCH/gqa-hf/config.json" "$SCRATCH/$kind/"
done
mkfifo "$SCRATCH/fifo/model.safetensors"
mkdir "$SCRATCH/folder/model.safetensors"
expect_user_error "safetensors .*/trailing/model.safetensors: 16 bytes after the last tensor's data belong to no tensor$" \
  $TITAN convert --to titan "$SCRATCH/trailing" "$SCRATCH/x.h5"
expect_user_error "safetensors .*/hole/model.safetensors: data bytes 0 to 8 belong to no tensor \(before '.*'\)$" \
  $TITAN convert --to titan "$SCRATCH/hole" "$SCRATCH/x.h5"
expect_user_error "safetensors .*/metadata/model.safetensors: __metadata__ is not an object of strings$" \
  $TITAN convert --to titan "$SCRATCH/metadata" "$SCRATCH/x.h5"
for kind in fifo folder; do
  expect_user_error "safetensors .*/$kind/model.safetensors is not a regular file$" \
    timeout 20 $TITAN convert --to titan "$SCRATCH/$kind" "$SCRATCH/x.h5"
done
$TITAN convert --to titan "$SCRATCH/nan" "$SCRATCH/nan.h5" 2>"$SCRATCH/nan.err" >/dev/null ||
  fail "a NaN weight failed the conversion: $(cat "$SCRATCH/nan.err")"
grep -Eqx "titan: warning: safetensors .*/nan/model.safetensors: tensor [a-z_.0-9]+ has 1 non-finite values \(NaN or infinity\) of [0-9]+" \
  "$SCRATCH/nan.err" || fail "no warning for the NaN weight: $(cat "$SCRATCH/nan.err")"
echo "ok: a NaN weight converted with one warning naming its tensor"

# config.json keys titan's Llama cannot be are refused naming the file and key.
edit_config() {  # PYTHON-STATEMENT [HF_DIR]: applied to HF_DIR's (gqa-hf's) config dict c,
  local from=${2:-$SCRATCH/gqa-hf}  # written to $SCRATCH/edit
  mkdir -p "$SCRATCH/edit" && cp "$from/model.safetensors" "$SCRATCH/edit/"
  $PY -c "import json, sys; c = json.load(open(sys.argv[1])); $1; json.dump(c, open(sys.argv[2], 'w'))" \
    "$from/config.json" "$SCRATCH/edit/config.json"
}
refused() {  # PYTHON-STATEMENT PATTERN [HF_DIR]: convert --to titan of the edited config is refused
  edit_config "$1" "${3:-}"
  expect_user_error "$2" $TITAN convert --to titan "$SCRATCH/edit" "$SCRATCH/x.h5"
}
refused "c['model_type'] = 'mistral'" \
  "config.json: model_type is 'mistral'; titan's Llama has llama; .*config.json: model_type is 'mistral'; titan's Qwen3 has qwen3; .*config.json: model_type is 'mistral'; titan's DeepSeek-V3 has deepseek_v3$"
refused "c['rope_scaling'] = {'rope_type': 'linear', 'factor': 2.0}" \
  "config.json: rope_scaling of type 'linear'; titan implements rope_type llama3"
refused "del c['hidden_size']" "config.json has no hidden_size$"
refused "c['num_key_value_heads'] = 3" "num_key_value_heads 3 and head_dim 32 do not make even heads"
refused "c['num_hidden_layers'] = 3" \
  "model.safetensors: tensor 'model.layers.3.input_layernorm.weight' is not a weight of this Llama \(3 layers\)$"
refused "c['decoder_sparse_step'] = 2" \
  "^titan: error: [^;]*config.json: decoder_sparse_step 2, mlp_only_layers of 0 layers: titan's Qwen3-MoE has experts in every layer$" \
  "$SCRATCH/moe-hf"
refused "c['num_experts'] = 4" \
  "model.safetensors: tensor 'model.layers.0.mlp.experts.4.gate_proj.weight' is not a weight of this Qwen3-MoE \(2 layers\)$" \
  "$SCRATCH/moe-hf"

# Sizes past their limits are refused as config.json is read, before anything is sized by them
# (they were "out of memory" exits, and 100000 layers spent minutes registering parameters);
# a model within them that does not fit the host is refused before its table is allocated.
for key in hidden_size intermediate_size num_hidden_layers num_attention_heads vocab_size \
           max_position_embeddings head_dim; do
  refused "c['$key'] = 2**31 - 1" "config.json: $key must be an integer in \[1, [0-9]+\]$"
done
refused "c['num_hidden_layers'] = 100000" "config.json: num_hidden_layers must be an integer in \[1, 1024\]$"
refused "c.update(hidden_size=1024, num_attention_heads=1, num_key_value_heads=1, head_dim=1024, max_position_embeddings=2**20)" \
  "config.json: max_position_embeddings 1048576 x head_dim 1024 is more than 2\^28 \(RoPE's tables\)$"
refused "c.update(hidden_size=65536, num_attention_heads=512, num_key_value_heads=512, head_dim=128, intermediate_size=2**20, num_hidden_layers=1024)" \
  "^titan: error: convert: the model's 2.29e\+14 parameters need 851969.50 GiB of host memory in fp32, but [0-9.]+ GiB is free$"

# checkpoint.initial_load_in_hf reads config.json as convert does, and the model it describes
# must be this run's (it trained whatever the run's model.* said, the file's keys unread).
load_refused() {  # PYTHON-STATEMENT PATTERN: training from the edited gqa-hf config is refused
  edit_config "$1"
  expect_user_error "$2" $TITAN "${start[@]}" --checkpoint.initial_load_path "$SCRATCH/edit" \
    --checkpoint.initial_load_in_hf --job.dump_folder "$SCRATCH/edit-run"
}
load_refused "c['hidden_act'] = 'gelu'" "config.json: hidden_act is 'gelu'; titan's Llama has silu$"
load_refused "c['model_type'] = 'gpt2'" "config.json: model_type is 'gpt2'; titan's Llama has llama$"
load_refused "c['rope_theta'] = 1e-300" \
  "^titan: error: checkpoint.initial_load_path $SCRATCH/edit/config.json describes another model: model.rope_theta 1e-300 there, [0-9]+ in this run \(use the model.\* settings it was trained with\)$"
load_refused "c['rms_norm_eps'] = 1e-3" "describes another model: model.norm_eps 0.001 there, 1e-05 in this run"

# The export as transformers reads it: the `safetensors` package (PyPI) in a venv next to the
# build, on top of Debian's interpreter for torch and h5py.
VENV=build/venv-safetensors
if ! $VENV/bin/python -c "import safetensors" 2>/dev/null; then
  $PY -m venv --system-site-packages "$VENV" &&
    $VENV/bin/pip install -q safetensors >"$SCRATCH/pip.log" 2>&1 ||
    { echo "SKIP reference check: cannot install safetensors from PyPI: $(tail -n 1 "$SCRATCH/pip.log")"; exit 0; }
fi
# The MoE's: the logits of the checkpoint without its expert biases (converted back).
for ckpt in "$gqa" "$tied" "$qwen3" "$qwen3_tied" "$SCRATCH/moe-back.h5"; do
  name=$(basename "$(dirname "$(dirname "$ckpt")")")
  [ "$ckpt" = "$SCRATCH/moe-back.h5" ] && name=moe
  ./build/tests/dump_step "$ckpt" "$DATA" 2 64 "$SCRATCH/$name-dump.h5" >/dev/null
  $VENV/bin/python tests/reference/check_hf.py "$SCRATCH/$name-hf" "$SCRATCH/$name-dump.h5"
done
