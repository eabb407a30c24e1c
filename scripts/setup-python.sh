#!/usr/bin/env bash
# setup-python.sh — a Python virtualenv with pytest for the UniFFI Python
# binding tests (bindings/python/tests).
#
# Idempotent: the venv lives outside the repository and is reused when it
# already has the pinned pytest; a second run only prints its path.
#
#   venv:    ${TOOLLEDGER_CACHE:-$HOME/.cache/toolledger}/venv
#   pytest:  9.2.0 (pinned; latest on PyPI when written; override with
#            TOOLLEDGER_PYTEST_VERSION). Installed with pip from PyPI.
#   Python:  python3 on PATH (3.9+; checked with 3.11.7). The bindings need
#            only the standard library (ctypes, asyncio).
#
# Options:  --print-python   print only the venv's python path
set -euo pipefail

CACHE="${TOOLLEDGER_CACHE:-$HOME/.cache/toolledger}"
VENV="$CACHE/venv"
PYTEST_VERSION="${TOOLLEDGER_PYTEST_VERSION:-9.2.0}"
PY="$VENV/bin/python"

if [ "${1:-}" = "--print-python" ]; then
  echo "$PY"
  exit 0
fi

have_pytest() {
  [ -x "$PY" ] && [ "$("$PY" -c 'import pytest; print(pytest.__version__)' 2>/dev/null)" = "$PYTEST_VERSION" ]
}

if ! have_pytest; then
  mkdir -p "$CACHE"
  if [ ! -x "$PY" ]; then
    echo "setup-python: creating $VENV" >&2
    if ! python3 -m venv "$VENV" 2>/dev/null; then
      # Debian's python3 splits venv/ensurepip out.
      echo "setup-python: python3 -m venv failed; installing python3-venv" >&2
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      rm -rf "$VENV"
      python3 -m venv "$VENV"
    fi
  fi
  echo "setup-python: installing pytest==$PYTEST_VERSION" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check "pytest==$PYTEST_VERSION"
  have_pytest || { echo "setup-python: pytest $PYTEST_VERSION not importable" >&2; exit 1; }
fi
echo "setup-python: $("$PY" --version) with pytest $PYTEST_VERSION at $VENV" >&2
