// A tiny test runner: no JUnit or Gradle on this machine (Maven Central is
// unreachable), so `main` in Main.kt hands the test list to `runTests`.
//
// Each test gets a fresh temporary directory and runs in `runBlocking` under
// a bounded timeout, so a hung call fails its test instead of the suite.
// Output: one `ok`/`FAIL` line per test, then `N passed, N failed` alone on
// the last line; the exit code is non-zero if anything failed.
package dev.toolledger.test

import java.nio.file.Files
import java.nio.file.Path
import java.util.Comparator
import kotlin.system.exitProcess
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout

/** One named test. The body runs as a coroutine with a fresh [TestContext]. */
class TestCase(val name: String, val body: suspend TestContext.() -> Unit)

/** Builds a [TestCase]; reads like `test("replay ...") { ... }`. */
fun test(name: String, body: suspend TestContext.() -> Unit) = TestCase(name, body)

/** What a test gets: its own directory, and objects closed after it. */
class TestContext(val dir: Path) {
    private val toClose = ArrayDeque<AutoCloseable>()

    /** The ledger database of this test (not created until opened). */
    val ledgerPath: String get() = dir.resolve("ledger.db").toString()

    /** Closes `value` (a Ledger, ToolExecutor …) when the test ends. */
    fun <T : AutoCloseable> closeAfter(value: T): T {
        toClose.addFirst(value)
        return value
    }

    internal fun closeAll() {
        while (toClose.isNotEmpty()) runCatching { toClose.removeFirst().close() }
    }
}

/** Longest time one test may take. */
const val TEST_TIMEOUT_MS = 120_000L

/**
 * Runs the tests whose name contains one of `filters` (all when empty) and
 * exits the JVM: status 0 when every selected test passed, 1 otherwise.
 */
fun runTests(tests: List<TestCase>, filters: List<String>): Nothing {
    val selected = tests.filter { t -> filters.isEmpty() || filters.any { t.name.contains(it) } }
    var passed = 0
    var failed = 0
    for (t in selected) {
        val dir = Files.createTempDirectory("toolledger-kt-")
        val ctx = TestContext(dir)
        val started = System.nanoTime()
        val error = try {
            runBlocking { withTimeout(TEST_TIMEOUT_MS) { t.body(ctx) } }
            null
        } catch (e: Throwable) { // AssertionError is an Error, not an Exception
            e
        } finally {
            ctx.closeAll()
        }
        val ms = (System.nanoTime() - started) / 1_000_000
        if (error == null) {
            passed++
            println("ok    ${t.name} (${ms} ms)")
            deleteTree(dir)
        } else {
            failed++
            println("FAIL  ${t.name} (${ms} ms): $error")
            error.stackTrace.take(12).forEach { println("        at $it") }
            println("      (files kept in $dir)")
        }
    }
    if (selected.isEmpty()) {
        println("no test matches ${filters.joinToString(" ")}")
        failed++
    }
    System.out.flush()
    System.err.flush()
    println("$passed passed, $failed failed")
    System.out.flush()
    exitProcess(if (failed == 0) 0 else 1)
}

private fun deleteTree(dir: Path) {
    runCatching {
        Files.walk(dir).use { paths ->
            paths.sorted(Comparator.reverseOrder()).forEach { Files.deleteIfExists(it) }
        }
    }
}
