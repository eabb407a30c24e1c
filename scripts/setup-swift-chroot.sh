#!/usr/bin/env bash
# setup-swift-chroot.sh — build (once) and cache a Debian trixie chroot that has
# Swift (Debian's `swiftlang`, 6.0.x) for building/testing the UniFFI Swift
# bindings on a Debian 12 host that has no Swift. Run things in it with
# scripts/swift-in-chroot.sh.
#
# Cache: ${TOOLLEDGER_SWIFT_CHROOT:-/var/cache/toolledger/swift-trixie}
#   (~2.8 GB; holds the whole chroot). Marker file: <chroot>/.toolledger-swift-ready
#   (written last, contains the package list + `swift --version`). When the marker
#   matches the wanted package list the script only prints the Swift version.
#   A half-built chroot (no marker) is deleted and rebuilt.
#
# Steps: apt-get install debootstrap on the host if missing;
#   debootstrap --variant=minbase trixie <chroot> <mirror>   (mirror: the Debian
#   URI that the host's apt uses, from /etc/apt/sources.list(.d); override with
#   TOOLLEDGER_DEBIAN_MIRROR); then inside the chroot
#   apt-get install -y --no-install-recommends swiftlang libc6-dev ca-certificates
#   (swiftlang pulls gcc/binutils; libswiftlang ships Foundation and XCTest).
# /proc, /dev and /dev/pts are mounted only while the installer runs, inside a
# private mount namespace (unshare -m) when available, and are always unmounted
# by a trap. Needs root.
#
# Options: --rebuild   delete the cached chroot and build it again
#          --check     only verify (exit 1 if the chroot is not ready)
#          --selftest  after setup, prove the toolchain in a temp dir: a host-built
#                      C .so used from Swift via swiftc and via `swift test`
#
# Verified recipe for `swift test` against a prebuilt shared library (this is
# what the UniFFI bindings need: toolledgerFFI.h + toolledgerFFI.modulemap +
# toolledger.swift, Rust cdylib libtoolledger.so):
#   Package.swift:  .systemLibrary(name: "toolledgerFFI", path: "Sources/toolledgerFFI")
#                   with Sources/toolledgerFFI/{toolledgerFFI.h, module.modulemap}
#                   (the generated toolledgerFFI.modulemap copied to the name
#                   module.modulemap; UniFFI's has no `link` line, its `use "Darwin"`
#                   lines are harmless on Linux), a Swift target holding
#                   toolledger.swift that depends on it, and a testTarget.
#   Link the .so, either on the command line (package stays path-free):
#     swift test --disable-swift-testing -Xlinker -L$LIB -Xlinker -ltoolledger \
#                -Xlinker -rpath -Xlinker $LIB
#   or in Package.swift on the Swift target:
#     linkerSettings: [.linkedLibrary("toolledger"),
#                      .unsafeFlags(["-L\(libDir)", "-Xlinker", "-rpath", "-Xlinker", libDir])]
#     with libDir from Context.environment[...] or "\(Context.packageDirectory)/..".
#   Without the rpath, set LD_LIBRARY_PATH=$LIB for `swift test` instead.
#   $LIB must be visible inside the chroot: bind a dir that contains both the
#   package and $LIB (e.g. the repo), or add it to SWIFT_CHROOT_EXTRA_BINDS.
#   --disable-swift-testing drops swift-testing's trailing "0 tests passed" line.
# swiftc directly: swiftc main.swift -module-cache-path /abs/mcache \
#   -Xcc -fmodule-map-file=/abs/toolledgerFFI.modulemap -L/abs/lib -ltoolledger
#   (absolute paths; the modulemap may keep its generated name here).
set -euo pipefail

CHROOT="${TOOLLEDGER_SWIFT_CHROOT:-/var/cache/toolledger/swift-trixie}"
SUITE=trixie
PACKAGES="swiftlang libc6-dev ca-certificates"
MARKER="$CHROOT/.toolledger-swift-ready"

rebuild=0; check_only=0; selftest=0
for arg in "$@"; do
  case "$arg" in
    --rebuild) rebuild=1 ;;
    --selftest) selftest=1 ;;
    --check) check_only=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "setup-swift-chroot.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { echo "setup-swift-chroot: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "must run as root (debootstrap, chroot, mount)"; exit 1; }

ready() { [ -f "$MARKER" ] && head -n1 "$MARKER" | grep -qxF "packages: $PACKAGES"; }

run_selftest() { # host-built C .so used from swiftc and from `swift test`
  local here t d rc=0
  here="$(cd "$(dirname "$0")" && pwd)"
  d="$(mktemp -d /tmp/toolledger-swift-selftest.XXXXXX)"
  [ -n "$d" ] && [ -d "$d" ] || { log "mktemp failed"; return 1; }
  mkdir -p "$d/lib" "$d/pkg/Sources/tlfooFFI" "$d/pkg/Sources/TLFoo" "$d/pkg/Tests/TLFooTests"
  printf '#pragma once\n#include <stdint.h>\nint32_t tlfoo_add(int32_t a, int32_t b);\n' \
    > "$d/pkg/Sources/tlfooFFI/tlfooFFI.h"
  printf '#include "tlfooFFI.h"\nint32_t tlfoo_add(int32_t a, int32_t b) { return a + b; }\n' > "$d/lib/foo.c"
  gcc -shared -fPIC -I"$d/pkg/Sources/tlfooFFI" -o "$d/lib/libtlfoo.so" "$d/lib/foo.c"
  # UniFFI-style module map: no `link` line, `use "Darwin"` included.
  printf 'module tlfooFFI {\n    header "tlfooFFI.h"\n    export *\n    use "Darwin"\n}\n' \
    > "$d/pkg/Sources/tlfooFFI/module.modulemap"
  cat > "$d/pkg/Package.swift" <<'EOF'
// swift-tools-version:5.9
import PackageDescription
let package = Package(
  name: "TLFoo",
  targets: [
    .systemLibrary(name: "tlfooFFI", path: "Sources/tlfooFFI"),
    .target(name: "TLFoo", dependencies: ["tlfooFFI"]),
    .testTarget(name: "TLFooTests", dependencies: ["TLFoo"]),
  ]
)
EOF
  printf 'import tlfooFFI\npublic func add(_ a: Int32, _ b: Int32) -> Int32 { tlfoo_add(a, b) }\n' \
    > "$d/pkg/Sources/TLFoo/TLFoo.swift"
  cat > "$d/pkg/Tests/TLFooTests/TLFooTests.swift" <<'EOF'
import XCTest
import TLFoo
final class TLFooTests: XCTestCase {
  func testAdd() { XCTAssertEqual(add(40, 2), 42) }
  func testAsync() async { let v = await Task.detached { add(1, 2) }.value; XCTAssertEqual(v, 3) }
}
EOF
  printf 'import tlfooFFI\nprecondition(tlfoo_add(40, 2) == 42)\nprint("swiftc + C .so OK")\n' > "$d/main.swift"
  local L="-Xlinker -L$d/lib -Xlinker -ltlfoo -Xlinker -rpath -Xlinker $d/lib"
  t=$(date +%s)
  "$here/swift-in-chroot.sh" "$d" "swiftc $d/main.swift -module-cache-path $d/mcache \
      -Xcc -fmodule-map-file=$d/pkg/Sources/tlfooFFI/module.modulemap -L$d/lib -ltlfoo -o $d/main \
      && LD_LIBRARY_PATH=$d/lib $d/main" >&2 || rc=1
  "$here/swift-in-chroot.sh" "$d" "cd $d/pkg && swift build $L && swift test --disable-swift-testing $L" \
    > "$d/test.log" 2>&1 || rc=1
  grep -E 'Build complete|Executed' "$d/test.log" | tail -n 2 >&2
  if [ "$rc" = 0 ]; then
    log "selftest OK ($(( $(date +%s) - t )) s)"
  else
    log "selftest FAILED:"; tail -n 40 "$d/test.log" >&2
  fi
  rm -rf --one-file-system "$d"
  return "$rc"
}

if [ "$rebuild" = 0 ] && ready; then
  log "chroot ready at $CHROOT"
  sed -n '2,$p' "$MARKER" >&2
  if [ "$selftest" = 1 ]; then run_selftest; fi
  exit 0
fi
if [ "$check_only" = 1 ]; then
  log "chroot at $CHROOT is NOT ready (run scripts/setup-swift-chroot.sh)"; exit 1
fi

# Run the rest in a private mount namespace so nothing we mount can leak to the
# host (even on SIGKILL). The trap below still unmounts explicitly.
if [ -z "${_TL_SWIFT_UNSHARED:-}" ] && command -v unshare >/dev/null \
   && unshare --mount --propagation private true 2>/dev/null; then
  export _TL_SWIFT_UNSHARED=1
  exec unshare --mount --propagation private "$0" "$@"
fi

mounted_under() { # prints mount points at or below $1 (deepest first)
  awk -v p="$1" '$2 == p || index($2, p "/") == 1 { print $2 }' /proc/self/mounts | sort -r
}
cleanup_mounts() {
  local m
  for m in $(mounted_under "$CHROOT"); do
    umount -l "$m" 2>/dev/null || true
  done
}
trap cleanup_mounts EXIT
trap 'exit 130' INT TERM

t_all=$(date +%s)

# ---- mirror -----------------------------------------------------------------
detect_mirror() {
  local uri
  uri="$( { grep -hsE '^[[:space:]]*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}';
            grep -hsE '^[[:space:]]*deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
              | sed -E 's/\[[^]]*\]//' | awk '{print $2}'; } \
          | grep -E '/debian/?$' | grep -v -- '-security' | head -n1 )"
  echo "${uri:-http://deb.debian.org/debian}"
}
MIRROR="${TOOLLEDGER_DEBIAN_MIRROR:-$(detect_mirror)}"
MIRROR="${MIRROR%/}"
log "mirror: $MIRROR"

# ---- debootstrap ------------------------------------------------------------
if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap on the host"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq debootstrap >&2 || { apt-get update -qq >&2; apt-get install -y -qq debootstrap >&2; }
fi

if [ "$rebuild" = 1 ] || [ ! -f "$CHROOT/.toolledger-debootstrap-done" ]; then
  if [ -e "$CHROOT" ]; then
    if [ -n "$(mounted_under "$CHROOT")" ]; then
      log "refusing to delete $CHROOT: something is mounted below it:"; mounted_under "$CHROOT" >&2; exit 1
    fi
    log "removing old/incomplete chroot $CHROOT"
    rm -rf --one-file-system "$CHROOT"
  fi
  mkdir -p "$(dirname "$CHROOT")"
  log "debootstrap --variant=minbase $SUITE $CHROOT $MIRROR"
  t0=$(date +%s)
  debootstrap --variant=minbase "$SUITE" "$CHROOT" "$MIRROR" > "$(dirname "$CHROOT")/debootstrap-$SUITE.log" 2>&1 || {
    log "debootstrap failed; last lines of $(dirname "$CHROOT")/debootstrap-$SUITE.log:"
    tail -n 20 "$(dirname "$CHROOT")/debootstrap-$SUITE.log" >&2; exit 1; }
  log "debootstrap took $(( $(date +%s) - t0 )) s"
  touch "$CHROOT/.toolledger-debootstrap-done"
fi
rm -f "$MARKER"

# ---- install swift inside ------------------------------------------------------
mount -t proc proc "$CHROOT/proc"
mount --bind /dev "$CHROOT/dev"
mount --bind /dev/pts "$CHROOT/dev/pts" 2>/dev/null || true
cp -L /etc/resolv.conf "$CHROOT/etc/resolv.conf" 2>/dev/null || true
# No daemons may start inside the chroot.
printf '#!/bin/sh\nexit 101\n' > "$CHROOT/usr/sbin/policy-rc.d"; chmod +x "$CHROOT/usr/sbin/policy-rc.d"

in_chroot() { chroot "$CHROOT" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
                DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "$@"; }

t0=$(date +%s)
log "apt-get install $PACKAGES (inside chroot; ~2 GB)"
in_chroot apt-get update -qq >&2
in_chroot apt-get install -y -qq --no-install-recommends $PACKAGES > "$CHROOT/var/log/toolledger-apt.log" 2>&1 || {
  log "apt-get install failed:"; tail -n 30 "$CHROOT/var/log/toolledger-apt.log" >&2; exit 1; }
in_chroot apt-get clean
log "apt-get install took $(( $(date +%s) - t0 )) s"

swift_version="$(in_chroot swift --version 2>&1)"
echo "$swift_version" | grep -qi 'swift version' || { log "swift does not run: $swift_version"; exit 1; }
cleanup_mounts

{ echo "packages: $PACKAGES"; echo "suite: $SUITE mirror: $MIRROR built: $(date -u +%FT%TZ)"; echo "$swift_version"; } > "$MARKER"
log "chroot ready at $CHROOT (total $(( $(date +%s) - t_all )) s)"
sed -n '2,$p' "$MARKER" >&2
if [ "$selftest" = 1 ]; then run_selftest; fi
