// Privacy by construction, as a Swift app sees it: a canary planted in
// arguments, results, previews, external ids and tool errors shows up in no
// interpolated or described value, no error description, nothing on
// stdout/stderr and no log line; an encrypted ledger keeps it off the disk
// and refuses a wrong key; the files are the owner's only.

import Foundation
import ToolLedger
import ToolLedgerLogging
import XCTest

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

let canary = "CANARY-swift-4111-1111-1111"

struct CanaryError: Error, CustomStringConvertible {
    var description: String { "socket closed \(canary)" }
}

/// Puts the canary in its result, external id, preview and errors.
final class CanaryTool: ToolHandler {
    let name: String
    let failure: (any Error)?

    init(_ name: String, failure: (any Error)? = nil) {
        self.name = name
        self.failure = failure
    }

    func descriptor() throws -> ToolDescriptor {
        ToolDescriptor(name: name, version: 1, effect: .sideEffect, batch: .atomic)
    }

    func perform(request: ToolRequest) async throws -> PerformOutcome {
        precondition(request.argumentsJson.contains(canary))
        if let failure { throw failure }
        return .committed(resultJson: #"{"receipt":"\#(canary)"}"#, externalId: "ext-\(canary)")
    }

    func lookup(request: ToolRequest) async throws -> LookupOutcome { .unsupported }

    func approvalPreview(argumentsJson: String) throws -> String? { #"{"to":"\#(canary)"}"# }
}

func canaryCall(_ callId: String, _ tool: String) -> ToolCall {
    ToolCall(provider: .custom, callId: callId, toolName: tool,
             arguments: #"{"iban":"\#(canary)","amount":"$50"}"#)
}

/// Collects what an observer hears.
final class Lines: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: [(Bool, String)] = []
    func add(_ warning: Bool, _ line: String) { lock.lock(); stored.append((warning, line)); lock.unlock() }
    var all: [(Bool, String)] { lock.lock(); defer { lock.unlock() }; return stored }
}

/// Everything written to file descriptors 1 and 2 while `body` runs.
func capturingOutput<T>(_ body: () async throws -> T) async rethrows -> (T, String) {
    fflush(nil)
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("out-\(UUID())").path
    let fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0o600)
    let (savedOut, savedErr) = (dup(1), dup(2))
    dup2(fd, 1)
    dup2(fd, 2)
    let value: T
    do {
        value = try await body()
    } catch {
        fflush(nil); dup2(savedOut, 1); dup2(savedErr, 2); close(fd)
        throw error
    }
    fflush(nil)
    dup2(savedOut, 1)
    dup2(savedErr, 2)
    close(savedOut); close(savedErr); close(fd)
    let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    try? FileManager.default.removeItem(atPath: path)
    return (value, text)
}

func printedForms(_ values: [Any]) -> [String] {
    values.flatMap { v in ["\(v)", String(describing: v), String(reflecting: v), "\([v])"] }
}

func diskBytes(_ path: String) -> Data {
    var data = (try? Data(contentsOf: URL(fileURLWithPath: path))) ?? Data()
    if let wal = try? Data(contentsOf: URL(fileURLWithPath: path + "-wal")) { data.append(wal) }
    return data
}

func holds(_ data: Data, _ text: String) -> Bool { data.range(of: Data(text.utf8)) != nil }

final class PrivacyTests: XCTestCase {
    func testNoPrintedValueErrorOutputOrLogLineShowsTheCanary() async throws {
        let path = "\(try scratchDirectory())/ledger.db"
        let ledger = try Ledger.open(path: path, config: LedgerConfig())
        let lines = Lines()
        try ledger.setObserver(observer: OSLogLedgerObserver(sink: { lines.add($0, $1) }))
        let executor = try executor(ledger, [
            CanaryTool("pay"),
            CanaryTool("boom", failure: CanaryError()),
            CanaryTool("declined", failure: ToolCallError.Tool(message: "declined for \(canary)")),
        ], config: ExecutorConfig(maxAttempts: 1))

        let (outcomes, output) = try await capturingOutput {
            [
                try await executor.execute(operationId: "op", round: 0, call: canaryCall("c1", "pay")),
                try await executor.execute(operationId: "op", round: 0, call: canaryCall("c2", "boom")),
                try await executor.execute(operationId: "op", round: 0, call: canaryCall("c3", "declined")),
            ]
        }
        let done = try completed(outcomes[0])
        XCTAssertTrue(done.resultJson.contains(canary))  // reachable explicitly
        guard case .unknown = outcomes[1], case let .unknown(_, _, reason, _) = outcomes[2] else {
            return XCTFail("throwing tools end unknown")
        }
        XCTAssertTrue(reason.contains(canary))  // what the app's own tool said

        let spec = CallSpec(call: canaryCall("c4", "pay"), toolVersion: 1, requiresApproval: true)
        let approval = try ledger.begin(operationId: "op2", round: 0, spec: spec)
        guard case let .needsApproval(request) = approval else { return XCTFail("approval first") }
        try ledger.approve(executionId: request.executionId, argsDigest: request.argsDigest,
                           previewJson: #"{"shown":"\#(canary)"}"#)
        let ticket = try ledger.markExecuting(executionId: request.executionId)
        try ledger.recordExternalId(ticket: ticket, externalId: "ext-\(canary)")
        let stored = try ledger.commit(ticket: ticket, resultJson: #"{"r":"\#(canary)"}"#, externalId: "ext-\(canary)")
        let replay = try ledger.begin(operationId: "op2", round: 0, spec: spec)
        let executions = try ledger.list(operationId: "op") + ledger.list(operationId: "op2")
        let transitions = try executions.flatMap { try ledger.transitions(executionId: $0.executionId) }
        var error: (any Error)?
        do { _ = try ledger.commit(ticket: ticket, resultJson: #"{"other":"\#(canary)"}"#, externalId: nil) } catch let e { error = e }
        XCTAssertNotNil(error)

        var texts = [output] + lines.all.map { $0.1 }
        texts += printedForms(outcomes + [approval, request, ticket, stored, replay, spec, spec.call] as [Any])
        texts += printedForms(executions) + printedForms(transitions)
        texts += printedForms([
            PerformOutcome.committed(resultJson: canary, externalId: canary),
            LookupOutcome.found(resultJson: canary, externalId: nil),
            Resolution.found(resultJson: canary, externalId: canary),
        ] as [Any])
        texts += ["\(error!)", String(describing: error!), error!.localizedDescription]
        for text in texts { XCTAssertFalse(text.contains(canary), "the canary leaked: \(text)") }
        XCTAssertTrue("\(outcomes[0])".contains("bytes>"), "\(outcomes[0])")

        // The log says why the calls ended unknown, not what the tools said.
        let unknown = lines.all.filter { $0.1.contains("->outcome_unknown") }
        XCTAssertEqual(unknown.count, 2, "\(lines.all)")
        XCTAssertTrue(unknown.allSatisfy { $0.0 && $0.1.contains("reason_kind=tool_error") })
    }

    func testAnEncryptedLedgerKeepsTheCanaryOffTheDiskRefusesAWrongKeyAndRotates() throws {
        let path = "\(try scratchDirectory())/ledger.db"
        let key = try generateLedgerKey()
        XCTAssertEqual(key.count, 32)
        var ledger: Ledger? = try Ledger.open(path: path, config: LedgerConfig(), key: key)
        XCTAssertTrue(ledger!.isEncrypted())
        let spec = CallSpec(call: canaryCall("c1", "pay"), toolVersion: 1)
        guard case let .execute(ticket) = try ledger!.begin(operationId: "op", round: 0, spec: spec) else {
            return XCTFail("execute")
        }
        _ = try ledger!.commit(ticket: ticket, resultJson: #"{"r":"\#(canary)"}"#, externalId: "ext-\(canary)")
        XCTAssertFalse(holds(diskBytes(path), canary))
        ledger = nil

        func storageKind(_ body: () throws -> Any) -> StorageKind? {
            do { _ = try body(); return nil } catch let LedgerError.Storage(kind, _) { return kind } catch { return nil }
        }
        XCTAssertEqual(storageKind { try Ledger.open(path: path, config: LedgerConfig(), key: try generateLedgerKey()) }, .wrongKey)
        XCTAssertEqual(storageKind { try Ledger.open(path: path, config: LedgerConfig()) }, .keyRequired)

        let newKey = try generateLedgerKey()
        try rotateLedgerKey(path: path, config: LedgerConfig(), oldKey: key, newKey: newKey)
        XCTAssertEqual(storageKind { try Ledger.open(path: path, config: LedgerConfig(), key: key) }, .wrongKey)
        let again = try Ledger.open(path: path, config: LedgerConfig(), key: newKey)
        guard case let .replay(result) = try again.begin(operationId: "op", round: 0, spec: spec) else {
            return XCTFail("replay")
        }
        XCTAssertTrue(result.resultJson.contains(canary))
    }

    func testAPlainLedgerIsEncryptedInPlace() throws {
        let path = "\(try scratchDirectory())/ledger.db"
        var ledger: Ledger? = try Ledger.open(path: path, config: LedgerConfig())
        let spec = CallSpec(call: canaryCall("c1", "pay"), toolVersion: 1)
        guard case let .execute(ticket) = try ledger!.begin(operationId: "op", round: 0, spec: spec) else {
            return XCTFail("execute")
        }
        _ = try ledger!.commit(ticket: ticket, resultJson: #"{"r":"\#(canary)"}"#, externalId: nil)
        ledger = nil
        XCTAssertTrue(holds(diskBytes(path), canary))
        let key = try generateLedgerKey()
        try encryptLedger(path: path, config: LedgerConfig(), key: key)
        XCTAssertFalse(holds(diskBytes(path), canary))
        let encrypted = try Ledger.open(path: path, config: LedgerConfig(), key: key)
        guard case .replay = try encrypted.begin(operationId: "op", round: 0, spec: spec) else {
            return XCTFail("replay")
        }
    }

    func testTheLedgerFilesAreTheOwnersOnlyUnderUmask022() throws {
        let previous = umask(0o022)
        defer { umask(previous) }
        let path = "\(try scratchDirectory())/ledger.db"
        let ledger = try Ledger.open(path: path, config: LedgerConfig())
        let spec = CallSpec(call: canaryCall("c1", "pay"), toolVersion: 1)
        guard case let .execute(ticket) = try ledger.begin(operationId: "op", round: 0, spec: spec) else {
            return XCTFail("execute")
        }
        _ = try ledger.commit(ticket: ticket, resultJson: "{}", externalId: nil)
        func mode(_ p: String) throws -> Int {
            (try FileManager.default.attributesOfItem(atPath: p)[.posixPermissions] as? NSNumber)?.intValue ?? -1
        }
        for suffix in ["", "-wal", "-shm"] { XCTAssertEqual(try mode(path + suffix), 0o600, suffix) }
        XCTAssertEqual(try mode(path + "-sessions"), 0o700)
        for file in try FileManager.default.contentsOfDirectory(atPath: path + "-sessions") {
            XCTAssertEqual(try mode(path + "-sessions/" + file), 0o600)
        }
    }
}
