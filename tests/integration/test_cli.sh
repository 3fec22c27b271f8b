#!/usr/bin/env bash
# The command line: --print-config prints the resolved config (file + overrides) as YAML that
# titan reads back to the same config (job.config_file and job.print_config aside); job.save_config_file writes that same text.
# --help for titan and each command (generate's and FLUX's sampler's: every flag described),
# --help-config, titan alone; generate's summary line.
source "$(dirname "$0")/lib.sh"

$TITAN --config configs/llama3_8b.yaml --training.steps 7 --print-config >"$SCRATCH/a.yaml"
grep -q 'flavor: "8B"' "$SCRATCH/a.yaml" || fail "flavor missing from the printed config"
grep -Eq '^  steps: 7( |$)' "$SCRATCH/a.yaml" || fail "override missing from the printed config"
$TITAN --config "$SCRATCH/a.yaml" --print-config >"$SCRATCH/b.yaml"
# job.config_file (the file read) and job.print_config (how it was asked for) differ by design
same() { diff <(grep -Ev '^  (config_file|print_config):' "$1") <(grep -Ev '^  (config_file|print_config):' "$2"); }
same "$SCRATCH/a.yaml" "$SCRATCH/b.yaml" || fail "printed config does not read back the same"

$TITAN "${SMALL[@]}" --training.steps 1 --job.dump_folder "$SCRATCH/run" \
  --job.save_config_file "$SCRATCH/saved.yaml" >/dev/null
$TITAN --config "$SCRATCH/saved.yaml" --print-config >"$SCRATCH/again.yaml"
same "$SCRATCH/again.yaml" "$SCRATCH/saved.yaml" ||
  fail "the saved config is not the resolved config"
# --device D is short for --training.device D (printing the config starts no backend).
$TITAN --config configs/debug_model.yaml --device cuda --print-config >"$SCRATCH/device.yaml"
grep -Eq '^  device: "cuda"' "$SCRATCH/device.yaml" || fail "--device cuda did not set training.device"
echo "ok: print-config round trip, save_config_file, --device"

# --help: the usage on stdout, exit 0, for titan and each command; titan alone: usage, exit 2.
$TITAN --help >"$SCRATCH/help.txt" || fail "titan --help did not exit 0"
for want in "titan tokenize" "titan tokenizer train" "titan generate" "titan convert" "--print-config" \
    "--help-config" "configs/" "README.md"; do
  grep -qF -- "$want" "$SCRATCH/help.txt" || fail "titan --help does not mention $want"
done
$TITAN --config configs/debug_model.yaml --training.steps 3 -h | cmp -s - "$SCRATCH/help.txt" ||
  fail "-h among training flags does not print the usage"
$TITAN tokenize --help | grep -q "^usage: titan tokenize --tokenizer" || fail "tokenize --help"
$TITAN tokenizer train --help | grep -q "^usage: titan tokenizer train --vocab-size" ||
  fail "tokenizer train --help"
$TITAN tokenizer --help | grep -q "^usage: titan tokenizer train --vocab-size" ||
  fail "tokenizer --help"
expect_user_error "^titan: error: tokenizer: unknown command tain; usage: titan tokenizer train" \
  $TITAN tokenizer tain
$TITAN generate --help | grep -q "^usage: titan generate --checkpoint" || fail "generate --help"
$TITAN generate --help | grep -qF -- "--checkpoint FLUX.h5 --help" ||
  fail "generate --help does not say where a FLUX checkpoint's flags are"
# generate --help describes every flag of its usage line, one line per flag; so does FLUX's
# sampler's (a FLUX checkpoint's --help).
/usr/bin/python3 scripts/flux_preprocess.py --digits --out "$SCRATCH/digits" >/dev/null
$TITAN --config configs/flux_digits.yaml --training.dataset_path "$SCRATCH/digits" \
  --checkpoint.enable --checkpoint.create_seed_checkpoint --job.dump_folder "$SCRATCH/flux" \
  >"$SCRATCH/flux.log" 2>&1 || fail "FLUX seed checkpoint: $(tail -1 "$SCRATCH/flux.log")"
# A FLUX run's log speaks of images: no vocabulary, images/s on the step line and in
# metrics.jsonl (beside tokens_per_s, which stays).
$TITAN --config configs/flux_digits.yaml --training.dataset_path "$SCRATCH/digits" \
  --training.steps 1 --job.dump_folder "$SCRATCH/flux1" >"$SCRATCH/flux1.log" 2>&1 ||
  fail "FLUX step: $(tail -1 "$SCRATCH/flux1.log")"
grep -q "^model: flux flux-digits, 2 layers, dim 64; batch" "$SCRATCH/flux1.log" ||
  fail "FLUX's model line: $(grep "^model:" "$SCRATCH/flux1.log")"
grep -q "^step *1 .* img/s *[0-9.]*  TFLOP/s" "$SCRATCH/flux1.log" ||
  fail "FLUX's step line: $(grep "^step" "$SCRATCH/flux1.log")"
grep -q '"tokens_per_s": [0-9.e+]*, "images_per_s": [0-9.e+]*,' "$SCRATCH/flux1/metrics.jsonl" ||
  fail "FLUX's metrics.jsonl: $(cat "$SCRATCH/flux1/metrics.jsonl")"
# MFU on cpu: against the rank's GEMM peak, measured once and named in the log; the step
# line's MFU is TFLOP/s over it. metrics.peak_flops replaces it, and the measurement with it.
for given in measured 1e12; do
  run=$SCRATCH/mfu-$given flag=() peak=$given
  [ "$given" = measured ] || flag=(--metrics.peak_flops "$given")
  $TITAN ${SMALL[@]} --training.steps 2 "${flag[@]}" --job.dump_folder "$run" >"$run.log" 2>&1 ||
    fail "MFU run: $(tail -1 "$run.log")"
  line=$(grep -o "MFU is against this rank's measured GEMM peak in fp32: [0-9.]* GFLOP/s" "$run.log" || true)
  if [ "$given" = measured ]; then
    [ -n "$line" ] || fail "no measured peak in the log: $(grep MFU "$run.log")"
    peak=$(awk '{print $(NF - 1) * 1e9}' <<<"$line")
  else
    [ -z "$line" ] || fail "metrics.peak_flops given, yet the peak was measured: $line"
  fi
  /usr/bin/python3 - "$run/metrics.jsonl" "$peak" <<'PY' || fail "MFU against $peak"
import json, sys
peak = float(sys.argv[2])
for line in open(sys.argv[1]):
    r = json.loads(line)
    want = 100 * r["tflops"] * 1e12 / peak
    assert r["mfu"] is not None and r["mfu"] > 0 and abs(r["mfu"] - want) <= 1e-3 * want, (r, want)
PY
done
grep -q "is above 100%" "$SCRATCH/mfu-1e12.log" && fail "MFU above 100% against 1 TFLOP/s"
# A peak below the run's own rate (a busy cpu while it was measured, or a wrong
# metrics.peak_flops) makes an MFU above 100%: one warning says so, not one per step line.
run=$SCRATCH/mfu-low
$TITAN ${SMALL[@]} --training.steps 3 --metrics.log_freq 1 --metrics.peak_flops 1e9 \
  --job.dump_folder "$run" >"$run.log" 2>&1 || fail "low-peak MFU run: $(tail -1 "$run.log")"
n=$(grep -c "MFU [0-9]*% is above 100%: its peak, 1.0 GFLOP/s (metrics.peak_flops), is below" \
  "$run.log" || true)
[ "$n" = 1 ] || fail "$n warnings of an MFU above 100%: $(grep -i mfu "$run.log")"
echo "ok: MFU on cpu against the measured peak and metrics.peak_flops; one warning above 100%"
for ckpt in build/test-data/models/stories260K.bin "$SCRATCH/flux/checkpoint/step-0.h5"; do
  $TITAN generate --checkpoint "$ckpt" --help >"$SCRATCH/gen_help.txt" ||
    fail "generate --checkpoint $ckpt --help"
  for flag in $(head -1 "$SCRATCH/gen_help.txt" | grep -o -- "--[a-z-]*" | sort -u); do
    grep -Eq -- "^  (-h, )?$flag( [^ ]+)?  +[^ ]" "$SCRATCH/gen_help.txt" ||
      fail "generate --checkpoint $ckpt --help does not describe $flag"
  done
done
for c in configs/*.yaml; do
  grep -qF "$(basename "$c")" "$SCRATCH/help.txt" || fail "titan --help does not list $c"
done
$TITAN convert --help | grep -q "^usage: titan convert --to hf" || fail "convert --help"
rc=0; $TITAN >/dev/null 2>"$SCRATCH/alone.txt" || rc=$?
[ "$rc" -eq 2 ] || fail "titan alone exited $rc, not 2"
cmp -s "$SCRATCH/alone.txt" "$SCRATCH/help.txt" || fail "titan alone does not print the usage"
# --help-config: every key of the printed config, with its type and default.
$TITAN --help-config >"$SCRATCH/keys.txt" || fail "--help-config did not exit 0"
awk '/^[a-z_0-9]+:$/ {s = substr($1, 1, length($1) - 1)} /^  [a-z_0-9]+:/ {print "  --" s "." substr($1, 1, length($1))}' \
  "$SCRATCH/a.yaml" >"$SCRATCH/key_names.txt"
[ "$(wc -l <"$SCRATCH/key_names.txt")" -gt 100 ] || fail "too few keys in the printed config"
while read -r key; do
  grep -qF -- "$key " "$SCRATCH/keys.txt" || fail "--help-config does not list $key"
done <"$SCRATCH/key_names.txt"
grep -qF -- "  --training.steps: an integer in [0, 2147483646]; default 10000" "$SCRATCH/keys.txt" ||
  fail "--help-config does not give training.steps' range and default"
# generate ends its text with a newline before the summary, also when both go to one file.
$TITAN generate --checkpoint build/test-data/models/stories260K.bin --prompt-ids 1 \
  --max-new-tokens 5 --temperature 0 --ids >"$SCRATCH/gen.txt" 2>&1
grep -q "^generate: 1 prompt + 5 new tokens" "$SCRATCH/gen.txt" ||
  fail "generate's summary does not start a line: $(cat "$SCRATCH/gen.txt")"
echo "ok: --help, --help-config, titan alone, generate's last line"
