// A CallerTool (a suspending tool) run by the suspending Executor.execute in
// the calling coroutine through the caller-driven steps: it sees the
// caller's context, runs once per call, a repeat replays, a caller
// cancelled while it runs loses only the answer, an exception is an unknown
// outcome (a key tool is resent under the same key, a lookup tool looked
// up, a neither tool answers Unknown), the perform timeout holds, an Error
// is rethrown with the attempt recorded. Effects are counted at the
// downstream.
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.ExecutionStatus
import dev.toolledger.LedgerException
import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.ToolRequest
import dev.toolledger.ktx.CallerTool
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.SyncTool
import dev.toolledger.ktx.executorConfig
import dev.toolledger.ktx.toolDescriptor
import java.util.concurrent.Executors
import java.util.concurrent.atomic.AtomicInteger
import kotlin.test.assertEquals
import kotlin.test.assertFailsWith
import kotlin.test.assertFalse
import kotlin.test.assertIs
import kotlin.test.assertTrue
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineName
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.asCoroutineDispatcher
import kotlinx.coroutines.awaitAll
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.cancelAndJoin
import kotlinx.coroutines.currentCoroutineContext
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext

/**
 * `send_email` as a [CallerTool]. [failFirst] is thrown by the first
 * perform after its effect (the request went out, the answer was lost);
 * [hangFirst] makes the first perform suspend forever after its effect;
 * [gate], when set, is awaited before the effect.
 */
private class SuspendSend(
    val downstream: Downstream,
    private val idempotencyKey: Boolean = false,
    canLookup: Boolean = false,
    private val failFirst: Throwable? = null,
    private val hangFirst: Boolean = false,
    val gate: CompletableDeferred<Unit>? = null,
) : CallerTool(toolDescriptor("send_email", idempotencyKey = idempotencyKey, lookup = canLookup)) {
    val calls = AtomicInteger()
    val lookups = AtomicInteger()
    val keys: MutableList<String> = java.util.Collections.synchronizedList(mutableListOf())

    /** The coroutine name the last perform saw. */
    @Volatile
    var sawName: String? = null

    /** The thread of the last perform. */
    @Volatile
    var sawThread: Thread? = null

    /** Set when a perform ran to its end. */
    val finished = AtomicInteger()

    override suspend fun perform(request: ToolRequest): PerformOutcome {
        val n = calls.incrementAndGet()
        sawName = currentCoroutineContext()[CoroutineName]?.name
        sawThread = Thread.currentThread()
        keys.add(request.downstreamKey)
        gate?.await()
        val id = withContext(Dispatchers.IO) {
            if (idempotencyKey) downstream.find(request.downstreamKey) ?: downstream.perform(request.downstreamKey)
            else downstream.perform(request.downstreamKey)
        }
        if (n == 1 && failFirst != null) throw failFirst
        if (n == 1 && hangFirst) awaitCancellation()
        finished.incrementAndGet()
        return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
    }

    override suspend fun lookup(request: ToolRequest): LookupOutcome {
        lookups.incrementAndGet()
        val id = withContext(Dispatchers.IO) { downstream.find(request.downstreamKey) } ?: return LookupOutcome.NotFound
        return LookupOutcome.Found(resultJson = sentJson(id), externalId = id)
    }
}

/** Blocks its thread (ignoring cancellation) for [blockMs] after its effect, then answers Committed. */
private class BlockingSend(val downstream: Downstream, private val blockMs: Long) :
    CallerTool(toolDescriptor("send_email")) {
    val calls = AtomicInteger()

    override suspend fun perform(request: ToolRequest): PerformOutcome {
        calls.incrementAndGet()
        val id = downstream.perform(request.downstreamKey)
        Thread.sleep(blockMs) // a blocking read with no deadline of its own
        return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
    }
}

/** Refuses every attempt, retryably (a 503 before anything was done). */
private class AlwaysRefused : CallerTool(toolDescriptor("send_email")) {
    val calls = AtomicInteger()

    override suspend fun perform(request: ToolRequest): PerformOutcome {
        calls.incrementAndGet()
        return PerformOutcome.FailedBeforeCommit(reason = "503", retryable = true)
    }
}

val callerToolTests = listOf(
    test("CallerTool: runs once in the calling coroutine, a repeat replays with no effect") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = SuspendSend(downstream, idempotencyKey = true)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val done = withContext(CoroutineName("app-call")) {
            assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        }
        assertFalse(done.replayed)
        assertEquals("app-call", tool.sawName, "the tool did not run in the caller's coroutine")
        assertEquals(ExecutionStatus.COMMITTED, ledger.get(done.executionId)!!.status)
        repeat(3) {
            val again = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
            assertTrue(again.replayed)
            assertEquals(done.resultJson, again.resultJson)
        }
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
        assertEquals(1u, ledger.get(done.executionId)!!.attemptCount)
    },

    test("CallerTool: called from the app's main thread, it runs on the executor's dispatcher and the main thread stays free") {
        val downstream = downstream()
        val steps = Executors.newSingleThreadExecutor { Thread(it, "ledger-steps").apply { isDaemon = true } }
        val main = Executors.newSingleThreadExecutor { Thread(it, "app-main").apply { isDaemon = true } }
        try {
            val ledger = closeAfter(SuspendLedger.open(ledgerPath, dispatcher = steps.asCoroutineDispatcher()))
            val gate = CompletableDeferred<Unit>()
            val tool = SuspendSend(downstream, gate = gate)
            val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
            val ticks = AtomicInteger()
            val done = withContext(main.asCoroutineDispatcher()) {
                val ticker = launch { while (true) { delay(10); ticks.incrementAndGet() } }
                val call = async { executor.execute("op_1", 0, emailCall()) }
                while (tool.calls.get() == 0) delay(5)
                val before = ticks.get()
                delay(200)
                val during = ticks.get() - before
                gate.complete(Unit)
                val outcome = call.await()
                ticker.cancel()
                assertTrue(during > 5, "the main thread was held while the tool ran ($during ticks)")
                outcome
            }
            assertIs<CallOutcome.Completed>(done)
            assertEquals("ledger-steps", tool.sawThread!!.name)
            assertEquals(1, downstream.count())
        } finally {
            steps.shutdown()
            main.shutdown()
        }
    },

    test("CallerTool: eight coroutines racing one call get one perform and one effect") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val gate = CompletableDeferred<Unit>()
        val tool = SuspendSend(downstream, gate = gate)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val outcomes = withContext(Dispatchers.Default) {
            val calls = (1..8).map { async { executor.execute("op_1", 0, emailCall()) } }
            delay(200)
            gate.complete(Unit)
            calls.awaitAll()
        }
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
        val completed = outcomes.filterIsInstance<CallOutcome.Completed>()
        assertTrue(completed.isNotEmpty())
        assertTrue(outcomes.all { it is CallOutcome.Completed || it is CallOutcome.InFlight }, "$outcomes")
        assertEquals(1, completed.map { it.resultJson }.toSet().size)
    },

    test("CallerTool: a caller cancelled while the tool runs loses only the answer; the call is committed") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val gate = CompletableDeferred<Unit>()
        val tool = SuspendSend(downstream, idempotencyKey = true, gate = gate)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        withContext(Dispatchers.Default) {
            val job = launch { executor.execute("op_1", 0, emailCall()) }
            while (tool.calls.get() == 0) delay(5)
            val cancelled = launch { job.cancelAndJoin() }
            delay(100)
            assertFalse(cancelled.isCompleted, "the caller's coroutine ended while its tool ran")
            gate.complete(Unit)
            cancelled.join()
        }
        assertEquals(1, tool.finished.get())
        val again = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        assertTrue(again.replayed, "the cancelled caller's call was not committed")
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
    },

    test("CallerTool: a caller cancelled before it calls runs nothing and records nothing") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = SuspendSend(downstream)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        withContext(Dispatchers.Default) {
            val job = launch {
                currentCoroutineContext()[kotlinx.coroutines.Job]!!.cancel()
                executor.execute("op_1", 0, emailCall())
            }
            job.join()
        }
        assertEquals(0, tool.calls.get())
        assertEquals(0, downstream.count())
        assertEquals(0, ledger.list("op_1").size)
    },

    test("CallerTool: a key tool that threw after its effect is resent under the same key, one effect") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = SuspendSend(downstream, idempotencyKey = true, failFirst = IllegalStateException("connection reset"))
        val executor = closeAfter(Executor(ledger, executorConfig(backoffBaseMs = 1, backoffMaxMs = 2), listOf(tool)))
        val done = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        assertEquals(2, tool.calls.get())
        assertEquals(1, tool.keys.toSet().size, "the resend used another key: ${tool.keys}")
        assertEquals(1, downstream.count())
        assertEquals(sentJson("msg_1"), done.resultJson)
    },

    test("CallerTool: a lookup tool that threw after its effect is looked up, not resent") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = SuspendSend(downstream, canLookup = true, failFirst = IllegalStateException("connection reset"))
        val executor = closeAfter(Executor(ledger, executorConfig(backoffBaseMs = 1, backoffMaxMs = 2), listOf(tool)))
        val done = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        assertEquals(1, tool.calls.get())
        assertEquals(1, tool.lookups.get())
        assertEquals(1, downstream.count())
        assertEquals(sentJson("msg_1"), done.resultJson)
    },

    test("CallerTool: a neither tool that threw after its effect answers Unknown and is never resent") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = SuspendSend(downstream, failFirst = IllegalStateException("connection reset"))
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val unknown = assertIs<CallOutcome.Unknown>(executor.execute("op_1", 0, emailCall()))
        assertTrue("IllegalStateException" in unknown.reason, unknown.reason)
        assertIs<CallOutcome.Unknown>(executor.execute("op_1", 0, emailCall()))
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
        assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, ledger.get(unknown.executionId)!!.status)
    },

    test("CallerTool: the perform timeout cancels a tool that does not answer; the outcome is unknown") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = SuspendSend(downstream, hangFirst = true)
        val executor = closeAfter(Executor(ledger, executorConfig(performTimeoutMs = 300), listOf(tool)))
        val started = System.nanoTime()
        val unknown = assertIs<CallOutcome.Unknown>(executor.execute("op_1", 0, emailCall()))
        val waitedMs = (System.nanoTime() - started) / 1_000_000
        assertTrue(waitedMs in 250..10_000, "waited $waitedMs ms")
        assertTrue("timed out" in unknown.reason, unknown.reason)
        assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, ledger.get(unknown.executionId)!!.status)
        assertEquals(1, tool.calls.get())
        assertEquals(0, tool.finished.get())
        assertEquals(1, downstream.count())
    },

    test("CallerTool: an Error from the tool is rethrown, the attempt recorded unknown, nothing resent") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = SuspendSend(downstream, idempotencyKey = true, failFirst = StackOverflowError("deep"))
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        assertFailsWith<StackOverflowError> { executor.execute("op_1", 0, emailCall()) }
        assertEquals(1, tool.calls.get())
        val stored = ledger.list("op_1").single()
        assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, stored.status)
        // The next ask resends under the same key: still one effect.
        val done = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        assertEquals(2, tool.calls.get())
        assertEquals(1, downstream.count())
        assertEquals(sentJson("msg_1"), done.resultJson)
    },

    test("CallerTool: a tool that blocks past the perform timeout is not resent meanwhile and its own answer is kept") {
        // Cancellation is cooperative: a blocked thread cannot be stopped.
        // Meanwhile the call is InFlight to another caller (nothing resent),
        // and the tool's own answer, which is true, is what is recorded.
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = BlockingSend(downstream, blockMs = 1_500)
        val executor = closeAfter(Executor(ledger, executorConfig(performTimeoutMs = 300), listOf(tool)))
        withContext(Dispatchers.Default) {
            val first = async { executor.execute("op_1", 0, emailCall()) }
            while (tool.calls.get() == 0) delay(5)
            delay(500) // past the 300 ms timeout, the tool still blocked
            assertIs<CallOutcome.InFlight>(executor.execute("op_1", 0, emailCall()))
            val done = assertIs<CallOutcome.Completed>(first.await())
            assertEquals(sentJson("msg_1"), done.resultJson)
        }
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
    },

    test("CallerTool: a perform timeout of 0 still starts the tool") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = BlockingSend(downstream, blockMs = 0)
        val executor = closeAfter(Executor(ledger, executorConfig(performTimeoutMs = 0), listOf(tool)))
        val out = executor.execute("op_1", 0, emailCall())
        assertEquals(1, tool.calls.get(), "no tool ran: $out")
        assertEquals(1, downstream.count())
    },

    test("CallerTool: a caller cancelled in a retry's backoff stops at once, nothing outstanding") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = AlwaysRefused()
        val executor = closeAfter(
            Executor(ledger, executorConfig(maxAttempts = 2, backoffBaseMs = 3_000, backoffMaxMs = 3_000), listOf(tool)),
        )
        withContext(Dispatchers.Default) {
            val job = launch { executor.execute("op_1", 0, emailCall()) }
            while (tool.calls.get() == 0) delay(5)
            delay(50)
            val started = System.nanoTime()
            job.cancelAndJoin()
            val ms = (System.nanoTime() - started) / 1_000_000
            assertTrue(ms < 1_000, "the cancelled caller was held $ms ms in the backoff")
        }
        val stored = ledger.list("op_1").single()
        assertEquals(1u, stored.attemptCount, "an attempt was handed out after the caller gave up")
        assertEquals(1, tool.calls.get())
        // The next ask goes on: the second and last attempt, refused again.
        assertIs<CallOutcome.Failed>(executor.execute("op_1", 0, emailCall()))
        assertEquals(2, tool.calls.get())
    },

    test("CallerTool: a walk past the step limit leaves nothing in flight") {
        // 600 attempts take 1,200 steps, past the walk's 1,024: the attempt
        // handed out last is recorded as never sent, and the call goes on
        // at the next ask instead of answering InFlight for the process's life.
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = AlwaysRefused()
        val executor = closeAfter(
            Executor(ledger, executorConfig(maxAttempts = 600, backoffBaseMs = 0, backoffMaxMs = 0), listOf(tool)),
        )
        val thrown = assertFailsWith<IllegalStateException> { executor.execute("op_1", 0, emailCall()) }
        assertTrue("step" in thrown.message!!, thrown.message)
        assertEquals(512, tool.calls.get())
        val stored = ledger.list("op_1").single()
        assertTrue(stored.status != ExecutionStatus.EXECUTING, "left ${stored.status}")
        val next = executor.execute("op_1", 0, emailCall())
        assertTrue(next !is CallOutcome.InFlight, "the call is in flight for good: $next")
        assertTrue(tool.calls.get() > 512, "the next ask ran nothing")
    },

    test("SyncTool: a walk past the step limit leaves nothing in flight either (executeBlocking)") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val calls = AtomicInteger()
        val tool = object : SyncTool(toolDescriptor("send_email")) {
            override fun performNow(request: ToolRequest): PerformOutcome {
                calls.incrementAndGet()
                return PerformOutcome.FailedBeforeCommit(reason = "503", retryable = true)
            }
        }
        val executor = closeAfter(
            Executor(ledger, executorConfig(maxAttempts = 600, backoffBaseMs = 0, backoffMaxMs = 0), listOf(tool)),
        )
        assertFailsWith<IllegalStateException> { executor.executeBlocking("op_1", 0, emailCall()) }
        assertEquals(512, calls.get())
        assertTrue(ledger.list("op_1").single().status != ExecutionStatus.EXECUTING)
        assertTrue(executor.executeBlocking("op_1", 0, emailCall()) !is CallOutcome.InFlight)
    },

    test("CallerTool: a caller cancelled between start and the tool sends nothing; the next ask runs it once") {
        val downstream = downstream()
        val pool = Executors.newSingleThreadExecutor { Thread(it, "steps").apply { isDaemon = true } }
        try {
            val ledger = closeAfter(SuspendLedger.open(ledgerPath, dispatcher = pool.asCoroutineDispatcher()))
            val tool = BlockingSend(downstream, blockMs = 0)
            val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
            val hold = CompletableDeferred<Unit>()
            // The dispatcher busy: the walk waits for it, and the caller is cancelled meanwhile.
            pool.execute { kotlinx.coroutines.runBlocking { hold.await() } }
            withContext(Dispatchers.Default) {
                val job = launch { executor.execute("op_1", 0, emailCall()) }
                delay(200)
                job.cancel()
                hold.complete(Unit)
                job.join()
            }
            assertEquals(0, tool.calls.get())
            assertEquals(0, downstream.count())
            assertEquals(ExecutionStatus.FAILED_BEFORE_COMMIT, ledger.list("op_1").single().status)
            assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
            assertEquals(1, tool.calls.get())
            assertEquals(1, downstream.count())
        } finally {
            pool.shutdown()
        }
    },

    test("CallerTool: the ledger suspended while the tool runs: the report is refused, and after resume one effect") {
        // The app goes to the background mid-call (`suspend()` while the
        // tool waits for its answer). The report cannot be recorded: the
        // caller gets Suspended. The executor keeps the result it could not
        // write; after `resume()` the next ask commits it: one effect, the
        // tool's own result.
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val gate = CompletableDeferred<Unit>()
        val tool = SuspendSend(downstream, idempotencyKey = true, gate = gate)
        val executor = closeAfter(Executor(ledger, executorConfig(backoffBaseMs = 1, backoffMaxMs = 2), listOf(tool)))
        withContext(Dispatchers.Default) {
            val call = async { runCatching { executor.execute("op_1", 0, emailCall()) } }
            while (tool.calls.get() == 0) delay(5)
            ledger.suspend()
            gate.complete(Unit)
            val first = call.await()
            assertIs<LedgerException.Suspended>(first.exceptionOrNull(), "$first")
        }
        assertEquals(1, downstream.count())
        ledger.resume()
        executor.recover()
        val done = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        assertEquals(sentJson("msg_1"), done.resultJson)
        assertEquals(1, downstream.count())
        assertEquals(1, tool.keys.toSet().size)
    },

    test("CallerTool: bad input is refused before anything is recorded") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = SuspendSend(downstream)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        assertFailsWith<LedgerException.InvalidInput> { executor.execute("op_1", -1, emailCall()) }
        assertFailsWith<LedgerException.InvalidInput> { executor.execute("op_1", 0, emailCall().copy(arguments = "{not json")) }
        assertFailsWith<LedgerException.InvalidInput> { executor.execute("op_\uD83D", 0, emailCall()) }
        assertEquals(0, tool.calls.get())
        assertEquals(0, ledger.list("op_1").size)
    },
)
