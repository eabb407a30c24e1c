package dev.toolledger.ktx

import dev.toolledger.BatchMode
import dev.toolledger.CallOutcome
import dev.toolledger.CallerStep
import dev.toolledger.ExecutorConfig
import dev.toolledger.JobApplied
import dev.toolledger.JobUpdate
import dev.toolledger.LedgerException
import dev.toolledger.MetricsSnapshot
import dev.toolledger.OperationStatus
import dev.toolledger.Recovery
import dev.toolledger.Resolution
import dev.toolledger.ToolCall
import dev.toolledger.ToolExecutor
import dev.toolledger.ToolHandler
import java.util.concurrent.ConcurrentHashMap
import kotlin.coroutines.cancellation.CancellationException
import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.CoroutineStart
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.Job
import kotlinx.coroutines.NonCancellable
import kotlinx.coroutines.async
import kotlinx.coroutines.currentCoroutineContext
import kotlinx.coroutines.ensureActive
import kotlinx.coroutines.supervisorScope
import kotlinx.coroutines.sync.Semaphore
import kotlinx.coroutines.sync.withPermit
import kotlinx.coroutines.withContext

/**
 * The [ToolExecutor] with Int rounds and attempts. Its protocol methods are
 * `suspend` and run on the library's own threads (they never block the
 * caller); the few that touch the database synchronously run on
 * [dispatcher] (`Dispatchers.IO` unless given). Cancelling the coroutine
 * that awaits a call only loses the answer: the call finishes inside the
 * library and its outcome is recorded (a repeat gets it back). A
 * coroutine already cancelled when it calls one of them starts nothing
 * (its `CancellationException` is thrown).
 *
 * A [SyncTool] is run by the caller itself, on [dispatcher] for
 * [execute] (no hop when the caller is already there; none for a replay
 * the library answers at once) or on the calling thread for
 * [executeBlocking], through the library's caller-driven steps: no hop to
 * the library's threads and no callback into the JVM. So is a
 * [CallerTool] (a tool that suspends) by [execute], on [dispatcher].
 *
 * A string argument with an unpaired UTF-16 surrogate (half an emoji, from
 * `take(n)`), which the generated methods refuse with a
 * `CharacterCodingException`, is `LedgerException.InvalidInput` here, with
 * nothing recorded; so is a negative round or attempt.
 */
class Executor @JvmOverloads constructor(
    /** The generated executor underneath. */
    val executor: ToolExecutor,
    /**
     * Where [execute] runs a [SyncTool] call and where the methods that
     * touch the database synchronously run: `Dispatchers.IO` unless given
     * (over a [SuspendLedger], its dispatcher).
     */
    val dispatcher: CoroutineDispatcher = Dispatchers.IO,
) : AutoCloseable {
    init {
        AttachedCallbacks.ensure()
    }

    /** The registered tools this layer runs itself, by name. */
    private val syncTools = ConcurrentHashMap<String, SyncTool>()

    /** The registered [CallerTool]s, which [execute] runs in the calling coroutine, by name. */
    private val callerTools = ConcurrentHashMap<String, CallerTool>()

    /**
     * The executor's `performTimeoutMs`, which bounds a [CallerTool]'s
     * attempt (null: no bound; 0 is taken as 1 ms, so that the tool starts
     * before it times out, as the library's own bound lets it).
     */
    private val performTimeoutMs: Long? = executor.performTimeoutMs()?.toSigned()?.coerceAtLeast(1)

    /** The executor's `maxParallel`: how many tools of a round [executeRound] runs at once. */
    private val maxParallel: Int = executor.maxParallel().toSigned().coerceIn(1, 1024)

    /** Calls of this layer's [SyncTool]s in progress (see [close]). */
    private val walks = java.util.concurrent.atomic.AtomicInteger(0)

    @Volatile
    private var closed = false

    /**
     * An executor over [ledger] with [config] and [tools] registered; its
     * [SyncTool] calls run on the ledger's dispatcher.
     */
    @JvmOverloads
    constructor(
        ledger: SuspendLedger,
        config: ExecutorConfig = executorConfig(),
        tools: List<ToolHandler> = emptyList(),
    ) : this(ToolExecutor(ledger.ledger, config), ledger.dispatcher) {
        tools.forEach(::register)
    }

    /**
     * Registers a tool under its descriptor's name. What the library calls
     * back (a suspending tool's `perform` / `lookup`, a [SyncTool] run by
     * `recover`, `approve`, `executeRound`) goes through a guard that turns
     * a result or error text with an unpaired UTF-16 surrogate (half an
     * emoji, from `take(n)`) into an unknown outcome: the bindings cannot
     * hand such a string to the library, and it would otherwise escape as
     * an uncaught exception on the library's thread. An [Error] the tool
     * throws there (`StackOverflowError`) is an unknown outcome too (from
     * `lookup`, a failed lookup): the generated callback catches
     * `Exception` only, and the library would hear nothing until
     * `performTimeoutMs`.
     */
    fun register(tool: ToolHandler) {
        executor.register(Utf16Guard(tool))
        if (tool is SyncTool && tool.descriptor().batch == BatchMode.ATOMIC) {
            syncTools[tool.descriptor().name] = tool
        }
        if (tool is CallerTool && tool.descriptor().batch == BatchMode.ATOMIC) {
            callerTools[tool.descriptor().name] = tool
        }
    }

    /**
     * Runs one tool call (replay, approval, or a run with durable intent and
     * result). A [SyncTool] runs on [dispatcher] in this coroutine's
     * place; once its tool has started it finishes even if the coroutine
     * is cancelled (only the answer is lost, as for every other tool). A
     * coroutine cancelled before that runs no tool: cancelled when it
     * calls, nothing is begun; cancelled while the call is begun, the
     * attempt handed out is recorded as never sent (the next ask runs it).
     *
     * A replay is answered on the calling thread when the library can
     * answer it at once (`startNow`: the ledger's one connection free at
     * this moment, a read that never waits for another call's lock, an fsync
     * or SQLite's busy handler),
     * with no hop; when it cannot — a new call, a read-only tool, the
     * connection held by another call across its fsync or by the deferred
     * commits' flush — the call goes to [dispatcher] as before. The calling
     * thread (Android's main thread) never waits for a lock or a sync; the
     * read itself may still load a few pages from the file when SQLite's
     * page cache does not hold them (after opening or resuming the
     * ledger, or after another process wrote to it). Bad input
     * and a suspended ledger throw what the dispatcher's path throws.
     */
    suspend fun execute(operationId: String, round: Int, call: ToolCall): CallOutcome {
        checkUtf16(operationId, call)
        syncTools[call.toolName]?.let { tool ->
            return inCallersPlace(operationId, round, call) { first, cancelled ->
                drive(executor, first, tool) { cancelled() ?: threadInterrupted() }
            }
        }
        callerTools[call.toolName]?.let { tool ->
            return inCallersPlace(operationId, round, call) { first, cancelled ->
                driveSuspending(executor, first, tool, performTimeoutMs, cancelled)
            }
        }
        return started { executor.execute(operationId, round.toU("round"), call) }
    }

    /**
     * One call of a tool this layer runs itself ([SyncTool], [CallerTool]):
     * a replay the library answers at once (`startNow`) is answered here, on
     * the calling thread; otherwise a coroutine cancelled already starts
     * nothing, and [walk] takes the call from its first step (`start` for
     * anything `startNow` did not answer) on [dispatcher], not cancellable,
     * with `cancelled` answering a `CancellationException` once the caller
     * is cancelled (the walk checks it before it runs the tool).
     */
    private suspend fun inCallersPlace(
        operationId: String,
        round: Int,
        call: ToolCall,
        walk: suspend (first: CallerStep, cancelled: () -> Throwable?) -> CallOutcome,
    ): CallOutcome {
        val r = round.toU("round")
        val cancelled = callersCancellation()
        return walking {
            val now = DirectSteps.startNow(executor, operationId, r, call)
            if (now is CallerStep.Done) {
                now.outcome
            } else {
                // A cancelled coroutine starts nothing (the library's own
                // `execute` runs nothing for it either).
                currentCoroutineContext().ensureActive()
                withContext(dispatcher + NonCancellable) {
                    // `startNow` only answers `Done`; any other step is walked here.
                    walk(now ?: DirectSteps.start(executor, operationId, r, call), cancelled)
                }
            }
        }
    }

    /**
     * What a walk asks before it runs a tool: this coroutine's cancellation
     * (a `CancellationException` once it is cancelled, else null), read
     * from the walk's non-cancellable context.
     */
    private suspend fun callersCancellation(): () -> Throwable? {
        val caller = currentCoroutineContext()[Job]
        return {
            if (caller?.isCancelled == true) {
                CancellationException("the caller was cancelled before the tool ran; nothing was sent")
            } else {
                null
            }
        }
    }

    /**
     * [execute] for a [SyncTool], on the calling thread (a worker thread, a
     * Java caller): every step and the tool run here; blocks on disk I/O.
     * Throws `LedgerException.InvalidInput` (nothing recorded) for a tool
     * that is not a registered [SyncTool].
     *
     * Interrupting the calling thread stops the call: a tool that throws
     * with the thread interrupted (an `InterruptedException`, NIO's
     * `ClosedByInterruptException`) or throws an [Error] has its attempt
     * recorded as interrupted (unknown, nothing more run; the next ask
     * resends under the same key, looks the effect up, or answers
     * `Unknown`) and the throwable is rethrown; a thread interrupted before
     * the tool starts runs no tool (the attempt is recorded as never sent)
     * and gets an `InterruptedException`, as does one interrupted in a
     * retry's backoff. (Declared, so that Java callers can catch it.)
     */
    @Throws(InterruptedException::class)
    fun executeBlocking(operationId: String, round: Int, call: ToolCall): CallOutcome {
        checkUtf16(operationId, call)
        val tool = syncTools[call.toolName]
            ?: throw LedgerException.InvalidInput("executeBlocking: ${call.toolName} is not a registered SyncTool")
        return walking { drive(executor, DirectSteps.start(executor, operationId, round.toU("round"), call), tool) }
    }

    /**
     * Runs one [SyncTool] call's walk; [close] waits for none of them but
     * frees the library's executor only after the last one (a walk holds
     * it from its `start` to its last report: a call that started finishes
     * and is recorded). Refused once closed.
     */
    private inline fun <T> walking(walk: () -> T): T {
        walks.incrementAndGet()
        try {
            check(!closed) { "the Executor is closed" }
            return walk()
        } finally {
            if (walks.decrementAndGet() == 0 && closed) executor.close()
        }
    }

    /**
     * [call], a generated `suspend` method that may run tools: refused with
     * this coroutine's `CancellationException` when it is cancelled already
     * (the generated code would start the call on its first poll, and only
     * the answer would be lost); a string it cannot hand the library is
     * `InvalidInput` ([utf16Checked]).
     */
    private suspend inline fun <T> started(call: () -> T): T {
        currentCoroutineContext().ensureActive()
        return utf16Checked(call)
    }

    /**
     * Runs every call of one model response: the side-effecting calls begun
     * in one durable transaction (one sync for the round), then run in
     * parallel, at most the executor's `maxParallel` at a time; outcomes in
     * call order. A bad call anywhere (an unknown tool, invalid arguments)
     * stops the whole round with nothing recorded or run.
     *
     * When every call's tool is a [SyncTool] or a [CallerTool] registered
     * here, the round is begun by the library's caller-driven `startRound`
     * and each call walked as [execute] walks one, in its own coroutine on
     * [dispatcher] (a [SyncTool] blocks one of its threads while it runs; a
     * [CallerTool]'s walk starts undispatched and yields where it suspends):
     * no hop to the library's threads, no callback into the JVM. Once the
     * round is begun it is not cancellable: a cancelled caller's calls
     * whose tool had not started are recorded as never sent (the next ask
     * runs them) and it gets its `CancellationException`; a tool that had
     * started finishes and is recorded. If a call's walk fails (a storage
     * error), the others still finish and the first failure is thrown.
     * Otherwise the library's async executor runs the round and calls the
     * tools back.
     *
     * A [SyncTool] holds a thread of [dispatcher] while it runs: on a
     * dispatcher with fewer threads than a round's blocking tools (a
     * single-thread one), the round's [CallerTool]s wait for a thread, and
     * their `performTimeoutMs` counts that wait (past it their outcome is
     * unknown). `Dispatchers.IO`, the default, has threads to spare. A
     * dispatcher shut down while a round runs ends it with its
     * `CancellationException`; the calls whose tool had not started are
     * given back first (the next ask runs them).
     */
    suspend fun executeRound(operationId: String, round: Int, calls: List<ToolCall>): List<CallOutcome> {
        calls.forEach { checkUtf16(operationId, it) }
        val r = round.toU("round")
        val tools: List<Any?> = calls.map { syncTools[it.toolName] ?: callerTools[it.toolName] }
        if (calls.isEmpty() || tools.any { it == null }) {
            return started { executor.executeRound(operationId, r, calls) }
        }
        val cancelled = callersCancellation()
        return walking {
            currentCoroutineContext().ensureActive()
            withContext(dispatcher + NonCancellable) {
                val first = utf16Checked { executor.startRound(operationId, r, calls) }
                val turns = Semaphore(maxParallel)
                supervisorScope {
                    val walks = first.zip(tools).map { (step, tool) ->
                        // A CallerTool's walk starts here, on this thread, and
                        // yields where its tool suspends (no dispatch for a
                        // tool that answers at once); a SyncTool's blocks, so
                        // each gets its own dispatch (a thread of its own).
                        // ATOMIC: the body runs even when its first dispatch is
                        // refused (a shut-down executor cancels the coroutine
                        // before it starts), so that the step is given back.
                        async(start = if (tool is SyncTool) CoroutineStart.ATOMIC else CoroutineStart.UNDISPATCHED) {
                            if (step is CallerStep.Done) {
                                step.outcome
                            } else {
                                var walked = false
                                try {
                                    turns.withPermit {
                                        walked = true
                                        when (tool) {
                                            is SyncTool -> drive(executor, step, tool) { cancelled() ?: threadInterrupted() }
                                            else -> driveSuspending(executor, step, tool as CallerTool, performTimeoutMs, cancelled)
                                        }
                                    }
                                } catch (e: Throwable) {
                                    // The walk never took its handed-out step (the
                                    // permit's resume refused): give it back.
                                    if (!walked) giveBack(executor, step, e)
                                    throw e
                                }
                            }
                        }
                    }
                    val ended = walks.map { runCatching { it.await() } }
                    ended.firstOrNull { it.isFailure }?.exceptionOrNull()?.let { throw it }
                    ended.map { it.getOrThrow() }
                }
            }
        }
    }

    /** [step], handed out and never walked: recorded as never sent (a Perform) or as a failed lookup. */
    private fun giveBack(executor: ToolExecutor, step: CallerStep, e: Throwable) {
        runCatching {
            when (step) {
                is CallerStep.Perform -> if (!step.attempt.readOnly) {
                    executor.abandonAttempt(step.attempt.request.executionId, step.attempt.request.attempt, "the round's walk ended before the tool ran")
                }
                is CallerStep.Lookup -> DirectSteps.reportLookupError(executor, step.attempt, "the round's walk ended before the lookup ran")
                else -> Unit
            }
        }.exceptionOrNull()?.let(e::addSuppressed)
    }

    /**
     * Approves a waiting call for exactly [argsDigest] and runs it. Approving
     * again a call already approved for the same digest (a double tap)
     * approves nothing more and answers where it stands (`InFlight` while it
     * runs, its stored result once committed).
     */
    suspend fun approve(executionId: String, argsDigest: String, previewJson: String? = null): CallOutcome =
        started { executor.approve(executionId, argsDigest, previewJson) }

    /** Runs an execution that may run now, or reports where it stands. */
    suspend fun runExisting(executionId: String): CallOutcome = started { executor.runExisting(executionId) }

    /** At app start (after registering every tool) and after resume. */
    suspend fun recover(): Recovery = started { executor.recover() }

    /** Settles the unknown outcome of [attempt]. */
    suspend fun resolveUnknown(executionId: String, attempt: Int, resolution: Resolution): CallOutcome =
        attempt.toU("attempt").let { a -> started { executor.resolveUnknown(executionId, a, resolution) } }

    /** Runs a compensation (a refund) of the committed execution [original]. */
    suspend fun compensate(original: String, operationId: String, round: Int, call: ToolCall): CallOutcome =
        round.toU("round").let { r -> started { executor.compensate(original, operationId, r, call) } }

    /** Cancels an operation (a database write: on [dispatcher]). */
    suspend fun cancelOperation(operationId: String): OperationStatus =
        withContext(dispatcher) { utf16Checked { executor.cancelOperation(operationId) } }

    /** Applies a webhook event to its execution exactly once (on [dispatcher]). */
    suspend fun ingestWebhook(source: String, eventId: String, executionId: String, update: JobUpdate): JobApplied =
        withContext(dispatcher) { utf16Checked { executor.ingestWebhook(source, eventId, executionId, update) } }

    /** Applies a polled background job's state (on [dispatcher]). */
    suspend fun recordJobUpdate(executionId: String, update: JobUpdate): JobApplied =
        withContext(dispatcher) { utf16Checked { executor.recordJobUpdate(executionId, update) } }

    /** Counters and latency figures so far. */
    fun metrics(): MetricsSnapshot = executor.metrics()

    /**
     * Closes the underlying [ToolExecutor]: at once when no [SyncTool] call
     * of this layer runs, otherwise when the last one has recorded its
     * outcome. Calls made after it are refused (`IllegalStateException`).
     */
    override fun close() {
        closed = true
        if (walks.get() == 0) executor.close()
    }
}
