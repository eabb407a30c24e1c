#!/usr/bin/env bash
# test-kotlin.sh — build the desktop JVM jar of the Kotlin bindings and run
# the Kotlin suite (bindings/kotlin/src/test/kotlin) against it, with JNA, as
# a desktop (or Android) app uses the bindings.
#
# 1. The toolchain: sources the env file written by scripts/setup-kotlin.sh
#    (kotlinc, kotlin-stdlib, kotlinx-coroutines, kotlin-test, JNA); runs
#    setup-kotlin.sh first when the file or the compiler is missing.
# 2. scripts/generate-bindings.sh kotlin: builds the cdylib and regenerates
#    bindings/kotlin/generated/ on every run, so the bindings can never be
#    stale (an up-to-date build makes this a few seconds); then
#    bindings/kotlin/tools/test_fast_calls.py checks its post-processing.
# 3. The jar, bindings/kotlin/build/toolledger-<version>.jar (version from the
#    workspace Cargo.toml): one kotlinc call compiles the generated
#    toolledger.kt and the hand-written layer (src/main/kotlin, package
#    dev.toolledger.ktx), then `jar` adds libtoolledger.so as the resource
#    linux-x86-64/libtoolledger.so, where JNA finds it on the class path. It
#    needs JNA and kotlinx-coroutines at run time (kotlin-stdlib too).
# 4. A second kotlinc call compiles the tests and the README's quick start
#    (extracted from bindings/kotlin/README.md as written) against the jar ->
#    build/tests.jar; the quick start then runs in an empty directory and
#    must print the README's output. Each kotlinc call (10 s to minutes) is
#    skipped when its inputs are byte-identical to the last successful one.
# 5. java -cp tests.jar:<the jar>:<runtime> dev.toolledger.test.MainKt, with
#    NO jna.library.path: the library is loaded from inside the jar (a test
#    checks it). The last line of output is `N passed, N failed`; the exit
#    code is the suite's.
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
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) jna_prefix=linux-x86-64 ;;
  Linux-aarch64) jna_prefix=linux-aarch64 ;;
  Darwin-arm64) jna_prefix=darwin-aarch64 ;;
  Darwin-x86_64) jna_prefix=darwin-x86-64 ;;
  *) echo "test-kotlin: no JNA resource prefix known for $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac
target_dir="$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')"
version="$(scripts/version.sh)"

generated=bindings/kotlin/generated/dev/toolledger/toolledger.kt
[ -f "$generated" ] || { echo "test-kotlin: $generated was not generated" >&2; exit 1; }
# The post-processing of the generated file (fast_calls.py) is exactly what
# is compiled, and any change of UniFFI's template fails it.
python3 bindings/kotlin/tools/test_fast_calls.py bindings/kotlin/generated/toolledger.kt.unpatched "$generated" >&2
# The jar: the ktx layer plus the JVM logging adapter (src/jvm; src/android needs the SDK).
mapfile -t layer < <(find bindings/kotlin/src/main/kotlin bindings/kotlin/src/jvm/kotlin -name '*.kt' | LC_ALL=C sort)
mapfile -t tests < <(find bindings/kotlin/src/test/kotlin -name '*.kt' | LC_ALL=C sort)
[ ${#tests[@]} -gt 0 ] || { echo "test-kotlin: no Kotlin test sources" >&2; exit 1; }

build=bindings/kotlin/build
mkdir -p "$build"

# compile_once OUT STAMP CP FLAGS SOURCES...: one kotlinc call (with the
# extra kotlinc FLAGS, one word or empty), skipped when the sources, the
# flags, the compiler and the class path's files are unchanged.
compile_once() {
  local out="$1" stamp="$2" cp="$3" flags="$4"; shift 4
  local hash
  local entry cp_files=()
  IFS=: read -r -a entries <<< "$cp"
  for entry in "${entries[@]}"; do [ -f "$entry" ] && cp_files+=("$entry"); done
  hash="$( { echo "$KOTLIN_VERSION $cp $flags"; sha256sum "$@" "${cp_files[@]}"; } | sha256sum | cut -d' ' -f1)"
  if [ -f "$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
    echo "test-kotlin: sources unchanged since the last compile: reusing $out" >&2
    return 0
  fi
  echo "test-kotlin: kotlinc -> $out ($# files; slow)" >&2
  rm -f "$out" "$stamp"
  # shellcheck disable=SC2086 # FLAGS is one word or empty
  "$KOTLINC" "$@" -cp "$cp" -d "$out" -nowarn $flags
  echo "$hash" > "$stamp"
}

# ---- 3. the jar: bindings + layer + the native library --------------------------------
classes="$build/classes.jar"
compile_once "$classes" "$classes.sha256" "$JNA_JAR:$KOTLIN_COROUTINES" "" "$generated" "${layer[@]}"
jar_out="$build/toolledger-${version}.jar"
rm -rf "$build/native" "$build"/toolledger-*.jar
mkdir -p "$build/native/$jna_prefix"
cp -f "${target_dir}/${PROFILE}/${libfile}" "$build/native/$jna_prefix/${libfile}"
cp -f "$classes" "$jar_out"
jar uf "$jar_out" -C "$build/native" "$jna_prefix/${libfile}"
echo "test-kotlin: built $jar_out ($(du -k "$jar_out" | cut -f1) KiB; $jna_prefix/${libfile} inside)" >&2

# ---- 4. the tests and the README quick start, compiled against the jar -----------------
readme=bindings/kotlin/README.md
mkdir -p "$build/readme"
python3 - "$readme" "$build/readme/Quickstart.kt" "$build/readme/expected.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
start = text.index("## Quick start (desktop JVM)")
code = re.compile(r"```kotlin\n(.*?)```", re.S).search(text, start)
expected = re.compile(r"```text\n(.*?)```", re.S).search(text, code.end())
open(sys.argv[2], "w").write(code.group(1))
open(sys.argv[3], "w").write(expected.group(1))
PY
tests_jar="$build/tests.jar"
# -Xfriend-paths: FastCallsTests reach the ktx layer's internal DirectSteps.
compile_once "$tests_jar" "$tests_jar.sha256" "$classes:$KOTLIN_COMPILE_CP" "-Xfriend-paths=$classes" \
  "${tests[@]}" "$build/readme/Quickstart.kt"

# The quick start as a user runs it, in an empty directory: it must print
# exactly the README's output.
qs_dir="$(mktemp -d)"
qs_cp="$PWD/$tests_jar:$PWD/$jar_out:$KOTLIN_RUNTIME_CP"
( cd "$qs_dir" && java -cp "$qs_cp" QuickstartKt ) > "$build/readme/actual.txt" \
  || { echo "test-kotlin: the README quick start failed" >&2; rm -rf "$qs_dir"; exit 1; }
rm -rf "$qs_dir"
if ! cmp -s "$build/readme/expected.txt" "$build/readme/actual.txt"; then
  echo "test-kotlin: the README quick start printed something else:" >&2
  diff "$build/readme/expected.txt" "$build/readme/actual.txt" >&2 || true
  exit 1
fi
echo "test-kotlin: the README quick start ran as written and printed the README's output" >&2

# ---- 5. run (no jna.library.path: the library comes out of the jar) ---------------------
set +e
java -cp "$tests_jar:$jar_out:$KOTLIN_RUNTIME_CP" dev.toolledger.test.MainKt "$@"
status=$?
set -e
exit "$status"
