#!/usr/bin/env bash
# build-rust.sh — cross-compile libtoolledger.so for Android and generate the
# Kotlin bindings into this Gradle module.
#
#   platforms/android/build-rust.sh
#
# 1. cargo-ndk builds the FFI crate (ffi/, package toolledger-ffi; release) for arm64-v8a, armeabi-v7a,
#    x86_64 and x86 and copies each libtoolledger.so into
#    platforms/android/src/main/jniLibs/<abi>/.
# 2. The FFI crate's own uniffi-bindgen (ffi/src/bin/toolledger-bindgen.rs, built for the
#    host) reads the UniFFI metadata embedded in the arm64-v8a library it just
#    built, with uniffi.toml, and writes the Kotlin bindings
#    (package dev.toolledger) into platforms/android/src/main/uniffi/:
#    the bindings always match the exact library that ships. Then
#    bindings/kotlin/tools/fast_calls.py post-processes them, as for the
#    desktop jar.
# Both outputs are generated and ignored by git. Then build with Gradle.
#
# Needs: the Android NDK (ANDROID_NDK_HOME pointing at it, r27 or newer),
# cargo-ndk (`cargo install cargo-ndk`), and the Rust targets
# aarch64-linux-android armv7-linux-androideabi x86_64-linux-android
# i686-linux-android (`rustup target add ...`). Exits with a message naming
# whatever is missing.
#
# Environment: ANDROID_NDK_HOME (required).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."   # the crate root

die() { echo "build-rust: $*" >&2; exit 1; }

# ---- prerequisites -----------------------------------------------------------------
command -v cargo >/dev/null || die "cargo not found (install Rust with rustup)"
if ! cargo ndk --version >/dev/null 2>&1; then
  die "cargo-ndk is missing. Install it with: cargo install cargo-ndk"
fi
if [ -z "${ANDROID_NDK_HOME:-}" ]; then
  die "ANDROID_NDK_HOME is not set. Install the NDK (Android Studio > SDK Manager > NDK, or sdkmanager 'ndk;<version>') and export ANDROID_NDK_HOME=\$ANDROID_HOME/ndk/<version>"
fi
[ -d "$ANDROID_NDK_HOME/toolchains/llvm" ] \
  || die "ANDROID_NDK_HOME=$ANDROID_NDK_HOME is not an NDK (no toolchains/llvm in it)"

triples=(aarch64-linux-android armv7-linux-androideabi x86_64-linux-android i686-linux-android)
if command -v rustup >/dev/null; then
  installed="$(rustup target list --installed)"
  missing=()
  for t in "${triples[@]}"; do
    grep -qx "$t" <<<"$installed" || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] || die "Rust targets missing. Install them with: rustup target add ${missing[*]}"
fi

# ---- 1. the native libraries -------------------------------------------------------------
jni_libs=platforms/android/src/main/jniLibs
# 16 KB ELF alignment (required by Google Play for apps targeting Android 15+);
# NDK r28+ does it by default, this makes older NDKs do it too for the 64-bit
# ABIs. Ignored by cargo if RUSTFLAGS is set.
export CARGO_TARGET_AARCH64_LINUX_ANDROID_RUSTFLAGS="${CARGO_TARGET_AARCH64_LINUX_ANDROID_RUSTFLAGS:--C link-arg=-Wl,-z,max-page-size=16384}"
export CARGO_TARGET_X86_64_LINUX_ANDROID_RUSTFLAGS="${CARGO_TARGET_X86_64_LINUX_ANDROID_RUSTFLAGS:--C link-arg=-Wl,-z,max-page-size=16384}"
echo "build-rust: cargo ndk (4 ABIs, release) -> $jni_libs" >&2
cargo ndk -t arm64-v8a -t armeabi-v7a -t x86_64 -t x86 -o "$jni_libs" build --release -p toolledger-ffi --lib

for abi in arm64-v8a armeabi-v7a x86_64 x86; do
  [ -f "$jni_libs/$abi/libtoolledger.so" ] || die "cargo ndk did not produce $jni_libs/$abi/libtoolledger.so"
done

# ---- 2. the Kotlin bindings ------------------------------------------------------------
target_dir="$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')"
echo "build-rust: building toolledger-bindgen (uniffi-bindgen) (host)" >&2
cargo build -p toolledger-ffi --features bindgen --bin toolledger-bindgen
out=platforms/android/src/main/uniffi
rm -rf "$out"
mkdir -p "$out"
"$target_dir/debug/toolledger-bindgen" generate "$jni_libs/arm64-v8a/libtoolledger.so" \
  --config uniffi.toml --language kotlin --out-dir "$out" --no-format
[ -f "$out/dev/toolledger/toolledger.kt" ] || die "no Kotlin bindings in $out"
# The same post-processing as the desktop jar (scripts/generate-bindings.sh):
# a per-thread call status; fails on any change of UniFFI's template.
python3 bindings/kotlin/tools/fast_calls.py "$out/dev/toolledger/toolledger.kt" \
  || die "bindings/kotlin/tools/fast_calls.py refused the generated Kotlin"
echo "build-rust: Kotlin bindings -> $out/dev/toolledger/toolledger.kt" >&2
echo "build-rust: done; now build the module with Gradle (e.g. ./gradlew :toolledger:assembleRelease)" >&2
