#!/usr/bin/env bash
# Runs every test of the project: the Rust suites (unit, integration, doc),
# then the foreign-language binding suites when their toolchains are present
# (scripts/setup-*.sh installs them; .ci/run always does).
set -euo pipefail
cd "$(dirname "$0")/.."

# The library, its FFI layer, the CLI, the demo, the benchmark and the test
# support, without the torture harness: the harness needs the core built with
# crash points, and features are unified over whatever one cargo run builds.
echo "== rust: cargo test (workspace: unit, integration, doc tests) =="
cargo test --workspace --exclude toolledger-torture --all-targets
cargo test --workspace --exclude toolledger-torture --doc

echo "== rust: torture suite (SIGKILL, crash points, live owners) =="
cargo test -p toolledger-torture

for suite in scripts/test-python.sh scripts/test-kotlin.sh scripts/test-swift.sh; do
  if [ -x "$suite" ]; then
    echo "== ${suite} =="
    "$suite"
  fi
done
