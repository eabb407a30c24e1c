// A SyncTool called through the suspending Executor.execute, as an Android
// app calls it from a coroutine on the main thread. A replay the library
// answers at once (`startNow`: the ledger's connection free, a read that
// never waits) comes back on the caller's thread with no dispatch; every
// other call, and a replay while another call holds the ledger's one
// connection, runs on the executor's dispatcher, never on the caller's
// thread, which stays free. A replay is exactly the stored result with no new
// effect; a suspended ledger, or one whose write lock another connection
// holds, gives its exact typed error. Effects are counted at the downstream.
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.LedgerException
import dev.toolledger.StorageKind
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.ledgerConfig
import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.Executors
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicInteger
import kotlin.coroutines.CoroutineContext
import kotlin.test.assertEquals
import kotlin.test.assertFailsWith
import kotlin.test.assertFalse
import kotlin.test.assertIs
import kotlin.test.assertTrue
import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.asCoroutineDispatcher
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext

/** `Dispatchers.IO`, counting its dispatches and remembering their threads. */
private class CountingIo : CoroutineDispatcher() {
    val dispatches = AtomicInteger()
    val threads: MutableSet<Thread> = ConcurrentHashMap.newKeySet()

    override fun dispatch(context: CoroutineContext, block: Runnable) {
        dispatches.incrementAndGet()
        Dispatchers.IO.dispatch(context, Runnable { threads.add(Thread.currentThread()); block.run() })
    }
}

/** Runs [block] on a thread of its own (the app's main thread), then ends that thread. */
private suspend fun <T> onCallerThread(block: suspend CoroutineScope.() -> T): T {
    val pool = Executors.newSingleThreadExecutor { Thread(it, "caller") }
    try {
        return withContext(pool.asCoroutineDispatcher()) { block() }
    } finally {
        pool.shutdown()
        pool.awaitTermination(10, TimeUnit.SECONDS)
    }
}

/** Counts in [ticks] every 10 ms on this scope's thread until cancelled: it keeps counting only while that thread is free. */
private fun CoroutineScope.tick(ticks: AtomicInteger) = launch {
    while (true) {
        delay(10)
        ticks.incrementAndGet()
    }
}

/**
 * Another connection (a python3 process, stdlib sqlite3) holding the write
 * lock of the database at [path] (`BEGIN IMMEDIATE`) until [close].
 */
private class WriteLockHolder(path: String) : AutoCloseable {
    private val child = ProcessBuilder(
        "python3", "-c",
        "import sqlite3, sys\n" +
            "c = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)\n" +
            "c.execute('BEGIN IMMEDIATE')\n" +
            "print('held', flush=True)\n" +
            "sys.stdin.read()\n" +
            "c.execute('ROLLBACK')\n",
        path,
    ).redirectError(ProcessBuilder.Redirect.INHERIT).start()

    init {
        val line = child.inputStream.bufferedReader().readLine()
        check(line == "held") { "the lock holder said: $line" }
    }

    override fun close() {
        child.outputStream.close()
        check(child.waitFor(30, TimeUnit.SECONDS)) { "the lock holder did not exit" }
    }
}

val suspendCallTests = listOf(
    test("suspending execute: a replay is answered in place, exactly the stored result, with no dispatch and no effect") {
        val downstream = downstream()
        val io = CountingIo()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath, dispatcher = io))
        val tool = SyncSend(downstream, idempotencyKey = true)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        // A new call: through the dispatcher, off the caller's thread.
        val first = onCallerThread {
            val before = io.dispatches.get()
            val first = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
            assertTrue(io.dispatches.get() > before, "a new call did not go through the dispatcher")
            assertTrue(tool.thread!! in io.threads, "the tool ran off the dispatcher")
            first
        }
        assertFalse(first.replayed)
        val stored = ledger.get(first.executionId)!!
        onCallerThread {
            repeat(3) {
                val before = io.dispatches.get()
                val again = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
                assertTrue(again.replayed)
                assertEquals(first.executionId, again.executionId)
                assertEquals(stored.resultJson, again.resultJson)
                assertEquals(stored.externalId, again.externalId)
                assertFalse(again.partial)
                // Answered on the caller's thread: nothing dispatched.
                assertEquals(before, io.dispatches.get(), "the replay hopped to the dispatcher")
                // The same answer as the blocking form's.
                assertEquals(again, executor.executeBlocking("op_1", 0, emailCall()))
            }
        }
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
        assertEquals(1u, ledger.get(first.executionId)!!.attemptCount)
        assertEquals(6uL, executor.metrics().replays)
    },

    test("suspending execute: a suspended ledger gives Suspended at once, and nothing runs") {
        val downstream = downstream()
        val io = CountingIo()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath, dispatcher = io))
        val tool = SyncSend(downstream, idempotencyKey = true)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val first = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        ledger.suspend()
        onCallerThread {
            val before = io.dispatches.get()
            // A replay and a new call alike: the library answers Suspended
            // without waiting, so on the caller's thread (what the
            // dispatcher's path throws, as `executeBlocking` shows).
            assertFailsWith<LedgerException.Suspended> { executor.execute("op_1", 0, emailCall()) }
            assertFailsWith<LedgerException.Suspended> { executor.execute("op_1", 0, emailCall("call_2")) }
            assertFailsWith<LedgerException.Suspended> { executor.executeBlocking("op_1", 0, emailCall()) }
            assertEquals(before, io.dispatches.get())
        }
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
        ledger.resume()
        val replay = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        assertTrue(replay.replayed)
        assertEquals(first.resultJson, replay.resultJson)
    },

    test("suspending execute: while another connection holds the write lock the caller's thread stays free") {
        val downstream = downstream()
        val io = CountingIo()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath, ledgerConfig(busyTimeoutMs = 1_500), dispatcher = io))
        val tool = SyncSend(downstream, idempotencyKey = true)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val first = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        WriteLockHolder(ledgerPath).use {
            onCallerThread {
                // The caller's thread runs other work while the call waits.
                val ticks = AtomicInteger()
                val ticker = tick(ticks)
                // A replay needs no write lock: answered from a read, in place.
                val dispatched = io.dispatches.get()
                val replay = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
                assertTrue(replay.replayed)
                assertEquals(first.resultJson, replay.resultJson)
                assertEquals(dispatched, io.dispatches.get())
                // A new call waits the busy timeout for the lock, then Busy:
                // nothing recorded, nothing performed.
                val before = ticks.get()
                val busy = assertFailsWith<LedgerException.Storage> {
                    executor.execute("op_1", 0, emailCall("call_2"))
                }
                val during = ticks.get() - before
                ticker.cancel()
                assertEquals(StorageKind.BUSY, busy.kind)
                // Blocked, the thread could not have ticked once.
                assertTrue(during > 0, "the caller's thread was held while the call waited")
            }
        }
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
        assertEquals(1, ledger.list("op_1").size)
        // The lock released, the same call runs once.
        val later = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall("call_2")))
        assertFalse(later.replayed)
        assertEquals(2, downstream.count())
    },

    test("suspending execute: while another call holds the ledger, a replay goes to the dispatcher and the caller stays free") {
        val downstream = downstream()
        val io = CountingIo()
        // A writer that meets another connection's lock waits up to 30 s for
        // it, holding the ledger's one connection all that time.
        val ledger = closeAfter(SuspendLedger.open(ledgerPath, ledgerConfig(busyTimeoutMs = 30_000), dispatcher = io))
        val tool = SyncSend(downstream, idempotencyKey = true)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val first = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        val holder = WriteLockHolder(ledgerPath)
        var writerOutcome: CallOutcome? = null
        var writerError: Throwable? = null
        val writer = Thread {
            try {
                writerOutcome = executor.executeBlocking("op_1", 0, emailCall("call_2"))
            } catch (e: Throwable) {
                writerError = e
            }
        }
        try {
            writer.start()
            // The writer holds the connection once the library says "would
            // block" twice, 50 ms apart (past its short first transactions).
            val deadline = System.nanoTime() + 10_000_000_000L
            var inARow = 0
            while (inARow < 2) {
                check(System.nanoTime() < deadline) { "the writer never held the ledger" }
                inARow = if (executor.executor.startNow("op_1", 0u, emailCall()) == null) inARow + 1 else 0
                Thread.sleep(50)
            }
            onCallerThread {
                val ticks = AtomicInteger()
                val ticker = tick(ticks)
                val before = io.dispatches.get()
                val replay = async { executor.execute("op_1", 0, emailCall()) }
                // It went to the dispatcher and waits there, not here.
                val dispatchDeadline = System.nanoTime() + 10_000_000_000L
                while (io.dispatches.get() == before) {
                    check(System.nanoTime() < dispatchDeadline) { "the replay neither answered nor dispatched" }
                    delay(5)
                }
                val ticked = ticks.get()
                delay(200)
                assertTrue(replay.isActive, "the replay did not wait for the writer")
                assertTrue(writer.isAlive, "the writer stopped waiting")
                assertTrue(ticks.get() > ticked, "the caller's thread was held")
                holder.close()
                val answer = assertIs<CallOutcome.Completed>(replay.await())
                ticker.cancel()
                assertTrue(answer.replayed)
                assertEquals(first.executionId, answer.executionId)
                assertEquals(first.resultJson, answer.resultJson)
            }
        } finally {
            holder.close()
            writer.join(30_000)
        }
        assertFalse(writer.isAlive)
        writerError?.let { throw it }
        // The writer's new call ran once, after the lock was released.
        val written = assertIs<CallOutcome.Completed>(writerOutcome)
        assertFalse(written.replayed)
        assertEquals(2, tool.calls.get())
        assertEquals(2, downstream.count())
        // And the replay is answered in place again.
        val dispatched = io.dispatches.get()
        onCallerThread {
            assertTrue(assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall())).replayed)
        }
        assertEquals(dispatched, io.dispatches.get())
    },
)
