#!/usr/bin/env bash
# setup-kotlin.sh — make a Kotlin/JVM compiler and JNA available for the
# UniFFI Kotlin bindings tests, and write an env file describing them.
#
# What it does (idempotent; a second run only re-writes the env file):
#   * Kotlin: installs the npm package `kotlin-compiler` (the full kotlinc
#     distribution: bin/kotlinc, lib/kotlin-stdlib.jar,
#     lib/kotlinx-coroutines-core-jvm.jar, lib/kotlin-test*.jar) with
#     `npm install --prefix $CACHE/kotlin kotlin-compiler@$KOTLIN_VERSION`.
#     Pinned version: 2.4.20 (latest stable on npm when written; override with
#     TOOLLEDGER_KOTLIN_VERSION). Reused when that version is already there.
#   * JNA: `apt-get install -y libjna-java` (Debian 5.13.0: /usr/share/java/jna.jar,
#     native part /usr/lib/x86_64-linux-gnu/jni/libjnidispatch.system.so) if
#     the jar is missing. Needs root (or sudo).
#   * Writes $CACHE/kotlin-env.sh defining KOTLINC, KOTLIN_HOME, KOTLIN_LIB,
#     KOTLIN_STDLIB, KOTLIN_COROUTINES, KOTLIN_TEST, JNA_JAR, KOTLIN_VERSION.
#     Use it with:  source "$(scripts/setup-kotlin.sh --print-env-file)"
#   * Smoke test (once per version, or always with --check): compiles and runs a
#     tiny Kotlin program using runBlocking/launch(Dispatchers.Default),
#     kotlin.test.assertEquals and com.sun.jna.Native (calls libc getpid).
#
# Cache: ${TOOLLEDGER_CACHE:-$HOME/.cache/toolledger}
#   kotlin/node_modules/kotlin-compiler/   the kotlinc distribution (~100 MB)
#   kotlin-env.sh                          the env file
#   kotlin-smoke/                          smoke-test sources, jar, ok-stamp
#
# Working compile + run commands (verified with Java 17, Kotlin 2.4.20):
#   "$KOTLINC" Foo.kt ... -cp "$JNA_JAR:$KOTLIN_COROUTINES:$KOTLIN_TEST" -d out.jar
#       (kotlinc adds kotlin-stdlib itself; no -include-runtime needed)
#   java -cp "out.jar:$JNA_JAR:$KOTLIN_STDLIB:$KOTLIN_COROUTINES:$KOTLIN_TEST" \
#        -Djna.library.path=/dir/with/libtoolledger.so  MainKt
#   (LD_LIBRARY_PATH=/dir also works for JNA; kotlin-stdlib MUST be on the
#   runtime classpath, else NoClassDefFoundError kotlin/jvm/functions/...).
#   kotlinc takes ~7-20 s even for a tiny file on this 2-core machine (JVM +
#   compiler start-up dominate), so compile all Kotlin tests in ONE invocation.
#
# Options:  --check           force the smoke test
#           --print-env-file  print only the env file path (for `source $(...)`)
set -euo pipefail

KOTLIN_VERSION="${TOOLLEDGER_KOTLIN_VERSION:-2.4.20}"
CACHE="${TOOLLEDGER_CACHE:-$HOME/.cache/toolledger}"
KDIR="$CACHE/kotlin"
ENV_FILE="$CACHE/kotlin-env.sh"
JNA_JAR_DEFAULT=/usr/share/java/jna.jar

force_check=0
print_env_only=0
for arg in "$@"; do
  case "$arg" in
    --check) force_check=1 ;;
    --print-env-file) print_env_only=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "setup-kotlin.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { if [ "$print_env_only" = 1 ]; then echo "setup-kotlin: $*" >&2; else echo "setup-kotlin: $*"; fi; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

command -v java >/dev/null || { echo "setup-kotlin: java not found (need a JDK >= 11, 17 recommended)" >&2; exit 1; }
command -v npm  >/dev/null || { echo "setup-kotlin: npm not found" >&2; exit 1; }

# ---- Kotlin compiler (npm) ---------------------------------------------------
KOTLIN_HOME="$KDIR/node_modules/kotlin-compiler"
installed_version=""
if [ -f "$KOTLIN_HOME/build.txt" ]; then
  installed_version="$(tr -d '[:space:]' < "$KOTLIN_HOME/build.txt")"
fi
if [ "$installed_version" != "$KOTLIN_VERSION" ] || [ ! -x "$KOTLIN_HOME/bin/kotlinc" ]; then
  log "installing kotlin-compiler@$KOTLIN_VERSION into $KDIR (had: ${installed_version:-none})"
  mkdir -p "$KDIR"
  npm install --prefix "$KDIR" --no-audit --no-fund --loglevel=error \
    "kotlin-compiler@$KOTLIN_VERSION" >&2
  # npm may drop the exec bits on some setups; make sure the launchers run.
  chmod +x "$KOTLIN_HOME"/bin/kotlin* 2>/dev/null || true
else
  log "kotlin-compiler $installed_version already in $KDIR"
fi

KOTLINC="$KOTLIN_HOME/bin/kotlinc"
KOTLIN_LIB="$KOTLIN_HOME/lib"
[ -x "$KOTLINC" ] || { echo "setup-kotlin: $KOTLINC missing after install" >&2; exit 1; }

find_jar() { # first jar in KOTLIN_LIB matching a glob, excluding -sources jars
  local pat="$1" f
  for f in "$KOTLIN_LIB"/$pat; do
    case "$f" in *-sources.jar) continue ;; esac
    [ -f "$f" ] && { echo "$f"; return 0; }
  done
  echo "setup-kotlin: no $pat in $KOTLIN_LIB" >&2
  return 1
}
KOTLIN_STDLIB="$(find_jar 'kotlin-stdlib.jar')"
KOTLIN_COROUTINES="$(find_jar 'kotlinx-coroutines-core-jvm*.jar')"
KOTLIN_TEST="$(find_jar 'kotlin-test.jar')"

# ---- JNA (Debian package) ----------------------------------------------------
JNA_JAR="${JNA_JAR:-$JNA_JAR_DEFAULT}"
if [ ! -f "$JNA_JAR" ]; then
  log "installing libjna-java (for $JNA_JAR)"
  export DEBIAN_FRONTEND=noninteractive
  if ! as_root apt-get install -y -qq libjna-java >&2; then
    as_root apt-get update -qq >&2
    as_root apt-get install -y -qq libjna-java >&2
  fi
fi
[ -f "$JNA_JAR" ] || { echo "setup-kotlin: $JNA_JAR still missing" >&2; exit 1; }

# ---- env file ----------------------------------------------------------------
mkdir -p "$CACHE"
tmp_env="$(mktemp "$CACHE/.kotlin-env.XXXXXX")"
cat > "$tmp_env" <<EOF
# Generated by scripts/setup-kotlin.sh — Kotlin $KOTLIN_VERSION toolchain + JNA.
# Compile: "\$KOTLINC" *.kt -cp "\$JNA_JAR:\$KOTLIN_COROUTINES:\$KOTLIN_TEST" -d out.jar
# Run:     java -cp "out.jar:\$KOTLIN_RUNTIME_CP" -Djna.library.path=DIR MainKt
export KOTLIN_VERSION='$KOTLIN_VERSION'
export KOTLIN_HOME='$KOTLIN_HOME'
export KOTLINC='$KOTLINC'
export KOTLIN_LIB='$KOTLIN_LIB'
export KOTLIN_STDLIB='$KOTLIN_STDLIB'
export KOTLIN_COROUTINES='$KOTLIN_COROUTINES'
export KOTLIN_TEST='$KOTLIN_TEST'
export JNA_JAR='$JNA_JAR'
export KOTLIN_COMPILE_CP='$JNA_JAR:$KOTLIN_COROUTINES:$KOTLIN_TEST'
export KOTLIN_RUNTIME_CP='$JNA_JAR:$KOTLIN_STDLIB:$KOTLIN_COROUTINES:$KOTLIN_TEST'
EOF
mv -f "$tmp_env" "$ENV_FILE"

# ---- smoke test ----------------------------------------------------------------
SMOKE="$CACHE/kotlin-smoke"
stamp="$SMOKE/ok-$KOTLIN_VERSION"
if [ "$force_check" = 1 ] || [ ! -f "$stamp" ]; then
  log "smoke test: compiling a tiny Kotlin file (kotlinc is slow, ~7-20 s)"
  rm -rf "$SMOKE"; mkdir -p "$SMOKE"
  cat > "$SMOKE/Smoke.kt" <<'EOF'
import com.sun.jna.Library
import com.sun.jna.Native
import java.util.concurrent.atomic.AtomicInteger
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlin.test.assertEquals
import kotlin.test.assertTrue

interface LibC : Library {
    fun getpid(): Int
}

fun main() {
    val counter = AtomicInteger(0)
    runBlocking {
        repeat(100) { launch(Dispatchers.Default) { counter.incrementAndGet() } }
    }
    assertEquals(100, counter.get())
    val libc = Native.load("c", LibC::class.java)
    val pid = libc.getpid()
    assertTrue(pid > 0, "getpid via JNA")
    assertEquals(ProcessHandle.current().pid(), pid.toLong())
    println("kotlin-smoke OK: coroutines=${counter.get()} jna-getpid=$pid jna=${Native.VERSION}")
}
EOF
  start=$(date +%s.%N)
  "$KOTLINC" "$SMOKE/Smoke.kt" -cp "$JNA_JAR:$KOTLIN_COROUTINES:$KOTLIN_TEST" \
    -d "$SMOKE/smoke.jar" >&2
  end=$(date +%s.%N)
  [ -f "$SMOKE/smoke.jar" ] || { echo "setup-kotlin: smoke compile failed" >&2; exit 1; }
  log "kotlinc of smoke test took $(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}') s"
  out="$(java -cp "$SMOKE/smoke.jar:$JNA_JAR:$KOTLIN_STDLIB:$KOTLIN_COROUTINES:$KOTLIN_TEST" SmokeKt)"
  log "$out"
  case "$out" in *"kotlin-smoke OK"*) : ;; *) echo "setup-kotlin: smoke run failed" >&2; exit 1 ;; esac
  touch "$stamp"
fi

if [ "$print_env_only" = 1 ]; then
  echo "$ENV_FILE"
else
  log "kotlinc-jvm $(tr -d '[:space:]' < "$KOTLIN_HOME/build.txt") ($KOTLINC)"
  log "env file: $ENV_FILE"
  cat "$ENV_FILE"
fi
