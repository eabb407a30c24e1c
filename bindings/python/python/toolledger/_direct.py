"""The caller-driven steps through one native call each.

The generated methods (`ToolExecutor.start`, `report_attempt`, ...) cost
five crossings a step: a clone of the object's handle, one Rust buffer per
string or record argument (`rustbuffer_from_bytes`), the call, and the free
of the answer's buffer; each is a ctypes call with its own status structure.
The library's `toolledger_direct_step_borrowed` (ffi/src/direct.rs) takes
the same arguments serialized exactly as the generated code serializes them
(its own converters write them here), in a buffer this thread owns, borrows
the object's handle instead of consuming a clone, and writes the answer
into the same buffer: one crossing a step, integers only.

`Steps(native)` has the generated methods' names, arguments, answers and
errors (a `LedgerError` variant as the generated call raises it, an
`InternalError` for a library bug), so `toolledger._driven` walks a call
through either. Arguments are checked with the generated `check_lower`
before anything crosses: a wrong type raises what the generated method
raises, and nothing is recorded.

The buffer: bytes [0, 8) are the answer's length (native-endian u64, set by
the library), the request is written at 8, the answer comes back at 8. An
answer longer than the buffer is kept by the library for this thread and
taken into a buffer large enough (`toolledger_direct_take`). Each thread
keeps one buffer (16 KiB, grown to at most 256 KiB; a larger request or
answer gets a buffer of its own for that call). The library has parsed the
whole request before it runs the step and writes the answer after it, and
the answer is copied out before anything else runs here, so a step made on
this thread meanwhile (an observer that runs a call) cannot mix them up.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

from ._native import toolledger as _ffi

# ffi/src/direct.rs
_HEADER = 8
_OK = 0
_ERROR = 1
_PANIC = 2
_NEEDS_SPACE = 3
_BAD_CALL = 4
_STEP_START = 1
_STEP_REPORT = 2
_STEP_REPORT_LOOKUP = 3
_STEP_REPORT_LOOKUP_ERROR = 4
_STEP_RETRY = 5
_STEP_REPORT_ATTEMPT = 6

_INITIAL = 16 * 1024
_KEEP = 256 * 1024

_length = struct.Struct("=Q").unpack_from


def _bind(name: str, argtypes: tuple) -> Any:
    # A function object of its own (`lib[name]`, not the cached attribute).
    fn = _ffi._UniffiLib[name]
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int32
    return fn


_u64 = ctypes.c_uint64
_step = _bind("toolledger_direct_step_borrowed", (_u64, ctypes.c_int32, _u64, _u64, _u64))
_take = _bind("toolledger_direct_take", (_u64, _u64))

# The generated converters (UniFFI's serialized form, as the generated
# methods write and read it).
_Builder = _ffi._UniffiRustBufferBuilder
_Stream = _ffi._UniffiRustBufferStream
_OperationId = _ffi._UniffiFfiConverterTypeOperationId
_ExecutionId = _ffi._UniffiFfiConverterTypeExecutionId
_U32 = _ffi._UniffiFfiConverterUInt32
_String = _ffi._UniffiFfiConverterString
_ToolCall = _ffi._UniffiFfiConverterTypeToolCall
_Attempt = _ffi._UniffiFfiConverterTypeCallerAttempt
_Perform = _ffi._UniffiFfiConverterTypePerformOutcome
_Lookup = _ffi._UniffiFfiConverterTypeLookupOutcome
_CallerStep = _ffi._UniffiFfiConverterTypeCallerStep
_LedgerError = _ffi._UniffiFfiConverterTypeLedgerError


class _Buffer:
    """Native-addressable memory: a bytearray pinned by a ctypes view."""

    __slots__ = ("mem", "view", "addr", "capacity")

    def __init__(self, capacity: int) -> None:
        self.mem = bytearray(capacity)
        # While the view exists the bytearray cannot be resized (moved).
        self.view = (ctypes.c_char * capacity).from_buffer(self.mem)
        self.addr = ctypes.addressof(self.view)
        self.capacity = capacity


_local = threading.local()


def _buffer(size: int) -> _Buffer:
    """This thread's buffer if it holds `size` bytes, else a larger one
    (kept for the thread up to `_KEEP` bytes)."""
    current = getattr(_local, "buf", None)
    if current is not None and size <= current.capacity:
        return current
    capacity = _INITIAL if current is None else current.capacity
    while capacity < size:
        capacity *= 2
    made = _Buffer(capacity)
    if capacity <= _KEEP:
        _local.buf = made
    return made


def _call(native: Any, step: int, request: Any) -> Any:
    """Runs one step: the answer (a generated `CallerStep`), or raises the
    step's `LedgerError` / an `InternalError`."""
    size = len(request)
    buf = _buffer(_HEADER + size)
    mem = buf.mem
    mem[_HEADER:_HEADER + size] = request
    # `native` (a local here) keeps the borrowed handle alive during the call.
    code = _step(native._handle, step, buf.addr, buf.capacity, size)
    if code == _NEEDS_SPACE:
        buf = _buffer(_HEADER + _length(mem, 0)[0])
        mem = buf.mem
        code = _take(buf.addr, buf.capacity)
    if code == _BAD_CALL:
        raise _ffi.InternalError("toolledger_direct_step: refused its arguments")
    length = _length(mem, 0)[0]
    if length > buf.capacity - _HEADER:
        raise _ffi.InternalError(f"toolledger_direct_step: answer length {length}")
    data = bytes(mem[_HEADER:_HEADER + length])
    stream = _Stream(data, length)
    if code == _OK:
        value = _CallerStep.read(stream)
        if stream.offset != length:
            raise _ffi.InternalError("toolledger_direct_step: junk after the answer")
        return value
    if code == _ERROR:
        raise _LedgerError.read(stream)
    if code == _PANIC:
        raise _ffi.InternalError(data.decode("utf-8", "replace"))
    raise _ffi.InternalError(f"toolledger_direct_step: unknown answer code {code}")


class Steps:
    """The caller-driven methods of one generated `ToolExecutor`, one native
    call each (same names, arguments, answers and errors)."""

    __slots__ = ("native",)

    def __init__(self, native: Any) -> None:
        self.native = native

    def start(self, operation_id: str, round: int, call: Any) -> Any:
        _OperationId.check_lower(operation_id)
        _U32.check_lower(round)
        _ToolCall.check_lower(call)
        b = _Builder()
        _OperationId.write(operation_id, b)
        _U32.write(round, b)
        _ToolCall.write(call, b)
        return _call(self.native, _STEP_START, b.buf)

    def report_attempt(self, execution_id: str, attempt: int, outcome: Any) -> Any:
        _ExecutionId.check_lower(execution_id)
        _U32.check_lower(attempt)
        _Perform.check_lower(outcome)
        b = _Builder()
        _ExecutionId.write(execution_id, b)
        _U32.write(attempt, b)
        _Perform.write(outcome, b)
        return _call(self.native, _STEP_REPORT_ATTEMPT, b.buf)

    def report(self, attempt: Any, outcome: Any) -> Any:
        _Attempt.check_lower(attempt)
        _Perform.check_lower(outcome)
        b = _Builder()
        _Attempt.write(attempt, b)
        _Perform.write(outcome, b)
        return _call(self.native, _STEP_REPORT, b.buf)

    def report_lookup(self, attempt: Any, found: Any) -> Any:
        _Attempt.check_lower(attempt)
        _Lookup.check_lower(found)
        b = _Builder()
        _Attempt.write(attempt, b)
        _Lookup.write(found, b)
        return _call(self.native, _STEP_REPORT_LOOKUP, b.buf)

    def report_lookup_error(self, attempt: Any, message: str) -> Any:
        _Attempt.check_lower(attempt)
        _String.check_lower(message)
        b = _Builder()
        _Attempt.write(attempt, b)
        _String.write(message, b)
        return _call(self.native, _STEP_REPORT_LOOKUP_ERROR, b.buf)

    def retry(self, attempt: Any) -> Any:
        _Attempt.check_lower(attempt)
        b = _Builder()
        _Attempt.write(attempt, b)
        return _call(self.native, _STEP_RETRY, b.buf)
