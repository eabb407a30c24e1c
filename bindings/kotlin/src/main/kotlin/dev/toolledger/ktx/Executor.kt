package dev.toolledger.ktx

import dev.toolledger.CallOutcome
import dev.toolledger.ExecutorConfig
import dev.toolledger.JobApplied
import dev.toolledger.JobUpdate
import dev.toolledger.MetricsSnapshot
import dev.toolledger.OperationStatus
import dev.toolledger.Recovery
import dev.toolledger.Resolution
import dev.toolledger.ToolCall
import dev.toolledger.ToolExecutor
import dev.toolledger.ToolHandler
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.withContext

/**
 * The [ToolExecutor] with Int rounds and attempts. Its protocol methods are
 * `suspend` and run on the library's own threads (they never block the
 * caller); the few that touch the database synchronously run on
 * `Dispatchers.IO` here. Cancelling the coroutine that awaits a call only
 * loses the answer: the call finishes inside the library and its outcome
 * is recorded (a repeat gets it back).
 */
class Executor(
    /** The generated executor underneath. */
    val executor: ToolExecutor,
) : AutoCloseable {
    /** An executor over [ledger] with [config] and [tools] registered. */
    @JvmOverloads
    constructor(
        ledger: SuspendLedger,
        config: ExecutorConfig = executorConfig(),
        tools: List<ToolHandler> = emptyList(),
    ) : this(ToolExecutor(ledger.ledger, config)) {
        tools.forEach(::register)
    }

    /** Registers a tool under its descriptor's name. */
    fun register(tool: ToolHandler) = executor.register(tool)

    /** Runs one tool call (replay, approval, or a run with durable intent and result). */
    suspend fun execute(operationId: String, round: Int, call: ToolCall): CallOutcome =
        executor.execute(operationId, round.toU("round"), call)

    /** Runs every call of one model response; outcomes in call order. */
    suspend fun executeRound(operationId: String, round: Int, calls: List<ToolCall>): List<CallOutcome> =
        executor.executeRound(operationId, round.toU("round"), calls)

    /** Approves a waiting call for exactly [argsDigest] and runs it. */
    suspend fun approve(executionId: String, argsDigest: String, previewJson: String? = null): CallOutcome =
        executor.approve(executionId, argsDigest, previewJson)

    /** Runs an execution that may run now, or reports where it stands. */
    suspend fun runExisting(executionId: String): CallOutcome = executor.runExisting(executionId)

    /** At app start (after registering every tool) and after resume. */
    suspend fun recover(): Recovery = executor.recover()

    /** Settles the unknown outcome of [attempt]. */
    suspend fun resolveUnknown(executionId: String, attempt: Int, resolution: Resolution): CallOutcome =
        executor.resolveUnknown(executionId, attempt.toU("attempt"), resolution)

    /** Runs a compensation (a refund) of the committed execution [original]. */
    suspend fun compensate(original: String, operationId: String, round: Int, call: ToolCall): CallOutcome =
        executor.compensate(original, operationId, round.toU("round"), call)

    /** Cancels an operation (a database write: on Dispatchers.IO). */
    suspend fun cancelOperation(operationId: String): OperationStatus =
        withContext(Dispatchers.IO) { executor.cancelOperation(operationId) }

    /** Applies a webhook event to its execution exactly once (on Dispatchers.IO). */
    suspend fun ingestWebhook(source: String, eventId: String, executionId: String, update: JobUpdate): JobApplied =
        withContext(Dispatchers.IO) { executor.ingestWebhook(source, eventId, executionId, update) }

    /** Applies a polled background job's state (on Dispatchers.IO). */
    suspend fun recordJobUpdate(executionId: String, update: JobUpdate): JobApplied =
        withContext(Dispatchers.IO) { executor.recordJobUpdate(executionId, update) }

    /** Counters and latency figures so far. */
    fun metrics(): MetricsSnapshot = executor.metrics()

    /** Closes the underlying [ToolExecutor]. */
    override fun close() = executor.close()
}
