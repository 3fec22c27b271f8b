#!/usr/bin/env bash
# float8 on the MoE experts' grouped GEMMs (float8.moe_fqns_prototype, torchao's rowwise MoE
# recipe through grouped_matmul_float8): its config errors, the startup line that names the
# converted expert weights, and convergence: qwen3 small_moe (test_moe.sh's shape: 8 experts,
# top 2) on the Austen text for 100 steps with only the experts in float8 tracks the
# high-precision run (the default bf16 one, as test_float8_training.sh's) within 2% at every
# logged step after step 20. About 10 s for both runs on one thread. Under expert parallel
# (ep 2) each expert's token group holds the same tokens as on one rank, so the per-group casts
# are the same and the run equals the 1-rank one within 1e-5.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

MOE=(--model.name qwen3 --model.flavor small_moe)
R=(${SMALL[@]} "${MOE[@]}" --training.steps 1 --job.dump_folder "$SCRATCH/err")
F8=(--model.converters float8)

# ---- config errors: exit 2, one line naming the key and where it was set ---------------------
expect_user_error "^titan: error: --float8.moe_fqns_prototype: float8.moe_fqns_prototype = \[experts\] does nothing: model.converters has no float8$" \
  $TITAN "${R[@]}" --float8.moe_fqns_prototype experts
expect_user_error "^titan: error: --float8.moe_fqns_prototype: float8.moe_fqns_prototype does nothing: model llama3 debugmodel has no MoE layers$" \
  $TITAN ${SMALL[@]} --training.steps 1 "${F8[@]}" --float8.moe_fqns_prototype experts
# torchao filters the experts' module, not their parameters: w1_EFD names none.
expect_user_error "^titan: error: --float8.moe_fqns_prototype: float8.moe_fqns_prototype = \[w1_EFD, router\] names no routed experts' module \(layers.0.moe.routed_experts.inner_experts\)$" \
  $TITAN "${R[@]}" "${F8[@]}" --float8.moe_fqns_prototype w1_EFD,router
printf 'model:\n  converters: [float8]\nfloat8:\n  moe_fqns_prototype: [layers.5]\n' >"$SCRATCH/moe.yaml"
expect_user_error "^titan: error: $SCRATCH/moe.yaml:4:23: float8.moe_fqns_prototype = \[layers.5\] names no routed experts' module" \
  $TITAN --config "$SCRATCH/moe.yaml" "${R[@]:2}"

# ---- the startup line and the metrics ----------------------------------------------------------
$TITAN "${R[@]}" "${F8[@]}" --float8.moe_fqns_prototype experts --float8.filter_fqns output \
  >"$SCRATCH/log.out"
grep -qFx "float8: tensorwise recipe on 8 linears (layers.0-1.attention.wq, layers.0-1.attention.wk, layers.0-1.attention.wv, layers.0-1.attention.wo); rowwise grouped GEMMs on 6 expert weights (layers.0-1.moe.routed_experts.inner_experts.w1_EFD, layers.0-1.moe.routed_experts.inner_experts.w2_EDF, layers.0-1.moe.routed_experts.inner_experts.w3_EFD); 3 at the backend's precision (layers.0-1.moe.router.gate, output)" \
  "$SCRATCH/log.out" || fail "no float8 line naming the experts: $(grep float8 "$SCRATCH/log.out")"
$TITAN "${R[@]}" "${F8[@]}" --float8.moe_fqns_prototype layers.1.moe \
  --float8.filter_fqns output,attention >"$SCRATCH/layer1.out"
grep -qFx "float8: no recipe on 0 linears (none); rowwise grouped GEMMs on 3 expert weights (layers.1.moe.routed_experts.inner_experts.w1_EFD, layers.1.moe.routed_experts.inner_experts.w2_EDF, layers.1.moe.routed_experts.inner_experts.w3_EFD); 14 at the backend's precision (layers.0-1.attention.wq, layers.0-1.attention.wk, layers.0-1.attention.wv, layers.0-1.attention.wo, layers.0-1.moe.router.gate, layers.0.moe.routed_experts.inner_experts.w1_EFD, layers.0.moe.routed_experts.inner_experts.w2_EDF, layers.0.moe.routed_experts.inner_experts.w3_EFD, output)" \
  "$SCRATCH/layer1.out" || fail "no float8 line for layer 1's experts: $(grep float8 "$SCRATCH/layer1.out")"
grep -q "step *1 .*  float8 rowwise$" "$SCRATCH/layer1.out" || fail "the step line does not name rowwise"
echo "ok: the log names the float8 experts"

# ---- convergence against the high-precision run -------------------------------------------------
RUN=(--config configs/debug_model.yaml --training.dataset_path "$DATA" --model.tokenizer_path null
     "${MOE[@]}" --training.seq_len 64 --training.local_batch_size 4 --training.steps 100
     --metrics.log_freq 1)
train_ranks high 1 "${RUN[@]}"
train_ranks experts 1 "${RUN[@]}" "${F8[@]}" --float8.moe_fqns_prototype experts \
  --float8.filter_fqns output,attention
$PY - "$SCRATCH" <<'PY'
import json, sys
def losses(name, recipe):
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{name}/metrics.jsonl")]
    assert all(r.get("float8") == recipe for r in rows), name
    return {r["step"]: r["loss"] for r in rows}
high, run = losses("high", None), losses("experts", "rowwise")
assert sorted(high) == sorted(run) == list(range(1, 101)), "expected a loss at every step 1..100"
worst = max((abs(run[s] - high[s]) / high[s], s) for s in high if s > 20)
off = [s for s in high if s > 20 and abs(run[s] - high[s]) > 0.02 * high[s]]
if off:
    sys.exit(f"FAIL: float8 experts are more than 2% off the high-precision loss at steps {off}")
if all(run[s] == high[s] for s in high):
    sys.exit("FAIL: float8 experts gave the high-precision losses: nothing ran in float8")
print(f"ok: float8 experts within 2% of the high-precision loss after step 20 "
      f"(worst {100 * worst[0]:.2f}% at step {worst[1]}; step 100: {run[100]:.4f} vs {high[100]:.4f})")
PY
# ---- expert parallel: the same casts on the tokens each rank receives ---------------------------
EP=(${SMALL[@]} "${MOE[@]}" --training.steps 8 "${F8[@]}" --float8.moe_fqns_prototype experts
    --float8.filter_fqns output,attention)
train_ranks ep1 1 "${EP[@]}"
train_ranks ep2 2 "${EP[@]}" --training.local_batch_size 2 --training.global_batch_size 4 \
  --parallelism.data_parallel_shard_degree 2 --parallelism.expert_parallel_degree 2
same_metrics "float8 experts, ep 2 against 1 rank" "$SCRATCH/ep1/metrics.jsonl" \
  "$SCRATCH/ep2/metrics.jsonl" 1 1e-5
echo "ok: test_float8_moe"
