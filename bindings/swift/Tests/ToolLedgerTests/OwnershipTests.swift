// Exactly one owner, as an iOS app sees it: every step of an attempt names
// its Ticket (a superseded one is refused with StaleAttempt), a live session
// owns its calls for as long as it is open, recover() reports the rows it
// cannot deal with instead of giving up, and a lookup's "not found" inside
// the landing window sends nothing again.

import Foundation
import ToolLedger
import ToolLedgerTestTools
import XCTest

final class OwnershipTests: XCTestCase {
    private func emailSpec(callId: String = "call_1", requiresApproval: Bool = false) -> CallSpec {
        CallSpec(call: emailCall(callId: callId), toolVersion: 1, requiresApproval: requiresApproval)
    }

    /// The `StaleAttempt` fields of `error`, or a failure.
    private func staleAttempt(
        _ error: (any Error)?, file: StaticString = #filePath, line: UInt = #line
    ) throws -> (executionId: String, attempt: UInt32, currentAttempt: UInt32, status: ExecutionStatus) {
        guard case let .StaleAttempt(executionId, attempt, currentAttempt, status) = error as? LedgerError else {
            XCTFail("expected LedgerError.StaleAttempt, got \(String(describing: error))", file: file, line: line)
            throw UnexpectedOutcome()
        }
        return (executionId, attempt, currentAttempt, status)
    }

    private func thrownSync(_ body: () throws -> Void) -> (any Error)? {
        do {
            try body()
            return nil
        } catch {
            return error
        }
    }

    func testASupersededTicketIsRefusedWithStaleAttemptAndChangesNothing() throws {
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: "\(dir)/ledger.db", config: LedgerConfig())
        let t1 = try executeTicket(ledger.begin(operationId: "op_fence", round: 0, spec: emailSpec()))
        let id = t1.executionId
        XCTAssertEqual(t1.attempt, 1)
        XCTAssertTrue(try ledger.owns(ticket: t1))

        // The request timed out; the app found nothing downstream and retries
        // under the same key, naming the attempt whose outcome is unknown.
        try ledger.markOutcomeUnknown(ticket: t1, reason: "timed out")
        XCTAssertFalse(try ledger.owns(ticket: t1))
        let unknown = try XCTUnwrap(ledger.get(executionId: id))
        XCTAssertEqual(unknown.status, .outcomeUnknown)
        XCTAssertEqual(unknown.attemptCount, 1)
        guard case let .retry(t2) = try ledger.resolveUnknown(
            executionId: id, attempt: unknown.attemptCount, resolution: .notFoundRetry)
        else {
            return XCTFail("expected .retry")
        }
        XCTAssertEqual(t2.executionId, id)
        XCTAssertEqual(t2.attempt, 2)
        XCTAssertEqual(t2.downstreamKey, t1.downstreamKey)  // the same key on every attempt
        XCTAssertTrue(try ledger.owns(ticket: t2))
        XCTAssertFalse(try ledger.owns(ticket: t1))

        // The first attempt's late answer: refused, nothing changes.
        let stale = try staleAttempt(thrownSync {
            _ = try ledger.commit(ticket: t1, resultJson: #"{"sent":"late"}"#, externalId: "msg_late")
        })
        XCTAssertEqual(stale.executionId, id)
        XCTAssertEqual(stale.attempt, 1)
        XCTAssertEqual(stale.currentAttempt, 2)
        XCTAssertEqual(stale.status, .executing)
        let otherSteps: [() throws -> Void] = [
            { try ledger.failBeforeCommit(ticket: t1, reason: "refused", retryable: false) },
            { try ledger.markOutcomeUnknown(ticket: t1, reason: "timed out again") },
            { try ledger.recordExternalId(ticket: t1, externalId: "msg_late") },
            { _ = try ledger.resolveUnknown(executionId: id, attempt: 1, resolution: .notFoundRetry) },
        ]
        for step in otherSteps {
            let e = try staleAttempt(thrownSync(step))
            XCTAssertEqual([e.attempt, e.currentAttempt], [1, 2])
        }
        let running = try XCTUnwrap(ledger.get(executionId: id))
        XCTAssertEqual(running.status, .executing)
        XCTAssertEqual(running.attemptCount, 2)
        XCTAssertNil(running.resultJson)
        XCTAssertNil(running.externalId)

        // The current ticket commits; a repeat replays its result.
        let stored = try ledger.commit(ticket: t2, resultJson: #"{"sent":true}"#, externalId: "msg_2")
        XCTAssertEqual(stored.resultJson, #"{"sent":true}"#)
        XCTAssertEqual(stored.externalId, "msg_2")
        guard case let .replay(result) = try ledger.begin(operationId: "op_fence", round: 0, spec: emailSpec()) else {
            return XCTFail("expected .replay")
        }
        XCTAssertEqual(result.resultJson, #"{"sent":true}"#)
        XCTAssertEqual(result.externalId, "msg_2")
        let late = try staleAttempt(thrownSync {
            _ = try ledger.commit(ticket: t1, resultJson: #"{"sent":"late"}"#, externalId: nil)
        })
        XCTAssertEqual(late.status, .committed)
        XCTAssertEqual(try ledger.get(executionId: id)?.resultJson, #"{"sent":true}"#)
    }

    func testALiveSessionOwnsItsCallUntilItEndsWhateverTheLease() async throws {
        let dir = try scratchDirectory()
        let path = "\(dir)/ledger.db"
        // leaseMs only covers suspended sessions.
        var first: Ledger? = try Ledger.open(path: path, config: LedgerConfig(leaseMs: 1))
        let other = try Ledger.open(path: path, config: LedgerConfig(leaseMs: 1))
        let t1 = try executeTicket(XCTUnwrap(first).begin(operationId: "op_1", round: 0, spec: emailSpec()))
        try await Task.sleep(nanoseconds: 50_000_000)  // far past the lease

        guard case let .inFlight(_, retryAfterMs) = try other.begin(operationId: "op_1", round: 0, spec: emailSpec()) else {
            return XCTFail("expected .inFlight while its session is open")
        }
        XCTAssertNil(retryAfterMs)  // alive: no lapse to wait for
        XCTAssertTrue(try XCTUnwrap(first).owns(ticket: t1))
        XCTAssertFalse(try other.owns(ticket: t1))  // not this session's attempt

        // The first session ends (as if its process died): the other one finds
        // the call abandoned, its outcome unknown, and takes it over.
        first = nil
        guard case let .reconcile(found) = try other.begin(operationId: "op_1", round: 0, spec: emailSpec()) else {
            return XCTFail("expected .reconcile once its session ended")
        }
        XCTAssertEqual(found.attempt, 1)
        XCTAssertEqual(try other.get(executionId: t1.executionId)?.status, .outcomeUnknown)
        guard case let .retry(t2) = try other.resolveUnknown(
            executionId: t1.executionId, attempt: 1, resolution: .notFoundRetry)
        else {
            return XCTFail("expected .retry")
        }
        XCTAssertEqual(t2.attempt, 2)
        XCTAssertTrue(try other.owns(ticket: t2))
        XCTAssertEqual(try other.get(executionId: t1.executionId)?.ownerSession, other.sessionId())
        _ = try other.commit(ticket: t2, resultJson: #"{"sent":true}"#, externalId: nil)
        guard case .replay = try other.begin(operationId: "op_1", round: 0, spec: emailSpec()) else {
            return XCTFail("expected .replay")
        }
    }

    func testRecoverListsARowWhoseToolIsNotRegisteredAndRecoversTheOthers() async throws {
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: "\(dir)/ledger.db", config: LedgerConfig())
        // A committed result the model never got (a registered tool) ...
        let sent = try executeTicket(ledger.begin(operationId: "op_r", round: 0, spec: emailSpec()))
        _ = try ledger.commit(ticket: sent, resultJson: #"{"sent":true}"#, externalId: "msg_7")
        // ... and an unknown outcome of a tool this build no longer registers.
        let faxCall = ToolCall(provider: .custom, callId: "call_2", toolName: "send_fax", arguments: "{}")
        let fax = try executeTicket(ledger.begin(operationId: "op_r", round: 0, spec: CallSpec(call: faxCall, toolVersion: 1)))
        try ledger.markOutcomeUnknown(ticket: fax, reason: "timed out")

        let tool = SendEmail(downstream: try Downstream(directory: "\(dir)/downstream"))
        let recovery = try await executor(ledger, [tool]).recover()

        XCTAssertEqual(recovery.failed.map(\.executionId), [fax.executionId])
        XCTAssertTrue(recovery.failed.first?.error.contains("send_fax") ?? false, "\(recovery.failed)")
        XCTAssertEqual(recovery.outcomes.count, 1)
        let replay = try completed(XCTUnwrap(recovery.outcomes.first))
        XCTAssertEqual(replay.executionId, sent.executionId)
        XCTAssertEqual(replay.resultJson, #"{"sent":true}"#)
        XCTAssertEqual(replay.externalId, "msg_7")
        XCTAssertTrue(replay.replayed)
        let (calls, lookups) = (await tool.calls.value, await tool.lookups.value)
        XCTAssertEqual([calls, lookups], [0, 0])
        // The row it could not deal with is left for a build that knows its tool.
        XCTAssertEqual(try ledger.get(executionId: fax.executionId)?.status, .outcomeUnknown)
    }

    func testNotFoundInsideTheLandingWindowSendsNothing() async throws {
        let (ledger, downstream, tool, executor) = try landingFixture(windowMs: nil)

        let out = try unknown(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))

        XCTAssertEqual(out.attempt, 1)
        let wait = try XCTUnwrap(out.retryAfterMs)
        XCTAssertTrue((1...120_000).contains(wait), "retryAfterMs = \(wait)")
        var calls = await tool.calls.value
        let lookups = await tool.lookups.value
        XCTAssertEqual([calls, lookups, try downstream.count()], [1, 1, 0])
        XCTAssertEqual(try ledger.get(executionId: out.executionId)?.status, .outcomeUnknown)
        // Asking again inside the window still sends nothing.
        let again = try unknown(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))
        XCTAssertNotNil(again.retryAfterMs)
        calls = await tool.calls.value
        XCTAssertEqual([calls, try downstream.count()], [1, 0])
    }

    func testWithNoLandingWindowNotFoundIsResentAtOnce() async throws {
        let (ledger, downstream, tool, executor) = try landingFixture(windowMs: 0)

        let out = try completed(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))

        XCTAssertFalse(out.replayed)
        let (calls, lookups) = (await tool.calls.value, await tool.lookups.value)
        XCTAssertEqual([calls, lookups, try downstream.count()], [2, 1, 1])
        let record = try XCTUnwrap(ledger.get(executionId: out.executionId))
        XCTAssertEqual(record.status, .committed)
        XCTAssertEqual(record.attemptCount, 2)  // resent under the same key
    }

    /// A tool whose first perform fails before reaching the downstream (the
    /// executor cannot know that: the outcome is unknown). This fake
    /// downstream applies requests synchronously, so with `landingWindowMs`
    /// 0 a resend after "not found" is safe.
    private func landingFixture(windowMs: UInt64?) throws -> (Ledger, Downstream, SendEmail, ToolExecutor) {
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: "\(dir)/ledger.db", config: LedgerConfig())
        let downstream = try Downstream(directory: "\(dir)/downstream")
        let tool = SendEmail(
            downstream: downstream, failure: ToolCallError.Transport(message: "reset"), failTimes: 1,
            landingWindowMs: windowMs)
        let executor = try executor(ledger, [tool], config: ExecutorConfig(backoffBaseMs: 1, backoffMaxMs: 5))
        return (ledger, downstream, tool, executor)
    }

    func testCancellingAnOperationWithACallRunningReportsAPossibleSideEffect() throws {
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: "\(dir)/ledger.db", config: LedgerConfig())
        let ticket = try executeTicket(ledger.begin(operationId: "op_c", round: 0, spec: emailSpec()))

        // Nothing committed yet, but the request may be on its way.
        XCTAssertEqual(try ledger.cancelOperation(operationId: "op_c"), .cancelledAfterSideEffect)
        XCTAssertEqual(try ledger.cancel(executionId: ticket.executionId), .notCancellable)
        _ = try ledger.commit(ticket: ticket, resultJson: #"{"sent":true}"#, externalId: nil)  // it finishes honestly
        XCTAssertEqual(try ledger.get(executionId: ticket.executionId)?.status, .committed)

        guard case let .needsApproval(request) = try ledger.begin(
            operationId: "op_idle", round: 0, spec: emailSpec(requiresApproval: true))
        else {
            return XCTFail("expected .needsApproval")
        }
        XCTAssertEqual(try ledger.cancelOperation(operationId: "op_idle"), .cancelled)
        XCTAssertEqual(try ledger.get(executionId: request.executionId)?.status, .cancelledBeforeCommit)
    }

    func testCompensateRunsUnderTheCompensatingToolsOwnDescriptor() async throws {
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: "\(dir)/ledger.db", config: LedgerConfig())
        let downstream = try Downstream(directory: "\(dir)/downstream")
        let send = SendEmail(downstream: downstream)
        let recall = SendEmail(downstream: downstream, name: "recall_email", requiresApproval: true)
        let executor = try executor(ledger, [send, recall])
        let original = try completed(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))
        let refund = ToolCall(provider: .custom, callId: "recall_1", toolName: "recall_email", arguments: #"{"id":"msg_1"}"#)

        let waiting = try await executor.compensate(
            original: original.executionId, operationId: "op_1", round: 1, call: refund)

        guard case let .needsApproval(executionId, toolName, argsDigest, _) = waiting else {
            return XCTFail("expected .needsApproval, got \(waiting)")
        }
        XCTAssertEqual(toolName, "recall_email")
        var recalls = await recall.calls.value
        XCTAssertEqual(recalls, 0)
        let linked = try ledger.compensations(original: original.executionId)
        XCTAssertEqual(linked.map(\.executionId), [executionId])
        XCTAssertEqual(linked.first?.compensates, original.executionId)
        let done = try completed(await executor.approve(executionId: executionId, argsDigest: argsDigest, previewJson: nil))
        XCTAssertFalse(done.replayed)
        recalls = await recall.calls.value
        let sends = await send.calls.value
        XCTAssertEqual([sends, recalls, try downstream.count()], [1, 1, 2])
    }
}
