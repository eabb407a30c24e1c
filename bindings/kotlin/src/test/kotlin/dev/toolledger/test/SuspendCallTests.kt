// A SyncTool called through the suspending Executor.execute, as an Android
// app calls it from a coroutine on the main thread: every step of the call
// runs on the executor's dispatcher, never on the caller's thread — a
// replay's too, since its read can wait for the ledger's one connection
// while another call holds it across an fsync. A replay is exactly the
// stored result with no new effect; a ledger that is suspended, or whose
// write lock another connection holds, gives its exact typed error while
// the caller's thread stays free. Effects are counted at the downstream.
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
    test("suspending execute: a replay is exactly the stored result and makes no new effect") {
        val downstream = downstream()
        val io = CountingIo()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath, dispatcher = io))
        val tool = SyncSend(downstream, idempotencyKey = true)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val first = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        assertFalse(first.replayed)
        val stored = ledger.get(first.executionId)!!
        onCallerThread {
            val caller = Thread.currentThread()
            repeat(3) {
                val before = io.dispatches.get()
                val again = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
                assertTrue(again.replayed)
                assertEquals(first.executionId, again.executionId)
                assertEquals(stored.resultJson, again.resultJson)
                assertEquals(stored.externalId, again.externalId)
                assertFalse(again.partial)
                // Answered through the executor's dispatcher, not on the caller's thread.
                assertTrue(io.dispatches.get() > before, "the replay did not go through the dispatcher")
                assertFalse(caller in io.threads)
            }
        }
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
        assertEquals(1u, ledger.get(first.executionId)!!.attemptCount)
    },

    test("suspending execute: a suspended ledger gives Suspended, off the caller's thread, and nothing runs") {
        val downstream = downstream()
        val io = CountingIo()
        val ledger = closeAfter(SuspendLedger.open(ledgerPath, dispatcher = io))
        val tool = SyncSend(downstream, idempotencyKey = true)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val first = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        ledger.suspend()
        onCallerThread {
            val caller = Thread.currentThread()
            val before = io.dispatches.get()
            // A replay and a new call alike.
            assertFailsWith<LedgerException.Suspended> { executor.execute("op_1", 0, emailCall()) }
            assertFailsWith<LedgerException.Suspended> { executor.execute("op_1", 0, emailCall("call_2")) }
            assertTrue(io.dispatches.get() >= before + 2)
            assertFalse(caller in io.threads)
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
        val ledger = closeAfter(SuspendLedger.open(ledgerPath, ledgerConfig(busyTimeoutMs = 1_500)))
        val tool = SyncSend(downstream, idempotencyKey = true)
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val first = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
        WriteLockHolder(ledgerPath).use {
            onCallerThread {
                // The caller's thread runs other work while the call waits.
                val ticks = AtomicInteger()
                val ticker = launch {
                    while (true) {
                        delay(10)
                        ticks.incrementAndGet()
                    }
                }
                // A replay needs no write lock: answered from a read.
                val replay = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, emailCall()))
                assertTrue(replay.replayed)
                assertEquals(first.resultJson, replay.resultJson)
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
)
