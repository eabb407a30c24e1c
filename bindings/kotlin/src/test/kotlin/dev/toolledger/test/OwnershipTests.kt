// Exactly one owner, as an Android app sees it: every step of an attempt
// names its Ticket (a superseded one is refused with StaleAttempt), a live
// session owns its calls for as long as it is open, recover() reports the
// rows it cannot deal with instead of giving up, and a lookup's "not found"
// inside the landing window sends nothing again.
package dev.toolledger.test

import dev.toolledger.Begin
import dev.toolledger.CallOutcome
import dev.toolledger.CallSpec
import dev.toolledger.CancelOutcome
import dev.toolledger.ExecutionStatus
import dev.toolledger.ExecutorConfig
import dev.toolledger.Ledger
import dev.toolledger.LedgerConfig
import dev.toolledger.LedgerException
import dev.toolledger.OperationStatus
import dev.toolledger.Provider
import dev.toolledger.Resolution
import dev.toolledger.Resolved
import dev.toolledger.ToolCall
import dev.toolledger.ToolCallException
import kotlin.test.assertEquals
import kotlin.test.assertFailsWith
import kotlin.test.assertFalse
import kotlin.test.assertIs
import kotlin.test.assertNotNull
import kotlin.test.assertNull
import kotlin.test.assertTrue
import kotlinx.coroutines.delay

private fun emailSpec(callId: String = "call_1", requiresApproval: Boolean = false) =
    CallSpec(call = emailCall(callId), toolVersion = 1u, requiresApproval = requiresApproval)

val ownershipTests = listOf(
    test("fencing: a superseded ticket is refused with StaleAttempt and changes nothing") {
        val ledger = openLedger()
        val t1 = assertIs<Begin.Execute>(ledger.begin("op_fence", 0u, emailSpec())).ticket
        val id = t1.executionId
        assertEquals(1u, t1.attempt)
        assertTrue(ledger.owns(t1))

        // The request timed out; the app found nothing downstream and retries
        // under the same key, naming the attempt whose outcome is unknown.
        ledger.markOutcomeUnknown(t1, "timed out")
        assertFalse(ledger.owns(t1))
        val unknown = ledger.get(id)!!
        assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, unknown.status)
        assertEquals(1u, unknown.attemptCount)
        val t2 = assertIs<Resolved.Retry>(
            ledger.resolveUnknown(id, unknown.attemptCount, Resolution.NotFoundRetry),
        ).ticket
        assertEquals(id, t2.executionId)
        assertEquals(2u, t2.attempt)
        assertEquals(t1.downstreamKey, t2.downstreamKey, "the same key on every attempt")
        assertTrue(ledger.owns(t2))
        assertFalse(ledger.owns(t1))

        // The first attempt's late answer: refused, nothing changes.
        val stale = assertFailsWith<LedgerException.StaleAttempt> {
            ledger.commit(t1, """{"sent":"late"}""", "msg_late")
        }
        assertEquals(id, stale.executionId)
        assertEquals(1u, stale.attempt)
        assertEquals(2u, stale.currentAttempt)
        assertEquals(ExecutionStatus.EXECUTING, stale.status)
        val otherSteps: List<() -> Unit> = listOf(
            { ledger.failBeforeCommit(t1, "refused", false) },
            { ledger.markOutcomeUnknown(t1, "timed out again") },
            { ledger.recordExternalId(t1, "msg_late") },
            { ledger.resolveUnknown(id, 1u, Resolution.NotFoundRetry) },
        )
        for (step in otherSteps) {
            val e = assertFailsWith<LedgerException.StaleAttempt> { step() }
            assertEquals(listOf(1u, 2u), listOf(e.attempt, e.currentAttempt))
        }
        val running = ledger.get(id)!!
        assertEquals(ExecutionStatus.EXECUTING, running.status)
        assertEquals(2u, running.attemptCount)
        assertNull(running.resultJson)
        assertNull(running.externalId)

        // The current ticket commits; a repeat replays its result.
        val stored = ledger.commit(t2, """{"sent":true}""", "msg_2")
        assertEquals("""{"sent":true}""", stored.resultJson)
        assertEquals("msg_2", stored.externalId)
        val replay = assertIs<Begin.Replay>(ledger.begin("op_fence", 0u, emailSpec()))
        assertEquals("""{"sent":true}""", replay.result.resultJson)
        assertEquals("msg_2", replay.result.externalId)
        val late = assertFailsWith<LedgerException.StaleAttempt> { ledger.commit(t1, """{"sent":"late"}""", null) }
        assertEquals(ExecutionStatus.COMMITTED, late.status)
        assertEquals("""{"sent":true}""", ledger.get(id)!!.resultJson)
    },

    test("a live session owns its call until it is closed, whatever the lease") {
        // leaseMs only covers suspended sessions.
        val first = Ledger.open(ledgerPath, LedgerConfig(leaseMs = 1uL))
        val other = openLedger(LedgerConfig(leaseMs = 1uL))
        val t1 = try {
            val t1 = assertIs<Begin.Execute>(first.begin("op_1", 0u, emailSpec())).ticket
            delay(50) // far past the lease
            val busy = assertIs<Begin.InFlight>(other.begin("op_1", 0u, emailSpec()))
            assertNull(busy.retryAfterMs, "alive: no lapse to wait for")
            assertTrue(first.owns(t1))
            assertFalse(other.owns(t1), "not this session's attempt")
            t1
        } finally {
            first.close() // the session ends (as if its process died)
        }

        val found = assertIs<Begin.Reconcile>(other.begin("op_1", 0u, emailSpec()))
        assertEquals(1u, found.ticket.attempt)
        assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, other.get(t1.executionId)!!.status)
        val t2 = assertIs<Resolved.Retry>(other.resolveUnknown(t1.executionId, 1u, Resolution.NotFoundRetry)).ticket
        assertEquals(2u, t2.attempt)
        assertTrue(other.owns(t2))
        assertEquals(other.sessionId(), other.get(t1.executionId)!!.ownerSession)
        other.commit(t2, """{"sent":true}""", null)
        assertIs<Begin.Replay>(other.begin("op_1", 0u, emailSpec()))
    },

    test("recover lists a row whose tool is not registered and still recovers the others") {
        val ledger = openLedger()
        // A committed result the model never got (a registered tool) ...
        val sent = assertIs<Begin.Execute>(ledger.begin("op_r", 0u, emailSpec())).ticket
        ledger.commit(sent, """{"sent":true}""", "msg_7")
        // ... and an unknown outcome of a tool this build no longer registers.
        val faxCall = ToolCall(Provider.CUSTOM, "call_2", "send_fax", "{}")
        val fax = assertIs<Begin.Execute>(ledger.begin("op_r", 0u, CallSpec(faxCall, 1u))).ticket
        ledger.markOutcomeUnknown(fax, "timed out")

        val tool = SendEmail(downstream())
        val recovery = executorWith(ledger, tool).recover()

        assertEquals(listOf(fax.executionId), recovery.failed.map { it.executionId })
        assertTrue("send_fax" in recovery.failed.single().error, recovery.failed.single().error)
        val replay = assertIs<CallOutcome.Completed>(recovery.outcomes.singleOrNull(), "${recovery.outcomes}")
        assertEquals(sent.executionId, replay.executionId)
        assertEquals("""{"sent":true}""", replay.resultJson)
        assertEquals("msg_7", replay.externalId)
        assertTrue(replay.replayed)
        assertEquals(listOf(0, 0), listOf(tool.calls.get(), tool.lookups.get()))
        // The row it could not deal with is left for a build that knows its tool.
        assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, ledger.get(fax.executionId)!!.status)
    },

    test("landing window: not found inside it sends nothing; with no window the call is resent") {
        val fast = ExecutorConfig(backoffBaseMs = 1uL, backoffMaxMs = 5uL)
        for (window in listOf<ULong?>(null, 0uL)) {
            val ledger = closeAfter(Ledger.open(dir.resolve("ledger-$window.db").toString(), LedgerConfig()))
            val downstream = Downstream(dir.resolve("downstream-$window.log"))
            // The first perform fails before reaching the downstream; the
            // executor cannot know that. This fake downstream applies requests
            // synchronously, so with landingWindowMs = 0 a resend after
            // "not found" is safe.
            val tool = SendEmail(
                downstream,
                failWith = ToolCallException.Transport("reset"),
                failTimes = 1,
                landingWindowMs = window,
            )
            val executor = executorWith(ledger, tool, config = fast)

            val out = executor.execute("op_1", 0u, emailCall())

            if (window == null) { // the default, 120 s: wait, send nothing
                assertIs<CallOutcome.Unknown>(out)
                assertEquals(1u, out.attempt)
                val wait = assertNotNull(out.retryAfterMs)
                assertTrue(wait in 1uL..120_000uL, "retryAfterMs = $wait")
                assertEquals(listOf(1, 1, 0), listOf(tool.calls.get(), tool.lookups.get(), downstream.count()))
                assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, ledger.get(out.executionId)!!.status)
                val again = assertIs<CallOutcome.Unknown>(executor.execute("op_1", 0u, emailCall()))
                assertNotNull(again.retryAfterMs)
                assertEquals(listOf(1, 0), listOf(tool.calls.get(), downstream.count()))
            } else { // resent at once under the same key: attempt 2
                assertIs<CallOutcome.Completed>(out)
                assertFalse(out.replayed)
                assertEquals(listOf(2, 1, 1), listOf(tool.calls.get(), tool.lookups.get(), downstream.count()))
                val record = ledger.get(out.executionId)!!
                assertEquals(ExecutionStatus.COMMITTED, record.status)
                assertEquals(2u, record.attemptCount)
            }
        }
    },

    test("cancelling an operation with a call running reports a possible side effect") {
        val ledger = openLedger()
        val ticket = assertIs<Begin.Execute>(ledger.begin("op_c", 0u, emailSpec())).ticket

        // Nothing committed yet, but the request may be on its way.
        assertEquals(OperationStatus.CANCELLED_AFTER_SIDE_EFFECT, ledger.cancelOperation("op_c"))
        assertEquals(CancelOutcome.NOT_CANCELLABLE, ledger.cancel(ticket.executionId))
        ledger.commit(ticket, """{"sent":true}""", null) // it finishes honestly
        assertEquals(ExecutionStatus.COMMITTED, ledger.get(ticket.executionId)!!.status)

        val idle = assertIs<Begin.NeedsApproval>(ledger.begin("op_idle", 0u, emailSpec(requiresApproval = true)))
        assertEquals(OperationStatus.CANCELLED, ledger.cancelOperation("op_idle"))
        assertEquals(ExecutionStatus.CANCELLED_BEFORE_COMMIT, ledger.get(idle.request.executionId)!!.status)
    },

    test("compensate runs under the compensating tool's own descriptor") {
        val ledger = openLedger()
        val downstream = downstream()
        val send = SendEmail(downstream)
        val recall = SendEmail(downstream, requiresApproval = true, name = "recall_email")
        val executor = executorWith(ledger, send, recall)
        val original = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0u, emailCall()))
        val refund = ToolCall(Provider.CUSTOM, "recall_1", "recall_email", """{"id":"msg_1"}""")

        val waiting = assertIs<CallOutcome.NeedsApproval>(executor.compensate(original.executionId, "op_1", 1u, refund))

        assertEquals("recall_email", waiting.toolName)
        assertEquals(0, recall.calls.get())
        val linked = ledger.compensations(original.executionId).single()
        assertEquals(waiting.executionId, linked.executionId)
        assertEquals(original.executionId, linked.compensates)
        val done = assertIs<CallOutcome.Completed>(executor.approve(waiting.executionId, waiting.argsDigest, null))
        assertFalse(done.replayed)
        assertEquals(listOf(1, 1, 2), listOf(send.calls.get(), recall.calls.get(), downstream.count()))
    },
)
