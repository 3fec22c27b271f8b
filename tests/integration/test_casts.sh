#!/usr/bin/env bash
# Casts: titan's e4m3fn and e5m2 casts (non-saturating and saturating), torchao's amax-to-scale
# and bf16 equal ml_dtypes bit for bit over every input class (each representable value and
# each midpoint with a float either side, subnormals, beyond max, infinities, NaN payloads, +-0,
# and millions of random bit patterns), and every code decodes as ml_dtypes decodes it
# (tests/reference/check_casts.py). ml_dtypes comes from PyPI into build/venv-dtypes (a few
# seconds, once per clone); without PyPI the test fails rather than pass unchecked.
source "$(dirname "$0")/lib.sh"

VENV=build/venv-dtypes
if ! $VENV/bin/python -c "import ml_dtypes" 2>/dev/null; then
  { $PY -m venv --system-site-packages "$VENV" && $VENV/bin/pip install -q ml_dtypes; } \
    >"$SCRATCH/pip.log" 2>&1 ||
    fail "cannot install ml_dtypes from PyPI into $VENV: $(tail -n 1 "$SCRATCH/pip.log")"
fi
$VENV/bin/python tests/reference/check_casts.py build/tests/dump_casts "$SCRATCH"
