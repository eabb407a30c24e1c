// Crash recovery across processes, as an app killed by iOS mid-call sees it:
// a child process (the ToolLedgerCrashChild executable of this package)
// performs a side effect downstream and is SIGKILLed before the ledger hears
// back; a fresh Ledger in this process recovers the call as an unknown
// outcome, and the executor reconciles it through the tool's lookup.

import Foundation
import ToolLedger
import ToolLedgerTestTools
import XCTest

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

final class CrashRecoveryTests: XCTestCase {
    /// How long the child may take to start and perform its effect.
    private let readyTimeoutMs: Int32 = 60_000

    func testAKilledProcessIsRecoveredAndReconciledExactlyOnce() async throws {
        let dir = try scratchDirectory()
        let ledgerPath = "\(dir)/ledger.db"
        let downstream = try Downstream(directory: "\(dir)/downstream")

        try runChildUntilItsEffectThenKill(arguments: [ledgerPath, downstream.directory])
        XCTAssertEqual(try downstream.count(), 1)

        // A fresh ledger: the dead owner's `executing` row is an unknown outcome.
        let ledger = try Ledger.open(path: ledgerPath, config: LedgerConfig())
        let pending = try ledger.recover()
        XCTAssertEqual(pending.map(\.status), [.outcomeUnknown])
        let executionId = try XCTUnwrap(pending.first?.executionId)

        // Reconcile through the tool's lookup: found downstream, so committed,
        // and the tool never performs again.
        let tool = SendEmail(downstream: downstream)
        let executor = try executor(ledger, [tool])
        let recovery = try await executor.recover()
        XCTAssertEqual(recovery.failed, [])
        let outcomes = recovery.outcomes
        XCTAssertEqual(outcomes.count, 1)
        let reconciled = try completed(XCTUnwrap(outcomes.first))
        XCTAssertEqual(reconciled.executionId, executionId)
        XCTAssertFalse(reconciled.replayed)
        XCTAssertEqual(reconciled.externalId, "msg_1")
        let (lookups, calls) = (await tool.lookups.value, await tool.calls.value)
        XCTAssertEqual(lookups, 1)
        XCTAssertEqual(calls, 0)
        XCTAssertEqual(try ledger.get(executionId: executionId)?.status, .committed)

        let again = try completed(await executor.execute(operationId: "op_crash", round: 0, call: emailCall()))
        XCTAssertTrue(again.replayed)
        XCTAssertEqual(again.resultJson, reconciled.resultJson)
        let callsAfter = await tool.calls.value
        XCTAssertEqual(callsAfter, 0)
        XCTAssertEqual(try downstream.count(), 1)
    }

    func testACallerDrivenCallKilledBetweenItsEffectAndItsReportIsReconciled() async throws {
        let dir = try scratchDirectory()
        let ledgerPath = "\(dir)/ledger.db"
        let downstream = try Downstream(directory: "\(dir)/downstream")

        try runChildUntilItsEffectThenKill(arguments: [ledgerPath, downstream.directory, "driven"])
        XCTAssertEqual(try downstream.count(), 1)

        // The same call asked for again: the dead owner's attempt is
        // reconciled through the tool's lookup, on this thread; no resend.
        let ledger = try Ledger.open(path: ledgerPath, config: LedgerConfig())
        let tool = SyncSend(downstream: downstream)
        let executor = try executor(ledger, [tool])
        let done = try completed(
            executor.executeNow(operationId: "op_crash", round: 0, call: emailCall(), tool: tool))
        XCTAssertFalse(done.replayed)
        XCTAssertEqual(done.externalId, "msg_1")
        XCTAssertEqual(tool.lookups.value, 1)
        XCTAssertEqual(tool.calls.value, 0)
        XCTAssertEqual(try downstream.count(), 1)
    }

    /// Starts the crash child, waits (bounded) for its "ready" line, which it
    /// writes once the effect is durable downstream, and SIGKILLs it.
    private func runChildUntilItsEffectThenKill(arguments: [String]) throws {
        let child = Process()
        child.executableURL = try crashChildURL()
        child.arguments = arguments
        let stdout = Pipe()
        child.standardOutput = stdout
        try child.run()
        defer {
            if child.isRunning {
                kill(child.processIdentifier, SIGKILL)
                child.waitUntilExit()
            }
        }

        let ready = try readLine(from: stdout.fileHandleForReading.fileDescriptor, timeoutMs: readyTimeoutMs)
        XCTAssertEqual(ready, "ready", "the child exited or failed before its effect")
        guard ready == "ready" else { throw ChildFailed() }

        XCTAssertEqual(kill(child.processIdentifier, SIGKILL), 0)
        child.waitUntilExit()
        XCTAssertEqual(child.terminationReason, .uncaughtSignal)
        XCTAssertEqual(child.terminationStatus, SIGKILL)
    }

    /// Reads one line, waiting at most `timeoutMs` in total; nil on EOF.
    private func readLine(from fd: Int32, timeoutMs: Int32) throws -> String? {
        let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(timeoutMs) * 1_000_000
        var line: [UInt8] = []
        while true {
            let now = DispatchTime.now().uptimeNanoseconds
            guard now < deadline else {
                XCTFail("no ready signal from the crash child within \(timeoutMs) ms")
                throw ChildFailed()
            }
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let remaining = Int32(clamping: (deadline - now) / 1_000_000 + 1)
            let n = poll(&pfd, 1, remaining)
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { continue }  // timed out: the deadline check fails next
            var byte: UInt8 = 0
            let got = read(fd, &byte, 1)
            if got < 0 && errno == EINTR { continue }
            guard got == 1 else { return nil }  // EOF: the child is gone
            if byte == UInt8(ascii: "\n") { return String(decoding: line, as: UTF8.self) }
            line.append(byte)
        }
    }

    /// The crash child's executable, built next to this test bundle
    /// (TOOLLEDGER_CRASH_CHILD overrides).
    private func crashChildURL() throws -> URL {
        let name = "ToolLedgerCrashChild"
        if let path = ProcessInfo.processInfo.environment["TOOLLEDGER_CRASH_CHILD"] {
            return URL(fileURLWithPath: path)
        }
        let bundle = Bundle(for: CrashRecoveryTests.self).bundleURL
        let candidates = [
            bundle.appendingPathComponent(name),  // Linux: the bundle URL is the build dir
            bundle.deletingLastPathComponent().appendingPathComponent(name),  // macOS: …/X.xctest
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
                .appendingPathComponent(name),
        ]
        guard let url = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0.path) }) else {
            XCTFail("\(name) not found in \(candidates.map(\.path)); build the package first")
            throw ChildFailed()
        }
        return url
    }

    private struct ChildFailed: Error {}
}
