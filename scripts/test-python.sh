#!/usr/bin/env bash
# test-python.sh — run the Python binding tests (bindings/python/tests).
#
# 1. scripts/setup-python.sh: the pytest venv (idempotent, reused).
# 2. scripts/generate-bindings.sh python: builds the cdylib and regenerates
#    bindings/python/generated/ (toolledger.py + libtoolledger.so next to it)
#    on every run, so the bindings can never be stale; an up-to-date build
#    makes this a few seconds.
# 3. pytest with the generated module on PYTHONPATH. pytest's exit code 5
#    ("no tests collected") is a failure here.
#
# Environment: PROFILE=debug (default here: shares the build of `cargo test`)
# or release. Extra arguments go to pytest (e.g. -k replay).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-python.sh
PY="$(scripts/setup-python.sh --print-python)"

PROFILE="${PROFILE:-debug}" scripts/generate-bindings.sh python

export PYTHONPATH="$PWD/bindings/python/generated${PYTHONPATH:+:$PYTHONPATH}"
set +e
"$PY" -m pytest bindings/python/tests -q -p no:cacheprovider "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "test-python: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
