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
    /// for each attempt or lookup the library hands out. When `gaveUp`
    /// answers true as an attempt is handed out (the awaiting task was
    /// cancelled before its tool ran), the tool does not run: the attempt
    /// is recorded as never sent (`abandonAttempt`: a first attempt failed
    /// before commit, retryable; a same-key resend back to unknown) and
    /// `CancellationError` is thrown; so it is before a retry's backoff.
    private func walk(
        from first: CallerStep, tool: any SyncTool, gaveUp: () -> Bool = { false }
    ) throws -> CallOutcome {
        var step = first
        // Bounded by the library's attempts (two steps per retried attempt).
        for _ in 0..<Self.maxSteps {
            switch step {
            case .done(let outcome):
                return outcome
            case .perform(let attempt):
                if gaveUp() {
                    // A failure to record it leaves the attempt this
                    // executor's orphan (reconciled at the next ask): the
                    // caller still gets its cancellation.
                    giveBack(attempt, reason: "the caller was cancelled before the tool ran")
                    throw CancellationError()
                }
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
                // Nothing is outstanding between a failure and its retry.
                if gaveUp() { throw CancellationError() }
                Thread.sleep(forTimeInterval: Double(afterMs) / 1000)
                step = try retry(attempt: attempt)
            }
        }
        // Past the limit (a library bug, or more attempts than the walk
        // allows): what the library handed out last is given back, so that
        // nothing is left in flight — a `Perform` recorded as never sent (the
        // tool did not run it), a `Lookup` reported as failed (the outcome
        // stays unknown) — then the walk throws.
        switch step {
        case .done(let outcome):
            return outcome
        case .perform(let attempt):
            giveBack(attempt, reason: "the caller's step limit was reached")
        case .lookup(let attempt):
            _ = try? reportLookupError(attempt: attempt, message: "the caller's step limit was reached")
        case .retry:
            break
        }
        throw LedgerError.Internal(message: "a call did not settle within its steps")
    }

    /// The most steps one call's walk takes.
    static let maxSteps = 1024

    /// Records a handed-out attempt whose tool did not run as never sent
    /// (`abandonAttempt`: a first attempt failed before commit, retryable;
    /// a same-key resend back to unknown). A read-only attempt has nothing
    /// recorded; a failure to record it is left to the next ask's
    /// reconciliation (the attempt is this executor's orphan).
    private func giveBack(_ attempt: CallerAttempt, reason: String) {
        guard !attempt.readOnly else { return }
        _ = try? abandonAttempt(
            executionId: attempt.request.executionId, attempt: attempt.request.attempt, reason: reason)
    }

    /// `executeNow` on `queue` (by default the layer's ledger queue), never
    /// on the caller's thread or actor and never on Swift concurrency's
    /// cooperative pool, which must not wait on the disk. Not cancellable
    /// once its tool has started: a cancelled task still waits and then
    /// sees the outcome. A task cancelled before that runs no tool: one
    /// cancelled when it calls throws `CancellationError` with nothing
    /// begun; one cancelled while its call waits for `queue` or is begun
    /// has the attempt it was handed recorded as never sent (the next ask
    /// runs it) and throws `CancellationError`.
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
        // A cancelled task starts nothing.
        try Task.checkCancellation()
        let cancelled = CancelledFlag()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                queue.async {
                    continuation.resume(with: Result {
                        // `startNow` only answers `.done`; any other step is walked here.
                        try self.walk(
                            from: now ?? self.start(operationId: operationId, round: round, call: call),
                            tool: tool, gaveUp: { cancelled.isSet })
                    })
                }
            }
        } onCancel: {
            cancelled.set()
        }
    }
}

extension ToolExecutor {
    /// Runs every call of one model response on the calling thread's
    /// behalf: the library's caller-driven `startRound` checks every call
    /// (a bad call anywhere: nothing recorded) and begins the
    /// side-effecting ones in one durable transaction (one sync for the
    /// round); then each call is walked as `executeNow` walks one, the
    /// calls in parallel (on the calling thread and threads started for the
    /// round), at most the executor's `maxParallel()` tools at a time. Blocks until
    /// every call has ended; outcomes in call order. If a call's walk fails
    /// (a storage error), the others still finish and the first error is
    /// thrown. Call it off the main thread (or use
    /// `executeRound(operationId:round:calls:tools:queue:)`).
    ///
    /// - Throws: `LedgerError` as `startRound`; `.InvalidInput`, nothing
    ///   recorded or run, when a call's tool is not among `tools` (by its
    ///   descriptor's name).
    public func executeRoundNow(
        operationId: String, round: UInt32, calls: [ToolCall], tools: [any SyncTool]
    ) throws -> [CallOutcome] {
        let byName = try Self.tools(tools, for: calls)
        return try walkRound(
            from: startRound(operationId: operationId, round: round, calls: calls), of: calls, tools: byName)
    }

    /// `executeRoundNow` on `queue` (by default the layer's ledger queue),
    /// never on the caller's thread or actor and never on Swift
    /// concurrency's cooperative pool. Not cancellable once the round is
    /// begun: a cancelled task's calls whose tool had not started are
    /// recorded as never sent (the next ask runs them) and it throws
    /// `CancellationError`; a tool that had started finishes and is
    /// recorded. A task cancelled before the round is begun starts nothing.
    public func executeRound(
        operationId: String, round: UInt32, calls: [ToolCall], tools: [any SyncTool],
        queue: DispatchQueue = AsyncLedger.defaultQueue
    ) async throws -> [CallOutcome] {
        let byName = try Self.tools(tools, for: calls)
        try Task.checkCancellation()
        let cancelled = CancelledFlag()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                queue.async {
                    continuation.resume(with: Result {
                        if cancelled.isSet { throw CancellationError() }
                        return try self.walkRound(
                            from: self.startRound(operationId: operationId, round: round, calls: calls),
                            of: calls, tools: byName, gaveUp: { cancelled.isSet })
                    })
                }
            }
        } onCancel: {
            cancelled.set()
        }
    }

    /// The tools of a round by name; refuses a call whose tool is missing.
    private static func tools(_ tools: [any SyncTool], for calls: [ToolCall]) throws -> [String: any SyncTool] {
        var byName: [String: any SyncTool] = [:]
        for tool in tools {
            byName[try tool.descriptor().name] = tool
        }
        if let missing = calls.first(where: { byName[$0.toolName] == nil }) {
            throw LedgerError.InvalidInput(
                message: "no tool was given for \(missing.toolName) (call \(missing.callId)); nothing was recorded")
        }
        return byName
    }

    /// Walks each of a round's first steps to its outcome, in parallel: up
    /// to `maxParallel()` workers (the calling thread and threads started
    /// for the round: blocking tools wait on the network, so the bound is
    /// the executor's, not the CPU count) take the calls in order. Outcomes
    /// in call order, or the first error once every walk has ended.
    private func walkRound(
        from steps: [CallerStep], of calls: [ToolCall], tools: [String: any SyncTool],
        gaveUp: @escaping @Sendable () -> Bool = { false }
    ) throws -> [CallOutcome] {
        guard steps.count == calls.count else {
            // Nothing handed out is left outstanding, even on a library bug.
            for case .perform(let attempt) in steps {
                giveBack(attempt, reason: "the round's steps did not match its calls")
            }
            throw LedgerError.Internal(message: "a round answered \(steps.count) steps for \(calls.count) calls")
        }
        let ended = RoundResults(count: steps.count)
        var pending: [Int] = []
        for (index, step) in steps.enumerated() {
            if case .done(let outcome) = step {
                ended.set(index, .success(outcome))
            } else {
                pending.append(index)
            }
        }
        let queue = RoundQueue(pending)
        let work: @Sendable () -> Void = {
            while let index = queue.next() {
                guard let tool = tools[calls[index].toolName] else {
                    if case .perform(let attempt) = steps[index] {
                        self.giveBack(attempt, reason: "the round's tool went missing")
                    }
                    ended.set(index, .failure(LedgerError.Internal(message: "a round's tool went missing")))
                    continue
                }
                ended.set(index, Result { try self.walk(from: steps[index], tool: tool, gaveUp: gaveUp) })
            }
        }
        let width = min(max(1, Int(min(maxParallel(), 1024))), pending.count)
        let workers = DispatchGroup()
        for _ in 1..<max(1, width) {
            workers.enter()
            Thread {
                work()
                workers.leave()
            }.start()
        }
        work()
        workers.wait()
        return try ended.outcomes()
    }
}

/// The calls of a round left to walk, taken in order by the workers.
private final class RoundQueue: @unchecked Sendable {
    private let lock = NSLock()
    private var indices: ArraySlice<Int>

    init(_ indices: [Int]) { self.indices = indices[...] }

    /// The next call to walk, if any.
    func next() -> Int? { lock.withLock { indices.popFirst() } }
}

/// The outcomes of a round's walks, set from the workers' threads.
private final class RoundResults: @unchecked Sendable {
    private let lock = NSLock()
    private var results: [Result<CallOutcome, Error>?]

    init(count: Int) { results = Array(repeating: nil, count: count) }

    /// Records call `index`'s result.
    func set(_ index: Int, _ result: Result<CallOutcome, Error>) {
        lock.withLock { results[index] = result }
    }

    /// The outcomes in call order, or the first error (in call order).
    func outcomes() throws -> [CallOutcome] {
        try lock.withLock { results }.map { result in
            guard let result else { throw LedgerError.Internal(message: "a round's call did not end") }
            return try result.get()
        }
    }
}

/// Set once, from a task's cancellation handler; read on the queue.
private final class CancelledFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false

    /// Whether the task was cancelled.
    var isSet: Bool { lock.withLock { value } }

    /// Marks the task cancelled.
    func set() { lock.withLock { value = true } }
}
