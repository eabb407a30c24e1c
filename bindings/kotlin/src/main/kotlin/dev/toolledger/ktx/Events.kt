// The ledger's status moves as a Flow (from the value-free observer hook).
@file:JvmName("Events")

package dev.toolledger.ktx

import dev.toolledger.Ledger
import dev.toolledger.LedgerEvent
import dev.toolledger.LedgerObserver
import kotlinx.coroutines.channels.BufferOverflow
import kotlinx.coroutines.channels.awaitClose
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.buffer
import kotlinx.coroutines.flow.callbackFlow

/**
 * Every committed status move of this ledger from the moment the flow is
 * collected until the collector stops: execution id, tool, statuses,
 * attempt, elapsed time and, for failures and unknown outcomes, the
 * reason's kind, never an argument, a result or a reason's text.
 *
 * ```kotlin
 * ledger.events()
 *     .filter { it.toStatus == ExecutionStatus.OUTCOME_UNKNOWN }
 *     .collect { Log.w("toolledger", "unknown: ${it.reasonKind} ($it)") }
 * ```
 *
 * Each collector is its own observer beside the one `setObserver` names
 * (a log adapter keeps logging). Moves are delivered on the thread that
 * made them into a buffer of [capacity] events; when a slow collector lets
 * it fill, the oldest are dropped (a log of moves, not a queue of work).
 */
@JvmOverloads
fun Ledger.events(capacity: Int = 10_000): Flow<LedgerEvent> = callbackFlow {
    val token = addObserver(object : LedgerObserver {
        override fun onEvent(event: LedgerEvent) {
            trySend(event)
        }
    })
    awaitClose {
        // The ledger may have been closed first: nothing is left to remove then.
        runCatching { removeObserver(token) }
    }
}.buffer(capacity, BufferOverflow.DROP_OLDEST)
