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

from . import outcomes
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


def _exchange(native: Any, step: int, request: Any) -> Any:
    """Runs one step: (the answer's code, its bytes)."""
    size = len(request)
    buf = getattr(_local, "buf", None)
    if buf is None or _HEADER + size > buf.capacity:
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
    return code, bytes(mem[_HEADER:_HEADER + length])


def _answer(code: int, data: bytes) -> Any:
    """The generated `CallerStep` an answer holds, or raises the step's
    `LedgerError` / an `InternalError`."""
    length = len(data)
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


def _call(native: Any, step: int, request: Any) -> Any:
    return _answer(*_exchange(native, step, request))


# The hot path's own writer and reader, for the usual field types: the same
# bytes as the generated converters (tests/test_direct.py compares them),
# without a converter call per field. Anything else (a str subclass, an
# out-of-range number, another variant) goes through the generated code.
_i32 = struct.Struct(">i")
_pack_i32 = _i32.pack
_unpack_i32 = _i32.unpack_from
_pack_u32 = struct.Struct(">I").pack


def _written(write: Any, value: Any) -> bytes:
    b = _Builder()
    write(value, b)
    return bytes(b.buf)


_PROVIDERS = {p: _written(_ffi._UniffiFfiConverterTypeProvider.write, p) for p in _ffi.Provider}
_FLAGS = {v: _written(_ffi._UniffiFfiConverterBoolean.write, v) for v in (False, True)}
_U32_MAX = 0xFFFFFFFF
# `CallerStep.DONE` holding `CallOutcome.COMPLETED`: the two tags.
_DONE_COMPLETED = _pack_i32(4) + _pack_i32(1)


def _start_request(operation_id: Any, round: Any, call: Any) -> Any:
    """`start`'s request, or None when a field is not of the usual type."""
    provider = _PROVIDERS.get(call.provider)
    derived = _FLAGS.get(call.call_id_derived)
    position = call.position
    call_id = call.call_id
    tool_name = call.tool_name
    arguments = call.arguments
    if (provider is None or derived is None
            or type(operation_id) is not str or type(call_id) is not str
            or type(tool_name) is not str or type(arguments) is not str
            or type(round) is not int or not 0 <= round <= _U32_MAX
            or type(position) is not int or not 0 <= position <= _U32_MAX):
        return None
    op = operation_id.encode("utf-8")
    cid = call_id.encode("utf-8")
    name = tool_name.encode("utf-8")
    args = arguments.encode("utf-8")
    return b"".join((
        _pack_i32(len(op)), op, _pack_u32(round), provider,
        _pack_i32(len(cid)), cid, _pack_i32(len(name)), name, _pack_i32(len(args)), args,
        _pack_u32(position), derived,
    ))


def _completed(data: bytes) -> Any:
    """The `Completed` outcome of a `DONE(COMPLETED)` answer, or None if it
    is not exactly one (the generated reader then reads it, or refuses it)."""
    end = len(data)
    try:
        off = 8
        n = _unpack_i32(data, off)[0]
        off += 4
        if n < 0 or off + n > end:
            return None
        execution_id = data[off:off + n].decode("utf-8")
        off += n
        n = _unpack_i32(data, off)[0]
        off += 4
        if n < 0 or off + n > end:
            return None
        result_json = data[off:off + n].decode("utf-8")
        off += n
        flag = data[off]
        off += 1
        external_id = None
        if flag == 1:
            n = _unpack_i32(data, off)[0]
            off += 4
            if n < 0 or off + n > end:
                return None
            external_id = data[off:off + n].decode("utf-8")
            off += n
        elif flag != 0:
            return None
        replayed = data[off] != 0
        partial = data[off + 1] != 0
        off += 2
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    if off != end:
        return None
    made = object.__new__(outcomes.Completed)
    made.__dict__.update(execution_id=execution_id, result_json=result_json, external_id=external_id,
                         replayed=replayed, partial=partial)
    return made


_COMMITTED = _ffi.PerformOutcome.COMMITTED
# `PerformOutcome.COMMITTED`'s tag; an absent and a present optional string's flag.
_COMMITTED_TAG = _written(_Perform.write, _COMMITTED(result_json="", external_id=None))[:4]
_ABSENT = _written(_ffi._UniffiFfiConverterOptionalString.write, None)
_PRESENT = _written(_ffi._UniffiFfiConverterOptionalString.write, "")[:1]


def _report_request(execution_id: Any, attempt: Any, outcome: Any) -> Any:
    """`report_attempt`'s request for a `COMMITTED` outcome, or None when it
    is another variant or a field is not of the usual type."""
    if type(outcome) is not _COMMITTED:
        return None
    result_json = outcome.result_json
    external_id = outcome.external_id
    if (type(execution_id) is not str or type(result_json) is not str
            or type(attempt) is not int or not 0 <= attempt <= _U32_MAX):
        return None
    if external_id is None:
        tail = _ABSENT
    elif type(external_id) is str:
        ext = external_id.encode("utf-8")
        tail = _PRESENT + _pack_i32(len(ext)) + ext
    else:
        return None
    eid = execution_id.encode("utf-8")
    result = result_json.encode("utf-8")
    return b"".join((
        _pack_i32(len(eid)), eid, _pack_u32(attempt), _COMMITTED_TAG, _pack_i32(len(result)), result, tail,
    ))


def _finished(code: int, data: bytes) -> Any:
    """An answer as `begin` / `settle_attempt` give it."""
    if code == _OK and data.startswith(_DONE_COMPLETED):
        made = _completed(data)
        if made is not None:
            return made
    return _settled(_answer(code, data))


_DONE = _ffi.CallerStep.DONE


class Steps:
    """The caller-driven methods of one generated `ToolExecutor`, one native
    call each (same names, arguments, answers and errors)."""

    __slots__ = ("native",)

    def __init__(self, native: Any) -> None:
        self.native = native

    def begin(self, operation_id: str, round: int, call: Any) -> Any:
        """`start` for the `Executor`: a finished call (a replay, ...) comes
        back as its `toolledger.CallOutcome`, anything else as the generated
        `CallerStep`."""
        request = _start_request(operation_id, round, call)
        if request is None:
            return _settled(self.start(operation_id, round, call))
        code, data = _exchange(self.native, _STEP_START, request)
        if code == _OK and data.startswith(_DONE_COMPLETED):
            made = _completed(data)
            if made is not None:
                return made
        return _settled(_answer(code, data))

    def settle_attempt(self, execution_id: str, attempt: int, outcome: Any) -> Any:
        """`report_attempt` for `toolledger._driven`: a finished call comes
        back as its `toolledger.CallOutcome`, anything else as the generated
        `CallerStep`."""
        request = _report_request(execution_id, attempt, outcome)
        if request is None:
            return _settled(self.report_attempt(execution_id, attempt, outcome))
        return _finished(*_exchange(self.native, _STEP_REPORT_ATTEMPT, request))

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

    def abandon_attempt(self, execution_id: str, attempt: int, reason: str) -> Any:
        # Rare (an interrupted caller): the generated call.
        return self.native.abandon_attempt(execution_id, attempt, reason)

    def report_interrupted(self, execution_id: str, attempt: int, reason: str) -> Any:
        # Rare (an interrupted caller): the generated call.
        return self.native.report_interrupted(execution_id, attempt, reason)

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


def _settled(step: Any) -> Any:
    return outcomes.from_ffi(step.outcome) if type(step) is _DONE else step
