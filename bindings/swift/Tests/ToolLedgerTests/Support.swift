// Helpers for the suite: a scratch directory per test, and unwrapping of
// outcomes and thrown errors with a failure message that names the line.

import Foundation
import ToolLedger
import ToolLedgerTestTools
import XCTest

extension XCTestCase {
    /// A fresh directory, removed when the test ends.
    func scratchDirectory() throws -> String {
        let dir = FileManager.default.temporaryDirectory
            .appendingPathComponent("toolledger-swift-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        addTeardownBlock { try? FileManager.default.removeItem(atPath: dir) }
        return dir
    }

    /// An executor over `ledger` with `tools` registered.
    func executor(
        _ ledger: Ledger, _ tools: [any ToolHandler], config: ExecutorConfig = ExecutorConfig()
    ) throws -> ToolExecutor {
        let executor = ToolExecutor(ledger: ledger, config: config)
        for tool in tools { try executor.register(tool: tool) }
        return executor
    }

    /// Runs `body`, which must throw; returns what it threw.
    func thrown<T>(
        _ body: () async throws -> T, file: StaticString = #filePath, line: UInt = #line
    ) async -> (any Error)? {
        do {
            let value = try await body()
            XCTFail("expected an error, got \(value)", file: file, line: line)
            return nil
        } catch {
            return error
        }
    }
}

/// The fields of `CallOutcome.completed`.
struct Completed {
    let executionId: String
    let resultJson: String
    let externalId: String?
    let replayed: Bool
    let partial: Bool
}

func completed(
    _ outcome: CallOutcome, file: StaticString = #filePath, line: UInt = #line
) throws -> Completed {
    guard case let .completed(executionId, resultJson, externalId, replayed, partial) = outcome else {
        XCTFail("expected .completed, got \(outcome)", file: file, line: line)
        throw UnexpectedOutcome()
    }
    return Completed(
        executionId: executionId, resultJson: resultJson, externalId: externalId,
        replayed: replayed, partial: partial)
}

/// The fields of `CallOutcome.unknown`.
struct Unknown {
    let executionId: String
    let attempt: UInt32
    let reason: String
    let retryAfterMs: UInt64?
}

func unknown(
    _ outcome: CallOutcome, file: StaticString = #filePath, line: UInt = #line
) throws -> Unknown {
    guard case let .unknown(executionId, attempt, reason, retryAfterMs) = outcome else {
        XCTFail("expected .unknown, got \(outcome)", file: file, line: line)
        throw UnexpectedOutcome()
    }
    return Unknown(executionId: executionId, attempt: attempt, reason: reason, retryAfterMs: retryAfterMs)
}

/// The ticket of `Begin.execute`.
func executeTicket(
    _ begin: Begin, file: StaticString = #filePath, line: UInt = #line
) throws -> Ticket {
    guard case let .execute(ticket) = begin else {
        XCTFail("expected .execute, got \(begin)", file: file, line: line)
        throw UnexpectedOutcome()
    }
    return ticket
}

/// A ticket the ledger never handed out (for error paths).
func madeUpTicket(_ executionId: String, attempt: UInt32 = 1) -> Ticket {
    Ticket(
        executionId: executionId, downstreamKey: "tl_" + String(repeating: "0", count: 32),
        attempt: attempt, toolName: "send_email", toolVersion: 1, argsJson: "{}",
        argsDigest: String(repeating: "0", count: 64), externalId: nil)
}

struct UnexpectedOutcome: Error {}

/// JSON text parsed into a dictionary (for comparisons that ignore key order).
func object(_ json: String) throws -> NSDictionary {
    try XCTUnwrap(JSONSerialization.jsonObject(with: Data(json.utf8)) as? NSDictionary)
}

/// A one-shot gate: `wait()` suspends until `open()` (no sleeping, no polling).
actor Gate {
    private var opened = false
    private var waiters: [CheckedContinuation<Void, Never>] = []

    func wait() async {
        if opened { return }
        await withCheckedContinuation { waiters.append($0) }
    }

    func open() {
        opened = true
        for waiter in waiters { waiter.resume() }
        waiters = []
    }
}
