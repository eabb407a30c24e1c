// The child process of the crash-recovery test:
//
//     ToolLedgerCrashChild LEDGER_DB DOWNSTREAM_DIR [driven]
//
// Opens the ledger, registers a `send_email` whose perform commits the effect
// downstream, then writes "ready" to stdout and never returns. The parent
// SIGKILLs this process on "ready": the effect happened, the ledger never
// heard back (the `after-remote-commit` crash boundary). With `driven`, the
// call goes through the caller-driven steps instead: `start`, then the child
// performs the effect itself and never reports it.

import Foundation
import ToolLedger
import ToolLedgerTestTools

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("crash child: \(message)\n".utf8))
    exit(2)
}

let args = CommandLine.arguments
guard args.count == 3 || (args.count == 4 && args[3] == "driven") else {
    fail("usage: ToolLedgerCrashChild LEDGER_DB DOWNSTREAM_DIR [driven]")
}

func signalReady() {
    let line = Array("ready\n".utf8)
    _ = line.withUnsafeBytes { write(STDOUT_FILENO, $0.baseAddress, $0.count) }
}

if args.count == 4 {
    do {
        let ledger = try Ledger.open(path: args[1], config: LedgerConfig())
        let executor = ToolExecutor(ledger: ledger, config: ExecutorConfig())
        let downstream = try Downstream(directory: args[2])
        try executor.register(tool: SyncSend(downstream: downstream))
        guard case .perform(let attempt) = try executor.start(
            operationId: "op_crash", round: 0, call: emailCall())
        else { fail("expected .perform") }
        _ = try downstream.perform(key: attempt.request.downstreamKey)
        signalReady()
        while true { sleep(3_600) }
    } catch {
        fail("\(error)")
    }
}

do {
    let ledger = try Ledger.open(path: args[1], config: LedgerConfig())
    let executor = ToolExecutor(ledger: ledger, config: ExecutorConfig(performTimeoutMs: nil))
    let tool = SendEmail(downstream: try Downstream(directory: args[2])) {
        // The effect is durable downstream: tell the parent, then hang.
        let line = Array("ready\n".utf8)
        _ = line.withUnsafeBytes { write(STDOUT_FILENO, $0.baseAddress, $0.count) }
        while true { try? await Task.sleep(nanoseconds: 3_600 * 1_000_000_000) }
    }
    try executor.register(tool: tool)
    _ = try await executor.execute(operationId: "op_crash", round: 0, call: emailCall())
    fail("unreachable: the tool never returns")
} catch {
    fail("\(error)")
}
