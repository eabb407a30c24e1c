// Tools that answer without suspending, run by the caller itself through the
// library's caller-driven steps (ToolExecutor.start / report), and the JNA
// setting that keeps the library's threads attached to the JVM between the
// callbacks of tools that do suspend.
package dev.toolledger.ktx

import com.sun.jna.CallbackThreadInitializer
import com.sun.jna.Native
import dev.toolledger.CallOutcome
import dev.toolledger.CallerAttempt
import dev.toolledger.CallerStep
import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.ToolDescriptor
import dev.toolledger.ToolExecutor
import dev.toolledger.ToolRequest
import dev.toolledger.uniffiCallbackInterfaceToolHandler
import dev.toolledger.uniffiForeignFutureDroppedCallbackImpl
import dev.toolledger.uniffiRustFutureContinuationCallbackImpl

/**
 * A tool whose [performNow] (and [lookupNow]) answers without suspending:
 * plain blocking code, like most HTTP clients. [Executor.execute] and
 * [Executor.executeBlocking] run it on the calling thread through the
 * library's caller-driven steps (`start` → the tool → `report`): no hop to
 * the library's threads, no call back from them into the JVM. Every rule of
 * the protocol is the library's: the intent is durable before [performNow]
 * runs, a second caller of the same call gets `InFlight`, a crash between
 * the effect and its report is reconciled on the next ask.
 *
 * ```kotlin
 * class SendEmail : SyncTool(toolDescriptor("send_email", idempotencyKey = true)) {
 *     override fun performNow(request: ToolRequest) =
 *         PerformOutcome.Committed(resultJson = http.post(request), externalId = null)
 * }
 * ```
 *
 * Throwing from [performNow] means the outcome is unknown (the request may
 * have gone out). The executor's `performTimeoutMs` cannot stop a running
 * function: keep the tool's own deadlines. The library still calls
 * [perform] / [lookup] itself when no caller waits (`recover`, `approve`,
 * `runExisting`, `executeRound`).
 */
abstract class SyncTool(descriptor: ToolDescriptor) : Tool(descriptor) {
    /** Runs one attempt on the calling thread. */
    abstract fun performNow(request: ToolRequest): PerformOutcome

    /** Looks the effect of [request] up downstream; `Unsupported` unless overridden. */
    open fun lookupNow(request: ToolRequest): LookupOutcome = LookupOutcome.Unsupported

    final override suspend fun perform(request: ToolRequest): PerformOutcome = performNow(request)

    final override suspend fun lookup(request: ToolRequest): LookupOutcome = lookupNow(request)
}

/**
 * Walks one call's caller-driven steps on this thread, running [tool] for
 * each attempt or lookup the library hands out (each step one native call:
 * [DirectSteps]). If the tool throws an [Exception], the attempt is
 * reported as an unknown outcome and the walk goes on (for a key tool, a
 * same-key resend). An [Error] (`OutOfMemoryError`, `StackOverflowError`)
 * or an interruption of this thread (an `InterruptedException`, or any
 * throw with the thread's interrupt status set, such as NIO's
 * `ClosedByInterruptException`) ends the walk: the attempt is reported
 * interrupted (unknown, nothing more handed out; the next ask reconciles
 * it) and the throwable is rethrown, a failure of that report attached to
 * it as suppressed. When [gaveUp] answers a throwable as an attempt is
 * handed out (this thread interrupted; for `execute`, its coroutine
 * cancelled), the tool does not run: the attempt is abandoned (never sent)
 * and that throwable thrown; so it is before a retry's backoff. Bounded by
 * the library's attempts.
 */
internal fun drive(
    executor: ToolExecutor,
    first: CallerStep,
    tool: SyncTool,
    gaveUp: () -> Throwable? = ::threadInterrupted,
): CallOutcome {
    var step = first
    repeat(MAX_STEPS) {
        step = when (val s = step) {
            is CallerStep.Done -> return s.outcome
            is CallerStep.Perform -> {
                gaveUp()?.let { abandon(executor, s.attempt, it) }
                val outcome = try {
                    tool.performNow(s.attempt.request)
                } catch (e: Throwable) {
                    if (e !is Exception || isInterruption(e)) interrupted(executor, s.attempt, e)
                    PerformOutcome.Unknown(reason = "${e.javaClass.simpleName} thrown by the tool")
                }
                // A string the library cannot take (an unpaired surrogate)
                // is an unknown outcome: the report must reach the library.
                DirectSteps.report(executor, s.attempt, encodable(outcome))
            }
            is CallerStep.Lookup -> {
                val found = try {
                    tool.lookupNow(s.attempt.request)
                } catch (e: Throwable) {
                    if (e !is Exception || isInterruption(e)) {
                        // The lookup proved nothing: the outcome stays unknown.
                        runCatching { DirectSteps.reportLookupError(executor, s.attempt, "the lookup was interrupted") }
                            .exceptionOrNull()?.let(e::addSuppressed)
                        throw e
                    }
                    null
                }
                reportFound(executor, s.attempt, found, "the lookup threw")
            }
            is CallerStep.Retry -> {
                // Nothing is outstanding between a failure and its retry.
                gaveUp()?.let { throw it }
                Thread.sleep(s.afterMs.toSigned())
                DirectSteps.retry(executor, s.attempt)
            }
        }
    }
    return atTheStepLimit(executor, step)
}

/**
 * A walk that took [MAX_STEPS] steps (a library bug, or a configuration
 * with more attempts than the walk allows) ends here with [last], the step
 * the library answered last: a `Done` is returned; a handed-out `Perform`
 * is abandoned (recorded as never sent: the tool did not run it) and a
 * `Lookup` reported as failed (the outcome stays unknown), so that nothing
 * is left in flight; then an [IllegalStateException] is thrown.
 */
internal fun atTheStepLimit(executor: ToolExecutor, last: CallerStep): CallOutcome {
    val e = IllegalStateException("toolledger: a call did not settle within $MAX_STEPS steps")
    when (last) {
        is CallerStep.Done -> return last.outcome
        is CallerStep.Perform -> abandon(executor, last.attempt, e)
        is CallerStep.Lookup -> {
            runCatching { DirectSteps.reportLookupError(executor, last.attempt, "the caller's step limit was reached") }
                .exceptionOrNull()?.let(e::addSuppressed)
            throw e
        }
        is CallerStep.Retry -> throw e
    }
}

/**
 * Reports what a lookup of [attempt] answered: [found], or, for null (the
 * lookup threw, or timed out), a failed lookup with [failure]; a result the
 * library cannot take (an unpaired UTF-16 surrogate) is a failed lookup too.
 */
internal fun reportFound(executor: ToolExecutor, attempt: CallerAttempt, found: LookupOutcome?, failure: String): CallerStep =
    when {
        found == null -> DirectSteps.reportLookupError(executor, attempt, failure)
        !isEncodable(found) -> DirectSteps.reportLookupError(executor, attempt, "the lookup's result is not valid UTF-16")
        else -> DirectSteps.reportLookup(executor, attempt, found)
    }

/**
 * An `InterruptedException` when this thread is interrupted (the interrupt
 * status cleared, as `Thread.sleep` would clear it), else null.
 */
internal fun threadInterrupted(): Throwable? =
    if (Thread.interrupted()) InterruptedException("the thread was interrupted before the tool ran; nothing was sent") else null

/** True when [e] is this thread's interruption, not the tool's own failure. */
private fun isInterruption(e: Throwable): Boolean =
    e is InterruptedException || Thread.currentThread().isInterrupted

/**
 * Reports [attempt] interrupted while the tool ran (unknown; unlike a
 * report of `Unknown` nothing is handed out, so no same-key resend is left
 * running for nobody) and rethrows [e]. A read-only attempt has nothing
 * recorded to report. A failure of the report is attached to [e], never
 * thrown in its place.
 */
internal fun interrupted(executor: ToolExecutor, attempt: CallerAttempt, e: Throwable): Nothing {
    if (!attempt.readOnly) {
        runCatching {
            executor.reportInterrupted(attempt.request.executionId, attempt.request.attempt, INTERRUPTED)
        }.exceptionOrNull()?.let(e::addSuppressed)
    }
    throw e
}

/**
 * [attempt] was handed out to a caller that gave up ([e]: its thread
 * interrupted, its coroutine cancelled): the tool does not run, the attempt
 * is recorded as never sent (a first attempt failed before commit,
 * retryable; a same-key resend back to unknown), and [e] is thrown, a
 * failure of that record attached as suppressed.
 */
internal fun abandon(executor: ToolExecutor, attempt: CallerAttempt, e: Throwable): Nothing {
    if (!attempt.readOnly) {
        runCatching {
            executor.abandonAttempt(attempt.request.executionId, attempt.request.attempt, NOT_RUN)
        }.exceptionOrNull()?.let(e::addSuppressed)
    }
    throw e
}

/** The most steps one call's walk takes (two per retried attempt). */
internal const val MAX_STEPS = 1024
private const val INTERRUPTED = "the caller was interrupted while the tool ran; the outcome is unknown"
private const val NOT_RUN = "the caller gave up before the tool ran"

/**
 * Keeps the library's threads attached to the JVM after they call into
 * Kotlin (a suspending tool's `perform`, the completion of an awaited call),
 * instead of JNA attaching and detaching a thread on every callback. Those
 * threads are the library's runtime workers, which live as long as the
 * process; JNA detaches them when they exit. Done once, before the first
 * executor is made.
 */
internal object AttachedCallbacks {
    init {
        val keep = CallbackThreadInitializer(true, false, "toolledger-callback")
        listOf(
            uniffiCallbackInterfaceToolHandler.`perform`,
            uniffiCallbackInterfaceToolHandler.`lookup`,
            uniffiCallbackInterfaceToolHandler.`approvalPreview`,
            uniffiCallbackInterfaceToolHandler.uniffiFree,
            uniffiCallbackInterfaceToolHandler.uniffiClone,
            uniffiRustFutureContinuationCallbackImpl,
            uniffiForeignFutureDroppedCallbackImpl,
        ).forEach { Native.setCallbackThreadInitializer(it, keep) }
    }

    /** Applies the setting (the first call does the work). */
    fun ensure() = Unit
}
