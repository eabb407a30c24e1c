// Java/Kotlin strings may hold unpaired UTF-16 surrogates (`text.take(n)`
// cutting an emoji in half gives one); Rust strings may not. The generated
// FfiConverterString throws java.nio.charset.MalformedInputException for
// them, and nothing in the bindings turns that into a LedgerException or
// an unknown outcome.
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.LedgerException
import dev.toolledger.PerformOutcome
import dev.toolledger.Provider
import dev.toolledger.ToolCall
import dev.toolledger.ToolRequest
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.SyncTool
import dev.toolledger.ktx.Tool
import dev.toolledger.ktx.executorConfig
import dev.toolledger.ktx.toolDescriptor
import java.util.concurrent.atomic.AtomicInteger
import java.util.concurrent.atomic.AtomicReference
import kotlin.test.assertEquals
import kotlin.test.assertTrue

/** Half of U+1F600: what `"ok 😀".take(4)` leaves at the end. */
private const val HALF_EMOJI = "\uD83D"

private class HalfEmojiSync : SyncTool(toolDescriptor("probe")) {
    val effects = AtomicInteger()
    override fun performNow(request: ToolRequest): PerformOutcome {
        effects.incrementAndGet()
        return PerformOutcome.Committed(resultJson = "{\"summary\":\"ok $HALF_EMOJI\"}", externalId = null)
    }
}

private class HalfEmojiSuspend(val throwIt: Boolean = false) : Tool(toolDescriptor("sprobe")) {
    val effects = AtomicInteger()
    override suspend fun perform(request: ToolRequest): PerformOutcome {
        effects.incrementAndGet()
        if (throwIt) throw java.io.IOException("server said: ok $HALF_EMOJI")
        return PerformOutcome.Committed(resultJson = "{\"summary\":\"ok $HALF_EMOJI\"}", externalId = null)
    }
}

private fun call(callId: String = "c1", tool: String = "probe", args: String = """{"x":1}""") =
    ToolCall(provider = Provider.CUSTOM, callId = callId, toolName = tool, arguments = args)

val loneSurrogateTests = listOf(
    // Observed: executeBlocking throws MalformedInputException (the report
    // could not be encoded, so it was never sent), and every later ask in
    // this process answers InFlight { retry_after_ms: None }: the attempt
    // stays "running" in the executor although nobody drives it.
    test("lone surrogate: a SyncTool result that cannot be encoded does not leave the call InFlight") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val tool = HalfEmojiSync()
        val executor = closeAfter(Executor(ledger, tools = listOf(tool)))
        val first = runCatching { executor.executeBlocking("op", 0, call()) }
        val second = runCatching { executor.execute("op", 0, call()) }
        assertEquals(1, tool.effects.get())
        assertTrue(second.getOrNull() !is CallOutcome.InFlight, "in flight for the life of the process: $second")
        val e = first.exceptionOrNull()
        assertTrue(e == null || e is LedgerException, "an untyped error: $e")
    },

    // Observed: MalformedInputException from every path (executeBlocking,
    // execute of a SyncTool, execute of a suspending Tool) for an operation
    // id, call id, arguments or (through execute) tool name with a lone
    // surrogate. Nothing is recorded, but the error is not a LedgerException.
    test("lone surrogate: ids and arguments give LedgerException.InvalidInput with nothing recorded") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val sync = HalfEmojiSync()
        val susp = HalfEmojiSuspend()
        val executor = closeAfter(Executor(ledger, tools = listOf(sync, susp)))
        val untyped = mutableListOf<String>()
        val cases = listOf(
            "op$HALF_EMOJI" to call(), "op" to call(callId = "c$HALF_EMOJI"),
            "op" to call(args = "{\"x\":\"$HALF_EMOJI\"}"), "op" to call(tool = "sprobe$HALF_EMOJI"),
        )
        for ((i, c) in cases.withIndex()) {
            val (op, base) = c
            val forms = mapOf<String, suspend () -> CallOutcome>(
                "executeBlocking" to { executor.executeBlocking(op, i, base) },
                "execute(SyncTool)" to { executor.execute(op, i, base) },
                "execute(Tool)" to { executor.execute(op, i, base.copy(toolName = base.toolName.replace("probe", "sprobe").replace("ssprobe", "sprobe"))) },
            )
            for ((name, form) in forms) {
                val e = runCatching { form() }.exceptionOrNull()
                if (e !is LedgerException) untyped += "case $i $name: $e"
            }
        }
        assertEquals(0, sync.effects.get() + susp.effects.get())
        assertTrue(ledger.list("op").isEmpty())
        assertTrue(untyped.isEmpty(), "untyped errors: $untyped")
    },

    // Observed: the generated callback lowers the returned PerformOutcome
    // (or the thrown exception's text) outside its try, so the
    // MalformedInputException escapes a GlobalScope coroutine to the
    // thread's uncaught-exception handler (an app crash on Android) and the
    // library hears nothing until performTimeoutMs (with
    // performTimeoutMs = null the call would wait forever).
    test("lone surrogate: a suspending Tool's result or error text is not an uncaught exception") {
        val problems = mutableListOf<String>()
        for (throwIt in listOf(false, true)) {
            val uncaught = AtomicReference<Throwable?>(null)
            val previous = Thread.getDefaultUncaughtExceptionHandler()
            Thread.setDefaultUncaughtExceptionHandler { _, e -> uncaught.set(e) }
            try {
                val ledger = closeAfter(SuspendLedger.open(dir.resolve("l$throwIt.db").toString()))
                val tool = HalfEmojiSuspend(throwIt)
                val executor = closeAfter(Executor(ledger, executorConfig(performTimeoutMs = 3_000), listOf(tool)))
                val t0 = System.nanoTime()
                runCatching { executor.execute("op", 0, call(tool = "sprobe")) }
                val ms = (System.nanoTime() - t0) / 1_000_000
                uncaught.get()?.let { problems += "throwIt=$throwIt: uncaught on a coroutine thread: $it" }
                if (ms >= 2_000) problems += "throwIt=$throwIt: the library waited for the perform timeout ($ms ms)"
            } finally {
                Thread.setDefaultUncaughtExceptionHandler(previous)
            }
        }
        assertTrue(problems.isEmpty(), problems.joinToString("; "))
    },
    // Bad input through every other method of the layer: a lone surrogate in
    // an id, a result or a reason, a negative attempt, huge strings. Each is
    // a LedgerException (nothing recorded, no effect), never another
    // exception type, a crash or a panic across the FFI.
    test("lone surrogate: every other Executor method gives a typed error for bad input") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val sync = HalfEmojiSync()
        val susp = HalfEmojiSuspend()
        val executor = closeAfter(Executor(ledger, tools = listOf(sync, susp)))
        val bad = "x$HALF_EMOJI"
        val id = "op:round_0:c1:sprobe:v1"
        val huge = "a".repeat(8 * 1024 * 1024)
        val forms = linkedMapOf<String, suspend () -> Any?>(
            "executeRound(op)" to { executor.executeRound(bad, 0, listOf(call(tool = "sprobe"))) },
            "executeRound(args)" to { executor.executeRound("op", 0, listOf(call(tool = "sprobe", args = "{\"x\":\"$bad\"}"))) },
            "executeRound(-1)" to { executor.executeRound("op", -1, listOf(call(tool = "sprobe"))) },
            "approve(id)" to { executor.approve(bad, "0".repeat(64)) },
            "approve(preview)" to { executor.approve(id, "0".repeat(64), "{\"p\":\"$bad\"}") },
            "runExisting" to { executor.runExisting(bad) },
            "resolveUnknown(id)" to { executor.resolveUnknown(bad, 1, dev.toolledger.Resolution.NotFoundRetry) },
            "resolveUnknown(-1)" to { executor.resolveUnknown(id, -1, dev.toolledger.Resolution.NotFoundRetry) },
            "resolveUnknown(Int.MAX)" to { executor.resolveUnknown(id, Int.MAX_VALUE, dev.toolledger.Resolution.NotFoundRetry) },
            "resolveUnknown(result)" to { executor.resolveUnknown(id, 1, dev.toolledger.Resolution.Found("{\"r\":\"$bad\"}", null)) },
            "resolveUnknown(reason)" to { executor.resolveUnknown(id, 1, dev.toolledger.Resolution.NotFoundAbandon(bad)) },
            "compensate" to { executor.compensate(bad, "op", 0, call(tool = "sprobe")) },
            "cancelOperation" to { executor.cancelOperation(bad) },
            "ingestWebhook" to { executor.ingestWebhook("src", bad, id, dev.toolledger.JobUpdate.Progress("s")) },
            "ingestWebhook(state)" to { executor.ingestWebhook("src", "e1", id, dev.toolledger.JobUpdate.Progress(bad)) },
            "recordJobUpdate" to { executor.recordJobUpdate(id, dev.toolledger.JobUpdate.Succeeded("{\"r\":\"$bad\"}")) },
            "executeBlocking(huge op)" to { executor.executeBlocking(huge, 0, call()) },
            "executeBlocking(huge args)" to { executor.executeBlocking("op", 0, call(args = "{\"x\":\"$huge\"}")) },
            "execute(huge call id)" to { executor.execute("op", 0, call(callId = huge, tool = "sprobe")) },
            "ledger.get" to { ledger.get(bad) },
            "ledger.list" to { ledger.list(bad) },
            "ledger.markDelivered" to { ledger.markDelivered(listOf(bad)) },
            "ledger.operations(-1)" to { ledger.operations(-1) },
        )
        val untyped = mutableListOf<String>()
        for ((name, form) in forms) {
            val e = runCatching { form() }.exceptionOrNull()
            if (e !is LedgerException) untyped += "$name: $e"
        }
        assertEquals(0, sync.effects.get() + susp.effects.get())
        assertTrue(ledger.list("op").isEmpty())
        assertTrue(untyped.isEmpty(), "untyped errors: $untyped")
    },
)
