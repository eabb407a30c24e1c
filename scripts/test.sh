#!/usr/bin/env bash
# Runs every test of the project: the Rust suites (unit, integration, doc),
# the SQLite-per-target check, then the binding suites: the Python wheel
# (built, installed, tested), the Kotlin JVM jar, the Swift package. Their
# toolchains come from scripts/setup-*.sh (.ci/run runs them; the suites run
# the setups they lack).
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

echo "== one SQLite per process: per-target resolution, symbol check control =="
cargo build --quiet -p toolledger-ffi --lib
scripts/check-one-sqlite.sh

for suite in scripts/test-python.sh scripts/test-kotlin.sh scripts/test-swift.sh; do
  if [ -x "$suite" ]; then
    echo "== ${suite} =="
    "$suite"
  fi
done
