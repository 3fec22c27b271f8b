#!/usr/bin/env bash
# TensorBoard (metrics.enable_tensorboard, metrics.save_tb_folder, metrics.save_for_all_ranks):
# TensorBoard's own reader (EventAccumulator, from PyPI's tensorboard in a venv kept under
# ~/.cache) reads back every scalar of metrics.jsonl, at every logged step, equal to its value
# rounded to float32 (the format's simple_value), and every record passes its CRC checks:
# - 6 steps with validation and MFU; resumed at step 3, where TensorBoard shows steps 4-6 once,
#   the resumed run's (the first run's figures after the checkpoint are hidden, as the JSONL
#   drops them); a fresh run in the same folder hides the earlier runs';
# - the MoE model's expert load and balance loss, in a folder named by metrics.save_tb_folder;
# - 2 ranks: rank 0 only, or with metrics.save_for_all_ranks a rank_<r> folder per rank, each
#   equal to that rank's JSONL; without the key, no events at all.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

VENV=${TITAN_TB_VENV:-$HOME/.cache/titan-tb-venv}
if ! "$VENV/bin/python" -c "import tensorboard" 2>/dev/null; then
  echo "creating $VENV with tensorboard from PyPI"
  $PY -m venv "$VENV" >"$SCRATCH/venv.log" 2>&1 &&
    "$VENV/bin/pip" install -q tensorboard >>"$SCRATCH/venv.log" 2>&1 ||
    fail "cannot install tensorboard in $VENV: $(tail -3 "$SCRATCH/venv.log")"
fi

# tb_equal NAME FOLDER JSONL: the scalars TensorBoard reads in FOLDER are JSONL's, tag by tag.
tb_equal() {
  "$VENV/bin/python" - "$@" <<'PY'
import glob, json, os, struct, sys
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
import tensorboard
name, folder, jsonl = sys.argv[1:4]
TAGS = {"loss": "loss_metrics/global_avg_loss", "grad_norm": "grad_norm", "lr": "lr/AdamW",
        "tokens_per_s": "throughput(tps)", "tflops": "tflops", "mfu": "mfu(%)",
        "peak_memory_gib": "memory/peak(GiB)", "expert_load_max": "moe/expert_load_max",
        "expert_load_mean": "moe/expert_load_mean", "aux_loss": "moe/aux_loss",
        "validation_loss": "validation_metrics/loss"}
TEXT = ("step", "precision", "float8")
f32 = lambda v: struct.unpack("f", struct.pack("f", v))[0]
want = {}
for line in open(jsonl):
    row = json.loads(line)
    for key, value in row.items():
        if key in TEXT or value is None:  # mfu is null without a known peak
            continue
        assert key in TAGS, f"{name}: metrics.jsonl's {key} has no TensorBoard tag here"
        want.setdefault(TAGS[key], []).append((row["step"], f32(value)))
# Every record of every file through TensorBoard's own framing and CRC checks (DataLossError).
files = sorted(glob.glob(os.path.join(folder, "*tfevents*")))
records = 0
for path in files:
    reader = pywrap_tensorflow.PyRecordReader_New(path)
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            break
        records += 1
acc = ea.EventAccumulator(folder, size_guidance={ea.SCALARS: 0})  # 0: keep every value
acc.Reload()
got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
got = {tag: values for tag, values in got.items() if values}  # a restart may purge a whole tag
assert sorted(got) == sorted(want), f"{name}: tags {sorted(got)}, metrics.jsonl's {sorted(want)}"
for tag in want:
    assert got[tag] == want[tag], f"{name}: {tag} {got[tag]}, metrics.jsonl's {want[tag]}"
print(f"ok: {name:28s} {sum(map(len, want.values())):3d} scalars, {len(want)} tags, "
      f"{len(files)} file(s) of {records} records (tensorboard {tensorboard.__version__})")
PY
}

VAL=(--validation.enable --validation.dataset_path "$DATA" --validation.freq 3
     --validation.steps 2 --validation.local_batch_size 2 --validation.seq_len 64)
run=(${SMALL[@]} --training.steps 6 "${VAL[@]}" --metrics.peak_flops 1e12
     --metrics.enable_tensorboard --checkpoint.enable --checkpoint.interval 3
     --job.dump_folder "$SCRATCH/run")
$TITAN "${run[@]}" >"$SCRATCH/run.log"
grep -q "tensorboard: events in $SCRATCH/run/tb/events.out.tfevents." "$SCRATCH/run.log" ||
  fail "no tensorboard line: $(head -20 "$SCRATCH/run.log")"
tb_equal "6 steps" "$SCRATCH/run/tb" "$SCRATCH/run/metrics.jsonl"
$TITAN "${run[@]}" --checkpoint.load_step 3 >"$SCRATCH/resume.log"
grep -q "resumed from .*step-3.h5 at step 3" "$SCRATCH/resume.log" || fail "did not resume at step 3"
[ "$(ls "$SCRATCH/run/tb" | wc -l)" -eq 2 ] || fail "resumed: not a second events file: $(ls "$SCRATCH/run/tb")"
tb_equal "resumed at step 3" "$SCRATCH/run/tb" "$SCRATCH/run/metrics.jsonl"
$TITAN "${SMALL[@]}" --training.steps 2 --metrics.enable_tensorboard \
  --job.dump_folder "$SCRATCH/run" >/dev/null
tb_equal "a fresh run in the folder" "$SCRATCH/run/tb" "$SCRATCH/run/metrics.jsonl"

$TITAN "${SMALL[@]}" --model.name qwen3 --model.flavor small_moe --model.moe_aux_loss_alpha 0.01 \
  --training.steps 2 --metrics.enable_tensorboard --metrics.save_tb_folder my_tb \
  --job.dump_folder "$SCRATCH/moe" >/dev/null
grep -q expert_load_max "$SCRATCH/moe/metrics.jsonl" || fail "no expert load in the MoE run"
tb_equal "MoE, metrics.save_tb_folder" "$SCRATCH/moe/my_tb" "$SCRATCH/moe/metrics.jsonl"

for all in false true; do
  train_ranks "ranks_$all" 2 "${SMALL[@]}" --training.steps 2 --metrics.enable_tensorboard \
    --parallelism.data_parallel_shard_degree 2 --metrics.save_for_all_ranks "$all"
done
tb=$SCRATCH/ranks_false/tb
[ "$(ls "$tb")" = "$(cd "$tb" && ls events.out.tfevents.*)" ] && [ "$(ls "$tb" | wc -l)" -eq 1 ] ||
  fail "2 ranks: not one events file of rank 0: $(ls -R "$tb")"
tb_equal "2 ranks, rank 0" "$tb" "$SCRATCH/ranks_false/metrics.jsonl"
tb=$SCRATCH/ranks_true/tb
[ "$(ls "$tb" | xargs)" = "rank_0 rank_1" ] || fail "save_for_all_ranks: $(ls -R "$tb")"
tb_equal "save_for_all_ranks, rank 0" "$tb/rank_0" "$SCRATCH/ranks_true/metrics.jsonl"
tb_equal "save_for_all_ranks, rank 1" "$tb/rank_1" "$SCRATCH/ranks_true/metrics_rank1.jsonl"

$TITAN "${SMALL[@]}" --training.steps 1 --job.dump_folder "$SCRATCH/off" >/dev/null
[ -e "$SCRATCH/off/tb" ] && fail "events without metrics.enable_tensorboard"
echo "ok: no events without metrics.enable_tensorboard"
