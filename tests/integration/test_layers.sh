#!/usr/bin/env bash
# The include graph keeps docs/design.md's layering: folders depend on each other without a
# circle (core/ at the bottom, then kernels/, protocols/, the library's folders, train/ on top);
# core/ includes only core/; models/ nothing of infer/ (what runs a model) or train/; and no
# file outside train/ includes train/ (the trainer is an application of the library, as
# Megatron's training/ is). Prints the offending includes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
fail() { echo "FAIL: $*" >&2; exit 1; }

# "FROM TO FILE" for each #include "TO/..." in a file of top-level folder FROM != TO.
folders=$(ls -d */ | tr -d / | grep -vxE 'build|configs|docs|outputs|scripts')
edges=$(find $folders -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.def' \) |
        sort | while read -r f; do
          from=${f%%/*}
          sed -n 's|^#include "\([a-z_0-9]*\)/.*|\1|p' "$f" | sort -u |
            while read -r to; do [ "$to" = "$from" ] || echo "$from $to $f"; done
        done)
[ -n "$edges" ] || fail "no includes found: the scan is broken"

bad=$(awk '$2 == "train" && $1 != "train"' <<<"$edges")
[ -z "$bad" ] || fail "files outside train/ include train/: $(cut -d' ' -f3 <<<"$bad" | tr '\n' ' ')"
bad=$(awk '$1 == "core"' <<<"$edges")
[ -z "$bad" ] || fail "core/ includes other folders: $bad"
bad=$(awk '$1 == "models" && ($2 == "infer" || $2 == "train")' <<<"$edges")
[ -z "$bad" ] || fail "models/ includes infer/ or train/: $bad"
loop=$(cut -d' ' -f1,2 <<<"$edges" | sort -u | tsort 2>&1 >/dev/null) ||
  fail "the folders include each other in a circle: $(tr '\n' ' ' <<<"$loop")"
echo "ok: $(cut -d' ' -f1,2 <<<"$edges" | sort -u | wc -l) folder dependencies, no circle; core/, models/ and train/ kept apart"
