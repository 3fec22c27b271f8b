#!/usr/bin/env bash
# scripts/loss_compare and scripts/plot_metrics on real runs: two identical runs compare equal
# (exit 0), runs of different seeds do not (exit 1) unless the tolerance covers them, runs that
# logged different steps fail, a missing file is exit 2; plot_metrics writes a PNG that PIL
# decodes (every chunk's CRC checked) at the requested size, with the curves drawn.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1

run=(${SMALL[@]} --training.steps 5 --validation.enable --validation.dataset_path "$DATA"
     --validation.freq 5 --validation.steps 2 --validation.local_batch_size 2
     --validation.seq_len 64)
$TITAN "${run[@]}" --job.dump_folder "$SCRATCH/a" >/dev/null
$TITAN "${run[@]}" --job.dump_folder "$SCRATCH/b" >/dev/null
$TITAN "${run[@]}" --training.seed 1 --job.dump_folder "$SCRATCH/seed1" >/dev/null

# compare EXPECTED_RC PATTERN ARGS...: loss_compare's exit code and a line of its output.
compare() {
  local want=$1 pattern=$2 rc=0; shift 2
  scripts/loss_compare "$@" >"$SCRATCH/compare.out" 2>&1 || rc=$?
  [ "$rc" -eq "$want" ] || fail "loss_compare $*: exit $rc, expected $want: $(cat "$SCRATCH/compare.out")"
  grep -Eq -- "$pattern" "$SCRATCH/compare.out" ||
    fail "loss_compare $*: no '$pattern' in: $(cat "$SCRATCH/compare.out")"
  echo "ok: loss_compare $* -> $rc: $(grep -E -- "$pattern" "$SCRATCH/compare.out" | head -1)"
}
compare 0 "^PASS: all 5 steps within atol 0 \+ rtol 0" "$SCRATCH/a" "$SCRATCH/b"
compare 0 "^PASS: all 1 steps" "$SCRATCH/a" "$SCRATCH/b/metrics.jsonl" --metric validation_loss
compare 1 "^FAIL: 5 of 5 steps beyond atol 0 \+ rtol 0" "$SCRATCH/a" "$SCRATCH/seed1"
compare 1 "^FAIL: [1-5] of 5 steps beyond atol 0 \+ rtol 1e-06" "$SCRATCH/a" "$SCRATCH/seed1" --rtol 1e-6
compare 0 "^PASS: all 5 steps within atol 1 " "$SCRATCH/a" "$SCRATCH/seed1" --atol 1
head -n 3 "$SCRATCH/a/metrics.jsonl" >"$SCRATCH/short.jsonl"
compare 1 "^FAIL: steps \[4, 5\] only in the baseline" "$SCRATCH/a" "$SCRATCH/short.jsonl"
compare 2 "^loss_compare: cannot read $SCRATCH/none/metrics.jsonl: No such file or directory$" \
  "$SCRATCH/a" "$SCRATCH/none/metrics.jsonl"

png=$SCRATCH/plot.png
out=$(scripts/plot_metrics "$SCRATCH/a" "$SCRATCH/seed1" -o "$png" --size 900x600) ||
  fail "plot_metrics failed: $out"
echo "ok: $out"
$PY - "$png" <<'PY'
import sys
from PIL import Image
path = sys.argv[1]
with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
image = Image.open(path)
assert image.format == "PNG" and image.size == (900, 600), f"{image.format} {image.size}"
image.load()  # decodes every chunk, checking their CRCs
colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
assert len(colors) > 50, f"only {len(colors)} colors: nothing drawn"
print(f"ok: {path} decodes as a 900x600 PNG of {len(colors)} colors")
PY
rc=0
scripts/plot_metrics "$SCRATCH/a" --size 90x60 -o "$png" 2>"$SCRATCH/plot.err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "each side must be 100 to 10000 pixels" "$SCRATCH/plot.err" ||
  fail "plot_metrics --size 90x60: exit $rc, $(cat "$SCRATCH/plot.err")"
echo "ok: plot_metrics refuses --size 90x60 (exit 2)"
