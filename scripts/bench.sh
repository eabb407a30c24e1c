#!/usr/bin/env bash
# Runs `toolledger-bench` (tools/bench) in release mode (every figure of README
# "Performance", in one run) and, as an independent cross-check of the
# fsync count, `strace -c` over N happy-path calls.
#
# The bench counts fsync/fdatasync per call itself by running child
# processes under strace, so strace is installed first if it is missing.
# Arguments are passed to `toolledger-bench` (e.g. --dir /path/on/the/disk
# --recover-rows 100000).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v strace >/dev/null 2>&1; then
  echo "== installing strace (fsync counts) =="
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq strace
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq strace
  fi
fi

echo "== cargo build --release -p toolledger-bench =="
cargo build --release -p toolledger-bench
target_dir="$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')"
bench="$target_dir/release/toolledger-bench"

echo "== toolledger-bench $* =="
"$bench" "$@"

calls=1000
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "== cross-check: strace -c over $calls happy-path calls (Ledger API) =="
strace -f -c -e trace=fsync,fdatasync -o "$dir/summary" \
  "$bench" --only happy-path --calls "$calls" --dir "$dir" >/dev/null
total=$(awk '$NF == "fsync" || $NF == "fdatasync" { s += $4 } END { print s + 0 }' "$dir/summary")
echo "strace_c_fsyncs=$total calls=$calls (includes opening and migrating the file)"
awk -v t="$total" -v n="$calls" 'BEGIN { printf "strace_c_fsyncs_per_call=%.3f\n", t / n }'
