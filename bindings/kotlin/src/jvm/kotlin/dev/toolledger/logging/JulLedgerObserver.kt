// The ledger's status moves into java.util.logging (desktop JVM, servers,
// tests). Android apps use AndroidLogObserver (src/android) instead.
//
//     ledger.setObserver(JulLedgerObserver())
//
// Each committed move is one record on the "toolledger" logger: execution
// id, tool, statuses, attempt, elapsed time and, for failures and unknown
// outcomes, the reason's kind (timeout, tool_error, owner_died, ...). Never an
// argument, a result or a reason's text: the records can go to any handler.
package dev.toolledger.logging

import dev.toolledger.ExecutionStatus
import dev.toolledger.LedgerEvent
import dev.toolledger.LedgerObserver
import java.util.logging.Level
import java.util.logging.Logger

/** A [LedgerObserver] writing to a `java.util.logging.Logger`. */
class JulLedgerObserver(
    private val logger: Logger = Logger.getLogger("toolledger"),
) : LedgerObserver {
    override fun onEvent(event: LedgerEvent) {
        val level = when (event.toStatus) {
            ExecutionStatus.OUTCOME_UNKNOWN, ExecutionStatus.FAILED_BEFORE_COMMIT -> Level.WARNING
            else -> Level.FINE
        }
        // `line` holds ids, tool, statuses, attempt, times and the reason's
        // kind only.
        logger.log(level, event.line)
    }
}
