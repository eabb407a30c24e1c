#!/usr/bin/env bash
# test-python.sh — build the `toolledger` wheel, install it, and run the
# Python suite (bindings/python/tests) against the installed package.
#
# 1. scripts/setup-python.sh: the venv with pytest and the pinned maturin.
# 2. The wheel, built the way `pip install ./bindings/python` builds it
#    (pip's PEP 517 path through bindings/python/build_backend, maturin,
#    the workspace's own UniFFI generator), without build isolation so the
#    venv's pinned maturin is used and nothing is downloaded:
#    bindings/python/dist/toolledger-<version>-*.whl.
# 3. `pip install --force-reinstall` of that wheel into the venv, then
#    pytest from bindings/python/tests with no PYTHONPATH: `import
#    toolledger` finds the installed wheel (a test checks it is not the
#    source tree). pytest's exit code 5 ("no tests collected") is a failure.
#
# Environment: PROFILE=debug (default here: shares the build of `cargo test`;
# maturin's `--profile dev`) or release (what `pip install` builds).
# Extra arguments go to pytest (e.g. -k replay).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-python.sh
PY="$(scripts/setup-python.sh --print-python)"
venv_bin="$(dirname "$PY")"

# ---- 2. the wheel -------------------------------------------------------------------
PROFILE="${PROFILE:-debug}"
case "$PROFILE" in
  debug) maturin_args="--profile dev" ;;
  release) maturin_args="" ;;
  *) echo "test-python: PROFILE must be debug or release" >&2; exit 2 ;;
esac
dist=bindings/python/dist
rm -rf "$dist"
echo "test-python: building the wheel (${PROFILE})" >&2
PATH="$venv_bin:$PATH" MATURIN_PEP517_ARGS="$maturin_args" \
  "$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
  -w "$dist" ./bindings/python
wheels=("$dist"/toolledger-*.whl)
[ -f "${wheels[0]}" ] || { echo "test-python: no wheel in $dist" >&2; exit 1; }
echo "test-python: built ${wheels[0]} ($(du -k "${wheels[0]}" | cut -f1) KiB)" >&2

# ---- 3. install it, run the suite against it ------------------------------------------
"$PY" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "${wheels[0]}"
unset PYTHONPATH
set +e
( cd bindings/python/tests && "$PY" -m pytest . -q -p no:cacheprovider "$@" )
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "test-python: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
