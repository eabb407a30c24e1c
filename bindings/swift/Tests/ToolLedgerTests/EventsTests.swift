// The layer's AsyncStream of ledger events: each stream hears the begin,
// the commit and an unknown outcome with its reason's kind, carries no
// values, and a log observer set with setObserver keeps hearing; an
// AsyncLedger opens an encrypted ledger with its key.

import Foundation
import ToolLedger
import XCTest

struct TimedOut: Error {}

/// The first `count` events of `stream`, or `TimedOut` after `seconds`.
func firstEvents(
    _ stream: AsyncStream<LedgerEvent>, _ count: Int, within seconds: Double = 30
) async throws -> [LedgerEvent] {
    try await withThrowingTaskGroup(of: [LedgerEvent].self) { group in
        group.addTask {
            var events: [LedgerEvent] = []
            for await event in stream {
                events.append(event)
                if events.count == count { break }
            }
            return events
        }
        group.addTask {
            try await Task.sleep(nanoseconds: UInt64(seconds * 1_000_000_000))
            throw TimedOut()
        }
        let first = try await group.next() ?? []
        group.cancelAll()
        return first
    }
}

/// Keeps what an observer hears.
final class Heard: LedgerObserver, @unchecked Sendable {
    private let lock = NSLock()
    private var stored: [LedgerEvent] = []
    func onEvent(event: LedgerEvent) { lock.lock(); stored.append(event); lock.unlock() }
    var all: [LedgerEvent] { lock.lock(); defer { lock.unlock() }; return stored }
}

final class EventsTests: XCTestCase {
    func testEachStreamHearsBeginCommitAndUnknownWithoutValues() async throws {
        let ledger = try Ledger.open(path: "\(try scratchDirectory())/ledger.db", config: LedgerConfig())
        let logged = Heard()
        try ledger.setObserver(observer: logged)
        let first = try ledger.events()
        let second = try AsyncLedger(ledger).events()

        let spec = CallSpec(call: canaryCall("c1", "pay"), toolVersion: 1)
        guard case let .execute(ticket) = try ledger.begin(operationId: "op", round: 0, spec: spec) else {
            return XCTFail("expected execute")
        }
        _ = try ledger.commit(ticket: ticket, resultJson: #"{"r":"\#(canary)"}"#, externalId: "ext-\(canary)")
        let other = CallSpec(call: canaryCall("c2", "pay"), toolVersion: 1)
        guard case let .execute(unsure) = try ledger.begin(operationId: "op", round: 0, spec: other) else {
            return XCTFail("expected execute")
        }
        try ledger.markOutcomeUnknown(ticket: unsure, reason: "timed out waiting for the downstream")

        let a = try await firstEvents(first, 4)
        let b = try await firstEvents(second, 4)
        let moves: [(ExecutionStatus?, ExecutionStatus)] = [
            (nil, .executing), (.executing, .committed), (nil, .executing), (.executing, .outcomeUnknown),
        ]
        for heard in [a, b, logged.all] {
            XCTAssertEqual(heard.count, 4)
            for (event, move) in zip(heard, moves) {
                XCTAssertEqual(event.fromStatus, move.0)
                XCTAssertEqual(event.toStatus, move.1)
            }
        }
        XCTAssertEqual(a[0].executionId, ticket.executionId)
        XCTAssertEqual(a[1].toolName, "pay")
        XCTAssertEqual(a[1].attempt, 1)
        XCTAssertEqual(a[3].reasonKind, .timeout)
        for text in printedForms(a) + a.map(\.line) {
            XCTAssertFalse(text.contains(canary), text)
        }
    }

    func testAStreamWhoseReaderIsCancelledEndsAndTheLogKeepsHearing() async throws {
        let ledger = try Ledger.open(path: "\(try scratchDirectory())/ledger.db", config: LedgerConfig())
        let logged = Heard()
        try ledger.setObserver(observer: logged)
        let reader = Task { () -> Int in
            var count = 0
            for await _ in try ledger.events() { count += 1 }
            return count  // reached once the stream ends
        }
        reader.cancel()
        _ = await reader.result  // the iteration ended: its observer is removed
        let spec = CallSpec(call: canaryCall("c1", "pay"), toolVersion: 1)
        guard case let .execute(ticket) = try ledger.begin(operationId: "op", round: 0, spec: spec) else {
            return XCTFail("expected execute")
        }
        _ = try ledger.commit(ticket: ticket, resultJson: "{}", externalId: nil)
        XCTAssertEqual(logged.all.map(\.toStatus), [.executing, .committed])
    }

    func testAnAsyncLedgerOpenedWithAKeyIsEncrypted() async throws {
        let path = "\(try scratchDirectory())/ledger.db"
        let key = try generateLedgerKey()
        let ledger = try await AsyncLedger.open(path: path, key: key)
        XCTAssertTrue(ledger.ledger.isEncrypted())
        let spec = CallSpec(call: canaryCall("c1", "pay"), toolVersion: 1)
        guard case let .execute(ticket) = try await ledger.begin(operationId: "op", round: 0, spec: spec) else {
            return XCTFail("expected execute")
        }
        _ = try await ledger.run { try $0.commit(ticket: ticket, resultJson: #"{"r":"\#(canary)"}"#, externalId: nil) }
        XCTAssertFalse(holds(diskBytes(path), canary))
        do {
            _ = try await AsyncLedger.open(path: path, key: try generateLedgerKey())
            XCTFail("a wrong key opened the ledger")
        } catch let LedgerError.Storage(kind, _) {
            XCTAssertEqual(kind, .wrongKey)
        }
    }
}
