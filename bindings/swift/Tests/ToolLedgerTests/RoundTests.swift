// Rounds of SyncTools from Swift: executeRoundNow and the async
// executeRound begin every call of one model response in one durable
// transaction (the library's startRound) and walk the calls in parallel:
// one effect per call, a repeat replays the round, maxParallel bounds the
// tools running at once, a bad call or a missing tool stops the round with
// nothing recorded, a cancelled task leaves no call in flight. Effects are
// counted at the downstream.

import Foundation
import ToolLedger
import ToolLedgerTestTools
import XCTest

final class RoundTests: XCTestCase {
    /// `send_email` as a SyncTool that counts how many performs run at once;
    /// each waits (up to 10 s) for `allStarted` to be running, or for `gate`.
    private final class RoundSend: SyncTool, @unchecked Sendable {
        let downstream: Downstream
        let allStarted: Int
        let gate: DispatchSemaphore?
        private let lock = NSLock()
        private var running = 0
        private(set) var most = 0
        let calls = SyncCounter()

        init(downstream: Downstream, allStarted: Int = 1, gate: DispatchSemaphore? = nil) {
            self.downstream = downstream
            self.allStarted = allStarted
            self.gate = gate
        }

        var runningNow: Int { lock.withLock { running } }

        func descriptor() throws -> ToolDescriptor {
            ToolDescriptor(
                name: "send_email", version: 1, effect: .sideEffect, batch: .atomic, idempotencyKey: true)
        }

        func performNow(request: ToolRequest) throws -> PerformOutcome {
            calls.increment()
            lock.withLock {
                running += 1
                most = max(most, running)
            }
            defer { lock.withLock { running -= 1 } }
            let deadline = Date().addingTimeInterval(10)
            // `calls` only grows: every tool of the round has started once it
            // reaches allStarted (the first to finish does not undo that).
            while calls.value < allStarted && Date() < deadline { usleep(1_000) }
            if let gate { _ = gate.wait(timeout: .now() + 10) }
            usleep(20_000)
            let id = try downstream.find(key: request.downstreamKey) ?? downstream.perform(key: request.downstreamKey)
            return .committed(resultJson: sentJSON(id), externalId: id)
        }
    }

    private func emails(_ n: Int) -> [ToolCall] {
        (0..<n).map { emailCall(callId: "call_\($0)", to: "u\($0)@example.com") }
    }

    private func fixture(maxParallel: UInt32 = 4, _ make: (Downstream) -> RoundSend) throws
        -> (ToolExecutor, Ledger, RoundSend, Downstream)
    {
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: "\(dir)/ledger.db", config: LedgerConfig())
        let downstream = try Downstream(directory: "\(dir)/downstream")
        let tool = make(downstream)
        let executor = try executor(ledger, [tool], config: ExecutorConfig(maxParallel: maxParallel))
        return (executor, ledger, tool, downstream)
    }

    /// Waits (up to 10 s) until `condition` holds.
    private func waitUntil(_ condition: () -> Bool) async throws {
        let deadline = Date().addingTimeInterval(10)
        while !condition() && Date() < deadline { try await Task.sleep(nanoseconds: 2_000_000) }
    }

    /// Awaits a cancelled round, which must throw `CancellationError`.
    private func expectCancelled(_ round: Task<[CallOutcome], Error>, line: UInt = #line) async {
        do {
            _ = try await round.value
            XCTFail("the cancelled round answered", line: line)
        } catch is CancellationError {
        } catch {
            XCTFail("expected CancellationError, got \(error)", line: line)
        }
    }

    func testARoundRunsItsCallsAtOnceOneEffectEachAndARepeatReplays() async throws {
        let (executor, ledger, tool, downstream) = try fixture { RoundSend(downstream: $0, allStarted: 3) }
        let first = try executor.executeRoundNow(operationId: "op_1", round: 0, calls: emails(3), tools: [tool])
        let done = try first.map { try completed($0) }
        XCTAssertEqual(done.map(\.replayed), [false, false, false])
        XCTAssertEqual(Set(done.map(\.resultJson)).count, 3)
        XCTAssertEqual(tool.most, 3)
        let again = try await executor.executeRound(operationId: "op_1", round: 0, calls: emails(3), tools: [tool])
        let replayed = try again.map { try completed($0) }
        XCTAssertEqual(replayed.map(\.replayed), [true, true, true])
        XCTAssertEqual(replayed.map(\.resultJson), done.map(\.resultJson))
        XCTAssertEqual(tool.calls.value, 3)
        XCTAssertEqual(try downstream.count(), 3)
        XCTAssertEqual(try ledger.list(operationId: "op_1").map(\.status), [.committed, .committed, .committed])
    }

    func testMaxParallelBoundsTheToolsRunningAtOnce() throws {
        // The first two wait for each other: two at once is certain, and the
        // bound keeps it at two.
        let (executor, _, tool, downstream) = try fixture(maxParallel: 2) { RoundSend(downstream: $0, allStarted: 2) }
        let outs = try executor.executeRoundNow(operationId: "op_1", round: 0, calls: emails(5), tools: [tool])
        XCTAssertEqual(try outs.map { try completed($0).replayed }, [false, false, false, false, false])
        XCTAssertEqual(tool.most, 2)
        XCTAssertEqual(try downstream.count(), 5)
    }

    func testABadCallOrAMissingToolStopsTheRoundWithNothingRecorded() throws {
        let (executor, ledger, tool, downstream) = try fixture { RoundSend(downstream: $0) }
        let bad = [
            ToolCall(provider: .custom, callId: "call_j", toolName: "send_email", arguments: #"{"to":"#),
            ToolCall(provider: .custom, callId: "call_x", toolName: "no_such_tool", arguments: "{}"),
        ]
        for call in bad {
            XCTAssertThrowsError(
                try executor.executeRoundNow(operationId: "op_1", round: 0, calls: emails(2) + [call], tools: [tool])
            ) {
                guard case LedgerError.InvalidInput = $0 else { return XCTFail("\($0)") }
            }
        }
        XCTAssertEqual(try ledger.list(operationId: "op_1").count, 0)
        XCTAssertEqual(tool.calls.value, 0)
        XCTAssertEqual(try downstream.count(), 0)
    }

    func testACancelledRoundGivesBackTheCallsThatDidNotRunAndTheNextAskRunsThemOnce() async throws {
        let gate = DispatchSemaphore(value: 0)
        let (executor, ledger, tool, downstream) = try fixture(maxParallel: 1) { RoundSend(downstream: $0, gate: gate) }
        let calls = emails(3)
        let round = Task { try await executor.executeRound(operationId: "op_1", round: 0, calls: calls, tools: [tool]) }
        try await waitUntil { tool.runningNow >= 1 }
        round.cancel()
        gate.signal()
        await expectCancelled(round)
        let statuses = try ledger.list(operationId: "op_1").map { "\($0.status)" }.sorted()
        XCTAssertEqual(statuses, ["committed", "failedBeforeCommit", "failedBeforeCommit"])
        XCTAssertEqual(try downstream.count(), 1)
        gate.signal()
        gate.signal()
        let outs = try executor.executeRoundNow(operationId: "op_1", round: 0, calls: calls, tools: [tool])
        XCTAssertEqual(try outs.map { try completed($0).executionId }.count, 3)
        XCTAssertEqual(tool.calls.value, 3)
        XCTAssertEqual(try downstream.count(), 3)
    }

    /// A task cancelled while its round waits for `queue` begins nothing (from a review).
    func testARoundCancelledWhileItWaitsForItsQueueBeginsNothing() async throws {
        let (executor, ledger, tool, downstream) = try fixture { RoundSend(downstream: $0) }
        let queue = DispatchQueue(label: "held")
        let hold = DispatchSemaphore(value: 0)
        queue.async { _ = hold.wait(timeout: .now() + 10) }
        let calls = emails(3)
        let round = Task { try await executor.executeRound(operationId: "op_1", round: 0, calls: calls, tools: [tool], queue: queue) }
        try await Task.sleep(nanoseconds: 50_000_000)
        round.cancel()
        hold.signal()
        await expectCancelled(round)
        XCTAssertEqual(try ledger.list(operationId: "op_1").count, 0)
        XCTAssertEqual(tool.calls.value, 0)
        XCTAssertEqual(try downstream.count(), 0)
    }

    /// maxParallel 2, four calls, cancelled while the first two tools run:
    /// those two finish and are recorded, the two that never started are
    /// given back; the next ask replays the two and runs the others once
    /// (from a review).
    func testACancelledParallelRoundRecordsTheStartedToolsAndGivesBackTheRest() async throws {
        let gate = DispatchSemaphore(value: 0)
        let (executor, ledger, tool, downstream) = try fixture(maxParallel: 2) { RoundSend(downstream: $0, gate: gate) }
        let calls = emails(4)
        let round = Task { try await executor.executeRound(operationId: "op_1", round: 0, calls: calls, tools: [tool]) }
        try await waitUntil { tool.calls.value >= 2 }
        round.cancel()
        gate.signal()
        gate.signal()
        await expectCancelled(round)
        let statuses = try ledger.list(operationId: "op_1").map { "\($0.status)" }.sorted()
        XCTAssertEqual(statuses, ["committed", "committed", "failedBeforeCommit", "failedBeforeCommit"])
        XCTAssertEqual(tool.calls.value, 2)
        for _ in 0..<2 { gate.signal() }
        let outs = try executor.executeRoundNow(operationId: "op_1", round: 0, calls: calls, tools: [tool])
        XCTAssertEqual(try outs.map { try completed($0).replayed }, [true, true, false, false])
        XCTAssertEqual(tool.calls.value, 4)
        XCTAssertEqual(try downstream.count(), 4)
    }
}
