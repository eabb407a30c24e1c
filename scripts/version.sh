#!/usr/bin/env bash
# version.sh — print the project's version: `version` of [workspace.package]
# in the workspace Cargo.toml, the one place it is written. Every crate
# inherits it (version.workspace = true); the Python wheel (maturin), the JVM
# jar, the Android AAR (build.gradle.kts reads the same line) and the Swift
# release script take it from there.
set -euo pipefail
cd "$(dirname "$0")/.."
v="$(awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{gsub(/.*= *"|".*/, ""); print; exit}' Cargo.toml)"
[ -n "$v" ] || { echo "version.sh: no version in [workspace.package] of Cargo.toml" >&2; exit 1; }
echo "$v"
