#!/usr/bin/env python3
"""lean_runtime.py — a cheaper marshalling runtime in the generated module.

UniFFI 0.32.2's generated Python module moves every value through helpers
that cost far more than the Rust call they wrap: a string argument allocates
a 16-byte Rust buffer (a crossing), grows it with another crossing when it
fills, and writes each field through a `contextlib` context manager; a
lifted buffer is read through another context manager, byte slice by byte
slice through a ctypes pointer; every call builds its status structure
field by field. Profiled on a replay through `execute_sync`, that runtime
was most of the Python time.

This rewrites five regions of the generated runtime with equivalents that
keep the wire format and the ownership rules:

* `_UniffiRustBufferStream`: copies the lifted buffer once (one slice of
  the ctypes pointer) and reads it with precompiled `struct.Struct`s.
* `_UniffiRustBufferBuilder`: accumulates into a `bytearray` and crosses
  once, at `finalize` (`ffi_*_rustbuffer_from_bytes`, declared a second
  time with a `c_char_p` for the data so bytes pass without a cast; beyond
  its i32 length, `alloc` of the exact size and one `memmove`); an empty
  buffer crosses as the null buffer Rust accepts (capacity 0, length 0, no
  data). Nothing is allocated in Rust before `finalize`, so an error while
  writing leaks nothing.
* `_uniffi_rust_call(_with_error)`: a zero-initialised status (what
  `_UniffiRustCallStatus.default()` builds, in one step), checked only when
  its code is not success (the generated checker runs then, unchanged).
* `_UniffiConverterRustBuffer.lift/lower` and `_UniffiFfiConverterString`:
  `try`/`finally` instead of context managers, the same checks (junk left
  in a lifted buffer is an error; the buffer is freed either way).

Each region is found by its first line and the line that follows it, and
must hash to the SHA-256 recorded here: a UniFFI upgrade that changes any
of them (uniffi is pinned `=0.32.2`) fails the build loudly instead of
being skipped or half-patched. Run after quiet_bindings.py, by the wheel's
build backend and scripts/generate-bindings.sh:
`lean_runtime.py <generated toolledger.py>`.
"""

from __future__ import annotations

import hashlib
import sys
from typing import List, NamedTuple


class PatchError(Exception):
    """The generated text is not what this patch was written against."""


class Region(NamedTuple):
    """One region of the generated module: from `start` (included, found
    exactly once) to the first `end` after it (excluded)."""

    name: str
    start: str
    end: str
    sha256: str
    replacement: str


_STREAM = '''class _UniffiRustBufferStream:
    """
    Reads a lifted buffer (toolledger's lean runtime, build_backend/lean_runtime.py):
    the bytes are copied out of Rust once, then unpacked with precompiled structs.
    """

    __slots__ = ("data", "len", "offset")

    def __init__(self, data, len):
        self.data = data
        self.len = len
        self.offset = 0

    @classmethod
    def from_rust_buffer(cls, buf):
        size = buf.len
        return cls(buf.data[0:size] if size else b"", size)

    def remaining(self):
        return self.len - self.offset

    def _unpack_from(self, size, format):
        start = self.offset
        if start + size > self.len:
            raise InternalError("read past end of rust buffer")
        self.offset = start + size
        return struct.unpack_from(format, self.data, start)[0]

    def read(self, size):
        start = self.offset
        end = start + size
        if end > self.len:
            raise InternalError("read past end of rust buffer")
        self.offset = end
        return self.data[start:end]


def _uniffi_lean_reader(format):
    unpack = struct.Struct(format).unpack_from
    size = struct.calcsize(format)

    def read_value(self):
        start = self.offset
        if start + size > self.len:
            raise InternalError("read past end of rust buffer")
        self.offset = start + size
        return unpack(self.data, start)[0]

    return read_value


def _uniffi_lean_writer(format):
    pack = struct.Struct(format).pack

    def write_value(self, v):
        self.buf += pack(v)

    return write_value


_UNIFFI_LEAN_FORMATS = (
    ("i8", ">b"), ("u8", ">B"), ("i16", ">h"), ("u16", ">H"), ("i32", ">i"), ("u32", ">I"),
    ("i64", ">q"), ("u64", ">Q"), ("float", ">f"), ("double", ">d"),
)
for _uniffi_name, _uniffi_format in _UNIFFI_LEAN_FORMATS:
    setattr(_UniffiRustBufferStream, "read_" + _uniffi_name, _uniffi_lean_reader(_uniffi_format))
_uniffi_lean_i32_pack = struct.Struct(">i").pack
_uniffi_lean_i32_unpack = struct.Struct(">i").unpack_from

'''

_BUILDER = '''class _UniffiRustBufferBuilder:
    """
    Writes a buffer to lower (toolledger's lean runtime, build_backend/lean_runtime.py):
    the bytes accumulate in Python and cross to Rust once, at `finalize`.
    """

    __slots__ = ("buf",)

    def __init__(self):
        self.buf = bytearray()

    def finalize(self):
        data = self.buf
        self.buf = None
        return _uniffi_lean_rustbuffer(data)

    def discard(self):
        self.buf = None

    def write(self, value):
        self.buf += value

    def write_c_size_t(self, v):
        self.buf += struct.pack("@N", v)


for _uniffi_name, _uniffi_format in _UNIFFI_LEAN_FORMATS:
    setattr(_UniffiRustBufferBuilder, "write_" + _uniffi_name, _uniffi_lean_writer(_uniffi_format))
del _uniffi_name, _uniffi_format


class _UniffiLeanForeignBytes(ctypes.Structure):
    # _UniffiForeignBytes' layout (the C ABI of ForeignBytes) with the data
    # as a `c_char_p`, which takes a bytes object as it is (no cast).
    _fields_ = [
        ("len", ctypes.c_int32),
        ("data", ctypes.c_char_p),
    ]


_UNIFFI_LEAN_FROM_BYTES = []


def _uniffi_lean_from_bytes():
    # ffi_*_rustbuffer_from_bytes declared once more, taking the struct above.
    if not _UNIFFI_LEAN_FROM_BYTES:
        fn = _UniffiLib["ffi_toolledger_rustbuffer_from_bytes"]
        fn.argtypes = (_UniffiLeanForeignBytes, ctypes.POINTER(_UniffiRustCallStatus))
        fn.restype = _UniffiRustBuffer
        _UNIFFI_LEAN_FROM_BYTES.append(fn)
    return _UNIFFI_LEAN_FROM_BYTES[0]


def _uniffi_lean_rustbuffer(data):
    """A Rust-owned buffer holding a copy of `data` (bytes or bytearray): one
    crossing, none for an empty one (the null buffer, which Rust reads as
    empty)."""
    size = len(data)
    if size == 0:
        return _UniffiRustBuffer(0, 0, None)
    if isinstance(data, bytearray):
        data = bytes(data)
    if size <= 0x7FFFFFFF:
        return _uniffi_rust_call(_uniffi_lean_from_bytes(), _UniffiLeanForeignBytes(size, data))
    # Beyond ForeignBytes' i32 length: allocate, then copy.
    rbuf = _uniffi_rust_call(_UniffiLib.ffi_toolledger_rustbuffer_alloc, size)
    if rbuf.len != size:
        rbuf.free()
        raise InternalError("rustbuffer_alloc returned a buffer of the wrong size")
    ctypes.memmove(rbuf.data, data, size)
    return rbuf

'''

_RUST_CALL = '''def _uniffi_rust_call(fn, *args):
    # Call a rust function (toolledger's lean runtime: a zero-initialised status,
    # the generated checker only when the call did not succeed).
    call_status = _UniffiRustCallStatus()
    result = fn(*args, ctypes.byref(call_status))
    if call_status.code != 0:
        _uniffi_check_call_status(None, call_status)
    return result

def _uniffi_rust_call_with_error(error_ffi_converter, fn, *args):
    # Call a rust function that returns Result<> (see _uniffi_rust_call).
    call_status = _UniffiRustCallStatus()
    result = fn(*args, ctypes.byref(call_status))
    if call_status.code != 0:
        _uniffi_check_call_status(error_ffi_converter, call_status)
    return result

'''

_CONVERTER = '''class _UniffiConverterRustBuffer:
    # Wrapper types that always go through a _UniffiRustBuffer: subclasses
    # implement `read` and `write` (toolledger's lean runtime).
    @classmethod
    def lift(cls, rbuf):
        try:
            stream = _UniffiRustBufferStream.from_rust_buffer(rbuf)
            value = cls.read(stream)
            if stream.offset != stream.len:
                raise RuntimeError(f"junk data left in buffer at end of consume_with_stream {stream.remaining()}")
            return value
        finally:
            rbuf.free()

    @classmethod
    def lower(cls, value):
        builder = _UniffiRustBufferBuilder()
        cls.write(value, builder)
        return builder.finalize()

'''

_STRING = '''class _UniffiFfiConverterString:
    # toolledger's lean runtime: strings cross as one buffer each way.
    @staticmethod
    def check_lower(value):
        if not isinstance(value, str):
            raise TypeError("argument must be str, not {}".format(type(value).__name__))
        return value

    @staticmethod
    def read(buf):
        # The length (i32) and the bytes, read in one step.
        start = buf.offset
        if start + 4 > buf.len:
            raise InternalError("read past end of rust buffer")
        size = _uniffi_lean_i32_unpack(buf.data, start)[0]
        if size < 0:
            raise InternalError("Unexpected negative string length")
        start += 4
        end = start + size
        if end > buf.len:
            raise InternalError("read past end of rust buffer")
        buf.offset = end
        return buf.data[start:end].decode("utf-8")

    @staticmethod
    def write(value, buf):
        utf8_bytes = value.encode("utf-8")
        out = buf.buf
        out += _uniffi_lean_i32_pack(len(utf8_bytes))
        out += utf8_bytes

    @staticmethod
    def lift(buf):
        try:
            size = buf.len
            return buf.data[0:size].decode("utf-8") if size else ""
        finally:
            buf.free()

    @staticmethod
    def lower(value):
        return _uniffi_lean_rustbuffer(value.encode("utf-8"))
'''

REGIONS: List[Region] = [
    Region("stream", "class _UniffiRustBufferStream:\n", "class _UniffiRustBufferBuilder:\n",
           "820e7bceca7ad8427762defa6d3722b2f7802eaf2ef9593520342b8fd05a607c", _STREAM),
    Region("builder", "class _UniffiRustBufferBuilder:\n", "# A handful of classes and functions",
           "32980e697c3fff3874735e57c86e77f92f725482cf240afc75702a3cd649e309", _BUILDER),
    Region("rust_call", "def _uniffi_rust_call(fn, *args):\n", "def _uniffi_check_call_status(",
           "0ba0fadd171a0fe5fbb87eaad7c5b4a57bff43854c804b2384a9d918d081e50b", _RUST_CALL),
    Region("converter", "class _UniffiConverterRustBuffer:\n", "# Contains loading, initialization code",
           "010100bd93e79f86b2441d99fd0bf2636ccd5cb9fd728389f605528e18458ee8", _CONVERTER),
    Region("string", "class _UniffiFfiConverterString:\n", "\n\nclass ",
           "5c61ec5e36bac9111244152088a536936835d8f06c43482f2db9dd5ad2e7c36b", _STRING),
]

#: Marks a module this step rewrote (a second run refuses it: the regions are gone).
MARK = "# toolledger: lean marshalling runtime (build_backend/lean_runtime.py)\n"


def patch(text: str) -> str:
    """The generated module `text` with every region replaced. Raises
    `PatchError` when a region's start is missing or not unique, its end is
    missing, or its text differs from the one this patch was written for."""
    if MARK in text:
        raise PatchError("the module was already rewritten by lean_runtime.py")
    for region in REGIONS:
        count = text.count(region.start)
        if count != 1:
            raise PatchError(f"region {region.name}: start {region.start!r} found {count} times (want 1)")
        i = text.index(region.start)
        j = text.find(region.end, i + len(region.start))
        if j < 0:
            raise PatchError(f"region {region.name}: end {region.end!r} not found after its start")
        digest = hashlib.sha256(text[i:j].encode("utf-8")).hexdigest()
        if digest != region.sha256:
            raise PatchError(
                f"region {region.name}: the generated text changed (sha256 {digest}, "
                f"want {region.sha256}): UniFFI's template is not the one this was written for"
            )
        text = text[:i] + region.replacement + text[j:]
    return MARK + text


def lean(path: str) -> None:
    """Rewrites the generated module at `path` in place (see `patch`)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        text = patch(text)
    except PatchError as e:
        sys.exit(f"lean_runtime: {path}: {e}")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    lean(sys.argv[1])
