// Signed views of the library's unsigned fields, for Kotlin and Java callers
// (`Records.attempts(execution)` from Java). The records themselves are
// immutable (`val`, uniffi.toml: generate_immutable_records).
@file:JvmName("Records")

package dev.toolledger.ktx

import dev.toolledger.CallOutcome
import dev.toolledger.Execution
import dev.toolledger.Ticket
import dev.toolledger.ToolRequest

/** The model response (round) the execution belongs to. */
val Execution.roundNumber: Int get() = round.toSigned()

/** How many attempts the execution has had. */
val Execution.attempts: Int get() = attemptCount.toSigned()

/** The tool's contract version. */
val Execution.version: Int get() = toolVersion.toSigned()

/** This ticket's attempt number, from 1. */
val Ticket.attemptNumber: Int get() = attempt.toSigned()

/** This request's attempt number, from 1. */
val ToolRequest.attemptNumber: Int get() = attempt.toSigned()

/** The batch item index, for independent batches. */
val ToolRequest.itemIndexOrNull: Int? get() = itemIndex?.toSigned()

/** The attempt whose outcome is unknown (name it in `resolveUnknown`). */
val CallOutcome.Unknown.attemptNumber: Int get() = attempt.toSigned()

/** When to ask again, in ms, if waiting can settle it. */
val CallOutcome.Unknown.retryAfterMillis: Long? get() = retryAfterMs?.toSigned()

/** When to ask again, in ms, if known. */
val CallOutcome.InFlight.retryAfterMillis: Long? get() = retryAfterMs?.toSigned()
