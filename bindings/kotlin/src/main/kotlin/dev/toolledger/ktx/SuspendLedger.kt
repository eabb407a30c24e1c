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
import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.Dispatchers
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

    /** Begins every call of one model response in one durable transaction. */
    suspend fun beginRound(operationId: String, round: Int, calls: List<CallSpec>): List<Begin> =
        round.toU("round").let { r -> io { ledger.beginRound(operationId, r, calls) } }

    /** Begins one call. */
    suspend fun begin(operationId: String, round: Int, spec: CallSpec): Begin =
        round.toU("round").let { r -> io { ledger.begin(operationId, r, spec) } }

    /** Approves the execution for exactly the arguments with [argsDigest]. */
    suspend fun approve(executionId: String, argsDigest: String, previewJson: String? = null) =
        io { ledger.approve(executionId, argsDigest, previewJson) }

    /** Rejects the execution: it never runs. */
    suspend fun reject(executionId: String, argsDigest: String, reason: String) =
        io { ledger.reject(executionId, argsDigest, reason) }

    /** Starts the next attempt of an approved (or retryable failed) execution. */
    suspend fun markExecuting(executionId: String): Ticket = io { ledger.markExecuting(executionId) }

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

    /** Resolves the unknown outcome of [attempt] of the execution. */
    suspend fun resolveUnknown(executionId: String, attempt: Int, resolution: Resolution): Resolved =
        attempt.toU("attempt").let { a -> io { ledger.resolveUnknown(executionId, a, resolution) } }

    /** Marks results as handed to the model. */
    suspend fun markDelivered(executionIds: List<String>) = io { ledger.markDelivered(executionIds) }

    /** Cancels one execution if nothing can have reached the downstream. */
    suspend fun cancel(executionId: String): CancelOutcome = io { ledger.cancel(executionId) }

    /** Cancels an operation: nothing starts in it again. */
    suspend fun cancelOperation(operationId: String): OperationStatus = io { ledger.cancelOperation(operationId) }

    /** Marks an operation completed. */
    suspend fun completeOperation(operationId: String) = io { ledger.completeOperation(operationId) }

    /** Begins a compensation of the committed execution [original]. */
    suspend fun compensate(original: String, operationId: String, round: Int, spec: CallSpec): Begin =
        round.toU("round").let { r -> io { ledger.compensate(original, operationId, r, spec) } }

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
