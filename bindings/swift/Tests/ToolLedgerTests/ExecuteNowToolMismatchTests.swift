// `executeNow(operationId:round:call:tool:)` and the async
// `execute(operationId:round:call:tool:)` run whatever SyncTool they are
// given, whether or not it is the tool registered under `call.toolName`.

import Foundation
import ToolLedger
import ToolLedgerTestTools
import XCTest

private final class NamedSync: SyncTool, @unchecked Sendable {
    let name: String
    let effects = SyncCounter()
    init(_ name: String) { self.name = name }
    func descriptor() throws -> ToolDescriptor {
        ToolDescriptor(name: name, version: 1, effect: .sideEffect, batch: .atomic)
    }
    func performNow(request: ToolRequest) throws -> PerformOutcome {
        effects.increment()
        return .committed(resultJson: json(["tool": name]), externalId: nil)
    }
}

final class ExecuteNowToolMismatchTests: XCTestCase {
    /// Observed: `refund`'s performNow runs for a `send_email` call and its
    /// result is committed (and replayed from then on) as send_email's.
    func testExecuteNowRefusesAToolThatIsNotTheCallsTool() async throws {
        let dir = try scratchDirectory()
        let ledger = try Ledger.open(path: "\(dir)/ledger.db", config: LedgerConfig())
        let email = NamedSync("send_email"), refund = NamedSync("refund")
        let executor = try executor(ledger, [email, refund])
        let error = await thrown {
            try executor.executeNow(operationId: "op", round: 0, call: emailCall(), tool: refund)
        }
        XCTAssertTrue(error is LedgerError, "expected a LedgerError, got \(String(describing: error))")
        XCTAssertEqual(refund.effects.value, 0, "another tool's side effect ran for this call")
        XCTAssertEqual(try ledger.list(operationId: "op").count, 0)
    }
}
