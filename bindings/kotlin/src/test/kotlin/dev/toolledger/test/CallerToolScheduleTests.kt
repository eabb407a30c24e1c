// Seeded schedules for a CallerTool: one to three coroutines ask for the same
// call at random moments, some are cancelled at random moments, and the tool
// follows a seeded script per attempt (answers, refuses retryably, throws or
// hangs past the perform timeout, before or after its effect). For each
// downstream kind the invariants are checked after every schedule:
//
// - at most one effect per call (a key downstream dedupes by key, so there
//   every attempt must carry the same key; a lookup or a neither downstream
//   does not dedupe, so a second effect would be a resend the ledger made);
// - every Completed answer (to any caller, and the final one) is the effect's
//   own result, and the effect exists; a final Failed answer (not retryable,
//   or the answer once every caller is gone) means no effect;
// - once every caller is gone the call settles: asking again answers
//   something other than InFlight within a bounded wait.
//
// The round schedules check the same per call for executeRound (rounds of
// two or three calls, racing single calls of the same calls, under a random
// maxParallel). TOOLLEDGER_KT_SCHEDULES sets the number of schedules per
// kind (default 100).
package dev.toolledger.test

import dev.toolledger.CallOutcome
import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.Provider
import dev.toolledger.ToolCall
import dev.toolledger.ToolRequest
import dev.toolledger.ktx.CallerTool
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.executorConfig
import dev.toolledger.ktx.toolDescriptor
import java.util.Collections
import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.atomic.AtomicInteger
import kotlin.random.Random
import kotlin.test.assertEquals
import kotlin.test.assertTrue
import kotlin.test.fail
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.Job
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.delay
import kotlinx.coroutines.joinAll
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext

/** What the downstream offers after an unknown outcome. */
private enum class Offers { KEY, LOOKUP, NEITHER }

/** What one attempt of the scripted tool does. */
private enum class Move { ANSWER, REFUSE, THROW_BEFORE, HANG_BEFORE, THROW_AFTER, HANG_AFTER, SLOW_ANSWER }

/** A service in memory: effects per downstream key; it dedupes by key only when told to. */
private class Service {
    private val effects = ConcurrentHashMap<String, AtomicInteger>()

    fun perform(key: String): String {
        effects.computeIfAbsent(key) { AtomicInteger() }.incrementAndGet()
        return "msg_$key"
    }

    fun find(key: String): String? = if (count(key) > 0) "msg_$key" else null

    fun count(key: String): Int = effects[key]?.get() ?: 0
}

/** A tool following [moves] attempt by attempt (the last move repeats). */
private class Scripted(
    name: String,
    private val offers: Offers,
    private val service: Service,
    private val moves: List<Move>,
) : CallerTool(
    toolDescriptor(name, idempotencyKey = offers == Offers.KEY, lookup = offers == Offers.LOOKUP, landingWindowMs = 1),
) {
    val attempts = AtomicInteger()
    val keys: MutableSet<String> = Collections.synchronizedSet(mutableSetOf())

    override suspend fun perform(request: ToolRequest): PerformOutcome {
        val n = attempts.incrementAndGet()
        val key = request.downstreamKey
        keys.add(key)
        // A downstream that dedupes by key answers a repeated key with the
        // first effect, whatever else it would do.
        if (offers == Offers.KEY) service.find(key)?.let { return committed(it) }
        val move = moves[minOf(n, moves.size) - 1]
        when (move) {
            Move.REFUSE -> return PerformOutcome.FailedBeforeCommit(reason = "503", retryable = true)
            Move.THROW_BEFORE -> throw java.io.IOException("connection refused")
            Move.HANG_BEFORE -> awaitCancellation()
            else -> Unit
        }
        val id = service.perform(key)
        when (move) {
            Move.THROW_AFTER -> throw java.io.IOException("connection reset")
            Move.HANG_AFTER -> awaitCancellation()
            Move.SLOW_ANSWER -> delay(3)
            else -> Unit
        }
        return committed(id)
    }

    override suspend fun lookup(request: ToolRequest): LookupOutcome =
        service.find(request.downstreamKey)?.let { LookupOutcome.Found(resultJson = sentJson(it), externalId = it) }
            ?: LookupOutcome.NotFound

    private fun committed(id: String) = PerformOutcome.Committed(resultJson = sentJson(id), externalId = id)
}

/**
 * The invariants of one call after its schedule: at most one effect (and
 * one key, for a key downstream); every Completed answer the effect's own
 * result; a final Failed only with no effect.
 */
private fun checkCall(what: String, service: Service, tool: Scripted, offers: Offers, answers: List<CallOutcome>, final: CallOutcome) {
    val key = tool.keys.singleOrNull()
    val effects = tool.keys.sumOf { service.count(it) }
    if (offers == Offers.KEY) assertTrue(tool.keys.size <= 1, "$what: a resend under another key: ${tool.keys}")
    assertTrue(effects <= 1, "$what: $effects effects")
    for (a in answers) {
        when (a) {
            is CallOutcome.Completed -> {
                assertEquals(1, effects, "$what: Completed with no effect: $a")
                assertEquals(sentJson("msg_$key"), a.resultJson, "$what: a result that is not the effect's")
            }
            // A retryable failure told to one caller may be followed by
            // another caller's retry that succeeds; a final one (not
            // retryable, or the answer once every caller is gone) may not.
            is CallOutcome.Failed -> if (!a.retryable || a === final) {
                assertEquals(0, effects, "$what: Failed although the effect happened: $a")
            }
            else -> Unit
        }
    }
}

private fun schedules(): Int = System.getenv("TOOLLEDGER_KT_SCHEDULES")?.toIntOrNull() ?: 100

private suspend fun TestContext.runSchedules(offers: Offers) {
    val ledger = closeAfter(SuspendLedger.open(ledgerPath))
    val executor = closeAfter(
        Executor(ledger, executorConfig(maxAttempts = 3, performTimeoutMs = 40, backoffBaseMs = 1, backoffMaxMs = 2)),
    )
    val service = Service()
    val counts = mutableMapOf<String, Int>()
    repeat(schedules()) { s ->
        val random = Random(20261202L * 31 + s * 7 + offers.ordinal)
        val moves = List(3) { Move.entries[random.nextInt(Move.entries.size)] }
        val name = "tool_$s"
        val tool = Scripted(name, offers, service, moves)
        executor.register(tool)
        val call = ToolCall(provider = Provider.CUSTOM, callId = "call_$s", toolName = name, arguments = "{}")
        val answers: MutableList<CallOutcome> = Collections.synchronizedList(mutableListOf())
        withContext(Dispatchers.Default) {
            val callers = List(1 + random.nextInt(3)) {
                val start = random.nextLong(0, 10)
                val cancelAfter = if (random.nextInt(10) < 3) random.nextLong(0, 60) else null
                launch {
                    delay(start)
                    val caller = launch {
                        try {
                            answers.add(executor.execute("sched_$offers", 0, call))
                        } catch (e: kotlinx.coroutines.CancellationException) {
                            throw e
                        }
                    }
                    if (cancelAfter != null) {
                        delay(cancelAfter)
                        caller.cancel()
                    }
                    caller.join()
                }
            }
            callers.joinAll()
        }
        // Every caller gone: the call settles.
        var last: CallOutcome? = null
        for (i in 0 until 300) {
            last = executor.execute("sched_$offers", 0, call)
            if (last !is CallOutcome.InFlight) break
            delay(10)
        }
        val final = last!!
        if (final is CallOutcome.InFlight) fail("schedule $s ($offers, $moves): still InFlight after every caller left")
        answers.add(final)
        checkCall("schedule $s ($offers, $moves): answers $answers", service, tool, offers, answers, final)
        val kind = final.javaClass.simpleName
        counts[kind] = (counts[kind] ?: 0) + 1
    }
    println("    $offers: ${schedules()} schedules, final answers $counts")
}

/**
 * The same invariants for `executeRound`: each schedule is a round of two
 * or three calls (a scripted tool each), asked for by one to three
 * coroutines at random moments, as a round or (some of them) one call at a
 * time, some cancelled at random moments, under a random `maxParallel`
 * (1 to 3).
 */
private suspend fun TestContext.runRoundSchedules(offers: Offers) {
    val ledger = closeAfter(SuspendLedger.open(ledgerPath))
    val executors = (1..3).associateWith { width ->
        closeAfter(
            Executor(
                ledger,
                executorConfig(maxAttempts = 3, performTimeoutMs = 40, backoffBaseMs = 1, backoffMaxMs = 2, maxParallel = width),
            ),
        )
    }
    val service = Service()
    val counts = mutableMapOf<String, Int>()
    val op = "rounds_$offers"
    repeat(schedules()) { s ->
        val random = Random(20261203L * 31 + s * 7 + offers.ordinal)
        val executor = executors.getValue(1 + random.nextInt(3))
        val size = 2 + random.nextInt(2)
        val scripts = List(size) { List(3) { Move.entries[random.nextInt(Move.entries.size)] } }
        val tools = List(size) { i -> Scripted("rtool_${s}_$i", offers, service, scripts[i]).also(executor::register) }
        val calls = tools.mapIndexed { i, t ->
            ToolCall(provider = Provider.CUSTOM, callId = "rcall_${s}_$i", toolName = t.descriptor().name, arguments = "{}")
        }
        val answers = List(size) { Collections.synchronizedList(mutableListOf<CallOutcome>()) }
        withContext(Dispatchers.Default) {
            val callers = List(1 + random.nextInt(3)) {
                val start = random.nextLong(0, 10)
                val cancelAfter = if (random.nextInt(10) < 3) random.nextLong(0, 60) else null
                val which = if (random.nextInt(3) == 0) random.nextInt(size) else null
                launch {
                    delay(start)
                    val caller = launch {
                        if (which == null) {
                            executor.executeRound(op, 0, calls).forEachIndexed { i, a -> answers[i].add(a) }
                        } else {
                            answers[which].add(executor.execute(op, 0, calls[which]))
                        }
                    }
                    if (cancelAfter != null) {
                        delay(cancelAfter)
                        caller.cancel()
                    }
                    caller.join()
                }
            }
            callers.joinAll()
        }
        // Every caller gone: every call settles.
        var final: List<CallOutcome> = emptyList()
        for (attempt in 0 until 300) {
            final = executor.executeRound(op, 0, calls)
            if (final.none { it is CallOutcome.InFlight }) break
            delay(10)
        }
        for (i in 0 until size) {
            val what = "round schedule $s ($offers), call $i ${scripts[i]}: answers ${answers[i]}, final ${final[i]}"
            if (final[i] is CallOutcome.InFlight) fail("$what: still InFlight after every caller left")
            checkCall(what, service, tools[i], offers, answers[i] + final[i], final[i])
            val kind = final[i].javaClass.simpleName
            counts[kind] = (counts[kind] ?: 0) + 1
        }
    }
    println("    $offers: ${schedules()} round schedules, final answers $counts")
}

val callerToolScheduleTests = listOf(
    test("CallerTool schedules: a key downstream, random callers, cancellations and failures: one effect, one key, settled") {
        runSchedules(Offers.KEY)
    },
    test("CallerTool schedules: a lookup downstream: at most one effect, never resent while it exists, settled") {
        runSchedules(Offers.LOOKUP)
    },
    test("CallerTool schedules: a neither downstream: at most one effect, never resent, settled") {
        runSchedules(Offers.NEITHER)
    },
    test("CallerTool round schedules: a key downstream, rounds and single calls racing, cancellations: one effect per call, settled") {
        runRoundSchedules(Offers.KEY)
    },
    test("CallerTool round schedules: a lookup downstream: at most one effect per call, settled") {
        runRoundSchedules(Offers.LOOKUP)
    },
    test("CallerTool round schedules: a neither downstream: at most one effect per call, never resent, settled") {
        runRoundSchedules(Offers.NEITHER)
    },
)
