// Suspending tools run by the calling coroutine itself through the library's
// caller-driven steps (ToolExecutor.start / report), with no callback from
// the library's threads into the JVM.
package dev.toolledger.ktx

import dev.toolledger.CallOutcome
import dev.toolledger.CallerStep
import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.ToolDescriptor
import dev.toolledger.ToolExecutor
import kotlinx.coroutines.delay
import kotlinx.coroutines.withTimeoutOrNull

/**
 * A suspending tool that [Executor.execute] runs in the calling coroutine's
 * place through the library's caller-driven steps: `start` → [perform] →
 * `report`, each step one native call, the whole walk on the executor's
 * dispatcher (`Dispatchers.IO` unless given) with the caller's context (its
 * `CoroutineName`, its tracing or MDC elements). No callback from the
 * library's threads into the JVM, so no thread attached, no foreign future
 * and no extra hop: what a [SyncTool] costs, for a tool that suspends (a
 * Ktor or Retrofit `suspend` call).
 *
 * ```kotlin
 * class SendEmail : CallerTool(toolDescriptor("send_email", idempotencyKey = true)) {
 *     override suspend fun perform(request: ToolRequest) =
 *         PerformOutcome.Committed(resultJson = api.send(request.downstreamKey), externalId = null)
 * }
 * ```
 *
 * The rules are the library's, as for every tool: the intent is durable
 * before [perform] runs, a second caller of the same call gets `InFlight`,
 * a crash between the effect and its report is reconciled on the next ask.
 * Once [perform] has started it runs to its end even if the calling
 * coroutine is cancelled (only the answer is lost, as for the library's own
 * calls; the caller's coroutine ends when the tool has); a caller cancelled
 * before that runs nothing, and so does one cancelled during a retry's
 * backoff. [perform] and [lookup] are bounded by the executor's
 * `performTimeoutMs` where they suspend: past it the tool's coroutine is
 * cancelled and the outcome is unknown. Cancellation is cooperative: code
 * that blocks a thread (a read with no deadline) cannot be stopped, and the
 * call is `InFlight` to other callers until it returns (nothing is resent
 * meanwhile); keep such code's own deadlines. An exception from [perform] means the outcome
 * is unknown (the request may have gone out); an [Error] is rethrown after
 * the attempt is recorded as interrupted. The library still calls
 * [perform] / [lookup] itself when no caller waits (`recover`, `approve`,
 * `runExisting`, `executeRound`).
 */
abstract class CallerTool(descriptor: ToolDescriptor) : Tool(descriptor)

/**
 * Walks one call's caller-driven steps for a [CallerTool], in the caller's
 * place on the executor's dispatcher and not cancellable (the caller runs
 * this in `withContext(dispatcher + NonCancellable)`): a step that began is
 * answered and its answer acted on. [gaveUp] answers a throwable when the
 * caller is cancelled as an attempt is handed out (then the tool does not
 * run: the attempt is abandoned, never sent) or before a retry's backoff.
 * Bounded by the library's attempts.
 */
internal suspend fun driveSuspending(
    executor: ToolExecutor,
    first: CallerStep,
    tool: CallerTool,
    performTimeoutMs: Long?,
    gaveUp: () -> Throwable?,
): CallOutcome {
    var step = first
    repeat(MAX_STEPS) {
        step = when (val s = step) {
            is CallerStep.Done -> return s.outcome
            is CallerStep.Perform -> {
                gaveUp()?.let { abandon(executor, s.attempt, it) }
                val outcome = try {
                    bounded(performTimeoutMs) { tool.perform(s.attempt.request) }
                        ?: PerformOutcome.Unknown(reason = TIMED_OUT)
                } catch (e: Throwable) {
                    if (e !is Exception) interrupted(executor, s.attempt, e)
                    PerformOutcome.Unknown(reason = "${e.javaClass.simpleName} thrown by the tool")
                }
                // A string the library cannot take (an unpaired surrogate)
                // is an unknown outcome: the report must reach the library.
                DirectSteps.report(executor, s.attempt, encodable(outcome))
            }
            is CallerStep.Lookup -> {
                var failure = "the lookup threw"
                val found: LookupOutcome? = try {
                    bounded(performTimeoutMs) { tool.lookup(s.attempt.request) }
                        .also { if (it == null) failure = "the lookup timed out" }
                } catch (e: Throwable) {
                    if (e !is Exception) {
                        // The lookup proved nothing: the outcome stays unknown.
                        runCatching { DirectSteps.reportLookupError(executor, s.attempt, "the lookup was interrupted") }
                            .exceptionOrNull()?.let(e::addSuppressed)
                        throw e
                    }
                    null
                }
                reportFound(executor, s.attempt, found, failure)
            }
            is CallerStep.Retry -> {
                // Nothing is outstanding between a failure and its retry: a
                // caller that gives up before or during the backoff stops
                // here (the walk is not cancellable, so it looks).
                gaveUp()?.let { throw it }
                var left = s.afterMs.toSigned()
                while (left > 0) {
                    val slice = minOf(left, BACKOFF_SLICE_MS)
                    delay(slice)
                    left -= slice
                    gaveUp()?.let { throw it }
                }
                DirectSteps.retry(executor, s.attempt)
            }
        }
    }
    return atTheStepLimit(executor, step)
}

/** [block], or null when it takes longer than [timeoutMs] (then cancelled); unbounded for null. */
private suspend fun <T : Any> bounded(timeoutMs: Long?, block: suspend () -> T): T? =
    if (timeoutMs == null) block() else withTimeoutOrNull(timeoutMs) { block() }

/** How often a retry's backoff looks whether the caller gave up, ms. */
private const val BACKOFF_SLICE_MS = 20L

/** The reason the library records for a tool past its perform timeout. */
private const val TIMED_OUT = "timed out waiting for the downstream"
