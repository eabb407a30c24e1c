// Closing the ktx Executor (or its ToolExecutor) must not leave the SyncTool
// path calling the library with a freed handle: the direct steps clone the
// handle with `uniffiCloneHandle()` outside the generated object's call
// counter (`callWithHandle`), so after close() they clone a freed Arc.
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.LedgerException
import dev.toolledger.PerformOutcome
import dev.toolledger.Provider
import dev.toolledger.ToolCall
import dev.toolledger.ToolRequest
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.SyncTool
import dev.toolledger.ktx.toolDescriptor
import java.util.concurrent.CountDownLatch
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicInteger
import java.util.concurrent.atomic.AtomicReference
import kotlin.concurrent.thread
import kotlin.test.assertEquals
import kotlin.test.assertIs
import kotlin.test.assertNotNull
import kotlin.test.assertTrue

/** A SyncTool that counts its effects; [before] runs first. */
private class CountingSync(val before: () -> Unit = {}) : SyncTool(toolDescriptor("probe")) {
    val effects = AtomicInteger()
    override fun performNow(request: ToolRequest): PerformOutcome {
        before()
        effects.incrementAndGet()
        return PerformOutcome.Committed(resultJson = """{"ok":true}""", externalId = null)
    }
}

private fun probeCall() = ToolCall(provider = Provider.CUSTOM, callId = "c1", toolName = "probe", arguments = """{"x":1}""")

val closedExecutorTests = listOf(
    // Observed: the JVM dies with SIGSEGV in toolledger_direct_step (hs_err:
    // DirectLib.toolledger_direct_step <- DirectSteps.start <- executeBlocking).
    // Run it alone: scripts/test-kotlin.sh "closed Executor".
    test("closed Executor: executeBlocking is refused (IllegalStateException or LedgerException), not a crash") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = CountingSync()
        val executor = Executor(ledger, tools = listOf(tool))
        executor.close()
        val r = runCatching { executor.executeBlocking("op", 0, probeCall()) }
        val e = r.exceptionOrNull()
        assertTrue(e is IllegalStateException || e is LedgerException, "expected a refusal, got $r")
        assertEquals(0, tool.effects.get())
    },

    // Observed: the report after the tool's effect fails with
    // LedgerException.UnknownTool(name=probe) (read from the freed executor),
    // and a new Executor over the same ledger answers InFlight for as long as
    // the ledger stays open: the effect happened, nothing was recorded.
    test("closed Executor: close() while a SyncTool runs lets the call finish and record its result") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val entered = CountDownLatch(1)
        val gate = CountDownLatch(1)
        val tool = CountingSync { entered.countDown(); gate.await(20, TimeUnit.SECONDS) }
        val executor = Executor(ledger, tools = listOf(tool))
        val box = AtomicReference<Result<CallOutcome>?>(null)
        val t = thread { box.set(runCatching { executor.executeBlocking("op", 0, probeCall()) }) }
        assertTrue(entered.await(20, TimeUnit.SECONDS))
        executor.close() // a view model cleared while its call runs
        gate.countDown()
        t.join(20_000)
        val r = assertNotNull(box.get(), "executeBlocking hung")
        assertEquals(1, tool.effects.get())
        assertIs<CallOutcome.Completed>(r.getOrThrow(), "the call that ran was not recorded: $r")
        val again = closeAfter(Executor(ledger, tools = listOf(CountingSync())))
        val replay = assertIs<CallOutcome.Completed>(again.executeBlocking("op", 0, probeCall()))
        assertTrue(replay.replayed)
    },
)
