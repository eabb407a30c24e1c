// What a call costs through the Swift bindings, beside the same call through
// the Rust API, in one run (scripts/bench-crossing.sh swift):
//
//     ToolLedgerCrossingBench REFERENCE DIR [calls] [batches]
//
// REFERENCE is the toolledger-crossing-reference program (the Rust side; see
// tools/bench/src/bin/crossing_reference.rs); batches alternate between it
// and each Swift variant. Figures: `ledger` (begin → commit → markDelivered),
// `executor` (a new side-effecting call), `replay`, `read_only`; the executor
// figures three ways: `callback` (the generated async `execute`: the library
// calls the Swift tool back from its threads), `driven_now` (`executeNow` of
// a SyncTool: caller-driven steps on this thread), `driven_async` (the async
// `execute(…, tool:)`, on the layer's dispatch queue). With ROUNDS=1, also
// `round8`: eight new calls as one round (the generated `executeRound`,
// calling the tools back; `executeRoundNow` and the async `executeRound(…,
// tools:)` of a SyncTool; eight `executeNow`s one after another).

import Foundation
import ToolLedger

let ok = PerformOutcome.committed(resultJson: "\"ok\"", externalId: nil)

final class Noop: ToolHandler {
    let name: String
    let effect: EffectClass
    init(_ name: String, _ effect: EffectClass) { self.name = name; self.effect = effect }
    func descriptor() throws -> ToolDescriptor {
        ToolDescriptor(name: name, version: 1, effect: effect, batch: .atomic,
                       idempotencyKey: effect == .sideEffect)
    }
    func perform(request: ToolRequest) async throws -> PerformOutcome { ok }
    func lookup(request: ToolRequest) async throws -> LookupOutcome { .unsupported }
    func approvalPreview(argumentsJson: String) throws -> String? { nil }
}

final class NoopSync: SyncTool {
    let name: String
    let effect: EffectClass
    init(_ name: String, _ effect: EffectClass) { self.name = name; self.effect = effect }
    func descriptor() throws -> ToolDescriptor {
        ToolDescriptor(name: name, version: 1, effect: effect, batch: .atomic,
                       idempotencyKey: effect == .sideEffect)
    }
    func performNow(request: ToolRequest) throws -> PerformOutcome { ok }
}

final class Reference {
    let child = Process()
    let input = Pipe()
    let output = Pipe()
    var buffer = Data()

    init(program: String, dir: String) throws {
        child.executableURL = URL(fileURLWithPath: program)
        child.arguments = [dir]
        child.standardInput = input
        child.standardOutput = output
        try child.run()
    }

    func batch(_ figure: String, _ n: Int) -> [UInt64] {
        input.fileHandleForWriting.write(Data("\(figure) \(n)\n".utf8))
        while true {
            if let nl = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffer[buffer.startIndex..<nl], as: UTF8.self)
                buffer.removeSubrange(buffer.startIndex...nl)
                return line.split(separator: " ").compactMap { UInt64($0) }
            }
            let more = output.fileHandleForReading.availableData
            if more.isEmpty { fatalError("the reference program stopped") }
            buffer.append(more)
        }
    }

    func close() {
        try? input.fileHandleForWriting.close()
        child.waitUntilExit()
    }
}

func pct(_ samples: [UInt64], _ q: Double) -> UInt64 {
    let sorted = samples.sorted()
    return sorted[min(sorted.count - 1, Int(q * Double(sorted.count)))] / 1000
}

func call(_ id: String, _ tool: String) -> ToolCall {
    ToolCall(provider: .custom, callId: id, toolName: tool, arguments: "{}")
}

func now() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

/// Waits for an async call from this synchronous main thread.
func wait<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) -> T {
    let done = DispatchSemaphore(value: 0)
    nonisolated(unsafe) var result: Result<T, Error>?
    Task.detached {
        do { result = .success(try await body()) } catch { result = .failure(error) }
        done.signal()
    }
    done.wait()
    switch result! {
    case .success(let value): return value
    case .failure(let error): fatalError("\(error)")
    }
}

func check(_ outcome: CallOutcome) {
    guard case .completed = outcome else { fatalError("not completed: \(outcome)") }
}

let args = CommandLine.arguments
let dir = args[2]
let calls = args.count > 3 ? Int(args[3]) ?? 50 : 50
let batches = args.count > 4 ? Int(args[4]) ?? 10 : 10
try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
let rust = try Reference(program: args[1], dir: dir)
let ledger = try Ledger.open(path: "\(dir)/swift.db", config: LedgerConfig())
let executor = ToolExecutor(ledger: ledger, config: ExecutorConfig())
let noopSync = NoopSync("noop_sync", .sideEffect)
let readSync = NoopSync("noop_read_sync", .readOnly)
for tool: any ToolHandler in [Noop("noop", .sideEffect), Noop("noop_read", .readOnly), noopSync, readSync] {
    try executor.register(tool: tool)
}
nonisolated(unsafe) var next = 0
func newId() -> String { next += 1; return "sw_\(next)" }

func ledgerOnce() {
    let spec = CallSpec(call: call(newId(), "noop"), toolVersion: 1, requiresApproval: false)
    guard case .execute(let ticket) = try! ledger.begin(operationId: "crossing", round: 1, spec: spec) else {
        fatalError("a new call was not executed")
    }
    _ = try! ledger.commit(ticket: ticket, resultJson: "\"ok\"", externalId: nil)
    try! ledger.markDelivered(executionIds: [ticket.executionId])
}
func callback(_ c: ToolCall) { check(wait { try await executor.execute(operationId: "crossing", round: 2, call: c) }) }
func now(_ c: ToolCall, _ tool: any SyncTool) {
    check(try! executor.executeNow(operationId: "crossing", round: 2, call: c, tool: tool))
}
func driven(_ c: ToolCall, _ tool: any SyncTool) {
    check(wait { try await executor.execute(operationId: "crossing", round: 2, call: c, tool: tool) })
}

let replayed = call("replayed", "noop")
let replayedSync = call("replayed", "noop_sync")
callback(replayed)
now(replayedSync, noopSync)
func eight(_ tool: String) -> [ToolCall] { (0..<8).map { _ in call(newId(), tool) } }
func checkAll(_ outcomes: [CallOutcome]) { outcomes.forEach(check) }

var variants: [(String, [(String, () -> Void)])] = [
    ("ledger", [("swift", ledgerOnce)]),
    ("executor", [
        ("swift_callback", { callback(call(newId(), "noop")) }),
        ("swift_driven_now", { now(call(newId(), "noop_sync"), noopSync) }),
        ("swift_driven_async", { driven(call(newId(), "noop_sync"), noopSync) }),
    ]),
    ("replay", [
        ("swift_callback", { callback(replayed) }),
        ("swift_driven_now", { now(replayedSync, noopSync) }),
        ("swift_driven_async", { driven(replayedSync, noopSync) }),
    ]),
    ("read_only", [
        ("swift_callback", { callback(call("read", "noop_read")) }),
        ("swift_driven_now", { now(call("read", "noop_read_sync"), readSync) }),
        ("swift_driven_async", { driven(call("read", "noop_read_sync"), readSync) }),
    ]),
]
if ProcessInfo.processInfo.environment["ROUNDS"] == "1" {
    // A round of eight new calls (one durable begin for the eight).
    variants.append(("round8", [
        ("swift_callback", {
            checkAll(wait { try await executor.executeRound(operationId: "crossing", round: 4, calls: eight("noop")) })
        }),
        ("swift_driven_now", {
            checkAll(try! executor.executeRoundNow(operationId: "crossing", round: 4, calls: eight("noop_sync"), tools: [noopSync]))
        }),
        ("swift_driven_async", {
            checkAll(wait { try await executor.executeRound(operationId: "crossing", round: 4, calls: eight("noop_sync"), tools: [noopSync]) })
        }),
        ("swift_driven_now_each", {
            for c in eight("noop_sync") { now(c, noopSync) }
        }),
    ]))
}
var samples: [String: [UInt64]] = [:]
for _ in 0..<batches {
    for (figure, ways) in variants {
        samples["\(figure)_rust", default: []] += rust.batch(figure, calls)
        for (name, fn) in ways {
            for _ in 0..<calls {
                let t0 = now()
                fn()
                samples["\(figure)_\(name)", default: []].append(now() - t0)
            }
        }
    }
}
rust.close()
var load = [0.0, 0.0, 0.0]
_ = getloadavg(&load, 3)
print("dir=\(dir) calls=\(calls) batches=\(batches) load=\(String(format: "%.1f", load[0]))")
for (figure, ways) in variants {
    let r = samples["\(figure)_rust"]!
    let r50 = pct(r, 0.5)
    print("\(figure)_rust_p50_us=\(r50) \(figure)_rust_p99_us=\(pct(r, 0.99))")
    for (name, _) in ways {
        let s = samples["\(figure)_\(name)"]!
        let p50 = pct(s, 0.5)
        print("\(figure)_\(name)_p50_us=\(p50) \(figure)_\(name)_p99_us=\(pct(s, 0.99)) \(figure)_\(name)_over_rust_p50_us=\(Int64(p50) - Int64(r50))")
    }
}
