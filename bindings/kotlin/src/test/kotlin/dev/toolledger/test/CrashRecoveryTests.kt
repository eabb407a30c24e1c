// Crash recovery across JVM processes: a child JVM is SIGKILLed after its
// tool committed downstream and before the ledger heard back (the
// `after-remote-commit` boundary); a fresh Ledger in this JVM recovers it.
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.ExecutionStatus
import dev.toolledger.test.child.CRASH_CHILD_MAIN
import dev.toolledger.test.child.READY_LINE
import java.nio.file.Path
import java.util.concurrent.LinkedBlockingQueue
import java.util.concurrent.TimeUnit
import kotlin.concurrent.thread
import kotlin.test.assertEquals
import kotlin.test.assertFalse
import kotlin.test.assertIs
import kotlin.test.assertTrue
import kotlin.test.fail
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.withContext

/** Exit status of a JVM killed by SIGKILL, as `Process.exitValue()` reports it. */
const val SIGKILL_EXIT = 128 + 9

/** Starts `mainClass` in a new JVM with this JVM's classpath and JNA path. */
fun startChildJvm(mainClass: String, vararg args: String): Process {
    val java = Path.of(System.getProperty("java.home"), "bin", "java").toString()
    val command = buildList {
        add(java)
        add("-cp")
        add(System.getProperty("java.class.path"))
        System.getProperty("jna.library.path")?.let { add("-Djna.library.path=$it") }
        add(mainClass)
        addAll(args)
    }
    return ProcessBuilder(command).redirectError(ProcessBuilder.Redirect.INHERIT).start()
}

private object EndOfStream

/**
 * Waits (at most `timeoutMs`) until the child prints `line` on stdout, and
 * echoes whatever else it prints. Fails if the child exits or stays silent.
 */
suspend fun awaitLine(child: Process, line: String, timeoutMs: Long) = withContext(Dispatchers.IO) {
    val lines = LinkedBlockingQueue<Any>()
    thread(isDaemon = true, name = "child-stdout") {
        try {
            child.inputStream.bufferedReader().forEachLine { lines.put(it) }
        } catch (_: java.io.IOException) {
            // the stream closes when the child is killed
        } finally {
            lines.put(EndOfStream)
        }
    }
    val deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs)
    while (true) {
        val left = deadline - System.nanoTime()
        if (left <= 0) fail("the child did not print '$line' within $timeoutMs ms")
        when (val got = lines.poll(left, TimeUnit.NANOSECONDS)) {
            line -> return@withContext
            EndOfStream -> {
                val exited = child.waitFor(10, TimeUnit.SECONDS)
                fail("the child closed stdout before '$line' (exit: ${if (exited) child.exitValue() else "still running"})")
            }
            null -> {} // timed out: the loop fails on the deadline
            else -> println("      child: $got")
        }
    }
}

val crashRecoveryTests = listOf(
    test("crash recovery: a JVM killed after the downstream commit is reconciled exactly once") {
        val downstream = downstream()
        val child = startChildJvm(CRASH_CHILD_MAIN, ledgerPath, downstream.path.toString())
        try {
            awaitLine(child, READY_LINE, timeoutMs = 60_000)
            child.destroyForcibly() // SIGKILL on Linux: no shutdown hooks, no cleanup
            assertTrue(child.waitFor(30, TimeUnit.SECONDS), "the child did not die")
            assertEquals(SIGKILL_EXIT, child.exitValue())
        } finally {
            if (child.isAlive) {
                child.destroyForcibly()
                child.waitFor(30, TimeUnit.SECONDS)
            }
        }
        assertEquals(1, downstream.count())

        // A fresh Ledger: the dead owner's row becomes an unknown outcome.
        val ledger = openLedger()
        val pending = ledger.recover()
        assertEquals(listOf(ExecutionStatus.OUTCOME_UNKNOWN), pending.map { it.status })
        val executionId = pending.single().executionId
        assertEquals("op_crash:round_0:call_1:send_email:v1", executionId)

        // The executor reconciles through the tool's lookup: found
        // downstream, so committed; the tool never performs again.
        val tool = SendEmail(downstream)
        val executor = executorWith(ledger, tool)
        val recovery = executor.recover()
        assertEquals(emptyList(), recovery.failed)
        val outcomes = recovery.outcomes
        val done = assertIs<CallOutcome.Completed>(outcomes.singleOrNull() ?: fail("recover: $outcomes"))
        assertEquals(executionId, done.executionId)
        assertFalse(done.replayed)
        assertEquals("msg_1", done.externalId)
        assertEquals(1, tool.lookups.get())
        assertEquals(0, tool.calls.get())
        assertEquals(ExecutionStatus.COMMITTED, ledger.get(executionId)!!.status)

        val again = assertIs<CallOutcome.Completed>(executor.execute("op_crash", 0u, emailCall()))
        assertTrue(again.replayed)
        assertEquals(done.resultJson, again.resultJson)
        assertEquals(0, tool.calls.get())
        assertEquals(1, downstream.count())
    },
)
