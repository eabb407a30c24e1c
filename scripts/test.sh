#!/usr/bin/env bash
# Runs every test of the project: the Rust suites (unit, integration, doc),
# then the foreign-language binding suites when their toolchains are present
# (scripts/setup-*.sh installs them; .ci/run always does).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== rust: cargo test (all targets, doc tests) =="
cargo test --all-targets
cargo test --doc

echo "== rust: torture suite (SIGKILL and crash points, crash-points feature) =="
cargo test --features crash-points --test torture

for suite in scripts/test-python.sh scripts/test-kotlin.sh scripts/test-swift.sh; do
  if [ -x "$suite" ]; then
    echo "== ${suite} =="
    "$suite"
  fi
done
