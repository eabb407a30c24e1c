#!/usr/bin/env bash
# setup-python.sh — the Python virtualenv of the binding tests: pytest to run
# bindings/python/tests and maturin to build the `toolledger` wheel.
#
# Idempotent: the venv lives outside the repository and is reused when it
# already has the pinned versions; a second run only prints its path.
#
#   venv:    ${TOOLLEDGER_CACHE:-$HOME/.cache/toolledger}/venv
#   pytest:  9.2.0 (pinned; latest on PyPI when written; override with
#            TOOLLEDGER_PYTEST_VERSION). Installed with pip from PyPI.
#   maturin: the version pinned in bindings/python/pyproject.toml
#            ([build-system] requires = ["maturin==X"]), read from there so
#            the test build and `pip install ./bindings/python` use the same.
#   agent frameworks: the exact versions in
#            bindings/python/tests/adapters/requirements.txt (LangGraph,
#            LangChain core, the OpenAI Agents SDK, MCP), which the adapter
#            tests and bench/adapters_overhead.py run against. The package
#            itself does not depend on them.
#   Python:  python3 on PATH (3.9+; checked with 3.11.7). The package needs
#            only the standard library (ctypes, asyncio).
#
# Options:  --print-python   print only the venv's python path
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${TOOLLEDGER_CACHE:-$HOME/.cache/toolledger}"
VENV="$CACHE/venv"
PYTEST_VERSION="${TOOLLEDGER_PYTEST_VERSION:-9.2.0}"
PY="$VENV/bin/python"

if [ "${1:-}" = "--print-python" ]; then
  echo "$PY"
  exit 0
fi

MATURIN_VERSION="$(sed -n 's/^requires = \["maturin==\([^"]*\)"\]$/\1/p' bindings/python/pyproject.toml)"
[ -n "$MATURIN_VERSION" ] || { echo "setup-python: no maturin==X pin in bindings/python/pyproject.toml" >&2; exit 1; }

FRAMEWORKS=bindings/python/tests/adapters/requirements.txt

have_frameworks() {
  # Every `name==version` line of $FRAMEWORKS installed at that version.
  "$PY" - "$FRAMEWORKS" <<'PY' 2>/dev/null
import sys
from importlib import metadata

for line in open(sys.argv[1]):
    pin = line.split("#")[0].strip()
    if pin:
        name, _, version = pin.partition("==")
        if metadata.version(name) != version:
            sys.exit(1)
PY
}

have_tools() {
  [ -x "$PY" ] \
    && [ "$("$PY" -c 'import pytest; print(pytest.__version__)' 2>/dev/null)" = "$PYTEST_VERSION" ] \
    && [ "$("$VENV/bin/maturin" --version 2>/dev/null)" = "maturin $MATURIN_VERSION" ] \
    && have_frameworks
}

if ! have_tools; then
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
  echo "setup-python: installing pytest==$PYTEST_VERSION maturin==$MATURIN_VERSION and the frameworks of $FRAMEWORKS" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check \
    "pytest==$PYTEST_VERSION" "maturin==$MATURIN_VERSION" -r "$FRAMEWORKS"
  have_tools || { echo "setup-python: pytest $PYTEST_VERSION / maturin $MATURIN_VERSION / $FRAMEWORKS missing" >&2; exit 1; }
fi
echo "setup-python: $("$PY" --version) with pytest $PYTEST_VERSION, maturin $MATURIN_VERSION and $FRAMEWORKS at $VENV" >&2
