#!/usr/bin/env bash
# test-kotlin.sh — run the Kotlin binding tests (bindings/kotlin/src/test/kotlin)
# on the desktop JVM with JNA, as an Android app would use the bindings.
#
# 1. The toolchain: sources the env file written by scripts/setup-kotlin.sh
#    (kotlinc, kotlin-stdlib, kotlinx-coroutines, kotlin-test, JNA); runs
#    setup-kotlin.sh first when the file or the compiler is missing.
# 2. scripts/generate-bindings.sh kotlin: builds the cdylib and regenerates
#    bindings/kotlin/generated/ on every run, so the bindings can never be
#    stale (an up-to-date build makes this a few seconds).
# 3. Copies libtoolledger.so to bindings/kotlin/build/lib/: a concurrent cargo
#    build in the shared target dir cannot swap the library under the suite.
# 4. ONE kotlinc invocation (kotlinc costs 10 s to minutes per call): the
#    generated toolledger.kt plus every test file -> build/tests.jar. Skipped
#    when the sources, the compiler and the classpath are byte-identical to
#    the last successful compile (sha256 stamp next to the jar).
# 5. java -Djna.library.path=build/lib dev.toolledger.test.MainKt; its exit
#    code is this script's. The last line of output is `N passed, N failed`.
#
# Environment: PROFILE=debug (default here: shares the build of `cargo test`)
# or release. Extra arguments select tests whose name contains one of them
# (e.g. scripts/test-kotlin.sh replay crash).
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- 1. toolchain --------------------------------------------------------------
env_file="${TOOLLEDGER_CACHE:-$HOME/.cache/toolledger}/kotlin-env.sh"
if [ -f "$env_file" ]; then
  # shellcheck source=/dev/null
  source "$env_file"
fi
if [ ! -f "$env_file" ] || [ ! -x "${KOTLINC:-}" ] || [ ! -f "${JNA_JAR:-}" ]; then
  echo "test-kotlin: Kotlin toolchain missing: running scripts/setup-kotlin.sh" >&2
  env_file="$(scripts/setup-kotlin.sh --print-env-file)"
  # shellcheck source=/dev/null
  source "$env_file"
fi

# ---- 2. bindings -----------------------------------------------------------------
PROFILE="${PROFILE:-debug}"
PROFILE="$PROFILE" scripts/generate-bindings.sh kotlin

case "$(uname -s)" in
  Darwin) libfile=libtoolledger.dylib ;;
  *) libfile=libtoolledger.so ;;
esac
target_dir="$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')"

# ---- 3. a private copy of the library ----------------------------------------------
build=bindings/kotlin/build
mkdir -p "$build/lib"
cp -f "${target_dir}/${PROFILE}/${libfile}" "$build/lib/${libfile}"

# ---- 4. compile once -----------------------------------------------------------------
generated=bindings/kotlin/generated/dev/toolledger/toolledger.kt
[ -f "$generated" ] || { echo "test-kotlin: $generated was not generated" >&2; exit 1; }
# The suite plus the JVM adapters it tests (src/jvm; src/android needs the SDK).
mapfile -t tests < <(find bindings/kotlin/src/test/kotlin bindings/kotlin/src/jvm/kotlin \
  -name '*.kt' | LC_ALL=C sort)
[ ${#tests[@]} -gt 0 ] || { echo "test-kotlin: no Kotlin test sources" >&2; exit 1; }

jar="$build/tests.jar"
stamp="$build/tests.jar.sha256"
inputs_hash="$( { echo "$KOTLIN_VERSION $KOTLIN_COMPILE_CP"; sha256sum "$generated" "${tests[@]}"; } \
  | sha256sum | cut -d' ' -f1)"
if [ -f "$jar" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs_hash" ]; then
  echo "test-kotlin: sources unchanged since the last compile: reusing $jar" >&2
else
  echo "test-kotlin: compiling ${#tests[@]} test files + the bindings (one kotlinc call; slow)" >&2
  rm -f "$jar" "$stamp"
  "$KOTLINC" "$generated" "${tests[@]}" -cp "$KOTLIN_COMPILE_CP" -d "$jar" -nowarn
  echo "$inputs_hash" > "$stamp"
fi

# ---- 5. run --------------------------------------------------------------------------
set +e
java -cp "$jar:$KOTLIN_RUNTIME_CP" -Djna.library.path="$PWD/$build/lib" \
  dev.toolledger.test.MainKt "$@"
status=$?
set -e
exit "$status"
