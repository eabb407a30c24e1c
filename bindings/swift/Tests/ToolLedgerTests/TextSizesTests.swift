// Sizes of stored text from Swift (docs/design.md, "Sizes of stored
// text"): a job started under an empty id becomes an unknown outcome that
// says why; a webhook without a source or an event id, or with one past
// 2,048 bytes, is `.InvalidInput` and records nothing, and the real event
// applies once; a long failure reason is stored cut.

import Foundation
import ToolLedger
import XCTest

final class TextSizesTests: XCTestCase {
    /// A side-effecting SyncTool that answers `answer` and counts its performs.
    private final class Answers: SyncTool, @unchecked Sendable {
        let answer: PerformOutcome
        private let lock = NSLock()
        private var count = 0
        var performs: Int { lock.withLock { count } }

        init(_ answer: PerformOutcome) { self.answer = answer }

        func descriptor() throws -> ToolDescriptor {
            ToolDescriptor(name: "render_video", version: 1, effect: .sideEffect, batch: .atomic)
        }

        func performNow(request: ToolRequest) throws -> PerformOutcome {
            lock.withLock { count += 1 }
            return answer
        }
    }

    private let render = ToolCall(provider: .custom, callId: "v1", toolName: "render_video", arguments: "{}")

    private func run(_ tool: Answers) throws -> (ToolExecutor, Ledger, CallOutcome) {
        let ledger = try Ledger.open(path: "\(try scratchDirectory())/ledger.db", config: LedgerConfig())
        let executor = try executor(ledger, [tool])
        let out = try executor.executeNow(operationId: "op_1", round: 0, call: render, tool: tool)
        XCTAssertEqual(tool.performs, 1)
        return (executor, ledger, out)
    }

    func testAJobStartedUnderAnEmptyIdIsAnUnknownOutcomeThatSaysWhy() throws {
        let (_, ledger, out) = try run(Answers(.jobStarted(jobId: "")))
        guard case let .unknown(executionId, _, reason, _) = out else {
            return XCTFail("expected unknown, got \(out)")
        }
        XCTAssertTrue(reason.contains("job id must not be empty"), reason)
        XCTAssertEqual(try ledger.get(executionId: executionId)?.status, .outcomeUnknown)
    }

    func testAWebhookWithoutASourceOrEventIdIsRefusedAndTheRealOneAppliesOnce() async throws {
        let (executor, ledger, out) = try run(Answers(.jobStarted(jobId: "job_7")))
        guard case let .pending(id, _) = out else { return XCTFail("expected pending, got \(out)") }
        let done = JobUpdate.succeeded(resultJson: #"{"url":"u"}"#)
        for (source, eventId) in [("render", ""), ("", "evt_1"), ("render", String(repeating: "e", count: 2049))] {
            let error = await thrown { try executor.ingestWebhook(source: source, eventId: eventId, executionId: id, update: done) }
            guard case .InvalidInput = error as? LedgerError else {
                return XCTFail("expected InvalidInput for (\(source.prefix(8)), \(eventId.prefix(8))), got \(String(describing: error))")
            }
        }
        XCTAssertEqual(try ledger.get(executionId: id)?.status, .executing)
        guard case .committed = try executor.ingestWebhook(source: "render", eventId: "evt_1", executionId: id, update: done)
        else { return XCTFail("the real event did not commit") }
        XCTAssertEqual(
            try executor.ingestWebhook(source: "render", eventId: "evt_1", executionId: id, update: done), .duplicateEvent)
        let stored = try ledger.get(executionId: id)
        XCTAssertEqual(stored?.status, .committed)
        XCTAssertEqual(stored?.resultJson, #"{"url":"u"}"#)
    }

    func testALongFailureReasonIsStoredCutAndSaysItsLength() throws {
        let long = String(repeating: "é", count: 1 << 20)
        let (_, ledger, out) = try run(Answers(.failedBeforeCommit(reason: long, retryable: false)))
        guard case let .failed(executionId, _, _) = out else { return XCTFail("expected failed, got \(out)") }
        let stored = try XCTUnwrap(try ledger.get(executionId: executionId)?.lastReason)
        let marker = " [cut: \(long.utf8.count) bytes in all]"
        XCTAssertLessThanOrEqual(stored.utf8.count, 4096)
        XCTAssertTrue(stored.hasSuffix(marker), String(stored.suffix(40)))
        XCTAssertTrue(long.hasPrefix(String(stored.dropLast(marker.count))))
    }
}
