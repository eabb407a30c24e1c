#!/usr/bin/env bash
# release.sh — make a release of the ToolLedger Swift package, the one an app
# adds by URL (the manifest is the repository's top-level Package.swift).
#
#   platforms/ios/release.sh --url-base URL         (macOS with Xcode)
#       URL: where release assets are downloaded from, without the version,
#       e.g. https://github.com/<owner>/toolledger/releases/download
#   platforms/ios/release.sh write-manifest ZIP URL [MANIFEST]   (anywhere)
#       only step 6: the SHA-256 of ZIP and URL into MANIFEST (default: the
#       top-level Package.swift). scripts/test-swift.sh checks this step.
#
# The full release, with VERSION from the workspace Cargo.toml
# (scripts/version.sh):
#   1. cargo build --release -p toolledger-ffi --lib for aarch64-apple-ios
#      (devices), aarch64-apple-ios-sim + x86_64-apple-ios (simulators) and
#      aarch64-apple-darwin + x86_64-apple-darwin (macOS); lipo joins the
#      two simulator and the two macOS slices (an XCFramework holds one
#      library per platform variant). On Apple targets the library links the
#      system SQLite (Cargo.toml: rusqlite without `bundled` there): the
#      script checks with nm that no slice defines a sqlite3_* symbol.
#   2. scripts/generate-bindings.sh swift (release): the Swift source, the C
#      header and the module map, the same for every target. The Swift goes
#      to platforms/ios/Sources/ToolLedgerBindings/ToolLedger.swift, committed
#      with the release.
#   3. Headers/toolledgerFFI/{toolledgerFFI.h, module.modulemap}: the header
#      and module map in a folder of their own, so two XCFrameworks that
#      both ship a top-level Headers/module.modulemap cannot collide in
#      Xcode ("Multiple commands produce .../module.modulemap").
#   4. xcodebuild -create-xcframework (device, simulator, macOS) ->
#      platforms/ios/build/ToolLedgerFFI.xcframework.
#   5. ditto zips it -> platforms/ios/build/ToolLedgerFFI.xcframework.zip.
#   6. The zip's checksum (`swift package compute-checksum`, a SHA-256) and
#      its URL (URL/VERSION/ToolLedgerFFI.xcframework.zip) are written into
#      Package.swift (`releaseURL`, `releaseChecksum`).
# Then: upload the zip to that URL, commit Package.swift and
# platforms/ios/Sources/ToolLedgerBindings/, tag VERSION (the script prints
# the commands).
#
# Needs macOS with Xcode (xcodebuild, lipo, the iOS and macOS SDKs) and the
# five Rust targets (added with rustup when rustup is present).
# Environment: IPHONEOS_DEPLOYMENT_TARGET (default 15.0) and
# MACOSX_DEPLOYMENT_TARGET (default 12.0), as Package.swift.
set -euo pipefail

die() { echo "release: $*" >&2; exit 1; }
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

# ---- step 6 on its own ----------------------------------------------------------
checksum_of() { # the SwiftPM checksum of a zip: its SHA-256, hex
  if command -v swift >/dev/null 2>&1 && [ "$(uname -s)" = Darwin ]; then
    swift package compute-checksum "$1"
  elif command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  else
    shasum -a 256 "$1" | cut -d' ' -f1
  fi
}

write_manifest() { # write_manifest ZIP URL MANIFEST
  local zip="$1" url="$2" manifest="$3" sum
  [ -f "$zip" ] || die "no zip at $zip"
  [ -f "$manifest" ] || die "no manifest at $manifest"
  case "$url" in https://*) ;; *) die "the URL must be https:// (SwiftPM refuses others): $url" ;; esac
  sum="$(checksum_of "$zip")"
  [[ "$sum" =~ ^[0-9a-f]{64}$ ]] || die "bad checksum '$sum'"
  grep -q '^let releaseURL = "' "$manifest" || die "$manifest has no 'let releaseURL = \"...\"' line"
  grep -q '^let releaseChecksum = "' "$manifest" || die "$manifest has no 'let releaseChecksum = \"...\"' line"
  local tmp
  tmp="$(mktemp "$manifest.XXXXXX")"
  URL="$url" SUM="$sum" awk '
    /^let releaseURL = "/ { print "let releaseURL = \"" ENVIRON["URL"] "\""; next }
    /^let releaseChecksum = "/ { print "let releaseChecksum = \"" ENVIRON["SUM"] "\""; next }
    { print }' "$manifest" > "$tmp"
  mv -f "$tmp" "$manifest"
  echo "release: $manifest -> $url ($sum)" >&2
}

if [ "${1:-}" = write-manifest ]; then
  [ $# -ge 3 ] || die "usage: $0 write-manifest ZIP URL [MANIFEST]"
  write_manifest "$2" "$3" "${4:-$repo/Package.swift}"
  exit 0
fi

url_base=""
while [ $# -gt 0 ]; do
  case "$1" in
    --url-base) url_base="${2:-}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
[ -n "$url_base" ] || die "--url-base URL is required (see --help)"

# ---- the full release: macOS with Xcode only -------------------------------------------
[ "$(uname -s)" = Darwin ] \
  || die "needs macOS with Xcode (xcodebuild, lipo, the Apple SDKs); this is $(uname -s). On Linux, scripts/test-swift.sh tests the Swift package against the host library and checks the manifest step."
command -v xcodebuild >/dev/null 2>&1 && xcodebuild -version >/dev/null 2>&1 \
  || die "xcodebuild is missing or points at the Command Line Tools only: install Xcode and run 'sudo xcode-select -s /Applications/Xcode.app'"
command -v lipo >/dev/null 2>&1 || die "lipo is missing (install Xcode)"
command -v cargo >/dev/null 2>&1 || die "cargo is missing (install Rust with rustup)"

cd "$repo"
version="$(scripts/version.sh)"
url="${url_base%/}/$version/ToolLedgerFFI.xcframework.zip"
export IPHONEOS_DEPLOYMENT_TARGET="${IPHONEOS_DEPLOYMENT_TARGET:-15.0}"
export MACOSX_DEPLOYMENT_TARGET="${MACOSX_DEPLOYMENT_TARGET:-12.0}"
device=aarch64-apple-ios
simulators=(aarch64-apple-ios-sim x86_64-apple-ios)
macs=(aarch64-apple-darwin x86_64-apple-darwin)
all=("$device" "${simulators[@]}" "${macs[@]}")

# ---- 1. static libraries ------------------------------------------------------------------
if command -v rustup >/dev/null 2>&1; then
  installed="$(rustup target list --installed)"
  for t in "${all[@]}"; do grep -qxF "$t" <<< "$installed" || rustup target add "$t"; done
fi
for t in "${all[@]}"; do
  echo "release: cargo build --release -p toolledger-ffi --lib --target $t" >&2
  cargo build --release -p toolledger-ffi --lib --target "$t"
done
target_dir="$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')"
lib_of() { echo "$target_dir/$1/release/libtoolledger.a"; }
for t in "${all[@]}"; do
  lib="$(lib_of "$t")"
  [ -f "$lib" ] || die "no static library at $lib"
  # One SQLite per process: the system's. A defined sqlite3_ symbol here
  # would be a second copy inside the app.
  defined="$(nm -gU "$lib" 2>/dev/null | grep -c ' T _sqlite3_' || true)"
  [ "$defined" = 0 ] || die "$lib defines $defined sqlite3_* functions: the bundled SQLite is linked on $t"
done

build="$here/build"
rm -rf "$build"
mkdir -p "$build/ios-simulator" "$build/macos" "$build/Headers/toolledgerFFI"
lipo -create "$(lib_of "${simulators[0]}")" "$(lib_of "${simulators[1]}")" -output "$build/ios-simulator/libtoolledger.a"
lipo -create "$(lib_of "${macs[0]}")" "$(lib_of "${macs[1]}")" -output "$build/macos/libtoolledger.a"

# ---- 2 and 3. Swift source, header, module map ----------------------------------------------
PROFILE=release scripts/generate-bindings.sh swift
gen="$repo/bindings/swift/generated"
cp "$gen/toolledgerFFI.h" "$build/Headers/toolledgerFFI/toolledgerFFI.h"
cp "$gen/toolledgerFFI.modulemap" "$build/Headers/toolledgerFFI/module.modulemap"
mkdir -p "$here/Sources/ToolLedgerBindings"
cp "$gen/ToolLedger.swift" "$here/Sources/ToolLedgerBindings/ToolLedger.swift"

# ---- 4 and 5. the XCFramework and its zip -------------------------------------------------------
xcframework="$build/ToolLedgerFFI.xcframework"
xcodebuild -create-xcframework \
  -library "$(lib_of "$device")" -headers "$build/Headers" \
  -library "$build/ios-simulator/libtoolledger.a" -headers "$build/Headers" \
  -library "$build/macos/libtoolledger.a" -headers "$build/Headers" \
  -output "$xcframework"
zip="$build/ToolLedgerFFI.xcframework.zip"
( cd "$build" && ditto -c -k --sequesterRsrc --keepParent ToolLedgerFFI.xcframework "$zip" )

# ---- 6. the manifest ---------------------------------------------------------------------------
write_manifest "$zip" "$url" "$repo/Package.swift"

cat >&2 <<EOT
release: built $zip
release: next, by hand:
  1. upload $zip to $url
  2. git add Package.swift platforms/ios/Sources/ToolLedgerBindings/ToolLedger.swift
     git commit -m "Swift package $version" && git tag $version && git push --tags
  3. check on a Mac: a new app adds the package by URL at $version, builds for a
     simulator and a device, and links one SQLite (see platforms/ios/README.md)
EOT
