#!/usr/bin/env bash
# swift-in-chroot.sh DIR_TO_BIND CMD... — run a command in the cached Swift
# chroot (built by scripts/setup-swift-chroot.sh) with the host directory
# DIR_TO_BIND bind-mounted at the SAME absolute path inside the chroot, so
# absolute paths (module maps, -L dirs, SwiftPM's .build and module cache) are
# identical inside and out. Caches nothing itself; SwiftPM keeps its caches in
# <chroot>/root/.cache and in DIR/.build.
#
#   scripts/swift-in-chroot.sh /work/main/bindings/swift 'swift build && swift test'
#   scripts/swift-in-chroot.sh "$PWD" swift test -Xlinker -L"$PWD/lib"
#
# CMD: one argument is run as a bash command string; several arguments are run
# as one command with each argument quoted. The command starts in the host's
# current directory if that lies inside DIR_TO_BIND, else in DIR_TO_BIND. The
# environment inside is clean (env -i HOME=/root PATH=/usr/bin:/bin LANG=C.UTF-8);
# variables named in SWIFT_CHROOT_PASS_ENV (space separated, e.g.
# "LD_LIBRARY_PATH CI") are passed through. SWIFT_CHROOT_EXTRA_BINDS
# (colon-separated host dirs) are bind-mounted at their own paths as well.
# /proc, /dev, /dev/pts and the binds are mounted only for the command, inside a
# private mount namespace (unshare -m) when available, and are unmounted by a
# trap even when the command fails. Exit status is the command's. Needs root.
#
# Chroot: ${TOOLLEDGER_SWIFT_CHROOT:-/var/cache/toolledger/swift-trixie}
set -euo pipefail

CHROOT="${TOOLLEDGER_SWIFT_CHROOT:-/var/cache/toolledger/swift-trixie}"
MARKER="$CHROOT/.toolledger-swift-ready"

if [ $# -lt 2 ]; then
  echo "usage: $0 DIR_TO_BIND CMD..." >&2; exit 2
fi
[ "$(id -u)" = 0 ] || { echo "swift-in-chroot: must run as root" >&2; exit 1; }
[ -f "$MARKER" ] || { echo "swift-in-chroot: $CHROOT is not ready; run scripts/setup-swift-chroot.sh" >&2; exit 1; }

BIND="$(realpath -e "$1")"; shift
[ -d "$BIND" ] || { echo "swift-in-chroot: $BIND is not a directory" >&2; exit 1; }
case "$BIND" in /) echo "swift-in-chroot: refusing to bind /" >&2; exit 1 ;; esac

if [ $# -eq 1 ]; then
  CMD="$1"
else
  CMD="$(printf '%q ' "$@")"
fi

# Private mount namespace: the mounts vanish with the process even if it is
# killed, and concurrent runs do not see each other's mounts.
if [ -z "${_TL_SWIFT_UNSHARED:-}" ] && command -v unshare >/dev/null \
   && unshare --mount --propagation private true 2>/dev/null; then
  export _TL_SWIFT_UNSHARED=1
  exec unshare --mount --propagation private "$0" "$BIND" "$CMD"
fi

MOUNTED=()
CREATED=()   # mount-point dirs we created inside the chroot (removed if empty)
cleanup() {
  local i
  for (( i=${#MOUNTED[@]}-1; i>=0; i-- )); do
    umount "${MOUNTED[$i]}" 2>/dev/null || umount -l "${MOUNTED[$i]}" 2>/dev/null || true
  done
  for (( i=${#CREATED[@]}-1; i>=0; i-- )); do
    rmdir "${CREATED[$i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

do_mount() { # do_mount TARGET mount-args...
  local target="$1"; shift
  mount "$@" "$target"
  MOUNTED+=("$target")
}

do_mount "$CHROOT/proc" -t proc proc
do_mount "$CHROOT/dev" --bind /dev
if [ -d /dev/pts ]; then do_mount "$CHROOT/dev/pts" --bind /dev/pts; fi

bind_dir() {
  local d p; d="$(realpath -e "$1")"
  p="$CHROOT$d"
  while [ ! -e "$p" ]; do CREATED=("$p" "${CREATED[@]}"); p="$(dirname "$p")"; done
  mkdir -p "$CHROOT$d"
  do_mount "$CHROOT$d" --bind "$d"
}
bind_dir "$BIND"
if [ -n "${SWIFT_CHROOT_EXTRA_BINDS:-}" ]; then
  IFS=: read -r -a extra <<< "$SWIFT_CHROOT_EXTRA_BINDS"
  for d in "${extra[@]}"; do [ -n "$d" ] && bind_dir "$d"; done
fi

cwd="$(pwd -P)"
case "$cwd/" in "$BIND"/*) start="$cwd" ;; *) start="$BIND" ;; esac

envs=(HOME=/root PATH=/usr/bin:/bin LANG=C.UTF-8)
[ -n "${TERM:-}" ] && envs+=("TERM=$TERM")
for v in ${SWIFT_CHROOT_PASS_ENV:-}; do
  if [ -n "${!v+x}" ]; then envs+=("$v=${!v}"); fi
done

set +e
chroot "$CHROOT" /usr/bin/env -i "${envs[@]}" bash -lc "cd $(printf '%q' "$start") && $CMD"
rc=$?
set -e
exit $rc
