// One ToolExecutor used from many coroutines on Dispatchers.Default (several
// threads), as a chat app's view models and workers would; and what a
// cancelled caller leaves behind (nothing: the call finishes inside the library).
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.ExecutionStatus
import dev.toolledger.ExecutorConfig
import dev.toolledger.Ledger
import dev.toolledger.LedgerConfig
import dev.toolledger.ToolExecutor
import dev.toolledger.ToolRequest
import java.util.concurrent.atomic.AtomicInteger
import kotlin.test.assertEquals
import kotlin.test.assertIs
import kotlin.test.assertTrue
import kotlin.test.fail
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitAll
import kotlinx.coroutines.channels.Channel
import kotlinx.coroutines.coroutineScope
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.withTimeout

/** How long a test waits for other coroutines to reach a point. */
const val WAIT_MS = 30_000L

/** Holds `perform` before its effect until the test opens the gate. */
class GatedSendEmail(downstream: Downstream) : SendEmail(downstream) {
    val entered = CompletableDeferred<Unit>()
    val gate = CompletableDeferred<Unit>()

    override suspend fun beforeEffect(request: ToolRequest) {
        entered.complete(Unit)
        gate.await()
    }
}

/** Holds every `perform` until `expected` of them are inside at once. */
class BarrierSendEmail(downstream: Downstream, private val expected: Int) : SendEmail(downstream) {
    private val inside = AtomicInteger()
    private val allInside = CompletableDeferred<Unit>()
    val maxInside = AtomicInteger()

    override suspend fun beforeEffect(request: ToolRequest) {
        val n = inside.incrementAndGet()
        maxInside.accumulateAndGet(n, ::maxOf)
        if (n == expected) allInside.complete(Unit)
        withTimeout(WAIT_MS) { allInside.await() }
    }
}

val concurrencyTests = listOf(
    test("8 coroutines racing the same call: the tool runs once, the others see InFlight") {
        val ledger = openLedger()
        val downstream = downstream()
        val tool = GatedSendEmail(downstream)
        val executor = executorWith(ledger, tool)

        val finished = Channel<CallOutcome>(capacity = 8)
        val outcomes = coroutineScope {
            val racers = (1..8).map {
                async(Dispatchers.Default) {
                    executor.execute("op_race", 0u, emailCall()).also { finished.send(it) }
                }
            }
            // Exactly one racer got to perform; it is held before its effect,
            // so the seven others must all be told the call is in flight.
            withTimeout(WAIT_MS) { tool.entered.await() }
            val early = withTimeout(WAIT_MS) { List(7) { finished.receive() } }
            early.forEach { assertIs<CallOutcome.InFlight>(it) }
            tool.gate.complete(Unit)
            racers.awaitAll()
        }

        val completed = outcomes.filterIsInstance<CallOutcome.Completed>()
        assertEquals(1, completed.size, "exactly one racer ran it: $outcomes")
        assertEquals(false, completed.single().replayed)
        assertEquals(7, outcomes.count { it is CallOutcome.InFlight })
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())

        // Once committed, everyone gets the replay.
        val later = assertIs<CallOutcome.Completed>(executor.execute("op_race", 0u, emailCall()))
        assertTrue(later.replayed)
        assertEquals(completed.single().resultJson, later.resultJson)
        assertEquals(1, tool.calls.get())
    },

    test("8 coroutines racing the same call without a gate: one run, the rest InFlight or Replay") {
        val ledger = openLedger()
        val downstream = downstream()
        val tool = SendEmail(downstream)
        val executor = executorWith(ledger, tool)

        repeat(5) { round ->
            val outcomes = coroutineScope {
                (1..8).map {
                    async(Dispatchers.Default) { executor.execute("op_free", round.toUInt(), emailCall()) }
                }.awaitAll()
            }
            val fresh = outcomes.filter { it is CallOutcome.Completed && !it.replayed }
            assertEquals(1, fresh.size, "round $round: $outcomes")
            val inFlight = outcomes.count { it is CallOutcome.InFlight }
            val replayed = outcomes.count { it is CallOutcome.Completed && it.replayed }
            assertEquals(7, inFlight + replayed, "round $round: $outcomes")
        }
        assertEquals(5, tool.calls.get())
        assertEquals(5, downstream.count())
    },

    test("8 different calls from 8 coroutines run in parallel and all complete") {
        val ledger = openLedger()
        val downstream = downstream()
        val tool = BarrierSendEmail(downstream, expected = 8)
        val executor = executorWith(ledger, tool, config = ExecutorConfig(maxParallel = 8u))

        val outcomes = coroutineScope {
            (1..8).map { i ->
                async(Dispatchers.Default) { executor.execute("op_par", 0u, emailCall("call_$i")) }
            }.awaitAll()
        }

        outcomes.forEach { assertIs<CallOutcome.Completed>(it) }
        assertEquals(8, outcomes.map { (it as CallOutcome.Completed).executionId }.toSet().size)
        assertEquals(8, tool.maxInside.get(), "all 8 performs were in flight at once")
        assertEquals(8, tool.calls.get())
        assertEquals(8, downstream.count())
        assertEquals(List(8) { ExecutionStatus.COMMITTED }, ledger.list("op_par").map { it.status })
    },

    test("a cancelled caller only loses the answer: the call still finishes once") {
        val downstream = downstream()
        val ledger = Ledger.open(ledgerPath, LedgerConfig())
        val tool = GatedSendEmail(downstream)
        val executor = ToolExecutor(ledger, ExecutorConfig()).also { it.register(tool) }

        // A view model's scope is cancelled while the tool is running.
        coroutineScope {
            val job = launch(Dispatchers.Default) { executor.execute("op_cancel", 0u, emailCall()) }
            withTimeout(WAIT_MS) { tool.entered.await() }
            job.cancel()
            job.join()
        }
        val id = "op_cancel:round_0:call_1:send_email:v1"
        // The attempt was not abandoned: it is still running inside the library.
        assertEquals(ExecutionStatus.EXECUTING, ledger.get(id)!!.status)
        assertIs<CallOutcome.InFlight>(executor.execute("op_cancel", 0u, emailCall()))

        // The tool finishes after its caller went away: the ledger records the
        // commit, and asking again replays it without a second effect.
        tool.gate.complete(Unit)
        withTimeout(WAIT_MS) {
            while (ledger.get(id)!!.status != ExecutionStatus.COMMITTED) delay(10)
        }
        val again = assertIs<CallOutcome.Completed>(executor.execute("op_cancel", 0u, emailCall()))
        assertTrue(again.replayed)
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
    },
)
