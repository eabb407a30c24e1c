// Seeded schedules for a SyncTool called through the async `execute(…, tool:)`:
// one to three tasks ask for the same call at random moments, some are
// cancelled at random moments, and the tool follows a seeded script per
// attempt (answers, refuses retryably, throws before or after its effect,
// answers slowly). For each downstream kind the invariants are checked after
// every schedule: at most one effect per call (a key downstream dedupes by
// key, so every attempt must carry the same key), every `.completed` answer
// is the effect's own result with the effect there, a final `.failed` (not
// retryable, or the answer once every caller is gone) means no effect, and
// the call settles once every caller is gone.
//
// TOOLLEDGER_SWIFT_SCHEDULES sets the number of schedules per kind (default 100).

import Foundation
import ToolLedger
import ToolLedgerTestTools
import XCTest

private enum Offers: String { case key, lookup, neither }

private enum Move: CaseIterable { case answer, refuse, throwBefore, throwAfter, slowAnswer }

private struct Reset: Error {}

/// Effects per downstream key, in memory; it dedupes only when told to.
private final class Service: @unchecked Sendable {
    private let lock = NSLock()
    private var effects: [String: Int] = [:]

    func perform(key: String) -> String {
        lock.withLock { effects[key, default: 0] += 1 }
        return "msg_\(key)"
    }

    func find(key: String) -> String? { count(key: key) > 0 ? "msg_\(key)" : nil }

    func count(key: String) -> Int { lock.withLock { effects[key] ?? 0 } }
}

/// A tool following `moves` attempt by attempt (the last move repeats).
private final class Scripted: SyncTool, @unchecked Sendable {
    let name: String
    let offers: Offers
    let service: Service
    let moves: [Move]
    private let lock = NSLock()
    private var attempts = 0
    private var seenKeys: Set<String> = []

    init(name: String, offers: Offers, service: Service, moves: [Move]) {
        self.name = name
        self.offers = offers
        self.service = service
        self.moves = moves
    }

    var keys: Set<String> { lock.withLock { seenKeys } }

    func descriptor() throws -> ToolDescriptor {
        var d = ToolDescriptor(
            name: name, version: 1, effect: .sideEffect, batch: .atomic,
            idempotencyKey: offers == .key, lookup: offers == .lookup)
        d.landingWindowMs = 1
        return d
    }

    func performNow(request: ToolRequest) throws -> PerformOutcome {
        let key = request.downstreamKey
        let n: Int = lock.withLock {
            attempts += 1
            seenKeys.insert(key)
            return attempts
        }
        // A downstream that dedupes answers a repeated key with the first effect.
        if offers == .key, let id = service.find(key: key) { return committed(id) }
        let move = moves[min(n, moves.count) - 1]
        switch move {
        case .refuse: return .failedBeforeCommit(reason: "503", retryable: true)
        case .throwBefore: throw Reset()
        default: break
        }
        let id = service.perform(key: key)
        switch move {
        case .throwAfter: throw Reset()
        case .slowAnswer: Thread.sleep(forTimeInterval: 0.003)
        default: break
        }
        return committed(id)
    }

    func lookupNow(request: ToolRequest) throws -> LookupOutcome {
        guard offers == .lookup else { return .unsupported }
        guard let id = service.find(key: request.downstreamKey) else { return .notFound }
        return .found(resultJson: sentJSON(id), externalId: id)
    }

    private func committed(_ id: String) -> PerformOutcome { .committed(resultJson: sentJSON(id), externalId: id) }
}

/// The answers the callers of one schedule got.
private actor Answers {
    var all: [CallOutcome] = []
    func add(_ outcome: CallOutcome) { all.append(outcome) }
}

final class ScheduleTests: XCTestCase {
    private var schedules: Int { Int(ProcessInfo.processInfo.environment["TOOLLEDGER_SWIFT_SCHEDULES"] ?? "") ?? 100 }

    private func run(_ offers: Offers) async throws {
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: "\(dir)/ledger.db", config: LedgerConfig())
        let executor = try executor(ledger, [], config: ExecutorConfig(maxAttempts: 3, backoffBaseMs: 1, backoffMaxMs: 2))
        let service = Service()
        var finals: [String: Int] = [:]
        for s in 0..<schedules {
            var rng = SeededRandom(seed: UInt64(20_261_202 &* 31 &+ s &* 7 &+ offers.rawValue.count))
            let moves = (0..<3).map { _ in Move.allCases[Int(rng.next() % UInt64(Move.allCases.count))] }
            let tool = Scripted(name: "tool_\(s)", offers: offers, service: service, moves: moves)
            try executor.register(tool: tool)
            let call = ToolCall(provider: .custom, callId: "call_\(s)", toolName: tool.name, arguments: "{}")
            let answers = Answers()
            let operation = "sched_\(offers.rawValue)"
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<(1 + Int(rng.next() % 3)) {
                    let startUs = rng.next() % 10_000
                    let cancelAfterUs: UInt64? = rng.next() % 10 < 3 ? rng.next() % 30_000 : nil
                    group.addTask {
                        try? await Task.sleep(nanoseconds: startUs * 1_000)
                        let caller = Task {
                            if let outcome = try? await executor.execute(
                                operationId: operation, round: 0, call: call, tool: tool)
                            {
                                await answers.add(outcome)
                            }
                        }
                        if let cancelAfterUs {
                            try? await Task.sleep(nanoseconds: cancelAfterUs * 1_000)
                            caller.cancel()
                        }
                        await caller.value
                    }
                }
            }
            // Every caller gone: the call settles.
            var final: CallOutcome?
            for _ in 0..<300 {
                final = try executor.executeNow(operationId: operation, round: 0, call: call, tool: tool)
                if case .inFlight = final { try await Task.sleep(nanoseconds: 10_000_000) } else { break }
            }
            let last = try XCTUnwrap(final)
            if case .inFlight = last { return XCTFail("schedule \(s) (\(offers), \(moves)): still in flight") }
            var all = await answers.all
            all.append(last)
            let keys = tool.keys
            let effects = keys.reduce(0) { $0 + service.count(key: $1) }
            let what = "schedule \(s) (\(offers), \(moves)): answers \(all)"
            if offers == .key { XCTAssertLessThanOrEqual(keys.count, 1, "\(what): a resend under another key") }
            XCTAssertLessThanOrEqual(effects, 1, "\(what): \(effects) effects")
            for (i, answer) in all.enumerated() {
                switch answer {
                case .completed(_, let resultJson, _, _, _):
                    XCTAssertEqual(effects, 1, "\(what): completed with no effect")
                    XCTAssertEqual(resultJson, sentJSON("msg_\(keys.first ?? "")"), "\(what): not the effect's result")
                case .failed(_, _, let retryable) where !retryable || i == all.count - 1:
                    XCTAssertEqual(effects, 0, "\(what): failed although the effect happened")
                default:
                    break
                }
            }
            let kind = "\(last)".prefix { $0 != " " && $0 != "(" }
            finals[String(kind), default: 0] += 1
        }
        print("    \(offers.rawValue): \(schedules) schedules, final answers \(finals.sorted { $0.key < $1.key })")
    }

    func testSeededSchedulesWithAKeyDownstream() async throws { try await run(.key) }

    func testSeededSchedulesWithALookupDownstream() async throws { try await run(.lookup) }

    func testSeededSchedulesWithANeitherDownstream() async throws { try await run(.neither) }
}

/// SplitMix64: a small seeded generator, the same numbers on every platform.
private struct SeededRandom {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
