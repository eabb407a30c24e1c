// The ledger's status moves into Apple's unified logging (os.Logger):
//
//     import ToolLedger
//     import ToolLedgerLogging
//     try ledger.setObserver(observer: OSLogLedgerObserver())
//
// Each committed move is one log entry: execution id, tool, statuses,
// attempt, elapsed time and, for failures and unknown outcomes, the reason's
// kind (timeout, tool_error, owner_died, ...). It holds no argument, result or
// reason text, which is why it is logged with `privacy: .public` (readable in
// Console.app and `log stream` without a profile). Unknown outcomes and
// failures log at `warning`, the rest at `debug`.
//
// Off Apple platforms (the Linux test run) there is no unified logging: the
// same line goes to `sink` (standard error by default).
import Foundation
import ToolLedger

#if canImport(os)
import os
#endif

/// A `LedgerObserver` writing to `os.Logger` (subsystem/category as given).
public final class OSLogLedgerObserver: LedgerObserver, @unchecked Sendable {
    #if canImport(os)
    private let logger: Logger
    #endif
    private let sink: @Sendable (_ warning: Bool, _ line: String) -> Void

    /// Logs under `subsystem` and `category`. `sink` receives each line where
    /// `os.Logger` does not exist (and in tests).
    public init(
        subsystem: String = "dev.toolledger",
        category: String = "ledger",
        sink: (@Sendable (_ warning: Bool, _ line: String) -> Void)? = nil
    ) {
        #if canImport(os)
        logger = Logger(subsystem: subsystem, category: category)
        #endif
        self.sink = sink ?? { _, line in
            FileHandle.standardError.write(Data("toolledger: \(line)\n".utf8))
        }
    }

    public func onEvent(event: LedgerEvent) {
        let warning = event.toStatus == .outcomeUnknown || event.toStatus == .failedBeforeCommit
        #if canImport(os)
        // `line` carries ids, tool, statuses, attempt, times and the reason's
        // kind only: public is safe.
        if warning {
            logger.warning("\(event.line, privacy: .public)")
        } else {
            logger.debug("\(event.line, privacy: .public)")
        }
        #else
        sink(warning, event.line)
        #endif
    }
}
