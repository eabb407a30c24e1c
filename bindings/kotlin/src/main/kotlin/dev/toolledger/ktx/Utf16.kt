// Strings the JVM allows and the library cannot take: an unpaired UTF-16
// surrogate (what `"ok 😀".take(4)` leaves at the end). The generated
// converters throw `MalformedInputException` for them wherever they meet
// one; this layer checks first, so that bad input is a typed error with
// nothing recorded, and a tool's unencodable result is an unknown outcome
// (the effect may have happened) rather than a report that never reaches the
// library.
package dev.toolledger.ktx

import dev.toolledger.LedgerException
import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.ToolCall
import dev.toolledger.ToolDescriptor
import dev.toolledger.ToolHandler
import dev.toolledger.ToolRequest
import kotlin.coroutines.cancellation.CancellationException

/** True when every surrogate in this string is half of a pair. */
internal fun String.isWellFormedUtf16(): Boolean {
    var i = 0
    while (i < length) {
        val c = this[i]
        if (Character.isHighSurrogate(c)) {
            if (i + 1 >= length || !Character.isLowSurrogate(this[i + 1])) return false
            i += 2
            continue
        }
        if (Character.isLowSurrogate(c)) return false
        i++
    }
    return true
}

/** `LedgerException.InvalidInput` for a call the library could not be handed. */
internal fun checkUtf16(operationId: String, call: ToolCall) {
    val bad = when {
        !operationId.isWellFormedUtf16() -> "the operation id"
        !call.callId.isWellFormedUtf16() -> "the call id"
        !call.toolName.isWellFormedUtf16() -> "the tool name"
        !call.arguments.isWellFormedUtf16() -> "the arguments"
        else -> return
    }
    throw LedgerException.InvalidInput("$bad is not valid UTF-16 (an unpaired surrogate); nothing was recorded")
}

/**
 * Runs [call], a generated method: a string argument with an unpaired
 * surrogate, for which the generated converters throw
 * `CharacterCodingException` before anything reaches the library, is
 * `LedgerException.InvalidInput` (nothing was sent, so nothing recorded).
 * Answers come from the library as valid UTF-8 and cannot throw it.
 */
internal inline fun <T> utf16Checked(call: () -> T): T = try {
    call()
} catch (e: java.nio.charset.CharacterCodingException) {
    throw LedgerException.InvalidInput("a string is not valid UTF-16 (an unpaired surrogate); nothing was recorded")
}

internal const val NOT_UTF16 = "the tool's result is not valid UTF-16 (an unpaired surrogate)"

/** [outcome], or an unknown outcome when it holds a string the library cannot take. */
internal fun encodable(outcome: PerformOutcome): PerformOutcome = when (outcome) {
    is PerformOutcome.Committed ->
        if (outcome.resultJson.isWellFormedUtf16() && outcome.externalId?.isWellFormedUtf16() != false) {
            outcome
        } else {
            PerformOutcome.Unknown(reason = NOT_UTF16)
        }
    is PerformOutcome.JobStarted ->
        if (outcome.jobId.isWellFormedUtf16()) outcome else PerformOutcome.Unknown(reason = NOT_UTF16)
    is PerformOutcome.FailedBeforeCommit ->
        if (outcome.reason.isWellFormedUtf16()) {
            outcome
        } else {
            PerformOutcome.FailedBeforeCommit(reason = "the tool's reason is not valid UTF-16", retryable = outcome.retryable)
        }
    is PerformOutcome.Unknown ->
        if (outcome.reason.isWellFormedUtf16()) outcome else PerformOutcome.Unknown(reason = NOT_UTF16)
}

/** True when a lookup's answer can be handed to the library. */
internal fun isEncodable(found: LookupOutcome): Boolean = when (found) {
    is LookupOutcome.Found -> found.resultJson.isWellFormedUtf16() && found.externalId?.isWellFormedUtf16() != false
    else -> true
}

/**
 * What the library calls back for a tool registered through [Executor]:
 * [tool] itself, except that an unencodable result becomes an unknown
 * outcome, an exception whose text is unencodable becomes one too (it would
 * escape the generated callback on the library's thread), and an
 * unencodable lookup answer fails the lookup (the outcome stays unknown).
 * An [Error] thrown by the tool (`StackOverflowError`, `OutOfMemoryError`)
 * is the tool's failure too: an unknown outcome from `perform`, a failed
 * lookup. The generated callback catches `Exception` only, so an `Error`
 * ended its coroutine on the thread's uncaught-exception handler (an app
 * crash on Android) and the library heard nothing until `performTimeoutMs`
 * (without one, never). On the library's thread there is no caller to
 * rethrow it to.
 */
internal class Utf16Guard(private val tool: ToolHandler) : ToolHandler {
    override fun descriptor(): ToolDescriptor = tool.descriptor()

    override suspend fun perform(request: ToolRequest): PerformOutcome = try {
        encodable(tool.perform(request))
    } catch (e: CancellationException) {
        throw e
    } catch (e: Exception) {
        if (e.toString().isWellFormedUtf16()) throw e
        PerformOutcome.Unknown(reason = "${e.javaClass.simpleName} thrown by the tool (its text is not valid UTF-16)")
    } catch (e: Error) {
        PerformOutcome.Unknown(reason = "${e.javaClass.simpleName} thrown by the tool")
    }

    override suspend fun lookup(request: ToolRequest): LookupOutcome {
        val found = try {
            tool.lookup(request)
        } catch (e: CancellationException) {
            throw e
        } catch (e: Exception) {
            if (e.toString().isWellFormedUtf16()) throw e
            throw IllegalStateException("${e.javaClass.simpleName} thrown by the lookup (its text is not valid UTF-16)")
        } catch (e: Error) {
            throw IllegalStateException("${e.javaClass.simpleName} thrown by the lookup")
        }
        if (!isEncodable(found)) throw IllegalStateException("the lookup's result is not valid UTF-16")
        return found
    }

    override fun approvalPreview(argumentsJson: String): String? {
        val preview = tool.approvalPreview(argumentsJson)
        return if (preview == null || preview.isWellFormedUtf16()) preview else null
    }
}
