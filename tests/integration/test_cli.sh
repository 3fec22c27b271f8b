#!/usr/bin/env bash
# The command line: --print-config prints the resolved config (file + overrides) as YAML that
# titan reads back to the same config (job.config_file and job.print_config aside); job.save_config_file writes that same text.
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
