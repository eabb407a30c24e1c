package dev.toolledger.ktx

import dev.toolledger.Begin
import dev.toolledger.CallSpec
import dev.toolledger.CancelOutcome
import dev.toolledger.Execution
import dev.toolledger.Ledger
import dev.toolledger.LedgerConfig
import dev.toolledger.LedgerEvent
import dev.toolledger.LedgerStats
import dev.toolledger.OperationStatus
import dev.toolledger.OperationSummary
import dev.toolledger.Resolution
import dev.toolledger.Resolved
import dev.toolledger.StoredResult
import dev.toolledger.Ticket
import dev.toolledger.TransitionEntry
import java.util.concurrent.atomic.AtomicReference
import kotlin.coroutines.cancellation.CancellationException
import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.NonCancellable
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.withContext

/**
 * The [Ledger] with `suspend` methods: each one is a short blocking SQLite
 * transaction (an fsync at commit boundaries), run on [dispatcher]
 * (`Dispatchers.IO` unless given), so the caller's thread, the main thread
 * included, never waits on the disk. Rounds, attempts and limits are Int,
 * milliseconds Long; the records are the library's (immutable).
 *
 * ```kotlin
 * val ledger = SuspendLedger.open(File(context.noBackupFilesDir, "toolledger.db").path)
 * val attention = ledger.recover()
 * ```
 *
 * Open one per database file per process and [close] it when the app no
 * longer needs it (it closes the underlying [Ledger]; an [Executor] over it
 * keeps the library's ledger alive until it is closed too). [events] is
 * the ledger's status moves as a `Flow` (no values in them). A string
 * argument with an unpaired UTF-16 surrogate (half an emoji) is
 * `LedgerException.InvalidInput` with nothing recorded.
 */
class SuspendLedger @JvmOverloads constructor(
    /** The generated ledger underneath, for what this class does not wrap. */
    val ledger: Ledger,
    /**
     * Where the blocking calls run (`Dispatchers.IO` unless given); an
     * [Executor] over this ledger runs its [SyncTool] calls there too.
     */
    val dispatcher: CoroutineDispatcher = Dispatchers.IO,
) : AutoCloseable {
    companion object {
        /**
         * Opens (creating if needed) the ledger at [path], on [dispatcher].
         * With [key] (32 bytes the app keeps in the Android Keystore, see
         * docs/design.md) the ledger is encrypted at rest; a wrong key is
         * `LedgerException.Storage` (`WRONG_KEY`) and changes nothing.
         */
        @JvmStatic
        suspend fun open(
            path: String,
            config: LedgerConfig = ledgerConfig(),
            dispatcher: CoroutineDispatcher = Dispatchers.IO,
            key: ByteArray? = null,
        ): SuspendLedger = withContext(dispatcher) { SuspendLedger(Ledger.open(path, config, key), dispatcher) }
    }

    /** The ledger's status moves as a `Flow` (see [Ledger.events]). */
    @JvmOverloads
    fun events(capacity: Int = 10_000): Flow<LedgerEvent> = ledger.events(capacity)

    /** True when the ledger is encrypted at rest. */
    val isEncrypted: Boolean get() = ledger.isEncrypted()

    /** [block] on [dispatcher]; a string it cannot hand the library is `InvalidInput`. */
    private suspend fun <T> io(block: () -> T): T = withContext(dispatcher) { utf16Checked(block) }

    /** This ledger's session id (the owner written on `executing` rows). */
    val sessionId: String get() = ledger.sessionId()

    /**
     * [io] for a method that starts attempts (the [tickets] in its answer).
     * A coroutine cancelled while [block] runs, or just after, loses the
     * answer: nobody holds those tickets and nothing can have been sent
     * under them, so each is recorded failed before commit (retryable; the
     * next `begin` runs the call) before the `CancellationException` goes
     * on. Otherwise the attempt stayed `executing` under this live session
     * and every later `begin` answered `InFlight` for the life of the
     * process. A coroutine cancelled before [block] starts runs nothing.
     */
    private suspend fun <T> startingAttempts(block: () -> T, tickets: (T) -> List<Ticket>): T {
        val handedOut = AtomicReference<List<Ticket>>(emptyList())
        try {
            return io { block().also { handedOut.set(tickets(it)) } }
        } catch (e: CancellationException) {
            val lost = handedOut.getAndSet(emptyList())
            if (lost.isNotEmpty()) {
                runCatching {
                    withContext(dispatcher + NonCancellable) {
                        lost.forEach { runCatching { ledger.failBeforeCommit(it, NOT_HANDED_OUT, true) } }
                    }
                }
            }
            throw e
        }
    }

    /**
     * Begins every call of one model response in one durable transaction.
     * Cancelled while it runs, it leaves no attempt started (see the class).
     */
    suspend fun beginRound(operationId: String, round: Int, calls: List<CallSpec>): List<Begin> =
        round.toU("round").let { r ->
            startingAttempts({ ledger.beginRound(operationId, r, calls) }) { begins -> begins.mapNotNull(::executeTicket) }
        }

    /** Begins one call. Cancelled while it runs, it leaves no attempt started. */
    suspend fun begin(operationId: String, round: Int, spec: CallSpec): Begin =
        round.toU("round").let { r -> startingAttempts({ ledger.begin(operationId, r, spec) }) { listOfNotNull(executeTicket(it)) } }

    /** Approves the execution for exactly the arguments with [argsDigest]. */
    suspend fun approve(executionId: String, argsDigest: String, previewJson: String? = null) =
        io { ledger.approve(executionId, argsDigest, previewJson) }

    /** Rejects the execution: it never runs. */
    suspend fun reject(executionId: String, argsDigest: String, reason: String) =
        io { ledger.reject(executionId, argsDigest, reason) }

    /**
     * Starts the next attempt of an approved (or retryable failed)
     * execution. Cancelled while it runs, it leaves no attempt started.
     */
    suspend fun markExecuting(executionId: String): Ticket =
        startingAttempts({ ledger.markExecuting(executionId) }) { listOf(it) }

    /** Makes the downstream's id for the effect durable. */
    suspend fun recordExternalId(ticket: Ticket, externalId: String) =
        io { ledger.recordExternalId(ticket, externalId) }

    /** How long ago the execution's outcome became unknown, in ms (null if it is not unknown). */
    suspend fun unknownForMs(executionId: String): Long? = io { ledger.unknownForMs(executionId)?.toSigned() }

    /** True while [ticket]'s attempt is still current and owned by this session. */
    suspend fun owns(ticket: Ticket): Boolean = io { ledger.owns(ticket) }

    /** Commits the result of [ticket]'s attempt: durable before the model sees it. */
    suspend fun commit(ticket: Ticket, resultJson: String, externalId: String? = null): StoredResult =
        io { ledger.commit(ticket, resultJson, externalId) }

    /** Records that [ticket]'s attempt provably did not commit. */
    suspend fun failBeforeCommit(ticket: Ticket, reason: String, retryable: Boolean) =
        io { ledger.failBeforeCommit(ticket, reason, retryable) }

    /** Records that [ticket]'s request may have reached the downstream. */
    suspend fun markOutcomeUnknown(ticket: Ticket, reason: String) =
        io { ledger.markOutcomeUnknown(ticket, reason) }

    /**
     * Resolves the unknown outcome of [attempt] of the execution. A
     * `Resolved.Retry` attempt whose coroutine was cancelled while it was
     * started is recorded failed before commit (nobody holds its ticket).
     */
    suspend fun resolveUnknown(executionId: String, attempt: Int, resolution: Resolution): Resolved =
        attempt.toU("attempt").let { a ->
            startingAttempts({ ledger.resolveUnknown(executionId, a, resolution) }) {
                listOfNotNull((it as? Resolved.Retry)?.ticket)
            }
        }

    /** Marks results as handed to the model. */
    suspend fun markDelivered(executionIds: List<String>) = io { ledger.markDelivered(executionIds) }

    /** Cancels one execution if nothing can have reached the downstream. */
    suspend fun cancel(executionId: String): CancelOutcome = io { ledger.cancel(executionId) }

    /** Cancels an operation: nothing starts in it again. */
    suspend fun cancelOperation(operationId: String): OperationStatus = io { ledger.cancelOperation(operationId) }

    /** Marks an operation completed. */
    suspend fun completeOperation(operationId: String) = io { ledger.completeOperation(operationId) }

    /** Begins a compensation of the committed execution [original] (cancelled: as [begin]). */
    suspend fun compensate(original: String, operationId: String, round: Int, spec: CallSpec): Begin =
        round.toU("round").let { r ->
            startingAttempts({ ledger.compensate(original, operationId, r, spec) }) { listOfNotNull(executeTicket(it)) }
        }

    /** Reads one execution. */
    suspend fun get(executionId: String): Execution? = io { ledger.get(executionId) }

    /** Every execution of an operation, in round and position order. */
    suspend fun list(operationId: String): List<Execution> = io { ledger.list(operationId) }

    /** The compensations recorded for [original]. */
    suspend fun compensations(original: String): List<Execution> = io { ledger.compensations(original) }

    /** The status of an operation, if it exists. */
    suspend fun operationStatus(operationId: String): OperationStatus? = io { ledger.operationStatus(operationId) }

    /** Operations with their status, newest first, at most [limit]. */
    suspend fun operations(limit: Int): List<OperationSummary> =
        limit.toU("limit").let { l -> io { ledger.operations(l) } }

    /** The transition log of one execution, oldest first. */
    suspend fun transitions(executionId: String): List<TransitionEntry> = io { ledger.transitions(executionId) }

    /** Row counts. */
    suspend fun stats(): LedgerStats = io { ledger.stats() }

    /** At app start and after resume: every execution that needs attention. */
    suspend fun recover(): List<Execution> = io { ledger.recover() }

    /**
     * Makes every deferred commit durable now (one WAL sync; nothing when
     * none waits). See [ledgerConfig]'s durability policy.
     */
    suspend fun sync() = io { ledger.sync() }

    /** True while a deferred commit is not durable yet (it already survives a killed app). */
    fun hasUnsyncedCommits(): Boolean = ledger.hasUnsyncedCommits()

    /** Checkpoints and closes the database; calls fail with `Suspended` until [resume]. */
    suspend fun suspend() = io { ledger.suspend() }

    /** Reopens after [suspend] and runs [recover]. */
    suspend fun resume(): List<Execution> = io { ledger.resume() }

    /** Closes the underlying [Ledger]. */
    override fun close() = ledger.close()
}

/**
 * The ticket of an attempt [begin] started for its caller, who runs it:
 * `Execute` only (a `Reconcile` ticket names an attempt whose outcome is
 * unknown already, which is not the caller's to fail).
 */
private fun executeTicket(begin: Begin): Ticket? = (begin as? Begin.Execute)?.ticket

private const val NOT_HANDED_OUT = "the caller was cancelled before it got the attempt; nothing was sent"
