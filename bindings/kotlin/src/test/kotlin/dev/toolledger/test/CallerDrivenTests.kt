// Caller-driven calls from Kotlin: a SyncTool runs on the caller's thread
// through ToolExecutor.start / report, and the exactly-once rules still hold
// (one perform per call, a stale report refused, a JVM killed between the
// effect and its report reconciled). Effects are counted at the downstream.
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.CallerStep
import dev.toolledger.ExecutionStatus
import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.ToolRequest
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.SyncTool
import dev.toolledger.ktx.toolDescriptor
import dev.toolledger.test.child.DRIVEN_CRASH_CHILD_MAIN
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicInteger
import kotlin.test.assertEquals
import kotlin.test.assertFalse
import kotlin.test.assertIs
import kotlin.test.assertSame
import kotlin.test.assertTrue

/** `SendEmail` as a [SyncTool]: blocking code, no suspension. */
class SyncSend(
    val downstream: Downstream,
    idempotencyKey: Boolean = false,
    canLookup: Boolean = true,
) : SyncTool(toolDescriptor("send_email", idempotencyKey = idempotencyKey, lookup = canLookup)) {
    /** `performNow` calls so far. */
    val calls = AtomicInteger()

    /** `lookupNow` calls so far. */
    val lookups = AtomicInteger()

    /** The thread of the last `performNow`. */
    @Volatile
    var thread: Thread? = null

    override fun performNow(request: ToolRequest): PerformOutcome {
        calls.incrementAndGet()
        thread = Thread.currentThread()
        val id = downstream.perform(request.downstreamKey)
        return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
    }

    override fun lookupNow(request: ToolRequest): LookupOutcome {
        lookups.incrementAndGet()
        val id = downstream.find(request.downstreamKey) ?: return LookupOutcome.NotFound
        return LookupOutcome.Found(resultJson = sentJson(id), externalId = id)
    }
}

private fun committed(json: String) = PerformOutcome.Committed(resultJson = json, externalId = null)

val callerDrivenTests = listOf(
    test("caller-driven: a SyncTool runs once on the caller's thread and a repeat replays") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = SyncSend(downstream)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val done = assertIs<CallOutcome.Completed>(executor.executeBlocking("op_1", 0, emailCall()))
        assertFalse(done.replayed)
        assertSame(Thread.currentThread(), tool.thread)
        val again = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        assertTrue(again.replayed)
        assertEquals(done.resultJson, again.resultJson)
        // The suspend path runs it too (on Dispatchers.IO), once.
        val other = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall("call_2")))
        assertFalse(other.replayed)
        assertEquals(2, tool.calls.get())
        assertEquals(2, downstream.count())
    },

    test("caller-driven: two callers of one call get one perform") {
        val downstream = downstream()
        val ledger = openLedger()
        val tool = SyncSend(downstream)
        val executor = executorWith(ledger, tool)
        val first = assertIs<CallerStep.Perform>(executor.start("op_1", 0u, emailCall()))
        val second = assertIs<CallerStep.Done>(executor.start("op_1", 0u, emailCall()))
        assertIs<CallOutcome.InFlight>(second.outcome)
        val id = downstream.perform(first.attempt.request.downstreamKey)
        val done = assertIs<CallerStep.Done>(executor.report(first.attempt, committed(sentJson(id))))
        assertIs<CallOutcome.Completed>(done.outcome)
        val later = assertIs<CallerStep.Done>(executor.start("op_1", 0u, emailCall()))
        assertTrue(assertIs<CallOutcome.Completed>(later.outcome).replayed)
        assertEquals(1, downstream.count())
    },

    test("caller-driven: a stale report is refused and the current attempt's result stands") {
        val downstream = downstream()
        val ledger = openLedger()
        val executor = executorWith(ledger, SyncSend(downstream, idempotencyKey = true, canLookup = false))
        val a1 = assertIs<CallerStep.Perform>(executor.start("op_1", 0u, emailCall())).attempt
        // Attempt 1 times out: the key tool is resent as attempt 2, same key.
        val a2 = assertIs<CallerStep.Perform>(executor.report(a1, PerformOutcome.Unknown("timed out"))).attempt
        assertEquals(2u, a2.request.attempt)
        assertEquals(a1.request.downstreamKey, a2.request.downstreamKey)
        // Attempt 1's answer arrives late: refused, attempt 2 still runs.
        val late = assertIs<CallerStep.Done>(executor.report(a1, committed("""{"late":1}""")))
        assertIs<CallOutcome.InFlight>(late.outcome)
        val record = ledger.get(a1.request.executionId)!!
        assertEquals(ExecutionStatus.EXECUTING, record.status)
        assertEquals(2u, record.attemptCount)
        val done = assertIs<CallerStep.Done>(executor.report(a2, committed("""{"fresh":2}""")))
        assertEquals("""{"fresh":2}""", assertIs<CallOutcome.Completed>(done.outcome).resultJson)
        // Reported again after the commit: still refused, the result stands.
        val again = assertIs<CallerStep.Done>(executor.report(a1, committed("""{"late":1}""")))
        val replay = assertIs<CallOutcome.Completed>(again.outcome)
        assertTrue(replay.replayed)
        assertEquals("""{"fresh":2}""", replay.resultJson)
    },

    test("caller-driven: a JVM killed between the effect and its report is reconciled by a lookup") {
        val downstream = downstream()
        val child = startChildJvm(DRIVEN_CRASH_CHILD_MAIN, ledgerPath, downstream.path.toString())
        try {
            awaitLine(child, dev.toolledger.test.child.DRIVEN_READY_LINE, timeoutMs = 60_000)
            child.destroyForcibly()
            assertTrue(child.waitFor(30, TimeUnit.SECONDS), "the child did not die")
        } finally {
            if (child.isAlive) {
                child.destroyForcibly()
                child.waitFor(30, TimeUnit.SECONDS)
            }
        }
        assertEquals(1, downstream.count())
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = SyncSend(downstream)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val done = assertIs<CallOutcome.Completed>(executor.executeBlocking("op_crash", 0, emailCall()))
        assertFalse(done.replayed)
        assertEquals("msg_1", done.externalId)
        assertEquals(0, tool.calls.get())
        assertEquals(1, tool.lookups.get())
        assertEquals(1, downstream.count())
    },
)
