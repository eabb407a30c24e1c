#!/usr/bin/env python3
"""fast_calls.py — a cheaper call status for UniFFI's generated Kotlin.

UniFFI 0.32.2's generated Kotlin (JNA direct mapping) makes a new JNA
`Structure` for the `RustCallStatus` of every call into the library: a
native allocation with its cleaner, a reflective write of its fields before
the call and a reflective read after it, whatever the call (the handle
clone every method makes, each argument's buffer allocation, the method
itself, the free of its answer). This rewrites the generated file so that
every such call passes instead a per-thread block of native memory (a
direct `ByteBuffer`, as a JNA `Pointer`) whose code byte Kotlin reads
directly. The slow path is the generated one: when the code is not
success, a generated `UniffiRustCallStatus` is built from the block and
handed to the unchanged `uniffiCheckCallStatus`, so errors, panics and
their messages are lifted exactly as before. Nothing else changes: the
same functions are called with the same arguments.

Why a per-thread block is safe: the library writes a call's status only
when the call fails, at its very end, after any callback it made into
Kotlin on the same thread has returned. The code is set to success before
each call and again after a failure is read, so a call made from such a
callback (which is finished before the outer call writes anything) leaves
the block as the outer call expects it.

Used by scripts/generate-bindings.sh and platforms/android/build-rust.sh
(the same generated file everywhere): `fast_calls.py <generated
toolledger.kt>`. Every replacement is anchored on exact generated text and
the number of times it must occur; a missing or changed anchor (a UniFFI
upgrade changed the template) fails the step and leaves the file as it
was. `--check` only verifies the anchors.
"""

import sys

MARKER = "// toolledger: call statuses patched by bindings/kotlin/tools/fast_calls.py\n"

# (what, generated text, replacement, how many times it must occur; None = at least once)
REPLACEMENTS = [
    (
        "the status of a call that returns a Result",
        """private inline fun <U, E: kotlin.Exception> uniffiRustCallWithError(errorHandler: UniffiRustCallStatusErrorHandler<E>, callback: (UniffiRustCallStatus) -> U): U {
    var status = UniffiRustCallStatus()
    val return_value = callback(status)
    uniffiCheckCallStatus(errorHandler, status)
    return return_value
}
""",
        """private inline fun <U, E: kotlin.Exception> uniffiRustCallWithError(errorHandler: UniffiRustCallStatusErrorHandler<E>, callback: (Pointer) -> U): U {
    // toolledger (fast_calls.py): this thread's status block instead of a new Structure.
    val slot = UniffiCallStatusSlot.mine()
    slot.bytes.put(0, UNIFFI_CALL_SUCCESS)
    val return_value = callback(slot.pointer)
    if (slot.bytes.get(0) != UNIFFI_CALL_SUCCESS) {
        uniffiCheckCallStatus(errorHandler, slot.takeFailure())
    }
    return return_value
}

/**
 * One thread's `RustCallStatus`, reused by every call the thread makes
 * (toolledger, bindings/kotlin/tools/fast_calls.py). The library writes it
 * only when a call fails; [takeFailure] copies a failure out into the
 * generated `UniffiRustCallStatus` and sets the code back to success.
 *
 * @suppress
 */
internal class UniffiCallStatusSlot private constructor() {
    val bytes: ByteBuffer = ByteBuffer.allocateDirect(SIZE).order(ByteOrder.nativeOrder())
    val pointer: Pointer = Native.getDirectBufferPointer(bytes)

    fun takeFailure(): UniffiRustCallStatus {
        val status = UniffiRustCallStatus()
        status.code = bytes.get(0)
        val data = if (Native.POINTER_SIZE == 8) {
            bytes.getLong(ERROR_BUF + 16)
        } else {
            bytes.getInt(ERROR_BUF + 16).toLong() and 0xffffffffL
        }
        status.error_buf = RustBuffer.create(
            bytes.getLong(ERROR_BUF).toULong(),
            bytes.getLong(ERROR_BUF + 8).toULong(),
            if (data == 0L) null else Pointer(data),
        )
        bytes.put(0, UNIFFI_CALL_SUCCESS)
        return status
    }

    companion object {
        // The layout JNA gives the generated Structures on this platform:
        // code, then error_buf (capacity: u64, len: u64, data: pointer).
        private val SIZE = UniffiRustCallStatus().size()
        private val ERROR_BUF = SIZE - RustBuffer().size()
        private val slots = ThreadLocal.withInitial { UniffiCallStatusSlot() }

        fun mine(): UniffiCallStatusSlot = slots.get()
    }
}
""",
        1,
    ),
    (
        "the status of a call that returns a plain value",
        """private inline fun <U> uniffiRustCall(callback: (UniffiRustCallStatus) -> U): U {
    return uniffiRustCallWithError(UniffiNullRustCallStatusErrorHandler, callback)
}
""",
        """private inline fun <U> uniffiRustCall(callback: (Pointer) -> U): U {
    return uniffiRustCallWithError(UniffiNullRustCallStatusErrorHandler, callback)
}
""",
        1,
    ),
    (
        "the status of an async call's completion",
        "    completeFunc: (Long, UniffiRustCallStatus) -> F,\n",
        "    completeFunc: (Long, Pointer) -> F,\n",
        1,
    ),
    (
        "the status parameter of every native function",
        "uniffi_out_err: UniffiRustCallStatus, \n",
        "uniffi_out_err: Pointer, \n",
        None,
    ),
]

# Text the replacements rely on without changing it.
REQUIRED = [
    ("the generated status check", "private fun<E: kotlin.Exception> uniffiCheckCallStatus(errorHandler: UniffiRustCallStatusErrorHandler<E>, status: UniffiRustCallStatus) {"),
    ("the status layout", '@Structure.FieldOrder("code", "error_buf")\ninternal open class UniffiRustCallStatus : Structure() {\n    @JvmField var code: Byte = 0\n    @JvmField var error_buf: RustBuffer.ByValue = RustBuffer.ByValue()\n'),
    ("the buffer layout", '@Structure.FieldOrder("capacity", "len", "data")\nopen class RustBuffer : Structure() {'),
    ("RustBuffer.create", "internal fun create(capacity: ULong, len: ULong, data: Pointer?): RustBuffer.ByValue {"),
    ("the imports", "import com.sun.jna.Native\nimport com.sun.jna.Pointer\n"),
    ("the imports", "import java.nio.ByteBuffer\nimport java.nio.ByteOrder\n"),
]


class AnchorMissing(Exception):
    """The generated text is not what this step was written against."""


def patch(text):
    """Returns `text` with every replacement made; raises AnchorMissing."""
    if MARKER in text:
        raise AnchorMissing("the file is already patched")
    for what, needle in REQUIRED:
        if needle not in text:
            raise AnchorMissing(f"{what}: {needle.splitlines()[0]!r} not found")
    for what, old, new, count in REPLACEMENTS:
        found = text.count(old)
        if (count is None and found == 0) or (count is not None and found != count):
            want = "at least 1" if count is None else str(count)
            raise AnchorMissing(f"{what}: {old.splitlines()[0]!r} found {found} times, expected {want}")
        text = text.replace(old, new)
    # Nothing may still pass a Structure as a call status.
    for leftover in ("uniffi_out_err: UniffiRustCallStatus", "callback: (UniffiRustCallStatus) -> U"):
        if leftover in text:
            raise AnchorMissing(f"{leftover!r} is still in the file after patching")
    return MARKER + text


def main(argv):
    check = "--check" in argv
    paths = [a for a in argv[1:] if a != "--check"]
    if len(paths) != 1:
        sys.exit("usage: fast_calls.py [--check] <generated toolledger.kt>")
    path = paths[0]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        patched = patch(text)
    except AnchorMissing as e:
        sys.exit(f"fast_calls: {path}: {e} (UniFFI's Kotlin template changed: look again; file left as it was)")
    if not check:
        with open(path, "w", encoding="utf-8") as f:
            f.write(patched)


if __name__ == "__main__":
    main(sys.argv)
