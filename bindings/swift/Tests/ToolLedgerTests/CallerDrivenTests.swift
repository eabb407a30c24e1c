// Caller-driven calls from Swift: a SyncTool runs on the caller's thread
// through ToolExecutor.start / report, and the exactly-once rules still hold:
// one perform per call, a stale report refused, the current attempt's result
// standing. (A process killed between the effect and its report:
// CrashRecoveryTests.) Effects are counted at the downstream.

import Foundation
import ToolLedger
import ToolLedgerTestTools
import XCTest

final class CallerDrivenTests: XCTestCase {
    private func fixture(_ tool: (Downstream) -> SyncSend) throws -> (ToolExecutor, Ledger, SyncSend, Downstream) {
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: "\(dir)/ledger.db", config: LedgerConfig())
        let downstream = try Downstream(directory: "\(dir)/downstream")
        let sync = tool(downstream)
        return (try executor(ledger, [sync]), ledger, sync, downstream)
    }

    private func attempt(_ step: CallerStep, line: UInt = #line) throws -> CallerAttempt {
        guard case .perform(let attempt) = step else {
            XCTFail("expected .perform, got \(step)", line: line)
            throw UnexpectedOutcome()
        }
        return attempt
    }

    private func outcome(_ step: CallerStep, line: UInt = #line) throws -> CallOutcome {
        guard case .done(let outcome) = step else {
            XCTFail("expected .done, got \(step)", line: line)
            throw UnexpectedOutcome()
        }
        return outcome
    }

    /// Refuses every attempt, retryably (a 503 before anything was done).
    private final class AlwaysRefused: SyncTool, @unchecked Sendable {
        let calls = SyncCounter()

        func descriptor() throws -> ToolDescriptor {
            ToolDescriptor(name: "send_email", version: 1, effect: .sideEffect, batch: .atomic)
        }

        func performNow(request: ToolRequest) throws -> PerformOutcome {
            calls.increment()
            return .failedBeforeCommit(reason: "503", retryable: true)
        }
    }

    func testAWalkPastTheStepLimitLeavesNothingInFlight() throws {
        // 600 retryable refusals take 1,200 steps, past the walk's 1,024: the
        // attempt handed out last is recorded as never sent before the walk
        // throws, so the next ask goes on instead of answering InFlight for
        // the life of the process (with a limit of 64 it was left executing).
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: "\(dir)/ledger.db", config: LedgerConfig())
        let tool = AlwaysRefused()
        let executor = try executor(
            ledger, [tool], config: ExecutorConfig(maxAttempts: 600, backoffBaseMs: 0, backoffMaxMs: 0))
        XCTAssertThrowsError(try executor.executeNow(operationId: "op_1", round: 0, call: emailCall(), tool: tool))
        XCTAssertEqual(tool.calls.value, 512)
        let stored = try XCTUnwrap(ledger.list(operationId: "op_1").first)
        XCTAssertNotEqual(stored.status, .executing)
        // The next ask goes on with the attempts left, to the last one's
        // refusal (attempt 513 was handed out and never run).
        let again = try executor.executeNow(operationId: "op_1", round: 0, call: emailCall(), tool: tool)
        guard case .failed = again else { return XCTFail("expected .failed, got \(again)") }
        XCTAssertEqual(tool.calls.value, 599)
    }

    func testASyncToolRunsOnceOnTheCallersThreadAndARepeatReplays() async throws {
        let (executor, _, tool, downstream) = try fixture { SyncSend(downstream: $0) }
        let done = try completed(
            executor.executeNow(operationId: "op_1", round: 0, call: emailCall(), tool: tool))
        XCTAssertFalse(done.replayed)
        let again = try completed(
            await executor.execute(operationId: "op_1", round: 0, call: emailCall(), tool: tool))
        XCTAssertTrue(again.replayed)
        XCTAssertEqual(again.resultJson, done.resultJson)
        XCTAssertEqual(tool.calls.value, 1)
        XCTAssertEqual(try downstream.count(), 1)
    }

    /// A serial queue held by a blocked item until `release()` (or 10 s):
    /// whatever `execute` sends to it cannot run before then.
    private final class HeldQueue: Sendable {
        let queue = DispatchQueue(label: "held")
        private let gate = DispatchSemaphore(value: 0)

        init() {
            let gate = self.gate
            queue.async { _ = gate.wait(timeout: .now() + 10) }
        }

        func release() { gate.signal() }
    }

    func testTheAsyncExecuteAnswersAReplayInPlaceWithoutItsQueue() async throws {
        let (executor, ledger, tool, downstream) = try fixture { SyncSend(downstream: $0, idempotencyKey: true) }
        let done = try completed(
            executor.executeNow(operationId: "op_1", round: 0, call: emailCall(), tool: tool))
        let stored = try XCTUnwrap(ledger.get(executionId: done.executionId))
        let held = HeldQueue()
        // The queue cannot run anything: a replay that needed it would wait
        // the 10 s of the held item.
        let started = Date()
        for _ in 0..<3 {
            let again = try completed(
                await executor.execute(operationId: "op_1", round: 0, call: emailCall(), tool: tool, queue: held.queue))
            XCTAssertTrue(again.replayed)
            XCTAssertEqual(again.executionId, done.executionId)
            XCTAssertEqual(again.resultJson, stored.resultJson)
            XCTAssertEqual(again.externalId, stored.externalId)
            let blocking = try completed(executor.executeNow(operationId: "op_1", round: 0, call: emailCall(), tool: tool))
            XCTAssertEqual(
                [again.executionId, again.resultJson, again.externalId ?? "", "\(again.replayed)", "\(again.partial)"],
                [blocking.executionId, blocking.resultJson, blocking.externalId ?? "", "\(blocking.replayed)",
                 "\(blocking.partial)"])
        }
        XCTAssertLessThan(Date().timeIntervalSince(started), 5, "a replay waited for the queue")
        // A new call goes to the queue: it cannot finish before the queue runs.
        let newCall = Task {
            try await executor.execute(
                operationId: "op_1", round: 0, call: emailCall(callId: "call_2"), tool: tool, queue: held.queue)
        }
        try await Task.sleep(nanoseconds: 100_000_000)
        XCTAssertEqual(tool.calls.value, 1, "the new call ran before its queue did")
        held.release()
        let ran = try completed(await newCall.value)
        XCTAssertFalse(ran.replayed)
        XCTAssertEqual(tool.calls.value, 2)
        XCTAssertEqual(try downstream.count(), 2)
        XCTAssertEqual(executor.metrics().replays, 6)
    }

    func testTheAsyncExecuteOfASuspendedLedgerThrowsSuspendedWithoutItsQueue() async throws {
        let (executor, ledger, tool, downstream) = try fixture { SyncSend(downstream: $0, idempotencyKey: true) }
        _ = try executor.executeNow(operationId: "op_1", round: 0, call: emailCall(), tool: tool)
        try ledger.suspend()
        let held = HeldQueue()
        defer { held.release() }
        for call in [emailCall(), emailCall(callId: "call_2")] {
            do {
                _ = try await executor.execute(operationId: "op_1", round: 0, call: call, tool: tool, queue: held.queue)
                XCTFail("a suspended ledger answered")
            } catch {
                XCTAssertEqual(error as? LedgerError, .Suspended)
            }
        }
        XCTAssertThrowsError(try executor.executeNow(operationId: "op_1", round: 0, call: emailCall(), tool: tool)) {
            XCTAssertEqual($0 as? LedgerError, .Suspended)
        }
        XCTAssertEqual(tool.calls.value, 1)
        XCTAssertEqual(try downstream.count(), 1)
    }

    func testTwoCallersOfOneCallGetOnePerform() throws {
        let (executor, _, _, downstream) = try fixture { SyncSend(downstream: $0) }
        let first = try attempt(executor.start(operationId: "op_1", round: 0, call: emailCall()))
        guard case .inFlight = try outcome(executor.start(operationId: "op_1", round: 0, call: emailCall())) else {
            return XCTFail("the second caller was not told the call is in flight")
        }
        let id = try downstream.perform(key: first.request.downstreamKey)
        let done = try completed(outcome(executor.report(
            attempt: first, outcome: .committed(resultJson: json(["id": id]), externalId: id))))
        XCTAssertFalse(done.replayed)
        let later = try completed(outcome(executor.start(operationId: "op_1", round: 0, call: emailCall())))
        XCTAssertTrue(later.replayed)
        XCTAssertEqual(try downstream.count(), 1)
    }

    func testAStaleReportIsRefusedAndTheCurrentAttemptsResultStands() throws {
        let (executor, ledger, _, _) = try fixture { SyncSend(downstream: $0, idempotencyKey: true, lookup: false) }
        let a1 = try attempt(executor.start(operationId: "op_1", round: 0, call: emailCall()))
        // Attempt 1 times out: the key tool is resent as attempt 2, same key.
        let a2 = try attempt(executor.report(attempt: a1, outcome: .unknown(reason: "timed out")))
        XCTAssertEqual(a2.request.attempt, 2)
        XCTAssertEqual(a2.request.downstreamKey, a1.request.downstreamKey)
        // Attempt 1's answer arrives late: refused; attempt 2 still runs.
        guard case .inFlight = try outcome(executor.report(
            attempt: a1, outcome: .committed(resultJson: #"{"late":1}"#, externalId: nil)))
        else { return XCTFail("a stale report was not refused") }
        let record = try XCTUnwrap(try ledger.get(executionId: a1.request.executionId))
        XCTAssertEqual(record.status, .executing)
        XCTAssertEqual(record.attemptCount, 2)
        let done = try completed(outcome(executor.report(
            attempt: a2, outcome: .committed(resultJson: #"{"fresh":2}"#, externalId: nil))))
        XCTAssertEqual(done.resultJson, #"{"fresh":2}"#)
        let again = try completed(outcome(executor.report(
            attempt: a1, outcome: .committed(resultJson: #"{"late":1}"#, externalId: nil))))
        XCTAssertTrue(again.replayed)
        XCTAssertEqual(again.resultJson, #"{"fresh":2}"#)
    }
}
