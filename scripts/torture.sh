#!/usr/bin/env bash
# The long crash-boundary torture run: real worker processes killed at armed
# crash points and by SIGKILL, restarted until every run's workload completes,
# with the invariants checked after each run (see RELIABILITY.md).
#
#   scripts/torture.sh --kills 5000 --seed 42
#
# Every argument is passed to the harness (`--jobs J`, `--modes keys,lookup,neither`,
# `--max-kills-per-run K`, `--workdir DIR`, `--keep`, `--keep-going`, `--verbose`,
# `--live` for the live-owner runs). Builds the harness (tools/torture, with the
# core's `crash-points` feature) in release mode. The last
# line of the output is machine-readable:
#   kills=<n> logical_calls=<n> duplicates=<n> unknown_unresolved=<n> lost_records=<n>
# Exit status: 0 when every invariant held, 1 otherwise (the failing runs'
# files are kept and their paths printed), 2 for bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --quiet -p toolledger-torture
target_dir="$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')"
exec "$target_dir/release/torture" "$@"
