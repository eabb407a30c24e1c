#!/usr/bin/env bash
# bench-crossing.sh [python] [kotlin] [swift] — the per-language crossing
# benchmarks: what a no-op call costs through each binding, beside the same
# call through the Rust API, in one run per language (release builds).
#
# Each benchmark starts tools/bench's `toolledger-crossing-reference` (the
# Rust API's side) and alternates batches between it and its own calls, on
# files in one directory under the repository (a real disk, not a tmpfs),
# and prints `name=value` lines: p50 / p99 in µs per figure and way, and each
# p50 minus the Rust p50 of the same figure (see
# bindings/python/bench/crossing_overhead.py for the figures).
#
#   python: the release wheel built and installed into the test venv (as
#           scripts/test-python.sh does), then crossing_overhead.py.
#   kotlin: the jars built by `PROFILE=release scripts/test-kotlin.sh` (a
#           short test selection), then CrossingBenchKt, twice: with the ktx
#           layer (callback threads kept attached) and --callbacks-only
#           (JNA attaches and detaches them on every callback).
#   swift:  the package prepared by `PROFILE=release scripts/test-swift.sh`
#           (a short test selection), then `swift run -c release
#           ToolLedgerCrossingBench` in the chroot.
#
# Environment: CALLS (per batch, default 50), BATCHES (default 10),
# BENCH_PARENT (the directory the files go under; default the repository,
# a real disk: BENCH_PARENT=/dev/shm measures on a tmpfs, without the
# disk's own tail), KOTLIN_MODES (default "both"; "ktx" skips the
# --callbacks-only run), JAVA_OPTS (extra JVM options for the Kotlin runs,
# e.g. -Xlog:gc), ROUNDS=1 (adds the round8 figure to the Python, Kotlin and
# Swift runs: a round of eight calls through execute_round, one durable begin).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
langs=("$@")
[ ${#langs[@]} -gt 0 ] || langs=(python kotlin swift)
CALLS="${CALLS:-50}"
BATCHES="${BATCHES:-10}"

cargo build --quiet --release -p toolledger-bench --bin toolledger-crossing-reference
target_dir="$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')"
reference="$target_dir/release/toolledger-crossing-reference"
work="$(mktemp -d -p "${BENCH_PARENT:-$repo}" .bench-crossing.XXXXXX)"
trap 'rm -rf "$work"' EXIT

for lang in "${langs[@]}"; do
  echo "== crossing: $lang =="
  case "$lang" in
    python)
      scripts/setup-python.sh
      PY="$(scripts/setup-python.sh --print-python)"
      dist="$work/dist"
      PATH="$(dirname "$PY"):$PATH" MATURIN_PEP517_ARGS="" \
        "$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation -w "$dist" ./bindings/python
      "$PY" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$dist"/toolledger-*.whl
      mkdir -p "$work/python"
      ( cd "$work" && "$PY" "$repo/bindings/python/bench/crossing_overhead.py" --reference "$reference" \
          --calls "$CALLS" --batches "$BATCHES" --dir "$work/python" \
          $([ "${ROUNDS:-0}" = 1 ] && echo --rounds) )
      ;;
    kotlin)
      PROFILE=release scripts/test-kotlin.sh "caller-driven: two callers" >/dev/null
      # shellcheck source=/dev/null
      source "${TOOLLEDGER_CACHE:-$HOME/.cache/toolledger}/kotlin-env.sh"
      build=bindings/kotlin/build
      cp=("$build/tests.jar" "$build"/toolledger-*.jar)
      cp="$(IFS=:; echo "${cp[*]}"):$KOTLIN_RUNTIME_CP"
      modes=("" --callbacks-only)
      [ "${KOTLIN_MODES:-both}" = ktx ] && modes=("")
      for mode in "${modes[@]}"; do
        # shellcheck disable=SC2086 # JAVA_OPTS: words, as a shell passes them
        java ${JAVA_OPTS:-} -cp "$cp" dev.toolledger.test.bench.CrossingBenchKt "$reference" "$work/kotlin$mode" "$CALLS" "$BATCHES" $mode
      done
      ;;
    swift)
      PROFILE=release scripts/test-swift.sh --filter CallerDrivenTests >/dev/null
      pkg="$repo/bindings/swift"
      cp -f "$reference" "$pkg/lib/toolledger-crossing-reference"
      ( cd "$pkg" && scripts_dir="$repo/scripts" && SWIFT_CHROOT_PASS_ENV="${SWIFT_CHROOT_PASS_ENV:-} ROUNDS" \
          "$scripts_dir/swift-in-chroot.sh" "$repo" \
          swift run -c release -Xlinker -L"$pkg/lib" -Xlinker -ltoolledger -Xlinker -rpath -Xlinker "$pkg/lib" \
          ToolLedgerCrossingBench "$pkg/lib/toolledger-crossing-reference" "$work/swift" "$CALLS" "$BATCHES" )
      ;;
    *) echo "bench-crossing: unknown language $lang" >&2; exit 2 ;;
  esac
done
