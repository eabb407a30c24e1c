// Sizes of stored text through the ktx layer (docs/design.md, "Sizes of
// stored text"): a job started under an empty id becomes an unknown outcome
// that says why; a webhook without a source or an event id, or with one
// past 2,048 bytes, is a typed error that records nothing, and the real
// event applies once; a long failure reason is stored cut.
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.ExecutionStatus
import dev.toolledger.JobApplied
import dev.toolledger.JobUpdate
import dev.toolledger.LedgerException
import dev.toolledger.PerformOutcome
import dev.toolledger.Provider
import dev.toolledger.ToolCall
import dev.toolledger.ToolRequest
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.SyncTool
import dev.toolledger.ktx.toolDescriptor
import java.util.concurrent.atomic.AtomicInteger
import kotlin.test.assertEquals
import kotlin.test.assertFailsWith
import kotlin.test.assertIs
import kotlin.test.assertTrue

/** A side-effecting tool that answers [answer] and counts its performs. */
private class Answers(private val answer: PerformOutcome) : SyncTool(toolDescriptor("render_video")) {
    val performs = AtomicInteger()

    override fun performNow(request: ToolRequest): PerformOutcome {
        performs.incrementAndGet()
        return answer
    }
}

private fun render(id: String) =
    ToolCall(provider = Provider.CUSTOM, callId = id, toolName = "render_video", arguments = "{}")

val textSizesTests = listOf(
    test("text sizes: a job started under an empty id is an unknown outcome that says why") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = Answers(PerformOutcome.JobStarted(""))
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val out = assertIs<CallOutcome.Unknown>(executor.executeBlocking("op_1", 0, render("v1")))
        assertTrue("job id must not be empty" in out.reason, out.reason)
        assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, ledger.get(out.executionId)?.status)
        assertEquals(1, tool.performs.get())
    },
    test("text sizes: a webhook without a source or event id is refused, the real one applies once") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = Answers(PerformOutcome.JobStarted("job_7"))
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val pending = assertIs<CallOutcome.Pending>(executor.executeBlocking("op_1", 0, render("v1")))
        val id = pending.executionId
        val done = JobUpdate.Succeeded("""{"url":"u"}""")
        for ((source, eventId) in listOf("render" to "", "" to "evt_1", "render" to "e".repeat(2049))) {
            assertFailsWith<LedgerException.InvalidInput> { executor.ingestWebhook(source, eventId, id, done) }
        }
        assertEquals(ExecutionStatus.EXECUTING, ledger.get(id)?.status)
        assertIs<JobApplied.Committed>(executor.ingestWebhook("render", "evt_1", id, done))
        assertIs<JobApplied.DuplicateEvent>(executor.ingestWebhook("render", "evt_1", id, done))
        val stored = ledger.get(id)
        assertEquals(ExecutionStatus.COMMITTED, stored?.status)
        assertEquals("""{"url":"u"}""", stored?.resultJson)
        assertEquals(1, tool.performs.get())
    },
    test("text sizes: a long failure reason is stored cut and says its length") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val long = "é".repeat(1 shl 20)
        val tool = Answers(PerformOutcome.FailedBeforeCommit(long, false))
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val out = assertIs<CallOutcome.Failed>(executor.executeBlocking("op_1", 0, render("v1")))
        val stored = ledger.get(out.executionId)?.lastReason ?: error("no reason stored")
        val bytes = long.toByteArray(Charsets.UTF_8).size
        assertTrue(stored.toByteArray(Charsets.UTF_8).size <= 4096, "${stored.length} chars stored")
        assertTrue(stored.endsWith(" [cut: $bytes bytes in all]"), stored.takeLast(40))
        assertTrue(long.startsWith(stored.removeSuffix(" [cut: $bytes bytes in all]")))
    },
)
