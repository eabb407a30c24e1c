#!/usr/bin/env bash
# check-one-sqlite.sh — check, as far as this machine can, that the library
# carries its own SQLite only where it must:
#
# 1. Cargo's feature resolution per target (`cargo tree --target`, no
#    toolchain for the target needed): libsqlite3-sys
#    must have `bundled` for Linux and Android, and must NOT have it for
#    iOS devices, iOS simulators and macOS (the system SQLite is linked
#    there). Checked for libtoolledger's own dependency graph
#    (-p toolledger-ffi's manifest).
# 2. The symbol check release.sh runs on the Apple slices, run here on the
#    host's libtoolledger.a as its positive control: the Linux
#    library defines the bundled SQLite's sqlite3_* functions, and the check
#    counts them (a Mac's slices must count 0).
#
# Not checkable here (no Apple toolchain): that an Apple build links
# -lsqlite3 and runs; platforms/ios/README.md lists what a Mac must confirm.
# Environment: PROFILE=debug (default) or release: the host library to inspect.
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0
features_of_sqlite() { # the features libsqlite3-sys gets for target $1 (cargo tree
  # runs the real feature resolver; `cargo metadata` does not separate targets)
  cargo tree -p toolledger-ffi --target "$1" -e features -i libsqlite3-sys --prefix none 2>/dev/null \
    | sed -n 's/^libsqlite3-sys feature "\([^"]*\)".*/\1/p' | sort -u | paste -sd, -
}

for target in x86_64-unknown-linux-gnu aarch64-linux-android armv7-linux-androideabi \
              aarch64-apple-ios aarch64-apple-ios-sim x86_64-apple-ios aarch64-apple-darwin x86_64-apple-darwin; do
  features="$(features_of_sqlite "$target")"
  case "$target" in *-apple-*) want=system ;; *) want=bundled ;; esac
  case ",$features," in *,bundled,*) got=bundled ;; *) got=system ;; esac
  if [ -z "$features" ]; then got=missing; fi
  if [ "$got" = "$want" ]; then
    echo "check-one-sqlite: ok    $target: $want SQLite (libsqlite3-sys features: ${features:-none})"
  else
    echo "check-one-sqlite: FAIL  $target: wanted $want SQLite, got $got (features: ${features:-none})"
    fail=1
  fi
done

PROFILE="${PROFILE:-debug}"
target_dir="$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')"
lib="$target_dir/$PROFILE/libtoolledger.a"
if [ -f "$lib" ]; then
  # Defined, global text symbols named sqlite3_* (Mach-O adds a leading _).
  n="$(nm -g --defined-only "$lib" 2>/dev/null | grep -cE ' T _?sqlite3_' || true)"
  if [ "$n" -gt 0 ]; then
    echo "check-one-sqlite: ok    libtoolledger.a (host, bundled SQLite): $n sqlite3_* functions defined; an Apple slice must define 0"
  else
    echo "check-one-sqlite: FAIL  libtoolledger.a: the positive control found no sqlite3_* symbol"
    fail=1
  fi
else
  echo "check-one-sqlite: skip  $lib (not built)"
fi
exit "$fail"
