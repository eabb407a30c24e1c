// Rounds through the ktx layer: Executor.executeRound of SyncTools and
// CallerTools begins every call of one model response in one durable
// transaction (the library's startRound) and walks each call in its own
// coroutine on the executor's dispatcher. One effect per call, a repeat
// replays the round, maxParallel bounds the tools running at once, a bad
// call stops the round with nothing recorded, a cancelled caller leaves no
// call in flight. Effects are counted at the downstream.
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.ExecutionStatus
import dev.toolledger.LedgerException
import dev.toolledger.PerformOutcome
import dev.toolledger.ToolCall
import dev.toolledger.ToolExecutor
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
import kotlin.test.assertIs
import kotlin.test.assertTrue
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineName
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.asCoroutineDispatcher
import kotlinx.coroutines.async
import kotlinx.coroutines.coroutineScope
import kotlinx.coroutines.currentCoroutineContext
import kotlinx.coroutines.delay
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout
import kotlinx.coroutines.withTimeoutOrNull

/** Counts the performs of a round's tool running at once. */
private class Concurrency {
    val running = AtomicInteger()
    val most = AtomicInteger()
    val performs = AtomicInteger()

    inline fun <T> counted(body: () -> T): T {
        performs.incrementAndGet()
        most.accumulateAndGet(running.incrementAndGet(), ::maxOf)
        try {
            return body()
        } finally {
            running.decrementAndGet()
        }
    }
}

/**
 * `send_email` as a [CallerTool] under an idempotency key. Each perform
 * waits for [allStarted] performs to be running at once (proof that the
 * round runs them in parallel), or for [gate] when given.
 */
private class RoundSend(
    val downstream: Downstream,
    private val allStarted: Int = 1,
    val gate: CompletableDeferred<Unit>? = null,
) : CallerTool(toolDescriptor("send_email", idempotencyKey = true)) {
    val seen = Concurrency()
    val names: MutableList<String?> = java.util.Collections.synchronizedList(mutableListOf())

    override suspend fun perform(request: ToolRequest): PerformOutcome = seen.counted {
        names.add(currentCoroutineContext()[CoroutineName]?.name)
        // `performs` only grows: every tool of the round has started once
        // it reaches allStarted (the first to finish does not undo that).
        withTimeout(10_000) { while (seen.performs.get() < allStarted) delay(2) }
        gate?.await()
        val id = withContext(Dispatchers.IO) {
            downstream.find(request.downstreamKey) ?: downstream.perform(request.downstreamKey)
        }
        PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
    }
}

/**
 * `send_email` as a [SyncTool] that holds its thread for [holdMs], each of
 * the first [allStarted] waiting (up to 10 s) for the others to start.
 */
private class BlockingRoundSend(val downstream: Downstream, private val holdMs: Long, private val allStarted: Int = 1) :
    SyncTool(toolDescriptor("send_email")) {
    val seen = Concurrency()

    override fun performNow(request: ToolRequest): PerformOutcome = seen.counted {
        val deadline = System.nanoTime() + 10_000_000_000
        while (seen.performs.get() < allStarted && System.nanoTime() < deadline) Thread.sleep(1)
        Thread.sleep(holdMs)
        val id = downstream.perform(request.downstreamKey)
        PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
    }
}

private fun emails(n: Int): List<ToolCall> = (0 until n).map { emailCall(callId = "call_$it", to = "u$it@example.com") }

val roundTests = listOf(
    test("executeRound: CallerTools run at once in the caller's context, one effect per call, a repeat replays") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = RoundSend(downstream, allStarted = 3)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val first = withContext(CoroutineName("app-round")) { executor.executeRound("op_1", 0, emails(3)) }
        first.forEach { assertIs<CallOutcome.Completed>(it); assertTrue(!it.replayed) }
        assertEquals(3, first.map { (it as CallOutcome.Completed).resultJson }.toSet().size)
        assertEquals(listOf("app-round", "app-round", "app-round"), tool.names.toList())
        assertEquals(3, tool.seen.most.get())
        val again = executor.executeRound("op_1", 0, emails(3))
        again.zip(first).forEach { (a, f) ->
            val replay = assertIs<CallOutcome.Completed>(a)
            assertTrue(replay.replayed)
            assertEquals((f as CallOutcome.Completed).resultJson, replay.resultJson)
        }
        assertEquals(3, tool.seen.performs.get())
        assertEquals(3, downstream.count())
        assertEquals(List(3) { ExecutionStatus.COMMITTED }, ledger.list("op_1").map { it.status })
    },

    test("executeRound: SyncTools run in parallel on the dispatcher, at most maxParallel at once") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = BlockingRoundSend(downstream, holdMs = 40, allStarted = 2)
        val executor = closeAfter(Executor(ledger, executorConfig(maxParallel = 2), listOf(tool)))
        val outs = executor.executeRound("op_1", 0, emails(5))
        outs.forEach { assertIs<CallOutcome.Completed>(it) }
        assertEquals(2, tool.seen.most.get())
        assertEquals(5, tool.seen.performs.get())
        assertEquals(5, downstream.count())
    },

    test("executeRound: one bad call stops the whole round with nothing recorded") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = RoundSend(downstream)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val unknown = emails(2) + emailCall(callId = "call_x").copy(toolName = "no_such_tool")
        assertFailsWith<LedgerException.UnknownTool> { executor.executeRound("op_1", 0, unknown) }
        val broken = emails(2) + emailCall(callId = "call_j").copy(arguments = """{"to":""")
        assertFailsWith<LedgerException.InvalidInput> { executor.executeRound("op_1", 0, broken) }
        assertEquals(0, ledger.list("op_1").size)
        assertEquals(0, tool.seen.performs.get())
        assertEquals(0, downstream.count())
    },

    test("executeRound: a cancelled caller's waiting calls are given back, the running one finishes; the next ask runs the rest once") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val gate = CompletableDeferred<Unit>()
        val tool = RoundSend(downstream, gate = gate)
        val executor = closeAfter(Executor(ledger, executorConfig(maxParallel = 1), listOf(tool)))
        coroutineScope {
            val round = async { executor.executeRound("op_1", 0, emails(3)) }
            withTimeout(10_000) { while (tool.seen.running.get() < 1) delay(2) }
            round.cancel()
            gate.complete(Unit)
            assertFailsWith<kotlinx.coroutines.CancellationException> { round.await() }
        }
        // The cancelled round is not awaited to its end: wait for its walks.
        withTimeout(10_000) {
            while (ledger.list("op_1").any { it.status == ExecutionStatus.EXECUTING }) delay(5)
        }
        val settled = ledger.list("op_1").map { it.status }.sortedBy { it.name }
        assertEquals(
            listOf(ExecutionStatus.COMMITTED, ExecutionStatus.FAILED_BEFORE_COMMIT, ExecutionStatus.FAILED_BEFORE_COMMIT),
            settled,
        )
        assertEquals(1, downstream.count())
        val outs = executor.executeRound("op_1", 0, emails(3))
        outs.forEach { assertIs<CallOutcome.Completed>(it) }
        assertEquals(3, tool.seen.performs.get())
        assertEquals(3, downstream.count())
    },

    test("executeRound: a dispatcher shut down while a call waits for its turn leaves no call in flight (from a review)") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val pool = Executors.newFixedThreadPool(2)
        val performs = AtomicInteger()
        val tool = object : SyncTool(toolDescriptor("send_email")) {
            override fun performNow(request: ToolRequest): PerformOutcome {
                if (performs.incrementAndGet() == 1) {
                    // The app tears its executor down while the round runs
                    // (shutdown(): queued tasks still run, new ones are refused).
                    Thread.sleep(300) // the other call now waits for the permit
                    pool.shutdown()
                }
                val id = downstream.perform(request.downstreamKey)
                return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
            }
        }
        val executor = Executor(ToolExecutor(ledger.ledger, executorConfig(maxParallel = 1)), pool.asCoroutineDispatcher())
        executor.register(tool)
        closeAfter(executor)
        val thrown = runCatching { executor.executeRound("op_1", 0, emails(2)) }
        assertIs<kotlinx.coroutines.CancellationException>(thrown.exceptionOrNull(), "$thrown")
        val settled = withTimeoutOrNull(5_000) {
            while (ledger.list("op_1").any { it.status == ExecutionStatus.EXECUTING }) delay(20)
            true
        }
        val statuses = ledger.list("op_1").map { it.status }
        // A second caller of the same call, on a live dispatcher:
        val other = Executor(ToolExecutor(ledger.ledger, executorConfig()), Dispatchers.IO)
        other.register(tool)
        closeAfter(other)
        val again = emails(2).map { other.execute("op_1", 0, it) }
        assertTrue(settled == true, "a call stays EXECUTING for good: $statuses; another caller gets $again")
        again.forEach { assertIs<CallOutcome.Completed>(it, "$again") }
        assertEquals(2, downstream.count())
    },

    test("executeRound: an Error thrown by one tool: the others finish and are recorded, the Error is thrown") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = object : SyncTool(toolDescriptor("send_email")) {
            override fun performNow(request: ToolRequest): PerformOutcome {
                if (request.argumentsJson.contains("u1@")) throw StackOverflowError("boom")
                Thread.sleep(100)
                val id = downstream.perform(request.downstreamKey)
                return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
            }
        }
        val executor = closeAfter(Executor(ledger, executorConfig(maxParallel = 2), listOf(tool)))
        val thrown = runCatching { executor.executeRound("op_1", 0, emails(3)) }.exceptionOrNull()
        assertIs<StackOverflowError>(thrown)
        val statuses = ledger.list("op_1").map { it.status }
        assertTrue(statuses.none { it == ExecutionStatus.EXECUTING })
        assertEquals(2, downstream.count())
    },

    test("executeRound: tools that throw CancellationException themselves are unknown outcomes, not a cancelled round") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val sync = object : SyncTool(toolDescriptor("send_email")) {
            override fun performNow(request: ToolRequest): PerformOutcome =
                throw kotlinx.coroutines.CancellationException("the tool's own")
        }
        val caller = object : CallerTool(toolDescriptor("get_weather")) {
            override suspend fun perform(request: ToolRequest): PerformOutcome {
                delay(5)
                throw kotlinx.coroutines.CancellationException("the tool's own")
            }
        }
        val executor = closeAfter(Executor(ledger, executorConfig(), listOf(sync, caller)))
        val calls = emails(1) + emailCall(callId = "call_w").copy(toolName = "get_weather")
        val outs = executor.executeRound("op_1", 0, calls)
        outs.forEach { assertIs<CallOutcome.Unknown>(it) }
        assertTrue(ledger.list("op_1").none { it.status == ExecutionStatus.EXECUTING })
    },

    test("executeRound: close() while a round runs: the round finishes and is recorded") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = object : CallerTool(toolDescriptor("send_email")) {
            override suspend fun perform(request: ToolRequest): PerformOutcome {
                delay(300)
                val id = downstream.perform(request.downstreamKey)
                return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
            }
        }
        val sync = object : SyncTool(toolDescriptor("get_weather")) {
            override fun performNow(request: ToolRequest): PerformOutcome {
                Thread.sleep(300)
                return PerformOutcome.Committed(resultJson = "{}", externalId = null)
            }
        }
        val executor = Executor(ledger, executorConfig(maxParallel = 1), listOf(tool, sync))
        val calls = emails(2) + emailCall(callId = "call_w").copy(toolName = "get_weather")
        val outs = coroutineScope {
            val r = async { executor.executeRound("op_1", 0, calls) }
            delay(100)
            executor.close()
            r.await()
        }
        outs.forEach { assertIs<CallOutcome.Completed>(it) }
        assertTrue(ledger.list("op_1").all { it.status == ExecutionStatus.COMMITTED })
    },
    test("executeRound: a dispatcher shut down before a SyncTool walk is first dispatched leaves no call in flight (from a review)") {
        val downstream = downstream()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val pool = Executors.newFixedThreadPool(2)
        val caller = object : CallerTool(toolDescriptor("get_weather")) {
            override suspend fun perform(request: ToolRequest): PerformOutcome {
                pool.shutdown() // before the round's next call is dispatched
                delay(50)
                return PerformOutcome.Committed(resultJson = "{}", externalId = null)
            }
        }
        val sync = object : SyncTool(toolDescriptor("send_email")) {
            override fun performNow(request: ToolRequest): PerformOutcome {
                val id = downstream.perform(request.downstreamKey)
                return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
            }
        }
        val executor = Executor(ToolExecutor(ledger.ledger, executorConfig()), pool.asCoroutineDispatcher())
        executor.register(caller); executor.register(sync)
        closeAfter(executor)
        val calls = listOf(emailCall(callId = "call_w").copy(toolName = "get_weather")) + emails(1)
        runCatching { executor.executeRound("op_1", 0, calls) }
        val settled = withTimeoutOrNull(5_000) {
            while (ledger.list("op_1").any { it.status == ExecutionStatus.EXECUTING }) delay(20)
            true
        }
        val statuses = ledger.list("op_1").map { it.toolName to it.status }
        assertTrue(settled == true, "a call stays EXECUTING for good: $statuses")
    },
)
