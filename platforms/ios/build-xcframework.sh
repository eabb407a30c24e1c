#!/usr/bin/env bash
# build-xcframework.sh — build the toolledger Swift package for iOS apps:
#
#   platforms/ios/ToolLedgerFFI.xcframework       static libtoolledger.a per platform
#                                                 + Headers/{toolledgerFFI.h, module.modulemap}
#   platforms/ios/Sources/ToolLedger/ToolLedger.swift   the generated Swift API
#
# which platforms/ios/Package.swift packages as `ToolLedger` (a .binaryTarget
# `toolledgerFFI` plus the Swift target). Apps add platforms/ios as a local
# package (or a copy of it) and `import ToolLedger`. Nothing here is committed
# (platforms/ios/.gitignore): run this script after every change to the crate.
#
# Steps (Apple's conventions for a Rust static library):
#   1. cargo build --release -p toolledger-ffi --lib (the FFI crate, ffi/) for aarch64-apple-ios (devices),
#      aarch64-apple-ios-sim and x86_64-apple-ios (simulators on Apple silicon
#      and Intel Macs); the FFI crate's crate-type includes "staticlib".
#   2. lipo the two simulator slices into one fat libtoolledger.a (an
#      XCFramework holds one library per platform variant, not per arch).
#   3. scripts/generate-bindings.sh swift (release) for the Swift source, the
#      C header and the module map: the same for every target, so they are
#      generated from the host build. The module map is renamed
#      module.modulemap inside a Headers directory, where Xcode/SwiftPM look.
#   4. xcodebuild -create-xcframework -library … -headers … (one pair per
#      platform variant).
#
# Needs macOS with Xcode (xcodebuild, lipo, the iOS SDKs) and the Rust targets
# (`rustup target add aarch64-apple-ios aarch64-apple-ios-sim x86_64-apple-ios`;
# done here when rustup is present). Fails with a clear message elsewhere.
#
# Environment: IPHONEOS_DEPLOYMENT_TARGET (default 15.0, as Package.swift).
set -euo pipefail

die() { echo "build-xcframework: $*" >&2; exit 1; }

[ "$(uname -s)" = Darwin ] \
  || die "needs macOS with Xcode (xcodebuild, lipo, the iOS SDKs); this is $(uname -s). On Linux, scripts/test-swift.sh checks the Swift bindings against the host library instead."
command -v xcodebuild >/dev/null 2>&1 && xcodebuild -version >/dev/null 2>&1 \
  || die "xcodebuild is missing or points at the Command Line Tools only: install Xcode and run 'sudo xcode-select -s /Applications/Xcode.app'"
command -v lipo >/dev/null 2>&1 || die "lipo is missing (install Xcode)"
command -v cargo >/dev/null 2>&1 || die "cargo is missing (install Rust: https://rustup.rs)"

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"

export IPHONEOS_DEPLOYMENT_TARGET="${IPHONEOS_DEPLOYMENT_TARGET:-15.0}"
device=aarch64-apple-ios
simulators=(aarch64-apple-ios-sim x86_64-apple-ios)

# ---- 1. static libraries ------------------------------------------------------
if command -v rustup >/dev/null 2>&1; then
  installed="$(rustup target list --installed)"
  for t in "$device" "${simulators[@]}"; do
    grep -qxF "$t" <<< "$installed" || rustup target add "$t"
  done
fi
for t in "$device" "${simulators[@]}"; do
  echo "build-xcframework: cargo build --release -p toolledger-ffi --lib --target $t" >&2
  cargo build --release -p toolledger-ffi --lib --target "$t"
done
target_dir="$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')"
lib_of() { echo "$target_dir/$1/release/libtoolledger.a"; }
for t in "$device" "${simulators[@]}"; do
  [ -f "$(lib_of "$t")" ] || die "no static library at $(lib_of "$t")"
done

build="$here/build"
rm -rf "$build"
mkdir -p "$build/ios-simulator" "$build/Headers"
lipo -create "$(lib_of "${simulators[0]}")" "$(lib_of "${simulators[1]}")" \
  -output "$build/ios-simulator/libtoolledger.a"

# ---- 2. Swift source, header, module map -----------------------------------------
PROFILE=release scripts/generate-bindings.sh swift
gen="$repo/bindings/swift/generated"
cp "$gen/toolledgerFFI.h" "$build/Headers/toolledgerFFI.h"
cp "$gen/toolledgerFFI.modulemap" "$build/Headers/module.modulemap"
mkdir -p "$here/Sources/ToolLedger"
cp "$gen/ToolLedger.swift" "$here/Sources/ToolLedger/ToolLedger.swift"

# ---- 3. the XCFramework ------------------------------------------------------------
out="$here/ToolLedgerFFI.xcframework"
rm -rf "$out"
xcodebuild -create-xcframework \
  -library "$(lib_of "$device")" -headers "$build/Headers" \
  -library "$build/ios-simulator/libtoolledger.a" -headers "$build/Headers" \
  -output "$out"

echo "build-xcframework: wrote $out and $here/Sources/ToolLedger/ToolLedger.swift" >&2
echo "build-xcframework: add $here as a local Swift package; import ToolLedger" >&2
