// Privacy by construction, as a Kotlin app sees it: a canary planted in
// arguments, results, previews, external ids and tool exceptions appears in
// no toString(), no exception message, nothing on stdout/stderr and no log
// record; an encrypted ledger keeps it off the disk and refuses a wrong key;
// the files are the owner's only.
package dev.toolledger.test

import dev.toolledger.BatchMode
import dev.toolledger.CallOutcome
import dev.toolledger.CallSpec
import dev.toolledger.EffectClass
import dev.toolledger.ExecutionStatus
import dev.toolledger.ExecutorConfig
import dev.toolledger.Ledger
import dev.toolledger.LedgerConfig
import dev.toolledger.LedgerEvent
import dev.toolledger.LedgerException
import dev.toolledger.LedgerObserver
import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.Provider
import dev.toolledger.ReasonKind
import dev.toolledger.Resolution
import dev.toolledger.StorageKind
import dev.toolledger.ToolCall
import dev.toolledger.ToolCallException
import dev.toolledger.ToolDescriptor
import dev.toolledger.ToolHandler
import dev.toolledger.ToolRequest
import dev.toolledger.encryptLedger
import dev.toolledger.generateLedgerKey
import dev.toolledger.logging.JulLedgerObserver
import dev.toolledger.rotateLedgerKey
import java.io.ByteArrayOutputStream
import java.io.PrintStream
import java.nio.file.Files
import java.nio.file.Path
import java.nio.file.Paths
import java.nio.file.attribute.PosixFilePermissions
import java.util.Collections
import java.util.logging.Handler
import java.util.logging.Level
import java.util.logging.LogRecord
import java.util.logging.Logger
import kotlin.test.assertEquals
import kotlin.test.assertFailsWith
import kotlin.test.assertFalse
import kotlin.test.assertIs
import kotlin.test.assertTrue

const val CANARY = "CANARY-kt-4111-1111-1111"

/** Puts the canary in its result, external id, preview and exceptions. */
class CanaryTool(private val name: String, private val throws: Throwable? = null) : ToolHandler {
    override fun descriptor() = ToolDescriptor(
        name = name, version = 1u, effect = EffectClass.SIDE_EFFECT, batch = BatchMode.ATOMIC,
    )

    override suspend fun perform(request: ToolRequest): PerformOutcome {
        assertTrue(request.argumentsJson.contains(CANARY))
        throws?.let { throw it }
        return PerformOutcome.Committed(resultJson = """{"receipt":"$CANARY"}""", externalId = "ext-$CANARY")
    }

    override suspend fun lookup(request: ToolRequest): LookupOutcome = LookupOutcome.Unsupported

    override fun approvalPreview(argumentsJson: String): String? = """{"to":"$CANARY"}"""
}

fun canaryCall(callId: String, tool: String) = ToolCall(
    provider = Provider.CUSTOM,
    callId = callId,
    toolName = tool,
    arguments = """{"iban":"$CANARY","amount":"${'$'}50"}""",
)

/** Everything printed while `block` runs, on System.out and System.err. */
inline fun <T> capturingOutput(block: () -> T): Pair<T, String> {
    val (out, err) = System.out to System.err
    val buffer = ByteArrayOutputStream()
    val capture = PrintStream(buffer, true)
    System.setOut(capture)
    System.setErr(capture)
    try {
        return block() to buffer.toString()
    } finally {
        System.setOut(out)
        System.setErr(err)
    }
}

fun assertNoCanary(texts: List<String>) {
    for (text in texts) assertFalse(text.contains(CANARY), "the canary leaked: $text")
}

fun disk(path: String): ByteArray {
    val wal = Paths.get("$path-wal")
    return Files.readAllBytes(Paths.get(path)) + (if (Files.exists(wal)) Files.readAllBytes(wal) else ByteArray(0))
}

fun ByteArray.holds(text: String): Boolean = String(this, Charsets.ISO_8859_1).contains(text)

val privacyTests = listOf(
    test("no toString, exception message, output or log record shows the canary") {
        val records = Collections.synchronizedList(mutableListOf<LogRecord>())
        val logger = Logger.getLogger("toolledger.test.privacy").apply {
            level = Level.ALL
            useParentHandlers = false
            addHandler(object : Handler() {
                override fun publish(record: LogRecord) { records.add(record) }
                override fun flush() {}
                override fun close() {}
            })
        }
        val ledger = openLedger()
        ledger.setObserver(JulLedgerObserver(logger))
        val executor = executorWith(
            ledger,
            CanaryTool("pay"),
            CanaryTool("boom", IllegalStateException("socket closed $CANARY")),
            CanaryTool("declined", ToolCallException.Tool("declined for $CANARY")),
            config = ExecutorConfig(maxAttempts = 1u),
        )
        val (outcomes, printed) = capturingOutput {
            listOf(
                executor.execute("op", 0u, canaryCall("c1", "pay")),
                executor.execute("op", 0u, canaryCall("c2", "boom")),
                executor.execute("op", 0u, canaryCall("c3", "declined")),
            )
        }
        val (done, boom, declined) = outcomes
        assertIs<CallOutcome.Completed>(done)
        assertTrue(done.resultJson.contains(CANARY)) // reachable explicitly
        assertIs<CallOutcome.Unknown>(boom)
        assertIs<CallOutcome.Unknown>(declined)
        assertTrue(declined.reason.contains(CANARY)) // what the app's own tool said

        val spec = CallSpec(call = canaryCall("c4", "pay"), toolVersion = 1u, requiresApproval = true)
        val approval = ledger.begin("op2", 0u, spec)
        assertIs<dev.toolledger.Begin.NeedsApproval>(approval)
        ledger.approve(approval.request.executionId, approval.request.argsDigest, """{"shown":"$CANARY"}""")
        val ticket = ledger.markExecuting(approval.request.executionId)
        ledger.recordExternalId(ticket, "ext-$CANARY")
        val stored = ledger.commit(ticket, """{"r":"$CANARY"}""", "ext-$CANARY")
        val replay = ledger.begin("op2", 0u, spec)
        val executions = ledger.list("op") + ledger.list("op2")
        val transitions = executions.flatMap { ledger.transitions(it.executionId) }
        val error = assertFailsWith<LedgerException> { ledger.commit(ticket, """{"other":"$CANARY"}""", null) }

        val texts = mutableListOf(printed)
        texts += listOf<Any>(
            done, boom, declined, approval, approval.request, ticket, stored, replay, spec, spec.call,
            PerformOutcome.Committed(resultJson = CANARY, externalId = CANARY),
            LookupOutcome.Found(resultJson = CANARY, externalId = null),
            Resolution.Found(resultJson = CANARY, externalId = CANARY),
            ToolCallException.Tool(CANARY), error,
        ).flatMap { listOf(it.toString(), "$it", listOf(it).toString()) }
        texts += executions.map { it.toString() } + transitions.map { it.toString() }
        texts += listOfNotNull(error.message, error.localizedMessage)
        texts += records.map { it.message }
        assertNoCanary(texts)
        assertTrue(done.toString().contains("bytes>"), done.toString())

        // The log says why the calls ended unknown, never what the tool said.
        val unknown = records.filter { it.message.contains("->outcome_unknown") }
        assertEquals(2, unknown.size, records.joinToString { it.message })
        assertTrue(unknown.all { it.level == Level.WARNING && it.message.contains("reason_kind=tool_error") })
    },

    test("the observer hears every committed move; one that throws is ignored") {
        val ledger = openLedger()
        val events = Collections.synchronizedList(mutableListOf<LedgerEvent>())
        ledger.setObserver(object : LedgerObserver {
            override fun onEvent(event: LedgerEvent) { events.add(event) }
        })
        val spec = CallSpec(call = canaryCall("c1", "pay"), toolVersion = 1u)
        val ticket = (ledger.begin("op", 0u, spec) as dev.toolledger.Begin.Execute).ticket
        ledger.commit(ticket, "{}", null)
        assertEquals(
            listOf(null to ExecutionStatus.EXECUTING, ExecutionStatus.EXECUTING to ExecutionStatus.COMMITTED),
            events.map { it.fromStatus to it.toStatus },
        )
        val failing = ledger.begin("op", 0u, CallSpec(call = canaryCall("c2", "pay"), toolVersion = 1u))
        ledger.markOutcomeUnknown((failing as dev.toolledger.Begin.Execute).ticket, "timed out waiting for the downstream")
        assertEquals(ReasonKind.TIMEOUT, events.last().reasonKind)

        ledger.setObserver(object : LedgerObserver {
            override fun onEvent(event: LedgerEvent) { throw IllegalStateException("observer bug $CANARY") }
        })
        val (third, printed) = capturingOutput {
            val t = (ledger.begin("op", 0u, CallSpec(call = canaryCall("c3", "pay"), toolVersion = 1u))
                as dev.toolledger.Begin.Execute).ticket
            ledger.commit(t, "{}", null)
        }
        assertEquals("{}", third.resultJson) // the move stands
        assertNoCanary(listOf(printed))
        ledger.setObserver(null)
    },

    test("an encrypted ledger keeps the canary off the disk, refuses a wrong key and rotates") {
        val key = generateLedgerKey()
        assertEquals(32, key.size)
        val ledger = Ledger.open(ledgerPath, LedgerConfig(), key)
        assertTrue(ledger.isEncrypted())
        val spec = CallSpec(call = canaryCall("c1", "pay"), toolVersion = 1u)
        val ticket = (ledger.begin("op", 0u, spec) as dev.toolledger.Begin.Execute).ticket
        ledger.commit(ticket, """{"r":"$CANARY"}""", "ext-$CANARY")
        assertFalse(disk(ledgerPath).holds(CANARY))
        ledger.close()

        val wrong = assertFailsWith<LedgerException.Storage> { Ledger.open(ledgerPath, LedgerConfig(), generateLedgerKey()) }
        assertEquals(StorageKind.WRONG_KEY, wrong.kind)
        val missing = assertFailsWith<LedgerException.Storage> { Ledger.open(ledgerPath, LedgerConfig()) }
        assertEquals(StorageKind.KEY_REQUIRED, missing.kind)

        val newKey = generateLedgerKey()
        rotateLedgerKey(ledgerPath, LedgerConfig(), key, newKey)
        val old = assertFailsWith<LedgerException.Storage> { Ledger.open(ledgerPath, LedgerConfig(), key) }
        assertEquals(StorageKind.WRONG_KEY, old.kind)
        val again = closeAfter(Ledger.open(ledgerPath, LedgerConfig(), newKey))
        val replay = again.begin("op", 0u, spec)
        assertIs<dev.toolledger.Begin.Replay>(replay)
        assertTrue(replay.result.resultJson.contains(CANARY))
    },

    test("a plain ledger is encrypted in place") {
        val ledger = Ledger.open(ledgerPath, LedgerConfig())
        val spec = CallSpec(call = canaryCall("c1", "pay"), toolVersion = 1u)
        ledger.commit((ledger.begin("op", 0u, spec) as dev.toolledger.Begin.Execute).ticket, """{"r":"$CANARY"}""", null)
        val inUse = assertFailsWith<LedgerException.Storage> { encryptLedger(ledgerPath, LedgerConfig(), generateLedgerKey()) }
        assertEquals(StorageKind.IN_USE, inUse.kind)
        ledger.close()
        assertTrue(disk(ledgerPath).holds(CANARY))
        val key = generateLedgerKey()
        encryptLedger(ledgerPath, LedgerConfig(), key)
        assertFalse(disk(ledgerPath).holds(CANARY))
        val encrypted = closeAfter(Ledger.open(ledgerPath, LedgerConfig(), key))
        assertIs<dev.toolledger.Begin.Replay>(encrypted.begin("op", 0u, spec))
    },

    test("the ledger files are the owner's only") {
        val ledger = openLedger()
        val spec = CallSpec(call = canaryCall("c1", "pay"), toolVersion = 1u)
        ledger.commit((ledger.begin("op", 0u, spec) as dev.toolledger.Begin.Execute).ticket, "{}", null)
        fun mode(p: Path) = PosixFilePermissions.toString(Files.getPosixFilePermissions(p))
        for (suffix in listOf("", "-wal", "-shm")) {
            assertEquals("rw-------", mode(Paths.get(ledgerPath + suffix)), "ledger.db$suffix")
        }
        val sessions = Paths.get("$ledgerPath-sessions")
        assertEquals("rwx------", mode(sessions))
        Files.list(sessions).use { files -> files.forEach { assertEquals("rw-------", mode(it)) } }
    },
)
