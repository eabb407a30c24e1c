// Tools written the way an Android app writes them (a class implementing the
// generated `ToolHandler`, suspend `perform`/`lookup`), and a fake downstream
// service that lives outside the ledger so tests can count real effects.
package dev.toolledger.test

import dev.toolledger.BatchMode
import dev.toolledger.EffectClass
import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.Provider
import dev.toolledger.ToolCall
import dev.toolledger.ToolDescriptor
import dev.toolledger.ToolHandler
import dev.toolledger.ToolRequest
import java.nio.ByteBuffer
import java.nio.channels.FileChannel
import java.nio.file.Files
import java.nio.file.Path
import java.nio.file.StandardOpenOption.APPEND
import java.nio.file.StandardOpenOption.CREATE
import java.nio.file.StandardOpenOption.WRITE
import java.util.concurrent.atomic.AtomicInteger
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.withContext
import kotlinx.coroutines.yield

/**
 * A remote service that records effects and does no deduplication of its
 * own: one line per effect (its downstream key) in a file. Safe across
 * threads and across processes (a JVM monitor plus an OS file lock), so the
 * crash test's child and parent can share it.
 */
class Downstream(val path: Path) {
    init {
        FileChannel.open(path, CREATE, WRITE).close()
    }

    /** Performs one effect; returns its id (`msg_<n>`). Durable on return. */
    fun perform(key: String): String = locked { ch ->
        val n = keys().size + 1
        ch.write(ByteBuffer.wrap("$key\n".toByteArray()))
        ch.force(true)
        "msg_$n"
    }

    /** The id of the first effect made under `key`, as a real service's search would. */
    fun find(key: String): String? = locked {
        val index = keys().indexOf(key)
        if (index < 0) null else "msg_${index + 1}"
    }

    /** How many effects happened. */
    fun count(): Int = locked { keys().size }

    private fun keys(): List<String> = Files.readAllLines(path).filter { it.isNotEmpty() }

    private fun <T> locked(block: (FileChannel) -> T): T = synchronized(Downstream::class.java) {
        FileChannel.open(path, WRITE, APPEND).use { ch -> ch.lock().use { block(ch) } }
    }
}

/** The result JSON `SendEmail` commits for effect `id`. */
fun sentJson(id: String) = """{"id":"$id","sent":true}"""

/**
 * A side-effecting tool that can look its effects up by downstream key.
 * `failWith` is thrown by `perform` before any effect: on every call, or
 * only on the first `failTimes` calls. `landingWindowMs = null` keeps the
 * descriptor's default (120000).
 */
open class SendEmail(
    val downstream: Downstream,
    private val canLookup: Boolean = true,
    private val requiresApproval: Boolean = false,
    private val failWith: Throwable? = null,
    private val failTimes: Int? = null,
    private val landingWindowMs: ULong? = null,
    private val name: String = "send_email",
) : ToolHandler {
    /** `perform` calls so far. */
    val calls = AtomicInteger()

    /** `lookup` calls so far. */
    val lookups = AtomicInteger()

    override fun descriptor() = ToolDescriptor(
        name = name,
        version = 1u,
        effect = EffectClass.SIDE_EFFECT,
        batch = BatchMode.ATOMIC,
        lookup = canLookup,
        requiresApproval = requiresApproval,
    ).let { d -> landingWindowMs?.let { d.copy(landingWindowMs = it) } ?: d }

    override suspend fun perform(request: ToolRequest): PerformOutcome {
        val n = calls.incrementAndGet()
        yield() // a real suspension point, as network code has
        if (failWith != null && (failTimes == null || n <= failTimes)) throw failWith
        beforeEffect(request)
        // Blocking I/O belongs on Dispatchers.IO: the bindings call
        // `perform` on Dispatchers.Default (GlobalScope).
        val id = withContext(Dispatchers.IO) { downstream.perform(request.downstreamKey) }
        afterEffect(request)
        return PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
    }

    /** A hook for tests: runs before the downstream effect. */
    open suspend fun beforeEffect(request: ToolRequest) {}

    /** A hook for tests: runs after the downstream effect, before returning. */
    open suspend fun afterEffect(request: ToolRequest) {}

    override suspend fun lookup(request: ToolRequest): LookupOutcome {
        lookups.incrementAndGet()
        val id = withContext(Dispatchers.IO) { downstream.find(request.downstreamKey) }
            ?: return LookupOutcome.NotFound
        return LookupOutcome.Found(resultJson = sentJson(id), externalId = id)
    }

    override fun approvalPreview(argumentsJson: String): String? {
        val to = Regex(""""to":"([^"]*)"""").find(argumentsJson)?.groupValues?.get(1) ?: "?"
        return """{"to":"$to"}"""
    }
}

/**
 * Performs the effect, tells the test it did (`onEffect`), then never
 * returns: the process is killed before the ledger learns the result (the
 * `after-remote-commit` crash boundary).
 */
class SendThenHang(downstream: Downstream, private val onEffect: () -> Unit) : SendEmail(downstream) {
    override suspend fun afterEffect(request: ToolRequest) {
        onEffect()
        awaitCancellation()
    }
}

/** A read-only tool: nothing is recorded for it. */
class Weather : ToolHandler {
    val calls = AtomicInteger()

    override fun descriptor() = ToolDescriptor(
        name = "weather",
        version = 1u,
        effect = EffectClass.READ_ONLY,
        batch = BatchMode.ATOMIC,
    )

    override suspend fun perform(request: ToolRequest): PerformOutcome {
        calls.incrementAndGet()
        return PerformOutcome.Committed(resultJson = """{"celsius":21}""", externalId = null)
    }

    override suspend fun lookup(request: ToolRequest): LookupOutcome = LookupOutcome.Unsupported

    override fun approvalPreview(argumentsJson: String): String? = null
}

/** A `send_email` call as the model would ask for it. */
fun emailCall(callId: String = "call_1", to: String = "a@example.com", body: String = "hi") = ToolCall(
    provider = Provider.CUSTOM,
    callId = callId,
    toolName = "send_email",
    arguments = """{"to":"$to","body":"$body"}""",
)
