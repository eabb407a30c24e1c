// The hand-written Kotlin layer (package dev.toolledger.ktx) and the jar it
// ships in: suspend ledger calls on Dispatchers.IO, Int/Long at the surface,
// immutable records, a read-only tool of one method, and libtoolledger.so
// loaded from inside the jar.
package dev.toolledger.test

import dev.toolledger.Begin
import dev.toolledger.CallOutcome
import dev.toolledger.CallSpec
import dev.toolledger.EffectClass
import dev.toolledger.ExecutionStatus
import dev.toolledger.Ledger
import dev.toolledger.LedgerConfig
import dev.toolledger.LedgerException
import dev.toolledger.PerformOutcome
import dev.toolledger.Provider
import dev.toolledger.ToolCall
import dev.toolledger.ToolRequest
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.Tool
import dev.toolledger.ktx.attemptNumber
import dev.toolledger.ktx.attempts
import dev.toolledger.ktx.executorConfig
import dev.toolledger.ktx.ledgerConfig
import dev.toolledger.ktx.retryAfterMillis
import dev.toolledger.ktx.roundNumber
import dev.toolledger.ktx.toolDescriptor
import java.lang.reflect.Modifier
import kotlin.test.assertEquals
import kotlin.test.assertFailsWith
import kotlin.test.assertIs
import kotlin.test.assertNull
import kotlin.test.assertTrue

private class OneMethodWeather : Tool(toolDescriptor("weather", EffectClass.READ_ONLY)) {
    override suspend fun perform(request: ToolRequest) =
        PerformOutcome.Committed(resultJson = """{"celsius":21}""", externalId = null)
}

/** Dispatches to [inner] and remembers the threads the blocks ran on. */
private class Recording(private val inner: kotlinx.coroutines.CoroutineDispatcher) :
    kotlinx.coroutines.CoroutineDispatcher() {
    val threads: MutableSet<Thread> = java.util.concurrent.ConcurrentHashMap.newKeySet()
    override fun dispatch(context: kotlin.coroutines.CoroutineContext, block: Runnable) =
        inner.dispatch(context, Runnable { threads.add(Thread.currentThread()); block.run() })
}

private fun call(id: String, tool: String, args: String = "{}") =
    ToolCall(provider = Provider.CUSTOM, callId = id, toolName = tool, arguments = args)

val layerTests = listOf(
    test("layer: the library is loaded from inside the jar, not from a library path") {
        // scripts/test-kotlin.sh runs the suite without -Djna.library.path.
        assertNull(System.getProperty("jna.library.path"))
        val resource = Ledger::class.java.classLoader.getResource("linux-x86-64/libtoolledger.so")
        assertTrue(resource != null && resource.toString().startsWith("jar:"), "resource: $resource")
        closeAfter(Ledger.open(ledgerPath, LedgerConfig())) // the native code runs
    },

    test("layer: suspend ledger calls run on Dispatchers.IO, not the caller's thread") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath, ledgerConfig(leaseMs = 1_000)))
        val io = Recording(kotlinx.coroutines.Dispatchers.IO)
        val probe = SuspendLedger(ledger.ledger, io)
        val spec = CallSpec(call = call("c1", "send_email", """{"to":"a"}"""), toolVersion = 1u)
        val begun = assertIs<Begin.Execute>(probe.begin("op_1", 0, spec))
        probe.commit(begun.ticket, """{"id":"m1"}""", "m1")
        val record = probe.get(begun.ticket.executionId)!!
        assertEquals(ExecutionStatus.COMMITTED, record.status)
        assertEquals(0, record.roundNumber)
        assertEquals(1, record.attempts)
        assertEquals(1, begun.ticket.attemptNumber)
        assertEquals(1, probe.recover().size) // committed, not delivered yet
        probe.markDelivered(listOf(begun.ticket.executionId))
        assertEquals(emptyList(), probe.recover())
        val caller = Thread.currentThread()
        assertTrue(io.threads.isNotEmpty() && caller !in io.threads, "ran on ${io.threads} (caller $caller)")
    },

    test("layer: negative rounds and durations are refused as InvalidInput before any call") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val spec = CallSpec(call = call("c1", "send_email"), toolVersion = 1u)
        assertFailsWith<LedgerException.InvalidInput> { ledger.begin("op_1", -1, spec) }
        assertFailsWith<LedgerException.InvalidInput> { ledgerConfig(leaseMs = -5) }
        assertFailsWith<LedgerException.InvalidInput> { executorConfig(maxAttempts = -1) }
        assertEquals(emptyList(), ledger.list("op_1"))
    },

    test("layer: a read-only Tool is one method; the executor takes Int rounds") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val executor = closeAfter(Executor(ledger, executorConfig(), listOf(OneMethodWeather())))
        val out = assertIs<CallOutcome.Completed>(executor.execute("op_1", 3, call("w1", "weather")))
        assertEquals("""{"celsius":21}""", out.resultJson)
        assertNull(ledger.get(out.executionId)) // read-only: nothing recorded
    },

    test("layer: Unknown outcomes give Int attempts and Long waits") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val failing = object : Tool(toolDescriptor("send_email", lookup = true)) {
            override suspend fun perform(request: ToolRequest): PerformOutcome =
                PerformOutcome.Unknown(reason = "timeout")
            override suspend fun lookup(request: ToolRequest) = dev.toolledger.LookupOutcome.NotFound
        }
        val executor = closeAfter(Executor(ledger, executorConfig(backoffBaseMs = 1), listOf(failing)))
        val out = assertIs<CallOutcome.Unknown>(executor.execute("op_1", 0, call("c1", "send_email")))
        assertEquals(1, out.attemptNumber)
        val wait = out.retryAfterMillis
        assertTrue(wait != null && wait in 1L..120_000L, "retryAfterMillis = $wait")
    },

    test("layer: records are immutable (no setters; copy makes a changed one)") {
        for (cls in listOf(LedgerConfig::class.java, dev.toolledger.ExecutorConfig::class.java,
                           dev.toolledger.Execution::class.java, dev.toolledger.ToolDescriptor::class.java)) {
            val setters = cls.declaredMethods.filter { it.name.startsWith("set") && Modifier.isPublic(it.modifiers) }
            assertEquals(emptyList(), setters.map { it.name }, "${cls.simpleName} has setters")
        }
        val config = ledgerConfig()
        assertEquals(60_000uL, config.leaseMs)
        assertEquals(1_000uL, config.copy(leaseMs = 1_000uL).leaseMs)
        assertEquals(250uL, config.idleCheckpointMs)
        assertEquals(LedgerConfig().idleCheckpointMs, config.idleCheckpointMs)
        assertEquals(0uL, ledgerConfig(idleCheckpointMs = 0).idleCheckpointMs)
        assertFailsWith<LedgerException.InvalidInput> { ledgerConfig(idleCheckpointMs = -1) }
    },

    test("layer: sync() makes a deferred commit durable; hasUnsyncedCommits says when one waits") {
        // A lookup tool's commit is deferred; an hour's deadline: only sync() flushes it.
        val ledger = closeAfter(SuspendLedger.open(ledgerPath, ledgerConfig(deferredDeadlineMs = 3_600_000)))
        val keyed = CallSpec(call = call("k1", "send_email"), toolVersion = 1u, lookup = true)
        val begun = assertIs<Begin.Execute>(ledger.begin("op_1", 0, keyed))
        assertEquals(false, ledger.hasUnsyncedCommits()) // the intent is durable when begin returns
        ledger.commit(begun.ticket, """{"id":"m1"}""", "m1")
        assertEquals(true, ledger.hasUnsyncedCommits())
        ledger.sync()
        assertEquals(false, ledger.hasUnsyncedCommits())
        assertEquals(ExecutionStatus.COMMITTED, ledger.get(begun.ticket.executionId)!!.status)
        // A tool with neither key nor lookup: its commit is durable when it returns.
        val plain = assertIs<Begin.Execute>(
            ledger.begin("op_1", 0, CallSpec(call = call("p1", "send_email"), toolVersion = 1u)))
        ledger.commit(plain.ticket, """{"id":"m2"}""", "m2")
        assertEquals(false, ledger.hasUnsyncedCommits())
        assertFailsWith<LedgerException.InvalidInput> { ledgerConfig(deferredDeadlineMs = -1) }
        ledger.suspend()
        assertFailsWith<LedgerException.Suspended> { ledger.sync() }
    },
)
