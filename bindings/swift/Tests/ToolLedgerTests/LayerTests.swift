// The hand-written layer of `import ToolLedger` (Swift 6 language mode):
// AsyncLedger calls off the caller's actor, Codable arguments and results,
// Date accessors.

import Dispatch
import Foundation
import ToolLedger
import ToolLedgerTestTools
import XCTest

private struct Email: Codable, Equatable, Sendable {
    let to: String
    let body: String
}

private struct Sent: Codable, Equatable, Sendable {
    let sent: Bool
    let id: String
}

/// A tool written with the Codable helpers: arguments decoded as `Email`,
/// the result encoded from `Sent`.
private final class CodableSend: ToolHandler {
    let downstream: Downstream
    init(downstream: Downstream) { self.downstream = downstream }

    func descriptor() throws -> ToolDescriptor {
        ToolDescriptor(name: "send_email", version: 1, effect: .sideEffect, batch: .atomic)
    }

    func perform(request: ToolRequest) async throws -> PerformOutcome {
        let email = try request.arguments(as: Email.self)
        XCTAssertEqual(email.to, "a@example.com")
        let id = try downstream.perform(key: request.downstreamKey)
        return try .committed(Sent(sent: true, id: id), externalId: id)
    }

    func lookup(request: ToolRequest) async throws -> LookupOutcome { .unsupported }
    func approvalPreview(argumentsJson: String) throws -> String? { nil }
}

/// Marks the test's ledger queue (written once, before any use).
nonisolated(unsafe) private let marker = DispatchSpecificKey<String>()

final class LayerTests: XCTestCase {

    func testAsyncLedgerRunsOffTheMainActorOnItsOwnQueue() async throws {
        try await ledgerCallsFromTheMainActor(dir: try scratchDirectory())
    }

    func testLedgerAsyncAccessorUsesTheDefaultQueue() async throws {
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: dir + "/ledger.db", config: LedgerConfig())
        let attention = try await ledger.async.recover()
        XCTAssertEqual(attention, [])
        let stats = try await ledger.async.stats()
        XCTAssertEqual(stats, try ledger.stats())
    }

    func testSyncMakesADeferredCommitDurable() async throws {
        // A lookup tool's commit is deferred; an hour's deadline: only sync() flushes it.
        let dir = try scratchDirectory()
        XCTAssertEqual(LedgerConfig().idleCheckpointMs, 250)  // the background checkpoint's idle time
        let ledger = try Ledger.open(
            path: dir + "/ledger.db", config: LedgerConfig(deferredDeadlineMs: 3_600_000))
        let keyed = CallSpec(
            call: try ToolCall(callId: "k1", toolName: "send_email", arguments: Email(to: "a", body: "b")),
            toolVersion: 1, lookup: true)
        let ticket = try executeTicket(try ledger.begin(operationId: "op", round: 0, spec: keyed))
        XCTAssertFalse(ledger.hasUnsyncedCommits())  // the intent is durable when begin returns
        _ = try ledger.commit(ticket: ticket, resultJson: "{}", externalId: nil)
        XCTAssertTrue(ledger.hasUnsyncedCommits())
        try await ledger.async.sync()
        XCTAssertFalse(ledger.hasUnsyncedCommits())
        XCTAssertEqual(try ledger.get(executionId: ticket.executionId)?.status, .committed)
        let plain = CallSpec(
            call: try ToolCall(callId: "p1", toolName: "send_email", arguments: Email(to: "a", body: "b")),
            toolVersion: 1)
        let other = try executeTicket(try ledger.begin(operationId: "op", round: 0, spec: plain))
        _ = try ledger.commit(ticket: other, resultJson: "{}", externalId: nil)
        XCTAssertFalse(ledger.hasUnsyncedCommits())  // a neither-tool's commit is durable at once
        try ledger.suspend()
        XCTAssertThrowsError(try ledger.sync()) { XCTAssertEqual($0 as? LedgerError, .Suspended) }
    }

    func testCodableArgumentsAndResultsThroughTheExecutor() async throws {
        let dir = try scratchDirectory()
        let downstream = try Downstream(directory: dir)
        let ledger = try Ledger.open(path: dir + "/ledger.db", config: LedgerConfig())
        let executor = try executor(ledger, [CodableSend(downstream: downstream)])

        let call = try ToolCall(callId: "call_1", toolName: "send_email",
                                arguments: Email(to: "a@example.com", body: "hi"))
        XCTAssertEqual(call.arguments, #"{"body":"hi","to":"a@example.com"}"#)
        XCTAssertEqual(try call.arguments(as: Email.self).to, "a@example.com")

        let out = try await executor.execute(operationId: "op_1", round: 0, call: call)
        let sent = try XCTUnwrap(try out.result(as: Sent.self))
        XCTAssertTrue(sent.sent)
        let again = try await executor.execute(operationId: "op_1", round: 0, call: call)
        XCTAssertEqual(try again.result(as: Sent.self), sent)
        XCTAssertTrue(try completed(again).replayed)
        XCTAssertNil(try CallOutcome.rejected(executionId: "x").result(as: Sent.self))
    }

    func testDatesAndSecondsInsteadOfMilliseconds() throws {
        let dir = try scratchDirectory()
        let before = Date().addingTimeInterval(-1)
        let ledger = try Ledger.open(path: dir + "/ledger.db", config: LedgerConfig())
        let begun = try ledger.begin(operationId: "op_1", round: 0,
                                     spec: CallSpec(call: emailCall(), toolVersion: 1))
        let ticket = try executeTicket(begun)
        let record = try XCTUnwrap(try ledger.get(executionId: ticket.executionId))
        let after = Date().addingTimeInterval(1)
        XCTAssertTrue(record.createdAt > before && record.createdAt < after, "\(record.createdAt)")
        XCTAssertGreaterThanOrEqual(record.updatedAt, record.createdAt)
        let entries = try ledger.transitions(executionId: ticket.executionId)
        XCTAssertFalse(entries.isEmpty)
        XCTAssertTrue(entries.allSatisfy { $0.at > before && $0.at < after })

        let unknown = CallOutcome.unknown(executionId: "x", attempt: 1, reason: "r", retryAfterMs: 1500)
        XCTAssertEqual(unknown.retryAfter, 1.5)
        XCTAssertEqual(CallOutcome.inFlight(executionId: "x", retryAfterMs: nil).retryAfter, nil)
        XCTAssertEqual(ToolDescriptor(name: "t", version: 1, effect: .readOnly, batch: .atomic).landingWindow, 120)
    }
}

/// Every AsyncLedger call made from the main actor: the work runs on the
/// ledger's queue (not the main thread) and the caller is back on the main
/// actor afterwards.
@MainActor
private func ledgerCallsFromTheMainActor(dir: String) async throws {
    let queue = DispatchQueue(label: "test.ledger", attributes: .concurrent)
    queue.setSpecific(key: marker, value: "ledger-queue")
    let ledger = try await AsyncLedger.open(path: dir + "/ledger.db", queue: queue)

    let seen = try await ledger.run { _ in
        (DispatchQueue.getSpecific(key: marker), Thread.isMainThread)
    }
    XCTAssertEqual(seen.0, "ledger-queue")
    XCTAssertFalse(seen.1)
    XCTAssertTrue(Thread.isMainThread)  // the caller is back on the main actor

    let call = try ToolCall(callId: "c1", toolName: "send_email",
                            arguments: Email(to: "a@example.com", body: "hi"))
    let begun = try await ledger.begin(operationId: "op_1", round: 0,
                                       spec: CallSpec(call: call, toolVersion: 1))
    let ticket = try executeTicket(begun)
    let stored = try await ledger.commit(ticket: ticket, resultJson: try LedgerJSON.encode(Sent(sent: true, id: "m1")))
    XCTAssertEqual(try stored.result(as: Sent.self), Sent(sent: true, id: "m1"))

    let fetched = try await ledger.get(executionId: ticket.executionId)
    let record = try XCTUnwrap(fetched)
    XCTAssertEqual(record.status, .committed)
    XCTAssertEqual(try record.arguments(as: Email.self), Email(to: "a@example.com", body: "hi"))
    XCTAssertEqual(try record.result(as: Sent.self), Sent(sent: true, id: "m1"))
    let attention = try await ledger.recover()
    XCTAssertEqual(attention.map(\.executionId), [ticket.executionId])

    try await ledger.suspend()
    do {
        _ = try await ledger.get(executionId: ticket.executionId)
        XCTFail("a suspended ledger answered")
    } catch let error as LedgerError {
        guard case .Suspended = error else { return XCTFail("\(error)") }
    }
    _ = try await ledger.resume()
    let resumed = try await ledger.get(executionId: ticket.executionId)
    XCTAssertNotNil(resumed)
}
