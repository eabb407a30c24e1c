import Dispatch
import Foundation

/// The `Ledger`'s methods as `async` functions that run on a dispatch queue
/// of their own, never on the caller's thread or actor (the main actor
/// included) and never on Swift concurrency's cooperative pool, which must
/// not wait on the disk.
///
/// Every `Ledger` method is a short SQLite transaction that blocks until it
/// is durable (an fsync at commit boundaries). Reach these through
/// `ledger.async`:
///
/// ```swift
/// let ledger = try await AsyncLedger.open(path: url.path)
/// let attention = try await ledger.recover()
/// try await ledger.ledger.suspend()           // or: ledger.suspend()
/// ```
///
/// The call is not cancellable once started: a cancelled task still waits
/// for the transaction (which is short) and then sees its result.
public struct AsyncLedger: Sendable {
    /// The generated ledger underneath (its methods block).
    public let ledger: Ledger
    private let queue: DispatchQueue

    /// The queue every `AsyncLedger` uses unless given another one.
    public static let defaultQueue = DispatchQueue(
        label: "dev.toolledger.ledger", qos: .utility, attributes: .concurrent)

    /// Wraps `ledger`; its calls run on `queue`.
    public init(_ ledger: Ledger, queue: DispatchQueue = AsyncLedger.defaultQueue) {
        self.ledger = ledger
        self.queue = queue
    }

    /// Opens (creating if needed) the ledger at `path`, off the caller's
    /// thread. With `key` (32 bytes the app keeps in the Keychain, see
    /// docs/design.md) it is encrypted at rest; a wrong key is
    /// `LedgerError.Storage` (`.wrongKey`) and changes nothing.
    public static func open(
        path: String, config: LedgerConfig = LedgerConfig(), key: Data? = nil,
        queue: DispatchQueue = AsyncLedger.defaultQueue
    ) async throws -> AsyncLedger {
        let ledger = try await onQueue(queue) { try Ledger.open(path: path, config: config, key: key) }
        return AsyncLedger(ledger, queue: queue)
    }

    /// Runs `body` with the ledger on this ledger's queue: for methods this
    /// type does not wrap.
    public func run<T: Sendable>(_ body: @escaping @Sendable (Ledger) throws -> T) async throws -> T {
        let ledger = self.ledger
        return try await Self.onQueue(queue) { try body(ledger) }
    }

    private static func onQueue<T: Sendable>(
        _ queue: DispatchQueue, _ work: @escaping @Sendable () throws -> T
    ) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            queue.async { continuation.resume(with: Result { try work() }) }
        }
    }

    /// At app start and after `resume`: every execution that needs attention.
    public func recover() async throws -> [Execution] { try await run { try $0.recover() } }
    /// Makes every deferred commit durable now (one WAL sync; nothing when
    /// none waits): see `LedgerConfig.deferredCommits`.
    public func sync() async throws { try await run { try $0.sync() } }
    /// Checkpoints and closes the database; calls throw `Suspended` until `resume`.
    public func suspend() async throws { try await run { try $0.suspend() } }
    /// Reopens after `suspend` and runs `recover`.
    public func resume() async throws -> [Execution] { try await run { try $0.resume() } }
    /// Reads one execution.
    public func get(executionId: ExecutionId) async throws -> Execution? {
        try await run { try $0.get(executionId: executionId) }
    }
    /// Every execution of an operation, in round and position order.
    public func list(operationId: OperationId) async throws -> [Execution] {
        try await run { try $0.list(operationId: operationId) }
    }
    /// Begins every call of one model response in one durable transaction.
    public func beginRound(operationId: OperationId, round: UInt32, calls: [CallSpec]) async throws -> [Begin] {
        try await run { try $0.beginRound(operationId: operationId, round: round, calls: calls) }
    }
    /// Begins one call.
    public func begin(operationId: OperationId, round: UInt32, spec: CallSpec) async throws -> Begin {
        try await run { try $0.begin(operationId: operationId, round: round, spec: spec) }
    }
    /// Approves the execution for exactly the arguments with `argsDigest`.
    public func approve(executionId: ExecutionId, argsDigest: ArgsDigest, previewJson: String? = nil) async throws {
        try await run { try $0.approve(executionId: executionId, argsDigest: argsDigest, previewJson: previewJson) }
    }
    /// Rejects the execution: it never runs.
    public func reject(executionId: ExecutionId, argsDigest: ArgsDigest, reason: String) async throws {
        try await run { try $0.reject(executionId: executionId, argsDigest: argsDigest, reason: reason) }
    }
    /// Starts the next attempt of an approved (or retryable failed) execution.
    public func markExecuting(executionId: ExecutionId) async throws -> Ticket {
        try await run { try $0.markExecuting(executionId: executionId) }
    }
    /// Commits the result of `ticket`'s attempt: durable before the model sees it.
    public func commit(ticket: Ticket, resultJson: String, externalId: String? = nil) async throws -> StoredResult {
        try await run { try $0.commit(ticket: ticket, resultJson: resultJson, externalId: externalId) }
    }
    /// Records that `ticket`'s attempt provably did not commit.
    public func failBeforeCommit(ticket: Ticket, reason: String, retryable: Bool) async throws {
        try await run { try $0.failBeforeCommit(ticket: ticket, reason: reason, retryable: retryable) }
    }
    /// Records that `ticket`'s request may have reached the downstream.
    public func markOutcomeUnknown(ticket: Ticket, reason: String) async throws {
        try await run { try $0.markOutcomeUnknown(ticket: ticket, reason: reason) }
    }
    /// Makes the downstream's id for the effect durable.
    public func recordExternalId(ticket: Ticket, externalId: String) async throws {
        try await run { try $0.recordExternalId(ticket: ticket, externalId: externalId) }
    }
    /// True while `ticket`'s attempt is still current and owned by this session.
    public func owns(ticket: Ticket) async throws -> Bool { try await run { try $0.owns(ticket: ticket) } }
    /// Resolves the unknown outcome of `attempt` of the execution.
    public func resolveUnknown(executionId: ExecutionId, attempt: UInt32, resolution: Resolution) async throws -> Resolved {
        try await run { try $0.resolveUnknown(executionId: executionId, attempt: attempt, resolution: resolution) }
    }
    /// Marks results as handed to the model.
    public func markDelivered(executionIds: [ExecutionId]) async throws {
        try await run { try $0.markDelivered(executionIds: executionIds) }
    }
    /// Cancels one execution if nothing can have reached the downstream.
    public func cancel(executionId: ExecutionId) async throws -> CancelOutcome {
        try await run { try $0.cancel(executionId: executionId) }
    }
    /// Cancels an operation: nothing starts in it again.
    public func cancelOperation(operationId: OperationId) async throws -> OperationStatus {
        try await run { try $0.cancelOperation(operationId: operationId) }
    }
    /// Marks an operation completed.
    public func completeOperation(operationId: OperationId) async throws {
        try await run { try $0.completeOperation(operationId: operationId) }
    }
    /// The transition log of one execution, oldest first.
    public func transitions(executionId: ExecutionId) async throws -> [TransitionEntry] {
        try await run { try $0.transitions(executionId: executionId) }
    }
    /// Row counts.
    public func stats() async throws -> LedgerStats { try await run { try $0.stats() } }
}

extension Ledger {
    /// This ledger's methods as `async` functions off the caller's actor.
    public var async: AsyncLedger { AsyncLedger(self) }
}
