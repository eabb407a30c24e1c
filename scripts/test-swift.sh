#!/usr/bin/env bash
# test-swift.sh — run the Swift binding tests (bindings/swift, XCTest).
#
# 1. The Swift toolchain. On Linux: the cached Debian trixie chroot with
#    swiftlang (scripts/setup-swift-chroot.sh builds it once, ~2 GB; CI runs
#    it first; here it is only built when `--check` says it is missing).
#    On macOS: the `swift` of the installed Xcode / toolchain, no chroot.
# 2. scripts/generate-bindings.sh swift: builds the cdylib and regenerates
#    bindings/swift/generated/ on every run, so the bindings can never be
#    stale (an up-to-date build makes this a few seconds).
# 3. Copies what the package expects (all gitignored, see
#    bindings/swift/.gitignore):
#      generated/ToolLedger.swift      -> Sources/ToolLedgerBindings/ToolLedger.swift
#      generated/toolledgerFFI.h       -> Sources/toolledgerFFI/toolledgerFFI.h
#      generated/toolledgerFFI.modulemap -> Sources/toolledgerFFI/module.modulemap
#      README.md's ```swift quick start  -> Sources/ToolLedgerQuickStart/main.swift
#      <target>/<profile>/libtoolledger.so -> lib/   (a private copy: a concurrent
#      cargo build cannot swap the library under the running tests)
# 4. The release manifest: platforms/ios/release.sh write-manifest on a copy
#    of the top-level Package.swift, evaluated by `swift package
#    dump-package` (URL, checksum, language modes).
# 5. `swift test --disable-swift-testing` in bindings/swift, linking lib/ with
#    -L/-l/-rpath (the package names no path). On Linux it runs in the chroot
#    with the repository bind-mounted at its own absolute path. XCTest's
#    summary ("Executed N tests, with 0 failures") ends the output; the exit
#    status is swift test's.
#
# Environment: PROFILE=debug (default, as scripts/test-python.sh: shares the
# build of `cargo test`) or release. CARGO_TARGET_DIR is honoured.
# SWIFT_TEST_TIMEOUT (seconds, default 1800, the Swift build included): a hung
# test fails the run (exit 124) instead of blocking CI. Extra arguments go to
# `swift test` (e.g. --filter CrashRecoveryTests).
# Needs root on Linux (chroot, bind mounts).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
pkg="$repo/bindings/swift"
t0=$(date +%s)

log() { echo "test-swift: $*" >&2; }

case "$(uname -s)" in
  Darwin) os=darwin; libfile=libtoolledger.dylib ;;
  *) os=linux; libfile=libtoolledger.so ;;
esac

# ---- 1. toolchain -------------------------------------------------------------
if [ "$os" = linux ]; then
  if ! scripts/setup-swift-chroot.sh --check >/dev/null 2>&1; then
    log "the Swift chroot is missing: building it (scripts/setup-swift-chroot.sh)"
    scripts/setup-swift-chroot.sh
  fi
else
  command -v swift >/dev/null || { log "no swift on PATH (install Xcode)"; exit 1; }
fi

# ---- 2. bindings --------------------------------------------------------------
PROFILE="${PROFILE:-debug}"
PROFILE="$PROFILE" scripts/generate-bindings.sh swift
target_dir="$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')"
lib="$target_dir/$PROFILE/$libfile"
gen="$pkg/generated"
for f in "$gen/ToolLedger.swift" "$gen/toolledgerFFI.h" "$gen/toolledgerFFI.modulemap" "$lib"; do
  [ -f "$f" ] || { log "missing $f (did generate-bindings.sh change its output?)"; exit 1; }
done

# ---- 3. copy into the package ---------------------------------------------------
mkdir -p "$pkg/Sources/ToolLedgerBindings" "$pkg/Sources/toolledgerFFI" "$pkg/lib"
# cp -p keeps mtimes, so an unchanged binding does not rebuild the package.
cp -p "$gen/ToolLedger.swift" "$pkg/Sources/ToolLedgerBindings/ToolLedger.swift"
cp -p "$gen/toolledgerFFI.h" "$pkg/Sources/toolledgerFFI/toolledgerFFI.h"
cp -p "$gen/toolledgerFFI.modulemap" "$pkg/Sources/toolledgerFFI/module.modulemap"
cp -p "$lib" "$pkg/lib/$libfile"
# README.md's quick start, as written (cmp first: an unchanged copy keeps its
# mtime and does not rebuild).
mkdir -p "$pkg/Sources/ToolLedgerQuickStart"
python3 - "$pkg/README.md" "$pkg/Sources/ToolLedgerQuickStart/main.swift.new" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
code = re.compile(r"```swift\n(.*?)```", re.S).search(text, text.index("## Quick start"))
open(sys.argv[2], "w").write(code.group(1))
PY
if cmp -s "$pkg/Sources/ToolLedgerQuickStart/main.swift.new" "$pkg/Sources/ToolLedgerQuickStart/main.swift"; then
  rm -f "$pkg/Sources/ToolLedgerQuickStart/main.swift.new"
else
  mv -f "$pkg/Sources/ToolLedgerQuickStart/main.swift.new" "$pkg/Sources/ToolLedgerQuickStart/main.swift"
fi

# ---- 4. the release manifest ------------------------------------------------------
# platforms/ios/release.sh's last step (checksum and URL into Package.swift)
# on a copy of the top-level manifest, which SwiftPM then evaluates: the
# binary target must name exactly that URL and checksum, the generated
# target Swift 5 mode and the layer Swift 6 mode.
manifest_dir="$(mktemp -d)"
trap 'rm -rf "$manifest_dir"' EXIT
cp "$repo/Package.swift" "$manifest_dir/Package.swift"
printf 'a stand-in for ToolLedgerFFI.xcframework.zip\n' > "$manifest_dir/asset.zip"
asset_url="https://example.com/toolledger/releases/download/$("$repo/scripts/version.sh")/ToolLedgerFFI.xcframework.zip"
"$repo/platforms/ios/release.sh" write-manifest "$manifest_dir/asset.zip" "$asset_url" "$manifest_dir/Package.swift"
if [ "$os" = linux ]; then
  ( cd "$manifest_dir" && "$repo/scripts/swift-in-chroot.sh" "$manifest_dir" swift package dump-package ) > "$manifest_dir/dump.json"
else
  ( cd "$manifest_dir" && swift package dump-package ) > "$manifest_dir/dump.json"
fi
python3 - "$manifest_dir/dump.json" "$asset_url" "$manifest_dir/asset.zip" <<'PY'
import hashlib, json, sys
dump, url = json.load(open(sys.argv[1])), sys.argv[2]
checksum = hashlib.sha256(open(sys.argv[3], "rb").read()).hexdigest()
targets = {t["name"]: t for t in dump["targets"]}
ffi = targets["toolledgerFFI"]
assert ffi["type"] == "binary" and ffi["url"] == url and ffi["checksum"] == checksum, ffi
def mode(name):
    return [s["kind"]["swiftLanguageMode"]["_0"] for s in targets[name]["settings"] if "swiftLanguageMode" in s["kind"]]
assert mode("ToolLedgerBindings") == ["5"], mode("ToolLedgerBindings")
assert mode("ToolLedger") == ["6"], mode("ToolLedger")
assert targets["ToolLedger"]["dependencies"][0]["byName"][0] == "ToolLedgerBindings"
print(f"test-swift: release manifest ok: {url} {checksum[:12]}..., Swift 5 generated / Swift 6 layer", file=sys.stderr)
PY

# ---- 5. swift test --------------------------------------------------------------
link=(-Xlinker -L"$pkg/lib" -Xlinker -ltoolledger -Xlinker -rpath -Xlinker "$pkg/lib")
cmd=(swift test --disable-swift-testing "${link[@]}" "$@")
log "running: ${cmd[*]}"
limit=(timeout --kill-after=30 "${SWIFT_TEST_TIMEOUT:-1800}")
set +e
if [ "$os" = linux ]; then
  # Bind the repository (package and lib/ inside it) at its own path.
  ( cd "$pkg" && "${limit[@]}" "$repo/scripts/swift-in-chroot.sh" "$repo" "${cmd[@]}" )
else
  ( cd "$pkg" && "${limit[@]}" "${cmd[@]}" )
fi
status=$?
set -e
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  log "swift test did not finish within ${SWIFT_TEST_TIMEOUT:-1800} s: a test hangs (see the last 'started' line above)"
fi
log "swift test exited with $status after $(( $(date +%s) - t0 )) s in total"
exit "$status"
