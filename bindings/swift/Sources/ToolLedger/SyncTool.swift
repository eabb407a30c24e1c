import Dispatch
import Foundation

/// A tool whose `performNow` (and `lookupNow`) answers without suspending:
/// plain blocking code. `ToolExecutor.executeNow` runs it on the calling
/// thread through the library's caller-driven steps (`start` → the tool →
/// `report`): no hop to the library's threads, no call back from them into
/// Swift. Every rule of the protocol is the library's: the intent is durable
/// before `performNow` runs, a second caller of the same call gets
/// `inFlight`, a crash between the effect and its report is reconciled on
/// the next ask.
///
/// ```swift
/// final class SendEmail: SyncTool {
///     func descriptor() throws -> ToolDescriptor {
///         ToolDescriptor(name: "send_email", version: 1, effect: .sideEffect,
///                        batch: .atomic, idempotencyKey: true)
///     }
///     func performNow(request: ToolRequest) throws -> PerformOutcome {
///         .committed(resultJson: try post(request), externalId: nil)
///     }
/// }
/// ```
///
/// Throwing from `performNow` means the outcome is unknown (the request may
/// have gone out). The executor's `performTimeoutMs` cannot stop a running
/// function: keep the tool's own deadlines. The library still calls
/// `perform` / `lookup` itself when no caller waits (`recover`, `approve`,
/// `runExisting`, `executeRound`); the defaults below forward them.
public protocol SyncTool: ToolHandler {
    /// Runs one attempt on the calling thread.
    func performNow(request: ToolRequest) throws -> PerformOutcome
    /// Looks the effect of `request` up downstream (default: unsupported).
    func lookupNow(request: ToolRequest) throws -> LookupOutcome
}

extension SyncTool {
    public func lookupNow(request: ToolRequest) throws -> LookupOutcome { .unsupported }

    public func perform(request: ToolRequest) async throws -> PerformOutcome {
        try performNow(request: request)
    }

    public func lookup(request: ToolRequest) async throws -> LookupOutcome {
        try lookupNow(request: request)
    }

    public func approvalPreview(argumentsJson: String) throws -> String? { nil }
}

extension ToolExecutor {
    /// Runs one call of `tool` (registered with this executor) on the calling
    /// thread: a replay answers at once; otherwise `tool.performNow` runs
    /// here between the two durable commits. Blocks on disk I/O: call it off
    /// the main thread (or use `execute(operationId:round:call:tool:)`).
    ///
    /// - Throws: `LedgerError` as `execute` (`.UnknownTool`, `.InvalidInput`:
    ///   nothing recorded; `.Storage`); `.InvalidInput`, nothing recorded or
    ///   run, when `tool` is not the call's tool (its descriptor's name is
    ///   not `call.toolName`).
    public func executeNow(
        operationId: String, round: UInt32, call: ToolCall, tool: any SyncTool
    ) throws -> CallOutcome {
        try Self.check(tool, runs: call)
        return try walk(from: start(operationId: operationId, round: round, call: call), tool: tool)
    }

    /// Refuses a tool that is not the one the call names: its side effect
    /// would run, and be recorded and replayed, as the call's.
    private static func check(_ tool: any SyncTool, runs call: ToolCall) throws {
        let name = try tool.descriptor().name
        guard name == call.toolName else {
            throw LedgerError.InvalidInput(
                message: "the tool given (\(name)) is not the call's tool (\(call.toolName)); nothing was recorded")
        }
    }

    /// Walks one call's steps from `first` on this thread, running `tool`
    /// for each attempt or lookup the library hands out.
    private func walk(from first: CallerStep, tool: any SyncTool) throws -> CallOutcome {
        var step = first
        // Bounded by the library's attempts; a longer walk is a bug.
        for _ in 0..<64 {
            switch step {
            case .done(let outcome):
                return outcome
            case .perform(let attempt):
                let outcome: PerformOutcome
                do {
                    outcome = try tool.performNow(request: attempt.request)
                } catch {
                    outcome = .unknown(reason: "\(type(of: error)) thrown by the tool")
                }
                step = try report(attempt: attempt, outcome: outcome)
            case .lookup(let attempt):
                do {
                    let found = try tool.lookupNow(request: attempt.request)
                    step = try reportLookup(attempt: attempt, found: found)
                } catch {
                    step = try reportLookupError(attempt: attempt, message: "the lookup threw")
                }
            case .retry(let attempt, let afterMs):
                Thread.sleep(forTimeInterval: Double(afterMs) / 1000)
                step = try retry(attempt: attempt)
            }
        }
        throw LedgerError.Internal(message: "a call did not settle within its steps")
    }

    /// `executeNow` on `queue` (by default the layer's ledger queue), never
    /// on the caller's thread or actor and never on Swift concurrency's
    /// cooperative pool, which must not wait on the disk. Not cancellable
    /// once started: a cancelled task still waits and then sees the outcome.
    ///
    /// A replay the library answers at once (`startNow`: the ledger's one
    /// connection free at this moment, a read that never waits) is answered
    /// here, with no hop; anything else — a new call, the connection held by
    /// another call across its fsync or the deferred commits' flush — goes
    /// to `queue`. Bad input and a suspended ledger throw what the queue's
    /// path throws.
    public func execute(
        operationId: String, round: UInt32, call: ToolCall, tool: any SyncTool,
        queue: DispatchQueue = AsyncLedger.defaultQueue
    ) async throws -> CallOutcome {
        try Self.check(tool, runs: call)
        let now = try startNow(operationId: operationId, round: round, call: call)
        if case .done(let outcome)? = now {
            return outcome
        }
        return try await withCheckedThrowingContinuation { continuation in
            queue.async {
                continuation.resume(with: Result {
                    // `startNow` only answers `.done`; any other step is walked here.
                    try self.walk(
                        from: now ?? self.start(operationId: operationId, round: round, call: call),
                        tool: tool)
                })
            }
        }
    }
}
