#!/usr/bin/env bash
# generate-bindings.sh — build the cdylib and generate the UniFFI bindings.
#
#   scripts/generate-bindings.sh [python|kotlin|swift ...]   (default: all three)
#
# Writes bindings/<lang>/generated/ (not committed: bindings/.gitignore) from
# the library's embedded metadata ("library mode") and the top-level
# uniffi.toml, with the uniffi-bindgen built from the FFI crate
# (ffi/src/bin/toolledger-bindgen.rs), so the generator always matches the uniffi
# the library was compiled with. The library is built from the FFI crate alone
# (`-p toolledger-ffi`), so nothing of the tools (crash points) reaches it.
# For Python the library is copied next to the generated module, which loads
# it from its own directory. The Kotlin file is post-processed by
# bindings/kotlin/tools/fast_calls.py (a per-thread call status).
#
# Environment: PROFILE=release (default) or debug: the profile of the library.
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE="${PROFILE:-release}"
langs=("$@")
[ ${#langs[@]} -eq 0 ] && langs=(python kotlin swift)

case "$(uname -s)" in
  Darwin) libfile=libtoolledger.dylib ;;
  *) libfile=libtoolledger.so ;;
esac

profile_flag=()
[ "$PROFILE" = release ] && profile_flag=(--release)

target_dir="$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')"

# The generator is a build tool: the dev profile compiles it much faster.
# Built first: building it also re-links the library with the `bindgen`
# feature, and the library built next must be the plain one.
echo "generate-bindings: building toolledger-bindgen (uniffi-bindgen)" >&2
cargo build -p toolledger-ffi --features bindgen --bin toolledger-bindgen
bindgen="${target_dir}/debug/toolledger-bindgen"

echo "generate-bindings: building the cdylib (${PROFILE})" >&2
cargo build "${profile_flag[@]}" -p toolledger-ffi --lib
lib="${target_dir}/${PROFILE}/${libfile}"
[ -f "$lib" ] || { echo "generate-bindings: no library at $lib" >&2; exit 1; }

for lang in "${langs[@]}"; do
  case "$lang" in python|kotlin|swift) ;; *)
    echo "generate-bindings: unknown language '$lang' (python, kotlin, swift)" >&2; exit 2 ;;
  esac
  out="bindings/${lang}/generated"
  rm -rf "$out"
  mkdir -p "$out"
  "$bindgen" generate "$lib" --config uniffi.toml --language "$lang" \
    --out-dir "$out" --no-format
  if [ "$lang" = kotlin ]; then
    # A per-thread call status instead of a JNA Structure per native call
    # (bindings/kotlin/tools/fast_calls.py; fails on any template change).
    # The unpatched file is kept for scripts/test-kotlin.sh's check of that step.
    kt="$out/dev/toolledger/toolledger.kt"
    cp "$kt" "$out/toolledger.kt.unpatched"
    python3 bindings/kotlin/tools/fast_calls.py "$kt"
  fi
  if [ "$lang" = python ]; then
    cp "$lib" "$out/"
    # A tool's exception text never reaches stderr or the ledger.
    python3 bindings/python/build_backend/quiet_bindings.py "$out/toolledger.py"
    # Cheaper marshalling helpers (the wheel's build does the same).
    python3 bindings/python/build_backend/lean_runtime.py "$out/toolledger.py"
  fi
  echo "generate-bindings: ${lang} -> ${out}" >&2
done
