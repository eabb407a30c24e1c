// The ledger's status moves into Android's log (logcat), for Android apps:
//
//     ledger.setObserver(AndroidLogObserver())
//
// Unknown outcomes and failures log at WARN, everything else at DEBUG (which
// release builds usually strip with `Log.isLoggable`). A line holds the
// execution id, tool, statuses, attempt, elapsed time and the reason's kind,
// never an argument, a result or a reason's text.
//
// This file needs the Android SDK (android.util.Log): it belongs in the
// Android module (platforms/android) next to the generated bindings; the JVM
// test suite compiles JulLedgerObserver instead.
package dev.toolledger.logging

import android.util.Log
import dev.toolledger.ExecutionStatus
import dev.toolledger.LedgerEvent
import dev.toolledger.LedgerObserver

/** A [LedgerObserver] writing to `android.util.Log` under [tag]. */
class AndroidLogObserver(private val tag: String = "toolledger") : LedgerObserver {
    override fun onEvent(event: LedgerEvent) {
        when (event.toStatus) {
            ExecutionStatus.OUTCOME_UNKNOWN, ExecutionStatus.FAILED_BEFORE_COMMIT ->
                Log.w(tag, event.line)
            else -> if (Log.isLoggable(tag, Log.DEBUG)) Log.d(tag, event.line)
        }
    }
}
