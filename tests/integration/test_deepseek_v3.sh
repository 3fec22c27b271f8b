#!/usr/bin/env bash
# DeepSeek-V3 (model.name deepseek_v3): multi-head latent attention, YaRN RoPE, a dense first
# layer, MoE layers with shared experts and group-limited routing.
# - Parity with the float64 PyTorch reference (tests/reference/llama_ref.py's MLA, built from
#   each checkpoint's attributes): `small` (671B's every feature: a q_lora_rank, v heads
#   narrower than q and k's, sigmoid scores with route norm and scale, 4 expert groups of
#   which 2 compete) and `debugmodel` (no q_lora_rank, softmax scores): loss, logits and every
#   gradient within 1e-5; 20 AdamW steps of `small` within 1e-4, the expert biases moving.
#   Multi-token prediction the same: two modules' step, one module's 20 steps (with two, the
#   expert biases' sign steps turn a routing near-tie into 2e-4 by step 20; without the bias
#   updates two modules stay within 1e-7).
# - Layouts against the 1-rank run, 10 steps within 1e-5 (losses, grad norms, expert loads):
#   FSDP, TP (MLA's up-projections by head, its low-rank ones replicated), CP (the padded
#   values through the ring), PP (1F1B, ZBV), EP with FSDP, with TP and in a pipeline; with two
#   MTP modules, TP (with and without loss parallel), EP with FSDP and PP (the head's copy of
#   the embedding table on the last stage's rank, or on the first's under ZBV with FSDP); a
#   checkpoint saved under tp 2 x ep 2 resumes under pp 2, one with MTP under pp 2 on one rank.
# - KV-cache decoding over the compressed latents: greedy ids equal the reference's no-cache
#   forward.
# - Hugging Face's DeepseekV3ForCausalLM: a trained checkpoint (its expert biases moved) goes to
#   HF and back bit for bit (but the latents' RMSNorm eps, HF's 1e-6), and the export run the
#   way transformers runs it (tests/reference/check_hf.py) gives the import's logits within
#   1e-5; the MTP modules are dropped saying so, or kept with --mtp as DeepSeek's release has
#   them (and imported back bit for bit); a softmax router (debugmodel) has no HF form;
#   config.json keys titan's model cannot be are refused.
# - Bad shapes (from a checkpoint's attributes) and a tp that does not divide the heads: one
#   line, exit 2.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

DS=(${SMALL[@]} --model.name deepseek_v3 --model.flavor small)

# ---- parity ----------------------------------------------------------------------------------
run=("${DS[@]}" --job.dump_folder "$SCRATCH/run" --training.steps 20 --training.global_batch_size 8
     --lr_scheduler.warmup_steps 5 --lr_scheduler.decay_type cosine --lr_scheduler.decay_ratio 0.6
     --lr_scheduler.min_lr_factor 0.1 --training.max_norm 0.5)
$TITAN "${run[@]}" --checkpoint.create_seed_checkpoint >/dev/null
seed=$SCRATCH/run/checkpoint/step-0.h5
./build/tests/dump_step "$seed" "$DATA" 4 64 "$SCRATCH/dump.h5"
$PY tests/reference/check_step.py "$seed" "$SCRATCH/dump.h5" | tail -1
$TITAN "${run[@]}" --checkpoint.initial_load_path "$seed" >/dev/null
$PY tests/reference/check_train.py "$seed" "$SCRATCH/run/metrics.jsonl" | tail -1
$TITAN "${run[@]}" --model.flavor debugmodel --job.dump_folder "$SCRATCH/debug" \
  --checkpoint.create_seed_checkpoint >/dev/null
./build/tests/dump_step "$SCRATCH/debug/checkpoint/step-0.h5" "$DATA" 2 64 "$SCRATCH/debug.h5"
$PY tests/reference/check_step.py "$SCRATCH/debug/checkpoint/step-0.h5" "$SCRATCH/debug.h5" | tail -1
for k in 2 1; do
  $TITAN "${run[@]}" --model.mtp_layers $k --job.dump_folder "$SCRATCH/mtp$k" \
    --checkpoint.create_seed_checkpoint >/dev/null
done
./build/tests/dump_step "$SCRATCH/mtp2/checkpoint/step-0.h5" "$DATA" 4 64 "$SCRATCH/mtp2.h5"
$PY tests/reference/check_step.py "$SCRATCH/mtp2/checkpoint/step-0.h5" "$SCRATCH/mtp2.h5" | tail -1
$TITAN "${run[@]}" --model.mtp_layers 1 --job.dump_folder "$SCRATCH/mtp1" \
  --checkpoint.initial_load_path "$SCRATCH/mtp1/checkpoint/step-0.h5" >/dev/null
$PY tests/reference/check_train.py "$SCRATCH/mtp1/checkpoint/step-0.h5" \
  "$SCRATCH/mtp1/metrics.jsonl" | tail -1

# ---- layouts ---------------------------------------------------------------------------------
lrun=("${DS[@]}" --training.global_batch_size 8 --training.steps 10 --lr_scheduler.warmup_steps 2)
$TITAN "${lrun[@]}" --training.local_batch_size 8 --job.dump_folder "$SCRATCH/ref" >/dev/null

compare() {  # name, metrics.jsonl: against the 1-rank run's ($REF_RUN's), every step
  layout_matches "$1" "$SCRATCH/${REF_RUN:-ref}/metrics.jsonl" "$2" loss grad_norm \
    expert_load_max expert_load_mean
}

layout() {  # name, ranks, local batch (global 8 = local x dp x accumulation), overrides...
  local name=$1 np=$2 local_batch=$3; shift 3
  train_ranks "$name" "$np" "${lrun[@]}" --training.local_batch_size "$local_batch" "$@"
  compare "$name" "$SCRATCH/$name/metrics.jsonl"
}

P=--parallelism
E=$P.expert_parallel_degree
PP2=($P.pipeline_parallel_degree 2 $P.pipeline_parallel_microbatch_size 2)
layout dp_shard=2 2 4 $P.data_parallel_shard_degree 2
layout tp=2 2 8 $P.tensor_parallel_degree 2 $P.data_parallel_shard_degree 1
layout cp=2 2 8 $P.context_parallel_degree 2 $P.data_parallel_shard_degree 1
layout pp=2,1F1B 2 8 "${PP2[@]}" $P.pipeline_parallel_schedule 1F1B $P.data_parallel_shard_degree 1
layout pp=2,ZBV 2 8 "${PP2[@]}" $P.pipeline_parallel_schedule ZBVZeroBubble \
  $P.data_parallel_shard_degree 1
layout ep=2xdp_shard=2 2 4 $P.data_parallel_shard_degree 2 $E 2
layout ep=2xtp=2 2 8 $P.tensor_parallel_degree 2 $P.data_parallel_shard_degree 1 $E 2
layout pp=2xep=2 4 4 "${PP2[@]}" $P.data_parallel_shard_degree 2 $E 2

# Two MTP modules: the head's modules on the sequence-parallel rows, the embedding's lookups of
# the shifted tokens vocab-parallel, their MoE layers' experts sharded.
MTP=(--model.mtp_layers 2)
$TITAN "${lrun[@]}" "${MTP[@]}" --training.local_batch_size 8 --job.dump_folder "$SCRATCH/mtp-ref" \
  >/dev/null
REF_RUN=mtp-ref layout mtp,tp=2 2 8 $P.tensor_parallel_degree 2 $P.data_parallel_shard_degree 1 \
  "${MTP[@]}"
REF_RUN=mtp-ref layout mtp,tp=2,no-loss-parallel 2 8 $P.tensor_parallel_degree 2 \
  $P.data_parallel_shard_degree 1 $P.disable_loss_parallel "${MTP[@]}"
REF_RUN=mtp-ref layout mtp,ep=2xdp_shard=2 2 4 $P.data_parallel_shard_degree 2 $E 2 "${MTP[@]}"
# In a pipeline the head's copy of the embedding table is on the last stage: its gradient and
# the first stage's summed over pp_tied (1F1B, two ranks; saved at step 5 and resumed on one
# rank), or on one rank (ZBV: stages 0 and 3 on pp rank 0, under FSDP).
REF_RUN=mtp-ref layout mtp,pp=2,1F1B 2 8 "${PP2[@]}" $P.pipeline_parallel_schedule 1F1B \
  $P.data_parallel_shard_degree 1 "${MTP[@]}" --checkpoint.enable --checkpoint.interval 5
REF_RUN=mtp-ref layout mtp,pp=2,ZBVxdp_shard=2 4 4 "${PP2[@]}" $P.pipeline_parallel_schedule \
  ZBVZeroBubble $P.data_parallel_shard_degree 2 "${MTP[@]}"
mkdir -p "$SCRATCH/mtp-resumed/checkpoint"
cp "$SCRATCH/mtp,pp=2,1F1B/checkpoint/step-5.h5" "$SCRATCH/mtp-resumed/checkpoint/"
$TITAN "${lrun[@]}" "${MTP[@]}" --training.local_batch_size 8 --checkpoint.enable \
  --job.dump_folder "$SCRATCH/mtp-resumed" >/dev/null
same_metrics "mtp,pp=2 -> 1 rank" "$SCRATCH/mtp-ref/metrics.jsonl" \
  "$SCRATCH/mtp-resumed/metrics.jsonl" 6 1e-5
expect_job_error "model.mtp_layers 2 needs whole sequences of one document each: not context_parallel_degree 2" \
  mpirun --oversubscribe -np 2 $TITAN "${lrun[@]}" "${MTP[@]}" --training.local_batch_size 8 \
  $P.context_parallel_degree 2 $P.data_parallel_shard_degree 1 --job.dump_folder "$SCRATCH/bad-cp"
expect_user_error "model.mtp_layers = 1: model llama3 has no multi-token prediction" \
  $TITAN "${SMALL[@]}" --model.mtp_layers 1 --job.dump_folder "$SCRATCH/bad-llama"
expect_user_error "model.mtp_loss_weight does nothing: model deepseek_v3 small has no multi-token" \
  $TITAN "${DS[@]}" --model.mtp_loss_weight 0.5 --job.dump_folder "$SCRATCH/bad-weight"

# Saved under tp 2 x ep 2 at step 5, resumed under pp 2: steps 6-10 as the 1-rank run's.
resume=(--checkpoint.enable --checkpoint.interval 5)
train_ranks saved 2 "${lrun[@]}" --training.local_batch_size 8 $P.tensor_parallel_degree 2 \
  $P.data_parallel_shard_degree 1 $E 2 "${resume[@]}"
mkdir -p "$SCRATCH/resumed/checkpoint"
cp "$SCRATCH/saved/checkpoint/step-5.h5" "$SCRATCH/resumed/checkpoint/"
train_ranks resumed 2 "${lrun[@]}" --training.local_batch_size 8 "${PP2[@]}" \
  $P.data_parallel_shard_degree 1 "${resume[@]}"
grep -q "resumed from .*step-5.h5 at step 5" "$SCRATCH/resumed.log" || fail "did not resume at step 5"
same_metrics "tp=2xep=2 -> pp=2" "$SCRATCH/ref/metrics.jsonl" "$SCRATCH/resumed/metrics.jsonl" 6 1e-5

# ---- KV-cache decoding -----------------------------------------------------------------------
ckpt=$SCRATCH/saved/checkpoint/step-10.h5
$TITAN generate --checkpoint "$ckpt" --prompt-ids 1 --max-new-tokens 20 --temperature 0 --ids \
  >"$SCRATCH/greedy.txt" 2>/dev/null
(cd tests/reference && $PY generate_ref.py "$ckpt" "$SCRATCH/greedy.txt" 20) ||
  fail "KV-cache decoding differs from the reference's greedy ids"

# ---- Hugging Face ------------------------------------------------------------------------------
ckpt=$SCRATCH/saved/checkpoint/step-10.h5
$TITAN convert --to hf "$ckpt" "$SCRATCH/hf" >/dev/null
$TITAN convert --to titan "$SCRATCH/hf" "$SCRATCH/hf-back.h5" >/dev/null
$PY - "$ckpt" "$SCRATCH/hf-back.h5" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
assert sorted(a["model"]) == sorted(b["model"]), set(a["model"]) ^ set(b["model"])
for name in a["model"]:
    assert np.array_equal(a["model"][name][...], b["model"][name][...]), name
bias = a["model"]["layers.1.moe.expert_bias_E"][...]
assert np.any(bias != 0), "the expert biases never moved: the round trip proves nothing of them"
for k in a.attrs:  # HF's latents' norms have eps 1e-6, the flavor's every norm's
    want = 1e-6 if k == "model.mla_norm_eps" else a.attrs[k]
    if k.startswith("model."):
        assert b.attrs[k] == want, (k, a.attrs[k], b.attrs.get(k))
print(f"ok: {len(a['model'])} tensors and the model.* attributes round-trip through HF bit for bit")
PY
# The import (HF's latent eps) gives the export's logits as transformers computes them.
./build/tests/dump_step "$SCRATCH/hf-back.h5" "$DATA" 2 64 "$SCRATCH/hf-dump.h5" >/dev/null
VENV=build/venv-safetensors  # test_hf's: the `safetensors` package over Debian's interpreter
if ! $VENV/bin/python -c "import safetensors" 2>/dev/null; then
  $PY -m venv --system-site-packages "$VENV" && $VENV/bin/pip install -q safetensors >/dev/null ||
    fail "cannot install the safetensors package from PyPI"
fi
$VENV/bin/python tests/reference/check_hf.py "$SCRATCH/hf" "$SCRATCH/hf-dump.h5"
$TITAN convert --to hf "$SCRATCH/mtp1/checkpoint/step-0.h5" "$SCRATCH/hf-mtp" 2>&1 >/dev/null |
  grep -q "the 1 multi-token prediction modules are dropped" || fail "no word of the MTP modules dropped"
# Kept on request (--mtp) as DeepSeek's release has them, layers n_layers + k with copies of the
# embedding and the output; an import takes them back bit for bit (its expert biases moved
# under pp 2), and none where config.json names some the weights lack (a transformers save).
mtp_ckpt="$SCRATCH/mtp,pp=2,1F1B/checkpoint/step-10.h5"
$TITAN convert --to hf --mtp "$mtp_ckpt" "$SCRATCH/hf-kept" >/dev/null 2>&1
$TITAN convert --to titan "$SCRATCH/hf-kept" "$SCRATCH/hf-kept.h5" >/dev/null
$PY - "$mtp_ckpt" "$SCRATCH/hf-kept.h5" "$SCRATCH/hf-kept" <<'PY'
import json, struct, sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
assert sorted(a["model"]) == sorted(b["model"]), set(a["model"]) ^ set(b["model"])
for name in a["model"]:
    assert np.array_equal(a["model"][name][...], b["model"][name][...]), name
assert b.attrs["model.mtp_layers"] == 2 and np.any(a["model"]["mtp_layers.1.moe.expert_bias_E"][...])
assert json.load(open(sys.argv[3] + "/config.json"))["num_nextn_predict_layers"] == 2
with open(sys.argv[3] + "/model.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
for k in range(2):
    for name in ("enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head", "embed_tokens"):
        assert f"model.layers.{3 + k}.{name}.weight" in header, (k, name)
print(f"ok: {len(a['model'])} tensors with 2 MTP modules round-trip through HF (--mtp) bit for bit")
PY
rm -rf "$SCRATCH/hf-edit" && cp -r "$SCRATCH/hf" "$SCRATCH/hf-edit"
$PY -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); c['num_nextn_predict_layers'] = 1; json.dump(c, open(p, 'w'))" \
  "$SCRATCH/hf-edit/config.json"
$TITAN convert --to titan "$SCRATCH/hf-edit" "$SCRATCH/hf-edit.h5" >/dev/null
$PY -c "import sys, h5py; assert 'model.mtp_layers' not in h5py.File(sys.argv[1], 'r').attrs" \
  "$SCRATCH/hf-edit.h5" || fail "an import made MTP modules the weights do not hold"
expect_user_error "^titan: error: --mtp: checkpoint .* has no multi-token prediction modules$" \
  $TITAN convert --to hf --mtp "$ckpt" "$SCRATCH/hf-none"
expect_user_error "^titan: error: --mtp applies to --to hf: an import takes the MTP modules the weights hold$" \
  $TITAN convert --to titan --mtp "$SCRATCH/hf-kept" "$SCRATCH/none.h5"
expect_user_error "DeepseekV3ForCausalLM's router scores by sigmoid" \
  $TITAN convert --to hf "$SCRATCH/debug/checkpoint/step-0.h5" "$SCRATCH/hf-debug"
hf_refused() {  # python edit of config.json (c), pattern: the import refuses it in one line
  rm -rf "$SCRATCH/hf-edit" && cp -r "$SCRATCH/hf" "$SCRATCH/hf-edit"
  $PY -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); $1; json.dump(c, open(p, 'w'))" \
    "$SCRATCH/hf-edit/config.json"
  expect_user_error "$2" $TITAN convert --to titan "$SCRATCH/hf-edit" "$SCRATCH/hf-edit.h5"
}
hf_refused "c['topk_group'] = 5" "config.json: topk_group 5 is not between 1 and n_group 4"
hf_refused "c['rope_interleave'] = False" "rope_interleave is false; titan's DeepSeek-V3 rotates interleaved pairs"
hf_refused "c['scoring_func'] = 'softmax'" "scoring_func is 'softmax'; titan's DeepSeek-V3 has sigmoid"

# ---- bad shapes ------------------------------------------------------------------------------
bad() {  # pattern, attribute=value...: the seed checkpoint so edited, loaded by generate
  local pattern=$1; shift
  cp "$seed" "$SCRATCH/bad.h5"
  $PY - "$SCRATCH/bad.h5" "$@" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    for edit in sys.argv[2:]:
        name, value = edit.split("=")
        f.attrs["model." + name] = type(f.attrs["model." + name].item())(value)
PY
  expect_user_error "$pattern" $TITAN generate --checkpoint "$SCRATCH/bad.h5" --prompt-ids 1 \
    --max-new-tokens 1
}
bad "RoPE width 15 \(qk_rope_head_dim\) is not a positive even number" mla_qk_rope_head_dim=15
bad "topk_group 5 is not between 1 and n_group 4" moe_limited_groups=5
bad "n_group 3 does not divide the 8 experts" moe_n_groups=3
bad "MLA's v_head_dim 40 is wider than its q and k heads" mla_v_head_dim=40
expect_user_error "model.mtp_layers 3 predicts more tokens ahead than a sequence of 3 has" \
  $TITAN "${DS[@]}" --model.mtp_layers 3 --training.seq_len 3 --job.dump_folder "$SCRATCH/bad-mtp"
expect_job_error "tensor_parallel_degree 3 does not divide model n_heads \(4\)" \
  mpirun --oversubscribe -np 3 $TITAN "${lrun[@]}" $P.tensor_parallel_degree 3 \
  $P.data_parallel_shard_degree 1 --job.dump_folder "$SCRATCH/bad-tp"
