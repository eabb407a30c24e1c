// Calls whose Task is cancelled, whose tool throws `CancellationError`, or
// whose async tool never returns until it is cancelled, for the three kinds
// of downstream: a key (the downstream dedupes by it: one effect per key), a
// lookup, and neither. Each test counts the effects at the downstream, reads
// what the ledger stored and asks for the call again: nothing is sent twice,
// nothing is left `inFlight`, a key call is resent under the same key, a
// lookup call is looked up, a neither call answers `unknown`.

import Foundation
import ToolLedger
import ToolLedgerTestTools
import XCTest

/// What the downstream offers after an unknown outcome.
enum DownstreamKind: Sendable, CaseIterable {
    case key, lookup, neither
}

/// Keys seen by a tool, from whatever thread.
final class Keys: @unchecked Sendable {
    private let lock = NSLock()
    private var seen: [String] = []

    func add(_ key: String) { lock.withLock { seen.append(key) } }
    var distinct: Int { lock.withLock { Set(seen).count } }
}

private func oddDescriptor(_ kind: DownstreamKind) -> ToolDescriptor {
    ToolDescriptor(
        name: "odd", version: 1, effect: .sideEffect, batch: .atomic,
        idempotencyKey: kind == .key, lookup: kind == .lookup)
}

/// Sends under `key`: a key downstream makes one effect per key.
private func send(_ downstream: Downstream, _ kind: DownstreamKind, _ key: String) throws -> String {
    if kind == .key, let id = try downstream.find(key: key) { return id }
    return try downstream.perform(key: key)
}

/// An async tool: sends, then on its first call awaits `afterFirstEffect`.
final class OddTool: ToolHandler {
    let downstream: Downstream
    let kind: DownstreamKind
    let calls = SyncCounter()
    let lookups = SyncCounter()
    let keys = Keys()
    /// Set when a perform saw its task cancelled.
    let sawCancellation = SyncCounter()
    private let afterFirstEffect: @Sendable (OddTool) async throws -> Void

    init(
        _ downstream: Downstream, _ kind: DownstreamKind,
        afterFirstEffect: @escaping @Sendable (OddTool) async throws -> Void
    ) {
        self.downstream = downstream
        self.kind = kind
        self.afterFirstEffect = afterFirstEffect
    }

    func descriptor() throws -> ToolDescriptor { oddDescriptor(kind) }

    func perform(request: ToolRequest) async throws -> PerformOutcome {
        calls.increment()
        let first = calls.value == 1
        keys.add(request.downstreamKey)
        let id = try send(downstream, kind, request.downstreamKey)
        if first { try await afterFirstEffect(self) }
        return .committed(resultJson: sentJSON(id), externalId: id)
    }

    func lookup(request: ToolRequest) async throws -> LookupOutcome {
        lookups.increment()
        guard let id = try downstream.find(key: request.downstreamKey) else { return .notFound }
        return .found(resultJson: sentJSON(id), externalId: id)
    }

    func approvalPreview(argumentsJson: String) throws -> String? { nil }
}

/// `OddTool` as a `SyncTool`.
final class OddSync: SyncTool {
    let downstream: Downstream
    let kind: DownstreamKind
    let calls = SyncCounter()
    let lookups = SyncCounter()
    let keys = Keys()
    private let afterFirstEffect: @Sendable () throws -> Void

    init(_ downstream: Downstream, _ kind: DownstreamKind, afterFirstEffect: @escaping @Sendable () throws -> Void) {
        self.downstream = downstream
        self.kind = kind
        self.afterFirstEffect = afterFirstEffect
    }

    func descriptor() throws -> ToolDescriptor { oddDescriptor(kind) }

    func performNow(request: ToolRequest) throws -> PerformOutcome {
        calls.increment()
        let first = calls.value == 1
        keys.add(request.downstreamKey)
        let id = try send(downstream, kind, request.downstreamKey)
        if first { try afterFirstEffect() }
        return .committed(resultJson: sentJSON(id), externalId: id)
    }

    func lookupNow(request: ToolRequest) throws -> LookupOutcome {
        lookups.increment()
        guard let id = try downstream.find(key: request.downstreamKey) else { return .notFound }
        return .found(resultJson: sentJSON(id), externalId: id)
    }
}

private func oddCall() -> ToolCall {
    ToolCall(provider: .custom, callId: "call_1", toolName: "odd", arguments: #"{"to":"a@example.com"}"#)
}

private let executionId = "op_1:round_0:call_1:odd:v1"

/// Waits (polling) until `condition` holds, up to 30 s.
private func eventually(_ what: String, _ condition: () throws -> Bool) async throws {
    let deadline = Date().addingTimeInterval(30)
    while try !condition() {
        if Date() > deadline { throw UnexpectedOutcome() }
        try await Task.sleep(nanoseconds: 10_000_000)
    }
}

final class InterruptionTests: XCTestCase {
    private func fixture(
        _ kind: DownstreamKind, config: ExecutorConfig = ExecutorConfig(),
        _ make: (Downstream) -> any ToolHandler
    ) throws -> (ToolExecutor, Ledger, Downstream, any ToolHandler) {
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: "\(dir)/ledger.db", config: LedgerConfig())
        let downstream = try Downstream(directory: "\(dir)/downstream")
        let tool = make(downstream)
        return (try executor(ledger, [tool], config: config), ledger, downstream, tool)
    }

    /// What a call whose first attempt ended without an answer must end as:
    /// a key call resent once under the same key, a lookup call found, a
    /// neither call unknown; one effect.
    private func checkSettled(
        _ out: CallOutcome, _ kind: DownstreamKind, calls: Int, lookups: Int, keys: Int,
        _ downstream: Downstream, _ what: String, line: UInt = #line
    ) throws {
        switch kind {
        case .key:
            _ = try completed(out, line: line)
            XCTAssertEqual(calls, 2, "\(what): one resend", line: line)
            XCTAssertEqual(keys, 1, "\(what): the same key", line: line)
        case .lookup:
            _ = try completed(out, line: line)
            XCTAssertEqual(calls, 1, "\(what): no second perform", line: line)
            XCTAssertEqual(lookups, 1, "\(what): one lookup", line: line)
        case .neither:
            _ = try unknown(out, line: line)
            XCTAssertEqual(calls, 1, "\(what): never resent", line: line)
        }
        XCTAssertEqual(try downstream.count(), 1, "\(what): effects", line: line)
    }

    /// A Task cancelled while its async tool runs: the call is not
    /// cancellable once started, so the task waits for the tool, and the
    /// outcome is recorded; the repeat replays it.
    func testATaskCancelledWhileItsAsyncToolRunsStillRecordsTheCall() async throws {
        for kind in DownstreamKind.allCases {
            let (executor, ledger, downstream, handler) = try fixture(kind) { d in
                OddTool(d, kind) { _ in try await Task.sleep(nanoseconds: 300_000_000) }
            }
            let tool = try XCTUnwrap(handler as? OddTool)
            let task = Task { try await executor.execute(operationId: "op_1", round: 0, call: oddCall()) }
            try await eventually("sent") { try downstream.count() == 1 }
            task.cancel()
            let first = await task.result
            switch first {
            case .success(let out): XCTAssertFalse(try completed(out).replayed, "\(kind)")
            case .failure(let error): XCTAssertTrue(error is CancellationError, "\(kind): \(error)")
            }
            var again = try await executor.execute(operationId: "op_1", round: 0, call: oddCall())
            if case .inFlight = again {
                try await Task.sleep(nanoseconds: 500_000_000)
                again = try await executor.execute(operationId: "op_1", round: 0, call: oddCall())
            }
            XCTAssertTrue(try completed(again).replayed, "\(kind)")
            XCTAssertEqual(try ledger.get(executionId: executionId)?.status, .committed)
            XCTAssertEqual(tool.calls.value, 1, "\(kind)")
            XCTAssertEqual(try downstream.count(), 1, "\(kind)")
        }
    }

    /// A Task cancelled while its SyncTool runs (`execute(…tool:)`): the same.
    func testATaskCancelledWhileItsSyncToolRunsStillRecordsTheCall() async throws {
        for kind in DownstreamKind.allCases {
            let (executor, ledger, downstream, handler) = try fixture(kind) { d in
                OddSync(d, kind) { Thread.sleep(forTimeInterval: 0.3) }
            }
            let tool = try XCTUnwrap(handler as? OddSync)
            let task = Task { try await executor.execute(operationId: "op_1", round: 0, call: oddCall(), tool: tool) }
            try await eventually("sent") { try downstream.count() == 1 }
            task.cancel()
            if case .success(let out) = await task.result {
                XCTAssertFalse(try completed(out).replayed, "\(kind)")
            }
            let again = try await executor.execute(operationId: "op_1", round: 0, call: oddCall(), tool: tool)
            XCTAssertTrue(try completed(again).replayed, "\(kind)")
            XCTAssertEqual(try ledger.get(executionId: executionId)?.status, .committed)
            XCTAssertEqual(tool.calls.value, 1, "\(kind)")
            XCTAssertEqual(try downstream.count(), 1, "\(kind)")
        }
    }

    /// An async tool that throws `CancellationError` (its own): an unknown
    /// outcome, reconciled as its downstream allows.
    func testAnAsyncToolThrowingCancellationErrorIsAnUnknownOutcome() async throws {
        for kind in DownstreamKind.allCases {
            let (executor, _, downstream, handler) = try fixture(kind, config: ExecutorConfig(performTimeoutMs: nil)) { d in
                OddTool(d, kind) { _ in throw CancellationError() }
            }
            let tool = try XCTUnwrap(handler as? OddTool)
            let out = try await executor.execute(operationId: "op_1", round: 0, call: oddCall())
            try checkSettled(
                out, kind, calls: tool.calls.value, lookups: tool.lookups.value, keys: tool.keys.distinct,
                downstream, "\(kind)")
            let again = try await executor.execute(operationId: "op_1", round: 0, call: oddCall())
            if case .inFlight = again { XCTFail("\(kind): in flight") }
        }
    }

    /// A SyncTool that throws `CancellationError`: the same.
    func testASyncToolThrowingCancellationErrorIsAnUnknownOutcome() throws {
        for kind in DownstreamKind.allCases {
            let (executor, ledger, downstream, handler) = try fixture(kind) { d in
                OddSync(d, kind) { throw CancellationError() }
            }
            let tool = try XCTUnwrap(handler as? OddSync)
            let out = try executor.executeNow(operationId: "op_1", round: 0, call: oddCall(), tool: tool)
            try checkSettled(
                out, kind, calls: tool.calls.value, lookups: tool.lookups.value, keys: tool.keys.distinct,
                downstream, "\(kind)")
            let status = try ledger.get(executionId: executionId)?.status
            XCTAssertEqual(status, kind == .neither ? .outcomeUnknown : .committed, "\(kind)")
            let again = try executor.executeNow(operationId: "op_1", round: 0, call: oddCall(), tool: tool)
            if case .inFlight = again { XCTFail("\(kind): in flight") }
        }
    }

    /// An async tool that never returns until it is cancelled: the perform
    /// timeout ends the attempt (unknown), the tool's task is cancelled, and
    /// the call is reconciled as its downstream allows.
    func testAnAsyncToolThatNeverReturnsUntilCancelledEndsAtThePerformTimeout() async throws {
        for kind in DownstreamKind.allCases {
            let (executor, _, downstream, handler) = try fixture(kind, config: ExecutorConfig(performTimeoutMs: 300)) { d in
                OddTool(d, kind) { tool in
                    while !Task.isCancelled { try? await Task.sleep(nanoseconds: 5_000_000) }
                    tool.sawCancellation.increment()
                    throw CancellationError()
                }
            }
            let tool = try XCTUnwrap(handler as? OddTool)
            let started = Date()
            let out = try await executor.execute(operationId: "op_1", round: 0, call: oddCall())
            XCTAssertLessThan(Date().timeIntervalSince(started), 10, "\(kind)")
            try checkSettled(
                out, kind, calls: tool.calls.value, lookups: tool.lookups.value, keys: tool.keys.distinct,
                downstream, "\(kind)")
            try await eventually("cancelled") { tool.sawCancellation.value == 1 }
        }
    }
    /// A Task cancelled before it calls `execute(…tool:)` starts nothing;
    /// one cancelled while its call waits for the queue (before the tool
    /// runs) runs no tool: the attempt handed out is recorded as never sent
    /// and the next ask runs it.
    func testATaskCancelledBeforeItsSyncToolStartsRunsNoTool() async throws {
        for kind in DownstreamKind.allCases {
            let (executor, ledger, downstream, handler) = try fixture(kind) { d in OddSync(d, kind) {} }
            let tool = try XCTUnwrap(handler as? OddSync)
            let task = Task {
                withUnsafeCurrentTask { $0?.cancel() }
                return try await executor.execute(operationId: "op_1", round: 0, call: oddCall(), tool: tool)
            }
            let first = await task.result
            if case .success(let out) = first { XCTFail("\(kind): ran for a cancelled task: \(out)") }
            XCTAssertEqual(tool.calls.value, 0, "\(kind): the tool ran for a cancelled task")
            XCTAssertNil(try ledger.get(executionId: executionId), "\(kind): begun for a cancelled task")

            // Cancelled while the call waits for its queue.
            let queue = DispatchQueue(label: "held")
            let gate = DispatchSemaphore(value: 0)
            queue.async { _ = gate.wait(timeout: .now() + 10) }
            let call2 = ToolCall(provider: .custom, callId: "call_2", toolName: "odd", arguments: #"{"to":"a@example.com"}"#)
            let task2 = Task { try await executor.execute(operationId: "op_1", round: 0, call: call2, tool: tool, queue: queue) }
            try await Task.sleep(nanoseconds: 200_000_000)
            task2.cancel()
            gate.signal()
            let second = await task2.result
            if case .success(let out) = second { XCTFail("\(kind): ran for a task cancelled while it waited: \(out)") }
            XCTAssertEqual(tool.calls.value, 0, "\(kind): the tool ran for a task cancelled while it waited")
            let id2 = executionId.replacingOccurrences(of: "call_1", with: "call_2")
            XCTAssertEqual(try ledger.get(executionId: id2)?.status, .failedBeforeCommit, "\(kind)")
            _ = try completed(executor.executeNow(operationId: "op_1", round: 0, call: call2, tool: tool))
            XCTAssertEqual(tool.calls.value, 1, "\(kind)")
            XCTAssertEqual(try downstream.count(), 1, "\(kind): effects")
        }
    }
}
