#!/usr/bin/env bash
# Selective activation checkpointing (issue 16), torchtitan's two forms: `selective_ac_option:
# op` (each block keeps its GEMMs' and attention's outputs; backward recomputes the norms and
# SwiGLU from them) and an integer n (every n-th block fully checkpointed). Each trains bit for
# bit as `none` and `full` (losses and grad norms at every step): on one rank with fp32 and bf16
# activations and on Qwen3's MoE with QK-norm, on 2 FSDP ranks, under tp 2 (which keeps the
# gathered norms) and under a zero-bubble pipeline (whose backward keeps the recomputed tensors
# from its input part for its weight part). The memory line gives the activations under each
# mode: selective's lie between full's and none's, and each run's arena is its mode's.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
AC=--activation_checkpoint
P=--parallelism
NONE=($AC.mode none) FULL=($AC.mode full)
OP=($AC.mode selective $AC.selective_ac_option op)
EVERY2=($AC.mode selective $AC.selective_ac_option 2)
run=(${SMALL[@]} --training.steps 4 --lr_scheduler.warmup_steps 2)

norms() { grep -o '"loss": [^,]*, "grad_norm": [^,]*' "$1"; }
# same NAME MODES...: runs NAME.none (the reference) and NAME.<mode> for each of the other mode
# arrays named, on the ranks and overrides in the array NAME_ARGS (first: the rank count).
same() {
  local name=$1; shift
  local -n args=${name}_ARGS
  train_ranks "$name.none" "${args[0]}" "${run[@]}" "${args[@]:1}" "${NONE[@]}"
  for mode in "$@"; do
    local -n m=$mode
    train_ranks "$name.$mode" "${args[0]}" "${run[@]}" "${args[@]:1}" "${m[@]}"
    local ref=$SCRATCH/$name.none/metrics.jsonl out=$SCRATCH/$name.$mode/metrics.jsonl
    diff <(norms "$ref") <(norms "$out") || fail "$name: $mode changed the losses or grad norms"
    [ "$(norms "$out" | wc -l)" -eq 4 ] || fail "$name.$mode: not 4 steps"
  done
  echo "ok: $name: ${*,,} bit-identical to none"
}

one_ARGS=(1)
same one FULL OP EVERY2
bf16_ARGS=(1 --training.mixed_precision_param bfloat16)
same bf16 OP
moe_ARGS=(1 --model.name qwen3 --model.flavor small_moe)
same moe OP
fsdp_ARGS=(2 $P.data_parallel_shard_degree 2)
same fsdp OP EVERY2
tp_ARGS=(2 $P.data_parallel_shard_degree 1 $P.tensor_parallel_degree 2)
same tp OP
pp_ARGS=(2 $P.pipeline_parallel_degree 2 $P.pipeline_parallel_microbatch_size 2
         $P.pipeline_parallel_schedule ZBVZeroBubble)
same pp OP EVERY2

# "activations 25.7 MiB (fp32 23.61, bf16 2.00, bytes 0.06)" then "activations by
# activation_checkpoint: none 28.8 MiB, selective op 25.7 MiB, full 12.1 MiB": the run's arena,
# then each mode's. --estimate prints the same three in bytes.
memory() {
  grep -o 'activations [0-9.]* MiB (.*\|activations by activation_checkpoint: .*' \
    "$SCRATCH/$1.log" | tail -n 2 | tr '\n' ' '
}
estimate=$($TITAN --estimate "${run[@]}" "${OP[@]}" | grep '^  activation_checkpoint none')
$PY - "$(memory one.OP)" "$(memory one.EVERY2)" "$(memory one.none)" "$(memory one.FULL)" \
  "$(memory bf16.OP)" "$estimate" <<'PY'
import re, sys
def parse(line):
    own = float(re.match(r"activations ([0-9.]+) MiB", line).group(1))
    modes = dict(re.findall(r"(none|selective \w+|full):? ([0-9.]+) MiB", line))
    return own, {k: float(v) for k, v in modes.items()}
op, every2, none, full, bf16 = map(parse, sys.argv[1:6])
estimate = {k: round(int(v) / 2**20, 1)
            for k, v in re.findall(r"(none|selective \w+|full): ([0-9]+)", sys.argv[6])}
assert estimate == op[1], f"--estimate's {estimate} MiB differ from the run's {op[1]}"
for (own, modes), key in ((op, "selective op"), (every2, "selective 2"), (none, "none"),
                          (full, "full")):
    assert own == modes[key], f"the run's arena {own} MiB is not its mode's: {modes}"
for own, modes in (op, every2, bf16):
    sel = [v for k, v in modes.items() if k.startswith("selective")][0]
    assert modes["full"] < sel < modes["none"], f"selective not between full and none: {modes}"
assert none[1]["none"] == op[1]["none"] and full[1]["full"] == op[1]["full"], (none, full, op)
print(f"ok: activations (MiB) none {op[1]['none']}, selective op {op[0]}, selective 2 "
      f"{every2[0]}, full {op[1]['full']}; bf16: {bf16[1]}")
PY
echo "ok: test_selective_ac"
