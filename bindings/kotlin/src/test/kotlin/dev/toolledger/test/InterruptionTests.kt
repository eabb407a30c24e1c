// Calls cancelled, interrupted, or whose tool throws something unusual (an
// Error, an InterruptedException, a CancellationException, an exception the
// generated interface does not declare), for the three kinds of downstream:
// a key (the downstream dedupes by it: one effect per key), a lookup, and
// neither. Each test counts the effects at the downstream, reads what the
// ledger stored, and asks for the call again: a key call is resent under
// the same key exactly once, a lookup call is looked up, a neither call
// answers Unknown, and nothing is left InFlight for the life of the process.
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.ExecutionStatus
import dev.toolledger.LedgerException
import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.ToolRequest
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.SyncTool
import dev.toolledger.ktx.Tool
import dev.toolledger.ktx.executorConfig
import dev.toolledger.ktx.toolDescriptor
import java.nio.file.Files
import java.util.concurrent.CountDownLatch
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicInteger
import java.util.concurrent.atomic.AtomicReference
import kotlin.coroutines.cancellation.CancellationException
import kotlin.test.assertEquals
import kotlin.test.assertFailsWith
import kotlin.test.assertFalse
import kotlin.test.assertIs
import kotlin.test.assertSame
import kotlin.test.assertTrue
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.cancelAndJoin
import kotlinx.coroutines.delay
import kotlinx.coroutines.job
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout

/** What the downstream offers after an unknown outcome. */
private enum class Kind { KEY, LOOKUP, NEITHER }

/** Every effect's key, in order (one line each). */
private fun Downstream.keys(): List<String> = Files.readAllLines(path).filter { it.isNotEmpty() }

/**
 * Sends one request under [key]: a key downstream makes the effect once per
 * key (a resend gets the first one back), the others make one per request.
 */
private fun Downstream.send(kind: Kind, key: String): String =
    (if (kind == Kind.KEY) find(key) else null) ?: perform(key)

private fun descriptorOf(kind: Kind, name: String) =
    toolDescriptor(name, idempotencyKey = kind == Kind.KEY, lookup = kind == Kind.LOOKUP)

/**
 * A [SyncTool] that sends its request and then, on its first call only,
 * runs [afterFirstEffect] (which throws, sleeps, …). Later calls return
 * the result.
 */
private class Unusual(
    val downstream: Downstream,
    val kind: Kind,
    private val afterFirstEffect: () -> Unit,
) : SyncTool(descriptorOf(kind, "unusual")) {
    val calls = AtomicInteger()
    val lookups = AtomicInteger()
    val keys: MutableList<String> = java.util.Collections.synchronizedList(mutableListOf())

    override fun performNow(request: ToolRequest): PerformOutcome {
        val n = calls.incrementAndGet()
        keys += request.downstreamKey
        val id = downstream.send(kind, request.downstreamKey)
        if (n == 1) afterFirstEffect()
        return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
    }

    override fun lookupNow(request: ToolRequest): LookupOutcome {
        lookups.incrementAndGet()
        val id = downstream.find(request.downstreamKey) ?: return LookupOutcome.NotFound
        return LookupOutcome.Found(resultJson = sentJson(id), externalId = id)
    }
}

/** [Unusual] as a suspending [Tool] (the library calls it back). */
private class UnusualSuspend(
    val downstream: Downstream,
    val kind: Kind,
    private val afterFirstEffect: suspend () -> Unit,
) : Tool(descriptorOf(kind, "unusual")) {
    val calls = AtomicInteger()
    val lookups = AtomicInteger()

    override suspend fun perform(request: ToolRequest): PerformOutcome {
        val n = calls.incrementAndGet()
        val id = withContext(Dispatchers.IO) { downstream.send(kind, request.downstreamKey) }
        if (n == 1) afterFirstEffect()
        return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
    }

    override suspend fun lookup(request: ToolRequest): LookupOutcome {
        lookups.incrementAndGet()
        val id = withContext(Dispatchers.IO) { downstream.find(request.downstreamKey) } ?: return LookupOutcome.NotFound
        return LookupOutcome.Found(resultJson = sentJson(id), externalId = id)
    }
}

private fun unusualCall(callId: String = "call_1") = dev.toolledger.ToolCall(
    provider = dev.toolledger.Provider.CUSTOM,
    callId = callId,
    toolName = "unusual",
    arguments = """{"to":"a@example.com"}""",
)

private const val EXECUTION_ID = "op_1:round_0:call_1:unusual:v1"

/** Deep recursion: a real StackOverflowError. */
private fun recurse(n: Int): Int = if (n < 0) n else recurse(n + 1) + 1

/**
 * After a first call that ended without an answer, what a repeat must do:
 * a key call is resent under the same key (one effect), a lookup call is
 * looked up and found (no second perform), a neither call answers Unknown
 * (never resent). Checks the stored attempt first: exactly one, unknown.
 */
private suspend fun checkRepeat(ledger: SuspendLedger, executor: Executor, tool: Unusual, what: String) {
    val record = ledger.get(EXECUTION_ID)!!
    assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, record.status, "$what: stored status")
    assertEquals(1u, record.attemptCount, "$what: stored attempts")
    assertEquals(1, tool.calls.get(), "$what: performs before the repeat")
    val again = executor.executeBlocking("op_1", 0, unusualCall())
    when (tool.kind) {
        Kind.KEY -> {
            val done = assertIs<CallOutcome.Completed>(again, "$what: the repeat")
            assertFalse(done.replayed)
            assertEquals(2, tool.calls.get(), "$what: one resend")
            assertEquals(1, tool.keys.toSet().size, "$what: the same key")
        }
        Kind.LOOKUP -> {
            assertIs<CallOutcome.Completed>(again, "$what: the repeat")
            assertEquals(1, tool.calls.get(), "$what: no second perform")
            assertEquals(1, tool.lookups.get(), "$what: one lookup")
        }
        Kind.NEITHER -> {
            assertIs<CallOutcome.Unknown>(again, "$what: the repeat")
            assertEquals(1, tool.calls.get(), "$what: never resent")
        }
    }
    assertEquals(1, tool.downstream.count(), "$what: effects")
    // And once more: settled, or still the same unknown, never InFlight.
    val third = executor.executeBlocking("op_1", 0, unusualCall())
    assertFalse(third is CallOutcome.InFlight, "$what: the third ask: $third")
}

val interruptionTests = listOf(
    // Observed before the fix: the Error was reported as Unknown, which for a
    // key tool answered with a same-key resend, already `executing`, that
    // nobody ran: the record stayed EXECUTING at attempt 2 and every later
    // ask in this process answered InFlight.
    test("interrupted: a SyncTool that throws an Error after its effect leaves one unknown attempt (key, lookup, neither)") {
        val errors = listOf<Pair<String, () -> Unit>>(
            "OutOfMemoryError" to { throw OutOfMemoryError("simulated") },
            "StackOverflowError" to { recurse(0) },
        )
        for (kind in Kind.values()) {
            for ((name, thrower) in errors) {
                val sub = dir.resolve("${kind}_$name")
                Files.createDirectories(sub)
                val ledger = closeAfter(SuspendLedger.open(sub.resolve("l.db").toString()))
                val tool = Unusual(Downstream(sub.resolve("d.log")), kind, thrower)
                val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
                val thrown = runCatching { executor.executeBlocking("op_1", 0, unusualCall()) }.exceptionOrNull()
                assertTrue(thrown is Error && thrown.javaClass.simpleName == name, "$kind $name: the caller gets the Error: $thrown")
                checkRepeat(ledger, executor, tool, "$kind $name")
            }
        }
    },

    // The report of the interruption fails (the tool suspended the ledger):
    // the caller still gets the tool's Error, the report's failure attached.
    test("interrupted: a failing report does not replace the tool's Error") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val downstream = downstream()
        val tool = Unusual(downstream, Kind.KEY) {
            ledger.ledger.suspend()
            throw OutOfMemoryError("simulated")
        }
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val thrown = runCatching { executor.executeBlocking("op_1", 0, unusualCall()) }.exceptionOrNull()
        assertIs<OutOfMemoryError>(thrown, "the tool's Error, not the report's: $thrown")
        assertTrue(thrown.suppressed.any { it is LedgerException }, "the report's failure: ${thrown.suppressed.toList()}")
        ledger.resume()
        val again = executor.executeBlocking("op_1", 0, unusualCall())
        assertIs<CallOutcome.Completed>(again, "after resume: $again")
        assertEquals(1, downstream.count())
    },

    // Observed before the fix: the InterruptedException was taken as the
    // tool's error (Unknown), and the interrupted thread went on: for a key
    // tool it ran the tool again at once (a same-key resend), for the
    // others it answered, the interruption swallowed (the flag cleared).
    test("interrupted: executeBlocking whose thread is interrupted mid-tool runs nothing more and keeps the interruption") {
        for (kind in Kind.values()) {
            val sub = dir.resolve("$kind")
            Files.createDirectories(sub)
            val ledger = closeAfter(SuspendLedger.open(sub.resolve("l.db").toString()))
            val sent = CountDownLatch(1)
            val tool = Unusual(Downstream(sub.resolve("d.log")), kind) {
                sent.countDown()
                Thread.sleep(60_000)
            }
            val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
            val outcome = AtomicReference<Result<CallOutcome>>()
            val stillInterrupted = AtomicReference<Boolean>()
            val worker = Thread {
                outcome.set(runCatching { executor.executeBlocking("op_1", 0, unusualCall()) })
                stillInterrupted.set(Thread.currentThread().isInterrupted)
            }
            worker.start()
            assertTrue(sent.await(30, TimeUnit.SECONDS))
            worker.interrupt()
            worker.join(30_000)
            assertFalse(worker.isAlive, "$kind: the worker did not stop")
            val e = outcome.get().exceptionOrNull()
            assertTrue(
                e is InterruptedException || stillInterrupted.get(),
                "$kind: the interruption was swallowed: ${outcome.get()}, interrupted=${stillInterrupted.get()}",
            )
            assertEquals(1, tool.calls.get(), "$kind: the interrupted thread ran the tool again")
            checkRepeat(ledger, executor, tool, "$kind interrupted")
        }
    },

    // A CancellationException out of a blocking tool (a `withTimeout` inside
    // `runBlocking`) is the tool's own timeout, not the caller's: unknown, and
    // for a key tool the same key is resent at once, as execute does.
    test("interrupted: a SyncTool throwing CancellationException is an unknown outcome") {
        for (kind in Kind.values()) {
            val sub = dir.resolve("$kind")
            Files.createDirectories(sub)
            val ledger = closeAfter(SuspendLedger.open(sub.resolve("l.db").toString()))
            val tool = Unusual(Downstream(sub.resolve("d.log")), kind) { throw CancellationException("tool's own") }
            val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
            val out = executor.executeBlocking("op_1", 0, unusualCall())
            when (kind) {
                Kind.KEY -> {
                    assertIs<CallOutcome.Completed>(out)
                    assertEquals(2, tool.calls.get())
                }
                Kind.LOOKUP -> {
                    assertIs<CallOutcome.Completed>(out)
                    assertEquals(1, tool.calls.get())
                    assertEquals(1, tool.lookups.get())
                }
                Kind.NEITHER -> assertIs<CallOutcome.Unknown>(out)
            }
            assertEquals(1, tool.downstream.count(), "$kind: effects")
            assertFalse(executor.executeBlocking("op_1", 0, unusualCall()) is CallOutcome.InFlight)
        }
    },

    // The coroutine awaiting `execute` of a SyncTool is cancelled while the
    // tool runs: the tool finishes and is recorded; the repeat replays it.
    test("interrupted: a coroutine cancelled while its SyncTool runs loses only the answer") {
        for (kind in Kind.values()) {
            val sub = dir.resolve("$kind")
            Files.createDirectories(sub)
            val ledger = closeAfter(SuspendLedger.open(sub.resolve("l.db").toString()))
            val sent = CountDownLatch(1)
            val release = CountDownLatch(1)
            val tool = Unusual(Downstream(sub.resolve("d.log")), kind) {
                sent.countDown()
                release.await(30, TimeUnit.SECONDS)
            }
            val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
            val job = CoroutineScope(Dispatchers.Default).launch { executor.execute("op_1", 0, unusualCall()) }
            withContext(Dispatchers.IO) { assertTrue(sent.await(30, TimeUnit.SECONDS)) }
            job.cancel()
            val during = executor.execute("op_1", 0, unusualCall())
            assertIs<CallOutcome.InFlight>(during, "$kind: while the tool runs")
            release.countDown()
            job.join()
            var again: CallOutcome
            val deadline = System.nanoTime() + 10_000_000_000
            do {
                again = executor.execute("op_1", 0, unusualCall())
                if (again !is CallOutcome.InFlight) break
                delay(20)
            } while (System.nanoTime() < deadline)
            assertTrue(assertIs<CallOutcome.Completed>(again, "$kind").replayed)
            assertEquals(1, tool.calls.get())
            assertEquals(1, tool.downstream.count())
        }
    },

    // The coroutine awaiting `execute` of a suspending Tool is cancelled
    // while the tool runs (the library's task goes on): the same.
    test("interrupted: a coroutine cancelled while its suspending Tool runs loses only the answer") {
        for (kind in Kind.values()) {
            val sub = dir.resolve("$kind")
            Files.createDirectories(sub)
            val ledger = closeAfter(SuspendLedger.open(sub.resolve("l.db").toString()))
            val sent = CompletableDeferred<Unit>()
            val release = CompletableDeferred<Unit>()
            val tool = UnusualSuspend(Downstream(sub.resolve("d.log")), kind) {
                sent.complete(Unit)
                release.await()
            }
            val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
            val job = CoroutineScope(Dispatchers.Default).launch { executor.execute("op_1", 0, unusualCall()) }
            withTimeout(30_000) { sent.await() }
            job.cancelAndJoin()
            assertIs<CallOutcome.InFlight>(executor.execute("op_1", 0, unusualCall()), "$kind: while the tool runs")
            release.complete(Unit)
            var again: CallOutcome
            val deadline = System.nanoTime() + 10_000_000_000
            do {
                again = executor.execute("op_1", 0, unusualCall())
                if (again !is CallOutcome.InFlight) break
                delay(20)
            } while (System.nanoTime() < deadline)
            assertTrue(assertIs<CallOutcome.Completed>(again, "$kind").replayed)
            assertEquals(1, tool.calls.get())
            assertEquals(1, tool.downstream.count())
        }
    },

    // Observed before the fix: the generated callback catches Exception
    // only, so an Error ended its GlobalScope coroutine (the thread's
    // uncaught-exception handler: an app crash on Android) and the library
    // heard nothing until performTimeoutMs; with performTimeoutMs = null the
    // call waited forever.
    test("interrupted: a suspending Tool that throws an Error is an unknown outcome at once, not a hang") {
        for (kind in Kind.values()) {
            val sub = dir.resolve("$kind")
            Files.createDirectories(sub)
            val uncaught = AtomicReference<Throwable?>(null)
            val previous = Thread.getDefaultUncaughtExceptionHandler()
            Thread.setDefaultUncaughtExceptionHandler { _, e -> uncaught.set(e) }
            try {
                val ledger = closeAfter(SuspendLedger.open(sub.resolve("l.db").toString()))
                val tool = UnusualSuspend(Downstream(sub.resolve("d.log")), kind) { recurse(0) }
                val executor = closeAfter(Executor(ledger, executorConfig(performTimeoutMs = null), listOf(tool)))
                val first = runCatching { withTimeout(15_000) { executor.execute("op_1", 0, unusualCall()) } }
                assertTrue(first.exceptionOrNull() == null, "$kind: ${first.exceptionOrNull()}")
                assertEquals(null, uncaught.get(), "$kind: uncaught on a coroutine thread")
                when (kind) {
                    Kind.KEY -> assertIs<CallOutcome.Completed>(first.getOrNull(), "$kind: resent under the same key")
                    Kind.LOOKUP -> assertIs<CallOutcome.Completed>(first.getOrNull(), "$kind: found by the lookup")
                    Kind.NEITHER -> assertIs<CallOutcome.Unknown>(first.getOrNull(), "$kind")
                }
                assertEquals(if (kind == Kind.KEY) 2 else 1, tool.calls.get(), "$kind: performs")
                assertEquals(1, tool.downstream.count(), "$kind: effects")
            } finally {
                Thread.setDefaultUncaughtExceptionHandler(previous)
            }
        }
    },

    // An exception the generated interface does not declare (not a
    // ToolCallException), an InterruptedException and a CancellationException
    // thrown by a suspending tool the library calls back: each an unknown
    // outcome at once (on a library thread none of them is the caller's).
    test("interrupted: a suspending Tool's undeclared, interrupted or cancellation exception is an unknown outcome") {
        val throwers = listOf<Pair<String, suspend () -> Unit>>(
            "IllegalStateException" to { throw IllegalStateException("boom") },
            "InterruptedException" to { throw InterruptedException() },
            "CancellationException" to { throw CancellationException("tool's own") },
        )
        for (kind in Kind.values()) {
            for ((name, thrower) in throwers) {
                val sub = dir.resolve("${kind}_$name")
                Files.createDirectories(sub)
                val ledger = closeAfter(SuspendLedger.open(sub.resolve("l.db").toString()))
                val tool = UnusualSuspend(Downstream(sub.resolve("d.log")), kind, thrower)
                val executor = closeAfter(Executor(ledger, executorConfig(performTimeoutMs = null), listOf(tool)))
                val out = withTimeout(15_000) { executor.execute("op_1", 0, unusualCall()) }
                when (kind) {
                    Kind.KEY, Kind.LOOKUP -> assertIs<CallOutcome.Completed>(out, "$kind $name")
                    Kind.NEITHER -> assertIs<CallOutcome.Unknown>(out, "$kind $name")
                }
                assertEquals(1, tool.downstream.count(), "$kind $name: effects")
            }
        }
    },

    // A lookup that throws an Error: the caller gets it; the call stays
    // unknown and the next ask looks again (nothing resent, nothing InFlight).
    test("interrupted: a SyncTool lookup that throws an Error leaves the call to be looked up again") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val downstream = downstream()
        val throwLookup = java.util.concurrent.atomic.AtomicBoolean(true)
        val tool = object : SyncTool(descriptorOf(Kind.LOOKUP, "unusual")) {
            val calls = AtomicInteger()
            override fun performNow(request: ToolRequest): PerformOutcome {
                calls.incrementAndGet()
                downstream.perform(request.downstreamKey)
                return PerformOutcome.Unknown(reason = "timed out")
            }
            override fun lookupNow(request: ToolRequest): LookupOutcome {
                if (throwLookup.getAndSet(false)) throw OutOfMemoryError("simulated")
                val id = downstream.find(request.downstreamKey) ?: return LookupOutcome.NotFound
                return LookupOutcome.Found(resultJson = sentJson(id), externalId = id)
            }
        }
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        assertFailsWith<OutOfMemoryError> { executor.executeBlocking("op_1", 0, unusualCall()) }
        assertEquals(ExecutionStatus.OUTCOME_UNKNOWN, ledger.get(EXECUTION_ID)!!.status)
        val again = executor.executeBlocking("op_1", 0, unusualCall())
        assertIs<CallOutcome.Completed>(again, "the repeat: $again")
        assertEquals(1, tool.calls.get())
        assertEquals(1, downstream.count())
    },

    // A thread interrupted while it waits out a retry's backoff: nothing is
    // running (the failure was recorded), and the next ask runs the retry.
    test("interrupted: executeBlocking interrupted in a retry's backoff leaves a retryable failure") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val downstream = downstream()
        val inBackoff = CountDownLatch(1)
        val tool = object : SyncTool(descriptorOf(Kind.KEY, "unusual")) {
            val calls = AtomicInteger()
            override fun performNow(request: ToolRequest): PerformOutcome {
                if (calls.incrementAndGet() == 1) {
                    inBackoff.countDown()
                    return PerformOutcome.FailedBeforeCommit(reason = "503", retryable = true)
                }
                val id = downstream.send(Kind.KEY, request.downstreamKey)
                return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
            }
        }
        val executor = closeAfter(Executor(ledger, executorConfig(backoffBaseMs = 60_000, backoffMaxMs = 60_000), listOf(tool)))
        val outcome = AtomicReference<Result<CallOutcome>>()
        val worker = Thread { outcome.set(runCatching { executor.executeBlocking("op_1", 0, unusualCall()) }) }
        worker.start()
        assertTrue(inBackoff.await(30, TimeUnit.SECONDS))
        Thread.sleep(200)
        worker.interrupt()
        worker.join(30_000)
        assertFalse(worker.isAlive)
        assertIs<InterruptedException>(outcome.get().exceptionOrNull(), "${outcome.get()}")
        assertEquals(ExecutionStatus.FAILED_BEFORE_COMMIT, ledger.get(EXECUTION_ID)!!.status)
        val again = executor.executeBlocking("op_1", 0, unusualCall())
        assertIs<CallOutcome.Completed>(again, "the repeat: $again")
        assertEquals(2, tool.calls.get())
        assertEquals(1, downstream.count())
    },
    // An approval preview that throws an Error or an exception: no preview,
    // the call waits for approval as any other (a throw shows none).
    test("interrupted: an approval preview that throws an Error shows none and the call waits for approval") {
        for ((name, thrown) in listOf<Pair<String, () -> Throwable>>(
            "StackOverflowError" to { StackOverflowError() },
            "IllegalStateException" to { IllegalStateException("boom") },
        )) {
            val sub = dir.resolve(name)
            Files.createDirectories(sub)
            val uncaught = AtomicReference<Throwable?>(null)
            val previous = Thread.getDefaultUncaughtExceptionHandler()
            Thread.setDefaultUncaughtExceptionHandler { _, e -> uncaught.set(e) }
            try {
                val ledger = closeAfter(SuspendLedger.open(sub.resolve("l.db").toString()))
                val downstream = Downstream(sub.resolve("d.log"))
                val tool = object : Tool(toolDescriptor("unusual", requiresApproval = true)) {
                    override suspend fun perform(request: ToolRequest): PerformOutcome {
                        val id = downstream.perform(request.downstreamKey)
                        return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
                    }
                    override fun approvalPreview(argumentsJson: String): String? = throw thrown()
                }
                val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
                val out = runCatching { executor.execute("op_1", 0, unusualCall()) }
                val waiting = assertIs<CallOutcome.NeedsApproval>(out.getOrNull(), "$name: $out")
                assertEquals(null, waiting.previewJson, "$name: a preview")
                assertEquals(null, uncaught.get(), "$name: uncaught")
                val done = executor.approve(waiting.executionId, waiting.argsDigest)
                assertIs<CallOutcome.Completed>(done, "$name")
                assertEquals(1, downstream.count(), "$name: effects")
            } finally {
                Thread.setDefaultUncaughtExceptionHandler(previous)
            }
        }
    },
    // A thread already interrupted when executeBlocking hands out the
    // attempt runs no tool: the attempt is recorded as never sent (a first
    // attempt failed before commit, retryable) and the next ask runs it.
    test("interrupted: executeBlocking on an interrupted thread runs no tool and leaves the call to run") {
        for (kind in Kind.values()) {
            val sub = dir.resolve("$kind")
            Files.createDirectories(sub)
            val ledger = closeAfter(SuspendLedger.open(sub.resolve("l.db").toString()))
            val tool = Unusual(Downstream(sub.resolve("d.log")), kind) {}
            val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
            val outcome = AtomicReference<Result<CallOutcome>>()
            val worker = Thread {
                Thread.currentThread().interrupt()
                outcome.set(runCatching { executor.executeBlocking("op_1", 0, unusualCall()) })
            }
            worker.start()
            worker.join(30_000)
            assertIs<InterruptedException>(outcome.get().exceptionOrNull(), "$kind: ${outcome.get()}")
            assertEquals(0, tool.calls.get(), "$kind: the tool ran")
            assertEquals(ExecutionStatus.FAILED_BEFORE_COMMIT, ledger.get(EXECUTION_ID)!!.status, "$kind")
            val again = executor.executeBlocking("op_1", 0, unusualCall())
            assertIs<CallOutcome.Completed>(again, "$kind: the repeat")
            assertEquals(1, tool.calls.get(), "$kind")
            assertEquals(1, tool.downstream.count(), "$kind: effects")
        }
    },

    // A coroutine cancelled before it calls execute (a view model scope that
    // ended) starts no SyncTool call; one cancelled while the call begins
    // (on the dispatcher, before the tool runs) runs no tool either: the
    // attempt is recorded as never sent. The suspending Tool path runs
    // nothing for an already cancelled coroutine as well.
    test("interrupted: a coroutine cancelled before its SyncTool starts runs no tool") {
        for (kind in Kind.values()) {
            val sub = dir.resolve("$kind")
            Files.createDirectories(sub)
            val ledger = closeAfter(SuspendLedger.open(sub.resolve("l.db").toString()))
            val tool = Unusual(Downstream(sub.resolve("d.log")), kind) {}
            val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
            val job = CoroutineScope(Dispatchers.Default).launch {
                coroutineContext.job.cancel()
                executor.execute("op_1", 0, unusualCall())
            }
            job.join()
            assertEquals(0, tool.calls.get(), "$kind: the tool ran for a cancelled coroutine")
            assertEquals(null, ledger.get(EXECUTION_ID), "$kind: nothing begun")

            // Cancelled while the call is begun on the dispatcher.
            val callerJob = AtomicReference<kotlinx.coroutines.Job?>(null)
            val cancelling = object : kotlinx.coroutines.CoroutineDispatcher() {
                override fun dispatch(context: kotlin.coroutines.CoroutineContext, block: Runnable) {
                    callerJob.get()?.cancel()
                    Dispatchers.IO.dispatch(context, block)
                }
            }
            val executor2 = closeAfter(Executor(dev.toolledger.ToolExecutor(ledger.ledger, executorConfig()), cancelling))
            executor2.register(tool)
            val job2 = CoroutineScope(Dispatchers.Default).launch(start = kotlinx.coroutines.CoroutineStart.LAZY) {
                executor2.execute("op_1", 0, unusualCall("call_2"))
            }
            callerJob.set(job2)
            job2.start()
            job2.join()
            assertEquals(0, tool.calls.get(), "$kind: the tool ran for a coroutine cancelled while its call began")
            val id2 = EXECUTION_ID.replace("call_1", "call_2")
            assertEquals(ExecutionStatus.FAILED_BEFORE_COMMIT, ledger.get(id2)?.status, "$kind")
            assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, unusualCall("call_2")), "$kind: the repeat")
            assertEquals(1, tool.calls.get(), "$kind")
            assertEquals(1, tool.downstream.count(), "$kind: effects")

            // The suspending Tool path, already cancelled: nothing runs.
            val suspTool = UnusualSuspend(Downstream(sub.resolve("d2.log")), kind) {}
            val ledger3 = closeAfter(SuspendLedger.open(sub.resolve("l3.db").toString()))
            val executor3 = closeAfter(Executor(ledger3, tools = listOf(suspTool)))
            CoroutineScope(Dispatchers.Default).launch {
                coroutineContext.job.cancel()
                executor3.execute("op_1", 0, unusualCall())
            }.join()
            delay(200)
            assertEquals(0, suspTool.calls.get(), "$kind: the suspending tool ran for a cancelled coroutine")
            assertEquals(null, ledger3.get(EXECUTION_ID), "$kind: suspending: nothing begun")
        }
    },
    // The step API through SuspendLedger: a coroutine cancelled while its
    // `begin` writes the intent (here: by an observer of that very write)
    // never gets the ticket. Before the fix, the execution stayed EXECUTING,
    // owned by this live session, and every later `begin` answered InFlight
    // for the life of the process; now the attempt nobody was handed is
    // recorded failed before commit (retryable) and the next begin runs it.
    test("interrupted: a coroutine cancelled while SuspendLedger.begin writes its intent does not leave the call InFlight") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val callerJob = AtomicReference<kotlinx.coroutines.Job?>(null)
        ledger.ledger.setObserver(object : dev.toolledger.LedgerObserver {
            override fun onEvent(event: dev.toolledger.LedgerEvent) {
                callerJob.getAndSet(null)?.cancel()
            }
        })
        val spec = dev.toolledger.CallSpec(call = unusualCall(), toolVersion = 1u, idempotencyKey = true)
        val job = CoroutineScope(Dispatchers.Default).launch(start = kotlinx.coroutines.CoroutineStart.LAZY) {
            ledger.begin("op_1", 0, spec)
        }
        callerJob.set(job)
        job.start()
        job.join()
        assertTrue(job.isCancelled)
        val record = ledger.get(EXECUTION_ID)
        assertEquals(ExecutionStatus.FAILED_BEFORE_COMMIT, record?.status, "stored")
        val again = ledger.begin("op_1", 0, spec)
        assertFalse(again is dev.toolledger.Begin.InFlight, "the repeat: $again (stored: ${record?.status})")
        val ticket = assertIs<dev.toolledger.Begin.Execute>(again, "the repeat").ticket
        ledger.commit(ticket, """{"ok":1}""")
        assertEquals(ExecutionStatus.COMMITTED, ledger.get(EXECUTION_ID)!!.status)
    },
    // An observer that throws an Error or an exception on every move (it
    // runs inside the library's writes, on the caller's thread for a
    // SyncTool and on the library's for a suspending tool): ignored, every
    // call still commits once.
    test("interrupted: an observer that throws an Error changes no call") {
        for ((name, thrown) in listOf<Pair<String, () -> Throwable>>(
            "StackOverflowError" to { StackOverflowError() },
            "IllegalStateException" to { IllegalStateException("boom") },
        )) {
            val sub = dir.resolve(name)
            Files.createDirectories(sub)
            val uncaught = AtomicReference<Throwable?>(null)
            val previous = Thread.getDefaultUncaughtExceptionHandler()
            Thread.setDefaultUncaughtExceptionHandler { _, e -> uncaught.set(e) }
            val savedErr = System.err
            System.setErr(java.io.PrintStream(java.io.ByteArrayOutputStream()))
            try {
                val ledger = closeAfter(SuspendLedger.open(sub.resolve("l.db").toString()))
                val heard = AtomicInteger()
                ledger.ledger.setObserver(object : dev.toolledger.LedgerObserver {
                    override fun onEvent(event: dev.toolledger.LedgerEvent) {
                        heard.incrementAndGet()
                        throw thrown()
                    }
                })
                val sync = Unusual(Downstream(sub.resolve("d.log")), Kind.NEITHER) {}
                val susp = object : Tool(toolDescriptor("susp")) {
                    override suspend fun perform(request: ToolRequest) =
                        PerformOutcome.Committed(resultJson = "{}", externalId = null)
                }
                val executor = closeAfter(Executor(ledger, tools = listOf(sync, susp)))
                assertIs<CallOutcome.Completed>(executor.executeBlocking("op_1", 0, unusualCall()), name)
                assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, unusualCall().copy(callId = "c2", toolName = "susp")), name)
                assertTrue(heard.get() >= 4, "$name: heard ${heard.get()}")
                assertEquals(ExecutionStatus.COMMITTED, ledger.get(EXECUTION_ID)!!.status)
                assertEquals(1, sync.downstream.count())
            } finally {
                System.setErr(savedErr)
                Thread.setDefaultUncaughtExceptionHandler(previous)
            }
        }
    },
)
