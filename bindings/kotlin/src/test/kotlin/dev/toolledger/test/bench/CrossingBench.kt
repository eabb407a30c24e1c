// What a call costs through the Kotlin bindings (JVM + JNA), beside the same
// call through the Rust API, in one run (scripts/bench-crossing.sh kotlin):
//
//     java -cp <tests.jar + toolledger.jar + runtime> dev.toolledger.test.bench.CrossingBenchKt \
//          REFERENCE DIR [calls] [batches] [--callbacks-only]
//
// REFERENCE is the toolledger-crossing-reference program (the Rust side; see
// tools/bench/src/bin/crossing_reference.rs); batches alternate between it
// and each Kotlin variant. Figures: `ledger` (begin → commit → markDelivered),
// `executor` (a new side-effecting call), `replay`, `read_only`; the executor
// figures three ways: `callback` (the generated suspend `execute`: the
// library calls the Kotlin tool back from its threads), `driven_blocking`
// (ktx `Executor.executeBlocking` of a SyncTool: caller-driven steps on this
// thread), `driven_suspend` (ktx `execute` of a SyncTool from a coroutine
// whose thread is blocked in `runBlocking`, as a UI thread's event loop
// waits: the hop to `Dispatchers.IO` and the wake-up back are paid), and
// `driven_suspend_from_default` (the same `execute` from a coroutine that
// already runs on `Dispatchers.Default`, as an agent loop in a worker
// coroutine does: `Dispatchers.IO` shares its threads, so the switch needs
// no other thread; each call is timed inside that coroutine), and
// `caller_tool_suspend` / `caller_tool_from_default`: the same two for a
// CallerTool (a suspending tool that ktx `execute` runs in the calling
// coroutine through the caller-driven steps).
// Also printed: the heap bytes each way allocates per call on the calling
// thread, the garbage collections (count, ms) and the JIT's compile time
// while measuring; for every way (Rust's too) p99/p50 and how many of the
// calls slower than twice the p50 were the first call of their batch (the
// call after the other side's batch, when caches are cold); and `hop`, a
// bare round trip from a blocked caller to `Dispatchers.IO` and back (what
// `driven_suspend` adds to `driven_blocking` by itself).
// `--callbacks-only` measures `callback` without ever making a ktx Executor,
// so the library's threads are attached and detached by JNA on every
// callback, as before the ktx layer kept them attached.
package dev.toolledger.test.bench

import dev.toolledger.CallOutcome
import dev.toolledger.CallSpec
import dev.toolledger.EffectClass
import dev.toolledger.ExecutorConfig
import dev.toolledger.Ledger
import dev.toolledger.LedgerConfig
import dev.toolledger.PerformOutcome
import dev.toolledger.Provider
import dev.toolledger.ToolCall
import dev.toolledger.ToolExecutor
import dev.toolledger.ToolRequest
import dev.toolledger.Begin
import dev.toolledger.ktx.CallerTool
import dev.toolledger.ktx.Executor
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.SyncTool
import dev.toolledger.ktx.Tool
import dev.toolledger.ktx.toolDescriptor
import java.nio.file.Files
import java.nio.file.Path
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.asCoroutineDispatcher
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withContext

private val OK = PerformOutcome.Committed(resultJson = "\"ok\"", externalId = null)

private class Noop(name: String, effect: EffectClass) :
    Tool(toolDescriptor(name, effect, idempotencyKey = effect == EffectClass.SIDE_EFFECT)) {
    override suspend fun perform(request: ToolRequest) = OK
}

private class NoopCaller(name: String, effect: EffectClass) :
    CallerTool(toolDescriptor(name, effect, idempotencyKey = effect == EffectClass.SIDE_EFFECT)) {
    override suspend fun perform(request: ToolRequest) = OK
}

private class NoopSync(name: String, effect: EffectClass) :
    SyncTool(toolDescriptor(name, effect, idempotencyKey = effect == EffectClass.SIDE_EFFECT)) {
    override fun performNow(request: ToolRequest) = OK
}

private class Reference(program: String, dir: Path) {
    private val child = ProcessBuilder(program, dir.toString())
        .redirectError(ProcessBuilder.Redirect.INHERIT).start()
    private val input = child.outputStream.bufferedWriter()
    private val output = child.inputStream.bufferedReader()

    fun batch(figure: String, n: Int): List<Long> {
        input.write("$figure $n\n")
        input.flush()
        val line = output.readLine() ?: error("the reference program stopped")
        return line.split(' ').map { it.toLong() }
    }

    fun close() {
        input.close()
        child.waitFor()
    }
}

private fun call(id: String, tool: String) = ToolCall(
    provider = Provider.CUSTOM, callId = id, toolName = tool, arguments = "{}",
)

private fun pct(samples: List<Long>, q: Double): Long {
    val sorted = samples.sorted()
    return sorted[minOf(sorted.size - 1, (q * sorted.size).toInt())] / 1000
}

fun main(args: Array<String>) {
    val reference = args[0]
    val dir = Path.of(args[1]).also { Files.createDirectories(it) }
    val calls = args.getOrNull(2)?.toIntOrNull() ?: 50
    val batches = args.getOrNull(3)?.toIntOrNull() ?: 10
    val callbacksOnly = "--callbacks-only" in args
    val rust = Reference(reference, dir)
    val native = Ledger.open(dir.resolve("kotlin.db").toString(), LedgerConfig())
    val generated = ToolExecutor(native, ExecutorConfig())
    generated.register(Noop("noop", EffectClass.SIDE_EFFECT))
    generated.register(Noop("noop_read", EffectClass.READ_ONLY))
    val ktx = if (callbacksOnly) null else Executor(
        SuspendLedger(native),
        tools = listOf(
            NoopSync("noop_sync", EffectClass.SIDE_EFFECT), NoopSync("noop_read_sync", EffectClass.READ_ONLY),
            NoopCaller("noop_caller", EffectClass.SIDE_EFFECT), NoopCaller("noop_read_caller", EffectClass.READ_ONLY),
        ),
    )
    // The same executor's SyncTool calls through one dedicated thread
    // instead of Dispatchers.IO (`driven_suspend_own_thread`): whether a
    // thread kept for the ledger's steps makes the hop cheaper.
    val ownThread = java.util.concurrent.Executors.newSingleThreadExecutor { Thread(it, "toolledger-steps").apply { isDaemon = true } }
    val ktxOwn = ktx?.let { Executor(ToolExecutor(native, ExecutorConfig()), ownThread.asCoroutineDispatcher()) }
    ktxOwn?.register(NoopSync("noop_sync", EffectClass.SIDE_EFFECT))
    ktxOwn?.register(NoopSync("noop_read_sync", EffectClass.READ_ONLY))
    var next = 0
    fun newId() = "kt_${next++}"

    fun ledgerOnce() {
        val spec = CallSpec(call = call(newId(), "noop"), toolVersion = 1u, requiresApproval = false)
        val begin = native.begin("crossing", 1u, spec) as Begin.Execute
        native.commit(begin.ticket, "\"ok\"", null)
        native.markDelivered(listOf(begin.ticket.executionId))
    }

    fun check(outcome: CallOutcome) = check(outcome is CallOutcome.Completed) { "not completed: $outcome" }
    fun callback(c: ToolCall) = check(runBlocking { generated.execute("crossing", 2u, c) })
    fun blocking(c: ToolCall) = check(ktx!!.executeBlocking("crossing", 2, c))
    fun suspending(c: ToolCall) = check(runBlocking { ktx!!.execute("crossing", 2, c) })
    fun ownThread(c: ToolCall) = check(runBlocking { ktxOwn!!.execute("crossing", 2, c) })
    // Calls timed inside one coroutine on Dispatchers.Default (see the top);
    // `timed` collects them for the measuring loop below.
    var timed: MutableList<Long>? = null
    fun fromDefault(c: () -> ToolCall): () -> Unit = {
        runBlocking(Dispatchers.Default) {
            repeat(calls) {
                val call = c()
                val t0 = System.nanoTime()
                check(ktx!!.execute("crossing", 2, call))
                timed?.add(System.nanoTime() - t0)
            }
        }
    }
    val batched = mutableSetOf<String>()

    val replayed = call("replayed", "noop")
    val replayedSync = call("replayed", "noop_sync")
    val replayedCaller = call("replayed", "noop_caller")
    callback(replayed)
    ktx?.let { blocking(replayedSync) }
    ktx?.let { suspending(replayedCaller) }
    val variants = linkedMapOf<String, List<Pair<String, () -> Unit>>>(
        "ledger" to listOf("kotlin" to ::ledgerOnce),
        "executor" to listOfNotNull(
            "kotlin_callback" to { callback(call(newId(), "noop")) },
            ktx?.let { "kotlin_driven_blocking" to { blocking(call(newId(), "noop_sync")) } },
            ktx?.let { "kotlin_driven_suspend" to { suspending(call(newId(), "noop_sync")) } },
            ktx?.let { "kotlin_driven_suspend_own_thread" to { ownThread(call(newId(), "noop_sync")) } },
            ktx?.let { "kotlin_driven_suspend_from_default" to fromDefault { call(newId(), "noop_sync") } },
            ktx?.let { "kotlin_caller_tool_suspend" to { suspending(call(newId(), "noop_caller")) } },
            ktx?.let { "kotlin_caller_tool_from_default" to fromDefault { call(newId(), "noop_caller") } },
        ),
        "replay" to listOfNotNull(
            "kotlin_callback" to { callback(replayed) },
            ktx?.let { "kotlin_driven_blocking" to { blocking(replayedSync) } },
            ktx?.let { "kotlin_driven_suspend" to { suspending(replayedSync) } },
            ktx?.let { "kotlin_driven_suspend_own_thread" to { ownThread(replayedSync) } },
            ktx?.let { "kotlin_driven_suspend_from_default" to fromDefault { replayedSync } },
            ktx?.let { "kotlin_caller_tool_suspend" to { suspending(replayedCaller) } },
            ktx?.let { "kotlin_caller_tool_from_default" to fromDefault { replayedCaller } },
        ),
        "read_only" to listOfNotNull(
            "kotlin_callback" to { callback(call("read", "noop_read")) },
            ktx?.let { "kotlin_driven_blocking" to { blocking(call("read", "noop_read_sync")) } },
            ktx?.let { "kotlin_driven_suspend" to { suspending(call("read", "noop_read_sync")) } },
            ktx?.let { "kotlin_driven_suspend_own_thread" to { ownThread(call("read", "noop_read_sync")) } },
            ktx?.let { "kotlin_driven_suspend_from_default" to fromDefault { call("read", "noop_read_sync") } },
            ktx?.let { "kotlin_caller_tool_suspend" to { suspending(call("read", "noop_read_caller")) } },
            ktx?.let { "kotlin_caller_tool_from_default" to fromDefault { call("read", "noop_read_caller") } },
        ),
    )
    if (System.getenv("ROUNDS") == "1") {
        // A round of eight new calls (one durable begin for the eight).
        fun eight(tool: String) = List(8) { call(newId(), tool) }
        fun checkAll(outs: List<CallOutcome>) = outs.forEach(::check)
        variants["round8"] = listOfNotNull(
            "kotlin_callback" to { checkAll(runBlocking { generated.executeRound("crossing", 4u, eight("noop")) }) },
            ktx?.let { "kotlin_driven_suspend" to { checkAll(runBlocking { ktx!!.executeRound("crossing", 4, eight("noop_sync")) }) } },
            ktx?.let { "kotlin_caller_tool_suspend" to { checkAll(runBlocking { ktx!!.executeRound("crossing", 4, eight("noop_caller")) }) } },
            ktx?.let { "kotlin_caller_tool_each" to { runBlocking { repeat(8) { check(ktx!!.execute("crossing", 4, call(newId(), "noop_caller"))) } } } },
        )
    }
    batched.addAll(
        listOf("executor", "replay", "read_only").flatMap {
            listOf("${it}_kotlin_driven_suspend_from_default", "${it}_kotlin_caller_tool_from_default")
        },
    )
    val hop = listOf("kotlin_hop" to { runBlocking { withContext(Dispatchers.IO) { } } })
    // Warm-up: the JIT compiles the paths before anything is measured —
    // rounds of every way until a round keeps the compiler busy for less
    // than 20 ms (at least 2 rounds, at most 20): compiling while measuring
    // takes a core from the calls on a 2-core machine and lands in the tail.
    val jit = java.lang.management.ManagementFactory.getCompilationMXBean()
    var warmRounds = 0
    do {
        val before = jit.totalCompilationTime
        for ((figure, ways) in variants + ("hop" to hop)) {
            for ((name, fn) in ways) if ("${figure}_$name" in batched) fn() else repeat(calls) { fn() }
        }
        warmRounds++
    } while (warmRounds < 20 && (warmRounds < 2 || jit.totalCompilationTime - before >= 20))
    // Heap bytes each way allocates per call on the calling thread (the
    // suspending way's I/O thread is not counted), after the warm-up.
    val threads = java.lang.management.ManagementFactory.getThreadMXBean() as com.sun.management.ThreadMXBean
    val allocated = variants.flatMap { (figure, ways) ->
        ways.filter { (name, _) -> "${figure}_$name" !in batched }.map { (name, fn) ->
            val before = threads.getThreadAllocatedBytes(Thread.currentThread().id)
            repeat(calls) { fn() }
            "${figure}_$name" to (threads.getThreadAllocatedBytes(Thread.currentThread().id) - before) / calls
        }
    }.toMap()
    val gcs = java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    val gcCount0 = gcs.sumOf { it.collectionCount }
    val gcMs0 = gcs.sumOf { it.collectionTime }
    val jitMs0 = jit.totalCompilationTime
    val samples = mutableMapOf<String, MutableList<Long>>()
    repeat(batches) {
        for ((figure, ways) in variants + ("hop" to hop)) {
            if (figure != "hop") {
                samples.getOrPut("${figure}_rust") { mutableListOf() }.addAll(rust.batch(figure, calls))
            }
            for ((name, fn) in ways) {
                val out = samples.getOrPut("${figure}_$name") { mutableListOf() }
                if ("${figure}_$name" in batched) {
                    timed = out
                    fn()
                    timed = null
                    continue
                }
                repeat(calls) {
                    val t0 = System.nanoTime()
                    fn()
                    out.add(System.nanoTime() - t0)
                }
            }
        }
    }
    val gcCount = gcs.sumOf { it.collectionCount } - gcCount0
    val gcMs = gcs.sumOf { it.collectionTime } - gcMs0
    val jitMs = jit.totalCompilationTime - jitMs0
    rust.close()
    val load = java.lang.management.ManagementFactory.getOperatingSystemMXBean().systemLoadAverage
    val heapMb = Runtime.getRuntime().maxMemory() / (1024 * 1024)
    println("dir=$dir calls=$calls batches=$batches load=${"%.1f".format(load)} callbacks_only=$callbacksOnly")
    println(
        "max_heap_mb=$heapMb gc_collections_while_measuring=$gcCount gc_ms_while_measuring=$gcMs " +
            "jit_ms_while_measuring=$jitMs warmup_rounds=$warmRounds",
    )
    // p99/p50; the calls slower than 2×p50: how many, and how many of those
    // were the first call of their batch (right after the other side's
    // batch); and p99/p50 without those first calls (`_warm`): 10 cold
    // first calls in 500 are the p99 by themselves, on either side.
    fun ratio(s: List<Long>) = "%.2f".format(pct(s, 0.99).toDouble() / maxOf(1, pct(s, 0.5)))
    fun tail(key: String, s: List<Long>): String {
        val p50 = pct(s, 0.5)
        val slow = s.withIndex().filter { (_, v) -> v > 2 * p50 * 1000 }
        val warm = s.filterIndexed { i, _ -> i % calls != 0 }
        return "${key}_p99_over_p50=${ratio(s)} ${key}_slow=${slow.size} " +
            "${key}_slow_first_of_batch=${slow.count { (i, _) -> i % calls == 0 }} " +
            "${key}_warm_p99_us=${pct(warm, 0.99)} ${key}_warm_p99_over_p50=${ratio(warm)}"
    }
    for ((figure, ways) in variants) {
        val r = samples.getValue("${figure}_rust")
        val r50 = pct(r, 0.5)
        println("${figure}_rust_p50_us=$r50 ${figure}_rust_p99_us=${pct(r, 0.99)} ${tail("${figure}_rust", r)}")
        for ((name, _) in ways) {
            val s = samples.getValue("${figure}_$name")
            val p50 = pct(s, 0.5)
            println(
                "${figure}_${name}_p50_us=$p50 ${figure}_${name}_p99_us=${pct(s, 0.99)} " +
                    "${figure}_${name}_over_rust_p50_us=${p50 - r50} ${figure}_${name}_alloc_bytes_per_call=${allocated["${figure}_$name"] ?: "n/a"} " +
                    tail("${figure}_$name", s),
            )
        }
    }
    hop.forEach { (name, _) ->
        val s = samples.getValue("hop_$name")
        println("hop_${name}_p50_us=${pct(s, 0.5)} hop_${name}_p99_us=${pct(s, 0.99)} ${tail("hop_$name", s)}")
    }
    ktx?.close()
    generated.close()
    native.close()
    kotlin.system.exitProcess(0)
}
