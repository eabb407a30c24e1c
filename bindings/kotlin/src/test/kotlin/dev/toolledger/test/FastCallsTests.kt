// The faster native calls: the per-thread call status that
// bindings/kotlin/tools/fast_calls.py patches into the generated code, and
// the ktx layer's one-call caller-driven steps (DirectSteps over the
// library's toolledger_direct_step). Both must carry every value and every
// typed error exactly as the generated code does: each test compares the
// two paths, or checks values that a byte slip would change (empty and
// non-ASCII strings, payloads larger than the per-thread buffers, nulls,
// nested records, errors with their payloads, many threads at once).
// (The tests reach the ktx layer's internals: compiled with -Xfriend-paths.)
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.CallerAttempt
import dev.toolledger.CallerStep
import dev.toolledger.ExecutorConfig
import dev.toolledger.Ledger
import dev.toolledger.LedgerConfig
import dev.toolledger.LedgerException
import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.Provider
import dev.toolledger.ToolCall
import dev.toolledger.ToolDescriptor
import dev.toolledger.ToolExecutor
import dev.toolledger.ToolHandler
import dev.toolledger.ToolRequest
import dev.toolledger.ktx.DirectSteps
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.SyncTool
import dev.toolledger.ktx.toolDescriptor
import java.util.concurrent.CountDownLatch
import java.util.concurrent.Executors
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicInteger
import kotlin.test.assertEquals
import kotlin.test.assertFailsWith
import kotlin.test.assertIs
import kotlin.test.assertNull
import kotlin.test.assertTrue

/** Text with 1-, 2-, 3- and 4-byte UTF-8 characters and JSON escapes. */
private const val TRICKY = "a é ✓ 日本 𝄞 \\\" \\n \\u0000 \\ud83d\\ude00"

/** A JSON object of about `bytes` bytes of `unit` (an argument or a result). */
private fun bigJson(unit: String, bytes: Int): String {
    val sb = StringBuilder("{\"nested\":{\"list\":[1,2.5,null,true,{\"k\":\"$TRICKY\"}]},\"fill\":\"")
    val perUnit = unit.toByteArray().size
    repeat(bytes / perUnit) { sb.append(unit) }
    return sb.append("\"}").toString()
}

/** Answers what it is told to, and remembers the request it got. */
private class Echo(name: String = "echo") : SyncTool(toolDescriptor(name, idempotencyKey = true, lookup = true)) {
    @Volatile var answer: PerformOutcome? = null
    @Volatile var lastRequest: ToolRequest? = null
    val calls = AtomicInteger()

    override fun performNow(request: ToolRequest): PerformOutcome {
        calls.incrementAndGet()
        lastRequest = request
        return answer ?: PerformOutcome.Committed(resultJson = request.argumentsJson, externalId = null)
    }
}

private fun echoCall(callId: String, arguments: String, tool: String = "echo") =
    ToolCall(provider = Provider.CUSTOM, callId = callId, toolName = tool, arguments = arguments)

/** Two executors over two ledgers of one test: the generated path and the direct one side by side. */
private class Pair2(ctx: TestContext) {
    val ledgerA = ctx.closeAfter(Ledger.open(ctx.dir.resolve("a.db").toString(), LedgerConfig()))
    val ledgerB = ctx.closeAfter(Ledger.open(ctx.dir.resolve("b.db").toString(), LedgerConfig()))
    val generated = ctx.closeAfter(ToolExecutor(ledgerA, ExecutorConfig())).also { it.register(Echo()) }
    val direct = ctx.closeAfter(ToolExecutor(ledgerB, ExecutorConfig())).also { it.register(Echo()) }
}

/** The same exception: class, message and every field (data-class-like comparison by toString of fields). */
private fun assertSameError(expected: Throwable, actual: Throwable) {
    assertEquals(expected.javaClass, actual.javaClass)
    assertEquals(expected.message, actual.message)
    val fields = expected.javaClass.declaredFields.filter { !java.lang.reflect.Modifier.isStatic(it.modifiers) }
    for (f in fields) {
        f.isAccessible = true
        assertEquals(f.get(expected), f.get(actual), "field ${f.name}")
    }
}

private inline fun caught(block: () -> Unit): Throwable =
    try {
        block()
        throw AssertionError("no exception")
    } catch (e: LedgerException) {
        e
    }

/** `request` with the field that differs between two ledgers (the key embeds the session) blanked. */
private fun ToolRequest.comparable() = copy(downstreamKey = "", attempt = attempt)

private fun CallerStep.comparable(): CallerStep = when (this) {
    is CallerStep.Perform -> CallerStep.Perform(attempt.copy(request = attempt.request.comparable()))
    is CallerStep.Lookup -> CallerStep.Lookup(attempt.copy(request = attempt.request.comparable()))
    is CallerStep.Retry -> CallerStep.Retry(attempt.copy(request = attempt.request.comparable()), afterMs)
    // The time left before a retry is measured from the clock of each ledger's call.
    is CallerStep.Done -> (outcome as? CallOutcome.Unknown)?.let { CallerStep.Done(it.copy(retryAfterMs = null)) } ?: this
}

val fastCallsTests = listOf(
    test("fast calls: a direct step answers exactly what the generated method answers") {
        val p = Pair2(this)
        val cases = listOf(
            "{}",
            """{"s":""}""",
            """{"s":"$TRICKY"}""",
            bigJson("x", 70 * 1024), // > 64 KiB: larger than the thread's first buffer
            bigJson("é✓𝄞", 300 * 1024), // non-ASCII, grows the buffer several times
        )
        for ((i, args) in cases.withIndex()) {
            val call = echoCall("call_$i", args)
            val a = p.generated.start("op_ü", 3u, call)
            val b = DirectSteps.start(p.direct, "op_ü", 3u, call)
            assertEquals(a.comparable(), b.comparable(), "start of case $i")
            val attemptA = assertIs<CallerStep.Perform>(a).attempt
            val attemptB = assertIs<CallerStep.Perform>(b).attempt
            // A result with nulls (no external id) and one with every field set.
            val outcome = if (i % 2 == 0) {
                PerformOutcome.Committed(resultJson = args, externalId = null)
            } else {
                PerformOutcome.Committed(resultJson = args, externalId = "ext_$i ✓ 𝄞")
            }
            val doneA = assertIs<CallerStep.Done>(p.generated.report(attemptA, outcome))
            val doneB = assertIs<CallerStep.Done>(DirectSteps.report(p.direct, attemptB, outcome))
            assertEquals(doneA, doneB, "report of case $i")
            val completed = assertIs<CallOutcome.Completed>(doneB.outcome)
            assertEquals(args, completed.resultJson)
            assertEquals(outcome.externalId, completed.externalId)
            // The replay: answered at once, the same on both paths.
            assertEquals(p.generated.start("op_ü", 3u, call), DirectSteps.start(p.direct, "op_ü", 3u, call))
        }
    },

    test("fast calls: typed errors with their payloads cross the direct steps as the generated ones") {
        val p = Pair2(this)
        val good = echoCall("call_1", "{}")
        // A refused operation id (the id converter's own error), bad JSON, an unknown tool.
        for ((op, call) in listOf(
            "" to good,
            "op_1" to echoCall("call_1", "{not json"),
            "op_1" to echoCall("call_1", "{}", tool = "nobody"),
            "op_1" to echoCall("", "{}"),
        )) {
            val a = caught { p.generated.start(op, 0u, call) }
            val b = caught { DirectSteps.start(p.direct, op, 0u, call) }
            assertSameError(a, b)
        }
        // An attempt the ledger never handed out: NotFound with its execution id.
        val attemptA = assertIs<CallerStep.Perform>(p.generated.start("op_1", 0u, good)).attempt
        val attemptB = assertIs<CallerStep.Perform>(DirectSteps.start(p.direct, "op_1", 0u, good)).attempt
        val ghostId = attemptA.request.executionId.replace("call_1", "call_ghost")
        val ghostA = attemptA.copy(request = attemptA.request.copy(executionId = ghostId))
        val ghostB = attemptB.copy(request = attemptB.request.copy(executionId = ghostId))
        val notFound = caught { DirectSteps.report(p.direct, ghostB, PerformOutcome.Unknown("x")) }
        assertIs<LedgerException.NotFound>(notFound)
        assertEquals(ghostId, notFound.executionId)
        assertSameError(caught { p.generated.report(ghostA, PerformOutcome.Unknown("x")) }, notFound)
        // The same through the other steps.
        for (step in listOf<(ToolExecutor, CallerAttempt) -> CallerStep>(
            { e, a -> if (e === p.direct) DirectSteps.reportLookup(e, a, LookupOutcome.NotFound) else e.reportLookup(a, LookupOutcome.NotFound) },
            { e, a -> if (e === p.direct) DirectSteps.reportLookupError(e, a, "é ✓") else e.reportLookupError(a, "é ✓") },
            { e, a -> if (e === p.direct) DirectSteps.retry(e, a) else e.retry(a) },
        )) {
            assertSameError(caught { step(p.generated, ghostA) }, caught { step(p.direct, ghostB) })
        }
        // A suspended ledger: Suspended, on both paths.
        p.ledgerA.suspend()
        p.ledgerB.suspend()
        assertSameError(
            caught { p.generated.start("op_2", 0u, good) },
            caught { DirectSteps.start(p.direct, "op_2", 0u, good) },
        )
    },

    test("fast calls: a lookup, a stale report and a retry walk the same steps on both paths") {
        val p = Pair2(this)
        val call = echoCall("call_1", """{"v":"$TRICKY"}""")
        val a1 = assertIs<CallerStep.Perform>(p.generated.start("op_1", 0u, call)).attempt
        val b1 = assertIs<CallerStep.Perform>(DirectSteps.start(p.direct, "op_1", 0u, call)).attempt
        // An unknown outcome of a lookup tool: both paths hand out a Lookup.
        val la = p.generated.report(a1, PerformOutcome.Unknown("timed out ✓"))
        val lb = DirectSteps.report(p.direct, b1, PerformOutcome.Unknown("timed out ✓"))
        assertEquals(la.comparable(), lb.comparable())
        val lookupB = assertIs<CallerStep.Lookup>(lb).attempt
        val lookupA = assertIs<CallerStep.Lookup>(la).attempt
        // Nothing found: resent under the same key.
        val ra = p.generated.reportLookup(lookupA, LookupOutcome.NotFound)
        val rb = DirectSteps.reportLookup(p.direct, lookupB, LookupOutcome.NotFound)
        assertEquals(ra.comparable(), rb.comparable())
        val a2 = assertIs<CallerStep.Perform>(ra).attempt
        val b2 = assertIs<CallerStep.Perform>(rb).attempt
        assertEquals(2u, b2.request.attempt)
        // A retryable failure with attempts left: Retry, then retry() hands out attempt 3.
        val fail = PerformOutcome.FailedBeforeCommit(reason = "503 é ✓", retryable = true)
        val fa = p.generated.report(a2, fail)
        val fb = DirectSteps.report(p.direct, b2, fail)
        assertEquals(fa.comparable(), fb.comparable())
        if (fb is CallerStep.Retry) {
            val ta = p.generated.retry(assertIs<CallerStep.Retry>(fa).attempt)
            val tb = DirectSteps.retry(p.direct, fb.attempt)
            assertEquals(ta.comparable(), tb.comparable())
        }
        // Attempt 1's answer arriving now is stale: refused on both paths, the same way.
        val sa = p.generated.report(a1, PerformOutcome.Committed(resultJson = "{}", externalId = null))
        val sb = DirectSteps.report(p.direct, b1, PerformOutcome.Committed(resultJson = "{}", externalId = null))
        assertEquals(sa.comparable(), sb.comparable())
    },

    test("fast calls: a SyncTool's request and answer round-trip exactly, beyond the buffer a thread keeps") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = Echo()
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        // ~700 KB of 2-byte characters: the request (its upper bound: 3 bytes
        // a character) and the answer are both over the 256 KiB a thread
        // keeps, so each gets a buffer of its own (the answer after
        // NEEDS_SPACE, through toolledger_direct_take).
        val args = bigJson("é", 700 * 1024)
        val done = assertIs<CallOutcome.Completed>(executor.executeBlocking("op_1", 0, echoCall("call_big", args)))
        assertEquals(args, done.resultJson)
        assertEquals(args, tool.lastRequest!!.argumentsJson)
        assertNull(done.externalId)
        val again = assertIs<CallOutcome.Completed>(executor.execute("op_1", 0, echoCall("call_big", args)))
        assertTrue(again.replayed)
        assertEquals(args, again.resultJson)
        assertEquals(1, tool.calls.get())
    },

    test("fast calls: many threads at once each get their own answers and errors") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = Echo()
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val threads = 8
        val perThread = 40
        val pool = Executors.newFixedThreadPool(threads)
        val start = CountDownLatch(1)
        val failures = java.util.concurrent.ConcurrentLinkedQueue<String>()
        try {
            val futures = (0 until threads).map { t ->
                pool.submit {
                    start.await()
                    for (i in 0 until perThread) {
                        val args = """{"t":$t,"i":$i,"s":"${"✓".repeat(t * 700)}"}"""
                        val out = executor.executeBlocking("op_$t", i, echoCall("call_${t}_$i", args))
                        if ((out as? CallOutcome.Completed)?.resultJson != args) failures.add("t$t i$i: $out")
                        // A failing generated call on every other step: its own typed error, nobody else's.
                        if (i % 2 == 0) {
                            try {
                                ledger.ledger.begin("op_$t", 0u, dev.toolledger.CallSpec(echoCall("x_$i", "{bad $t"), 1u, false))
                                failures.add("t$t i$i: bad JSON accepted")
                            } catch (e: LedgerException.InvalidInput) {
                                // expected
                            }
                        }
                        if (ledger.ledger.get("op_$t:none") != null) failures.add("t$t: found a ghost")
                    }
                }
            }
            start.countDown()
            futures.forEach { it.get(90, TimeUnit.SECONDS) }
        } finally {
            pool.shutdownNow()
        }
        assertTrue(failures.isEmpty(), failures.take(5).joinToString("; "))
        assertEquals(threads * perThread, tool.calls.get())
    },

    test("fast calls: a failing call made from a callback does not leak its status into the outer call") {
        val ledger = openLedger()
        val executor = closeAfter(ToolExecutor(ledger, ExecutorConfig()))
        val inner = AtomicInteger()
        // `register` calls descriptor() back on this thread; in it, a call fails.
        val tool = object : ToolHandler {
            override fun descriptor(): ToolDescriptor {
                val e = assertFailsWith<LedgerException.InvalidInput> {
                    ledger.begin("", 0u, dev.toolledger.CallSpec(echoCall("c", "{}"), 1u, false))
                }
                assertTrue(e.detail.isNotEmpty())
                inner.incrementAndGet()
                return toolDescriptor("nested")
            }

            override suspend fun perform(request: ToolRequest) = PerformOutcome.Committed(resultJson = "{}", externalId = null)

            override suspend fun lookup(request: ToolRequest): LookupOutcome = LookupOutcome.Unsupported

            override fun approvalPreview(argumentsJson: String): String? = null
        }
        executor.register(tool) // must not throw the inner call's error
        assertTrue(inner.get() >= 1, "descriptor() was not called back during register")
        val done = DirectSteps.start(executor, "op_1", 0u, echoCall("c1", "{}", tool = "nested"))
        assertIs<CallerStep.Perform>(done)
    },
)
