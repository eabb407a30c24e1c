// The caller-driven steps of a SyncTool call through one plain native call
// each (the library's ffi/src/direct.rs), instead of the generated methods'
// RustBuffer structures, per-argument allocations and handle clones.
package dev.toolledger.ktx

import com.sun.jna.Native
import com.sun.jna.Pointer
import dev.toolledger.CallerAttempt
import dev.toolledger.CallerStep
import dev.toolledger.FfiConverterString
import dev.toolledger.FfiConverterTypeCallerAttempt
import dev.toolledger.FfiConverterTypeCallerStep
import dev.toolledger.FfiConverterTypeLedgerError
import dev.toolledger.FfiConverterTypeLookupOutcome
import dev.toolledger.FfiConverterTypePerformOutcome
import dev.toolledger.FfiConverterTypeToolCall
import dev.toolledger.FfiConverterUInt
import dev.toolledger.InternalException
import dev.toolledger.LedgerException
import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.ToolCall
import dev.toolledger.ToolExecutor
import java.nio.ByteBuffer
import java.nio.ByteOrder

/**
 * `ToolExecutor.start` / `startNow` / `report` / `reportLookup` /
 * `reportLookupError` / `retry` with the same arguments, answers and errors, through
 * `toolledger_direct_step`: the arguments are written with the generated
 * converters into a buffer this thread owns, the library answers into the
 * same buffer. One native call per step (plus the handle clone every
 * generated method makes too); no JNA `Structure`, no `RustBuffer`.
 */
internal object DirectSteps {
    fun start(executor: ToolExecutor, operationId: String, round: UInt, call: ToolCall): CallerStep =
        step(executor, STEP_START, startSize(operationId, round, call)) { writeStart(operationId, round, call, it) }

    /**
     * `ToolExecutor.startNow`: the step when the library answers at once
     * without waiting (a replay), `null` when the call must go through
     * [start] on a thread that may wait (nothing ran). The same request,
     * errors and answer as [start].
     */
    fun startNow(executor: ToolExecutor, operationId: String, round: UInt, call: ToolCall): CallerStep? =
        stepOrNull(executor, STEP_START_NOW, startSize(operationId, round, call)) { writeStart(operationId, round, call, it) }

    /** The bytes of a start request ([start] and [startNow] send the same). */
    private fun startSize(operationId: String, round: UInt, call: ToolCall): ULong =
        FfiConverterString.allocationSize(operationId) + FfiConverterUInt.allocationSize(round) +
            FfiConverterTypeToolCall.allocationSize(call)

    private fun writeStart(operationId: String, round: UInt, call: ToolCall, buf: ByteBuffer) {
        FfiConverterString.write(operationId, buf)
        FfiConverterUInt.write(round, buf)
        FfiConverterTypeToolCall.write(call, buf)
    }

    fun report(executor: ToolExecutor, attempt: CallerAttempt, outcome: PerformOutcome): CallerStep =
        step(
            executor, STEP_REPORT,
            FfiConverterTypeCallerAttempt.allocationSize(attempt) + FfiConverterTypePerformOutcome.allocationSize(outcome),
        ) {
            FfiConverterTypeCallerAttempt.write(attempt, it)
            FfiConverterTypePerformOutcome.write(outcome, it)
        }

    fun reportLookup(executor: ToolExecutor, attempt: CallerAttempt, found: LookupOutcome): CallerStep =
        step(
            executor, STEP_REPORT_LOOKUP,
            FfiConverterTypeCallerAttempt.allocationSize(attempt) + FfiConverterTypeLookupOutcome.allocationSize(found),
        ) {
            FfiConverterTypeCallerAttempt.write(attempt, it)
            FfiConverterTypeLookupOutcome.write(found, it)
        }

    fun reportLookupError(executor: ToolExecutor, attempt: CallerAttempt, message: String): CallerStep =
        step(
            executor, STEP_REPORT_LOOKUP_ERROR,
            FfiConverterTypeCallerAttempt.allocationSize(attempt) + FfiConverterString.allocationSize(message),
        ) {
            FfiConverterTypeCallerAttempt.write(attempt, it)
            FfiConverterString.write(message, it)
        }

    fun retry(executor: ToolExecutor, attempt: CallerAttempt): CallerStep =
        step(executor, STEP_RETRY, FfiConverterTypeCallerAttempt.allocationSize(attempt)) {
            FfiConverterTypeCallerAttempt.write(attempt, it)
        }

    /**
     * Writes the request (at most [size] bytes, the converters' own upper
     * bound) after the header, makes the call, reads the answer. The
     * library has parsed the whole request before it runs the step and
     * writes the answer after it, so a step made on this thread in between
     * (from a callback) cannot mix the two up.
     */
    private inline fun step(executor: ToolExecutor, step: Int, size: ULong, write: (ByteBuffer) -> Unit): CallerStep =
        stepOrNull(executor, step, size, write)
            ?: throw InternalException("toolledger_direct_step: step $step answered WOULD_BLOCK")

    /** [step], `null` for the library's `WOULD_BLOCK` (only [STEP_START_NOW] answers it). */
    private inline fun stepOrNull(executor: ToolExecutor, step: Int, size: ULong, write: (ByteBuffer) -> Unit): CallerStep? {
        val buf = Buffers.forRequest(HEADER + size.toLong())
        val data = buf.data
        data.clear()
        data.position(HEADER.toInt())
        try {
            write(data)
        } catch (e: java.nio.charset.CharacterCodingException) {
            // A string with an unpaired UTF-16 surrogate (half an emoji):
            // nothing was sent to the library.
            throw LedgerException.InvalidInput("a string is not valid UTF-16 (an unpaired surrogate)")
        }
        val inputLen = data.position() - HEADER.toInt()
        // Through the object's call counter, as every generated method: a
        // closed executor refuses (IllegalStateException) instead of handing
        // the library a freed handle, and one closed during the call is
        // freed after it.
        var code = executor.callWithHandle { handle ->
            DirectLib.toolledger_direct_step(handle, step, buf.address, buf.capacity.toLong(), inputLen.toLong())
        }
        var out = buf
        if (code == NEEDS_SPACE) {
            out = Buffers.forAnswer(HEADER + buf.header.getLong(0))
            code = DirectLib.toolledger_direct_take(out.address, out.capacity.toLong())
        }
        if (code == BAD_CALL) throw InternalException("toolledger_direct_step: refused its arguments")
        if (code == WOULD_BLOCK) return null
        val len = out.header.getLong(0)
        check(len >= 0 && len <= out.capacity - HEADER) { "toolledger_direct_step: answer length $len" }
        val answer = out.data
        answer.clear()
        answer.position(HEADER.toInt())
        answer.limit((HEADER + len).toInt())
        when (code) {
            OK -> {
                val next = FfiConverterTypeCallerStep.read(answer)
                if (answer.hasRemaining()) throw InternalException("toolledger_direct_step: junk after the answer")
                return next
            }
            ERROR -> throw FfiConverterTypeLedgerError.read(answer)
            PANIC -> {
                val bytes = ByteArray(len.toInt())
                answer.get(bytes)
                throw InternalException(bytes.toString(Charsets.UTF_8))
            }
            else -> throw InternalException("toolledger_direct_step: unknown answer code $code")
        }
    }

    // ffi/src/direct.rs
    private const val HEADER = 8L
    private const val OK = 0
    private const val ERROR = 1
    private const val PANIC = 2
    private const val NEEDS_SPACE = 3
    private const val BAD_CALL = 4
    private const val WOULD_BLOCK = 5
    private const val STEP_START = 1
    private const val STEP_REPORT = 2
    private const val STEP_REPORT_LOOKUP = 3
    private const val STEP_REPORT_LOOKUP_ERROR = 4
    private const val STEP_RETRY = 5
    private const val STEP_START_NOW = 7
}

/**
 * One direct buffer of native memory: [data] (big-endian, as UniFFI's
 * serialized form) and [header] (native order) are views of the same bytes.
 */
internal class DirectBuffer(val capacity: Int) {
    val data: ByteBuffer = ByteBuffer.allocateDirect(capacity)
    val header: ByteBuffer = data.duplicate().order(ByteOrder.nativeOrder())
    val address: Long = Pointer.nativeValue(Native.getDirectBufferPointer(data))
}

/**
 * This thread's buffer, grown to fit: requests and answers up to
 * [KEEP] bytes reuse it; a larger one gets a buffer of its own that the GC
 * takes back after the call. (Every thread that runs steps keeps one:
 * `Dispatchers.IO` may have 64 threads, so at most 16 MiB in all.)
 */
internal object Buffers {
    private const val INITIAL = 16 * 1024
    private const val KEEP = 256 * 1024
    private val mine = ThreadLocal.withInitial { DirectBuffer(INITIAL) }

    fun forRequest(size: Long): DirectBuffer = fit(size)

    fun forAnswer(size: Long): DirectBuffer = fit(size)

    private fun fit(size: Long): DirectBuffer {
        val current = mine.get()
        if (size <= current.capacity) return current
        check(size <= Int.MAX_VALUE - 8) { "toolledger: a request or answer of $size bytes" }
        var capacity = current.capacity.toLong()
        while (capacity < size) capacity *= 2
        val bigger = DirectBuffer(minOf(capacity, Int.MAX_VALUE - 8L).toInt())
        if (bigger.capacity <= KEEP) mine.set(bigger)
        return bigger
    }
}

/** The library's `toolledger_direct_*` functions, JNA direct-mapped. */
internal object DirectLib {
    init {
        val name = System.getProperty("uniffi.component.toolledger.libraryOverride") ?: "toolledger"
        Native.register(DirectLib::class.java, name)
    }

    @JvmStatic external fun toolledger_direct_step(handle: Long, step: Int, buf: Long, capacity: Long, inputLen: Long): Int

    @JvmStatic external fun toolledger_direct_take(buf: Long, capacity: Long): Int
}
