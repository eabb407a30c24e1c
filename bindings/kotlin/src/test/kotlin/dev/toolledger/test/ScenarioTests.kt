// The Kotlin bindings as an Android app sees them: tools written in Kotlin,
// the executor's outcomes, the ledger's exceptions, suspend/resume.
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.CallSpec
import dev.toolledger.ExecutionStatus
import dev.toolledger.ExecutorConfig
import dev.toolledger.Ledger
import dev.toolledger.LedgerConfig
import dev.toolledger.LedgerException
import dev.toolledger.Provider
import dev.toolledger.Resolution
import dev.toolledger.StorageKind
import dev.toolledger.ToolCall
import dev.toolledger.ToolCallException
import dev.toolledger.ToolExecutor
import dev.toolledger.ToolHandler
import dev.toolledger.ToolRequest
import dev.toolledger.Ticket
import dev.toolledger.Begin
import java.nio.file.Files
import kotlin.test.assertContentEquals
import kotlin.test.assertEquals
import kotlin.test.assertFailsWith
import kotlin.test.assertFalse
import kotlin.test.assertIs
import kotlin.test.assertNotEquals
import kotlin.test.assertTrue
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.withTimeout

fun TestContext.openLedger(config: LedgerConfig = LedgerConfig()): Ledger =
    closeAfter(Ledger.open(ledgerPath, config))

fun TestContext.downstream(): Downstream = Downstream(dir.resolve("downstream.log"))

fun TestContext.executorWith(
    ledger: Ledger,
    vararg tools: ToolHandler,
    config: ExecutorConfig = ExecutorConfig(),
): ToolExecutor {
    val executor = closeAfter(ToolExecutor(ledger, config))
    tools.forEach { executor.register(it) }
    return executor
}

/** A ticket the ledger never handed out (for error paths). */
fun madeUpTicket(executionId: String, attempt: UInt = 1u) = Ticket(
    executionId = executionId,
    downstreamKey = "tl_" + "0".repeat(32),
    attempt = attempt,
    toolName = "send_email",
    toolVersion = 1u,
    argsJson = "{}",
    argsDigest = "0".repeat(64),
    externalId = null,
)

val scenarioTests = listOf(
    // --- the happy path and replay ---------------------------------------

    test("execute runs a Kotlin tool and commits") {
        val ledger = openLedger()
        val downstream = downstream()
        val tool = SendEmail(downstream)
        val executor = executorWith(ledger, tool)

        val out = executor.execute("op_1", 0u, emailCall())

        assertIs<CallOutcome.Completed>(out)
        assertFalse(out.replayed)
        assertEquals(sentJson("msg_1"), out.resultJson)
        assertEquals("msg_1", out.externalId)
        assertEquals("op_1:round_0:call_1:send_email:v1", out.executionId)
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
        val record = ledger.get(out.executionId)!!
        assertEquals(ExecutionStatus.COMMITTED, record.status)
        assertEquals(out.resultJson, record.resultJson)
        assertEquals(1u, record.attemptCount)
    },

    test("replay returns the stored result without running the tool") {
        val ledger = openLedger()
        val downstream = downstream()
        val tool = SendEmail(downstream)
        val executor = executorWith(ledger, tool)

        val first = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0u, emailCall()))
        val again = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0u, emailCall()))

        assertTrue(again.replayed)
        assertEquals(first.resultJson, again.resultJson)
        assertEquals(first.externalId, again.externalId)
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
        val m = executor.metrics()
        assertEquals(listOf(1uL, 1uL, 1uL), listOf(m.attempts, m.replays, m.preventedDuplicates))
    },

    test("replay survives reopening the ledger") {
        val downstream = downstream()
        val first = Ledger.open(ledgerPath, LedgerConfig()).use { ledger ->
            ToolExecutor(ledger, ExecutorConfig()).use { executor ->
                executor.register(SendEmail(downstream))
                assertIs<CallOutcome.Completed>(executor.execute("op_1", 0u, emailCall()))
            }
        }

        val tool = SendEmail(downstream)
        val again = executorWith(openLedger(), tool).execute("op_1", 0u, emailCall())

        assertIs<CallOutcome.Completed>(again)
        assertTrue(again.replayed)
        assertEquals(first.resultJson, again.resultJson)
        assertEquals(0, tool.calls.get())
        assertEquals(1, downstream.count())
    },

    test("changed arguments under the same call id conflict") {
        val ledger = openLedger()
        val downstream = downstream()
        val tool = SendEmail(downstream)
        val executor = executorWith(ledger, tool)

        executor.execute("op_1", 0u, emailCall(to = "a@example.com"))
        val out = executor.execute("op_1", 0u, emailCall(to = "b@example.com"))

        assertIs<CallOutcome.Conflict>(out)
        assertNotEquals(out.storedDigest, out.newDigest)
        assertEquals(ledger.get(out.executionId)!!.argsDigest, out.storedDigest)
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
    },

    test("read-only tools run and record nothing") {
        val ledger = openLedger()
        val weather = Weather()
        val executor = executorWith(ledger, weather)
        val call = ToolCall(Provider.CUSTOM, "w1", "weather", """{"city":"Oslo"}""")

        val out = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0u, call))

        assertEquals("""{"celsius":21}""", out.resultJson)
        assertEquals(1, weather.calls.get())
        assertEquals(emptyList(), ledger.list("op_1"))
    },

    // --- approval ---------------------------------------------------------

    test("approval binds to the digest") {
        val ledger = openLedger()
        val downstream = downstream()
        val tool = SendEmail(downstream, requiresApproval = true)
        val executor = executorWith(ledger, tool)

        val waiting = executor.execute("op_1", 0u, emailCall(to = "bob@example.com"))
        assertIs<CallOutcome.NeedsApproval>(waiting)
        assertEquals("send_email", waiting.toolName)
        assertEquals("""{"to":"bob@example.com"}""", waiting.previewJson)
        assertEquals(0, tool.calls.get())

        val wrong = "0".repeat(64)
        val mismatch = assertFailsWith<LedgerException.DigestMismatch> {
            executor.approve(waiting.executionId, wrong, null)
        }
        assertEquals(waiting.executionId, mismatch.executionId)
        assertEquals(waiting.argsDigest, mismatch.stored)
        assertEquals(wrong, mismatch.given)
        assertFailsWith<LedgerException.InvalidInput> {
            executor.approve(waiting.executionId, "not-a-digest", null)
        }
        assertEquals(0, tool.calls.get())
        assertEquals(ExecutionStatus.PREPARED, ledger.get(waiting.executionId)!!.status)

        val done = executor.approve(waiting.executionId, waiting.argsDigest, waiting.previewJson)
        assertIs<CallOutcome.Completed>(done)
        assertFalse(done.replayed)
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())

        val late = assertFailsWith<LedgerException.InvalidTransition> {
            ledger.approve(waiting.executionId, waiting.argsDigest, null)
        }
        assertEquals(ExecutionStatus.COMMITTED, late.fromStatus)
        assertEquals("approve", late.transition)
        // The executor's approve of the same call again (a double tap)
        // answers with its stored result; nothing runs again.
        val again = executor.approve(waiting.executionId, waiting.argsDigest, null)
        assertIs<CallOutcome.Completed>(again)
        assertTrue(again.replayed)
        assertEquals(done.resultJson, again.resultJson)
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
    },

    // --- foreign exceptions -------------------------------------------------

    test("a Kotlin exception thrown from perform is an unknown outcome, not a crash") {
        for ((i, thrown) in listOf(
            IllegalStateException("socket closed for a@example.com"),
            ToolCallException.Transport("connection reset"),
        ).withIndex()) {
            val ledger = closeAfter(Ledger.open(dir.resolve("ledger-$i.db").toString(), LedgerConfig()))
            val tool = SendEmail(downstream(), canLookup = false, failWith = thrown)
            val executor = executorWith(ledger, tool)

            val out = executor.execute("op_1", 0u, emailCall())

            assertIs<CallOutcome.Unknown>(out, "for ${thrown::class.simpleName}")
            assertFalse(out.reason.contains("a@example.com"), "foreign text may hold user data")
            // No lookup and no idempotency key: nothing settles it by waiting.
            assertEquals(1u, out.attempt)
            assertEquals(null, out.retryAfterMs)
            assertEquals(1, tool.calls.get())
            assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, ledger.get(out.executionId)!!.status)
            assertEquals(1uL, executor.metrics().outcomeUnknown)

            // The app settles it; the stored result is what every retry sees.
            val settled = executor.resolveUnknown(out.executionId, out.attempt, Resolution.Found("""{"sent":true}""", null))
            assertIs<CallOutcome.Completed>(settled)
            assertEquals("""{"sent":true}""", settled.resultJson)
            assertFalse(settled.partial)
            val again = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0u, emailCall()))
            assertTrue(again.replayed)
            assertEquals(1, tool.calls.get())
        }
    },

    test("a Kotlin Error (TODO()) in perform escapes the bindings; the perform timeout makes it Unknown") {
        // The generated code catches `Exception` only. An `Error` (TODO(),
        // StackOverflowError, a failed `assert`) kills the tool's coroutine,
        // reaches the thread's uncaught-exception handler (on Android: the
        // app crashes) and never answers the Rust side, which waits for the
        // perform timeout. If this starts failing because UniFFI now catches
        // Throwable, update bindings/kotlin/README.md and this test.
        val escaped = CompletableDeferred<Throwable>()
        val previous = Thread.getDefaultUncaughtExceptionHandler()
        Thread.setDefaultUncaughtExceptionHandler { _, e -> escaped.complete(e) }
        try {
            val ledger = openLedger()
            val tool = object : SendEmail(downstream(), canLookup = false) {
                override suspend fun beforeEffect(request: ToolRequest): Unit = TODO("not written yet")
            }
            val executor = executorWith(ledger, tool, config = ExecutorConfig(performTimeoutMs = 300uL))

            val out = executor.execute("op_1", 0u, emailCall())

            assertIs<CallOutcome.Unknown>(out)
            assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, ledger.get(out.executionId)!!.status)
            assertEquals(0, tool.downstream.count())
            assertIs<NotImplementedError>(withTimeout(WAIT_MS) { escaped.await() })
        } finally {
            Thread.setDefaultUncaughtExceptionHandler(previous)
        }
    },

    test("a descriptor that throws is InvalidInput at register, not a crash") {
        val broken = object : SendEmail(downstream()) {
            override fun descriptor() = throw IllegalArgumentException("no descriptor")
        }
        val executor = closeAfter(ToolExecutor(openLedger(), ExecutorConfig()))
        assertFailsWith<LedgerException.InvalidInput> { executor.register(broken) }
    },

    // --- bad input and bad storage ----------------------------------------

    test("bad JSON arguments are InvalidInput and nothing is recorded") {
        val ledger = openLedger()
        val tool = SendEmail(downstream())
        val executor = executorWith(ledger, tool)
        val bad = ToolCall(Provider.CUSTOM, "c1", "send_email", "{not json")

        val e = assertFailsWith<LedgerException.InvalidInput> { executor.execute("op_1", 0u, bad) }
        assertFalse(e.detail.contains("not json"), "the detail never echoes the input")
        assertFailsWith<LedgerException.InvalidInput> {
            ledger.begin("op_1", 0u, CallSpec(call = bad, toolVersion = 1u))
        }

        assertEquals(emptyList(), ledger.list("op_1"))
        assertEquals(0uL, ledger.stats().operations)
        assertEquals(0, tool.calls.get())
    },

    test("bad identifiers are InvalidInput; unknown ids NotFound; unknown tools UnknownTool") {
        val ledger = openLedger()
        val executor = executorWith(ledger, SendEmail(downstream()))
        assertFailsWith<LedgerException.InvalidInput> { executor.execute("", 0u, emailCall()) }
        assertFailsWith<LedgerException.InvalidInput> { ledger.get("op_1:round_0:\u0000:send_email:v1") }
        assertFailsWith<LedgerException.InvalidInput> { ledger.get("") }
        val missing = "op_1:round_0:nope:send_email:v1"
        val e = assertFailsWith<LedgerException.NotFound> { ledger.commit(madeUpTicket(missing), "{}", null) }
        assertEquals(missing, e.executionId)
        // A ticket's ids are validated on the way in like any other.
        assertFailsWith<LedgerException.InvalidInput> { ledger.commit(madeUpTicket(""), "{}", null) }
        assertFailsWith<LedgerException.InvalidInput> { ledger.owns(madeUpTicket("op_1:round_0:\u0000:send_email:v1")) }

        val bare = closeAfter(ToolExecutor(ledger, ExecutorConfig()))
        val u = assertFailsWith<LedgerException.UnknownTool> { bare.execute("op_2", 0u, emailCall()) }
        assertEquals("send_email", u.name)
        assertEquals(emptyList(), ledger.list("op_2"))
    },

    test("a file that is not a database is a Storage error and stays untouched") {
        val path = dir.resolve("notes.db")
        val content = "these are my notes, not a database\n".repeat(200).toByteArray()
        Files.write(path, content)

        val e = assertFailsWith<LedgerException.Storage> { Ledger.open(path.toString(), LedgerConfig()) }

        assertEquals(StorageKind.NOT_A_DATABASE, e.kind)
        assertContentEquals(content, Files.readAllBytes(path))
    },

    // --- mobile lifecycle -----------------------------------------------------

    test("suspend() refuses every call with Suspended until resume()") {
        val ledger = openLedger()
        val tool = SendEmail(downstream())
        val executor = executorWith(ledger, tool)
        val first = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0u, emailCall()))

        ledger.suspend()
        assertFailsWith<LedgerException.Suspended> { ledger.list("op_1") }
        assertFailsWith<LedgerException.Suspended> { executor.execute("op_1", 0u, emailCall("call_2")) }
        assertEquals(1, tool.calls.get(), "nothing runs while suspended")

        val pending = ledger.resume()
        // The committed result was never marked delivered: resume reports it.
        assertEquals(listOf(first.executionId), pending.map { it.executionId })
        assertEquals(listOf(ExecutionStatus.COMMITTED), ledger.list("op_1").map { it.status })
        val again = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0u, emailCall()))
        assertTrue(again.replayed)
        assertEquals(1, tool.calls.get())
    },

    // --- the step API without the executor ----------------------------------

    test("ledger steps: begin, commit, replay, deliver") {
        val ledger = openLedger()
        val spec = CallSpec(call = emailCall(), toolVersion = 1u)

        val begun = assertIs<Begin.Execute>(ledger.begin("op_1", 0u, spec))
        val ticket = begun.ticket
        assertEquals(1u, ticket.attempt)
        assertTrue(ticket.downstreamKey.startsWith("tl_"))

        assertEquals(emailCall().arguments, ticket.argsJson) // as the model sent them
        assertTrue(ledger.owns(ticket))

        val stored = ledger.commit(ticket, """{"sent":true}""", "msg_9")
        assertEquals("""{"sent":true}""", stored.resultJson)
        assertFalse(stored.partial)
        assertFalse(ledger.owns(ticket), "committed: no longer running")
        assertFailsWith<LedgerException.AlreadyCommitted> {
            ledger.commit(ticket, """{"sent":false}""", null)
        }

        val again = assertIs<Begin.Replay>(ledger.begin("op_1", 0u, spec))
        assertEquals("""{"sent":true}""", again.result.resultJson)
        ledger.markDelivered(listOf(ticket.executionId))
        assertEquals(ExecutionStatus.RESULT_DELIVERED, ledger.get(ticket.executionId)!!.status)
        // The refused other result is kept as evidence, with a note in the log.
        assertEquals(
            listOf("commit", "found_after_settled", "deliver"),
            ledger.transitions(ticket.executionId).map { it.transition }.takeLast(3),
        )
    },
)
