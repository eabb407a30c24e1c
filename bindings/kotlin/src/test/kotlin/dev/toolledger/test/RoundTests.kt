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
import dev.toolledger.ToolRequest
import dev.toolledger.ktx.CallerTool
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.SyncTool
import dev.toolledger.ktx.executorConfig
import dev.toolledger.ktx.toolDescriptor
import java.util.concurrent.atomic.AtomicInteger
import kotlin.test.assertEquals
import kotlin.test.assertFailsWith
import kotlin.test.assertIs
import kotlin.test.assertTrue
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineName
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.coroutineScope
import kotlinx.coroutines.currentCoroutineContext
import kotlinx.coroutines.delay
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout

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
)
