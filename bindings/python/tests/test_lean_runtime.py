"""The generated module runs toolledger's lean marshalling runtime
(build_backend/lean_runtime.py), and it carries every kind of value across
the library boundary exactly: empty strings, non-ASCII text, payloads far
larger than any buffer it starts with, absent optional fields, nested
records and enums, and the library's errors with their payloads. The patch
step itself refuses a generated text it was not written for."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolledger import ffi as tl
from toolledger._native import toolledger as generated

BUILD_BACKEND = Path(__file__).resolve().parents[1] / "build_backend"
sys.path.insert(0, str(BUILD_BACKEND))
import lean_runtime  # noqa: E402

# Non-ASCII of every UTF-8 length (2, 3 and 4 bytes), a NUL-free control char.
ODD = "é漢🙂\t\"\\"
# Larger than 64 KiB in UTF-8, with multi-byte characters straddling any
# chunk boundary.
BIG = ("0123456789abcdef" * 2048) + (ODD * 3000)


def email_call(call_id="call_1", arguments=None):
    return tl.ToolCall(
        provider=tl.Provider.CUSTOM,
        call_id=call_id,
        tool_name="send_email",
        arguments=json.dumps({"to": "a@example.com"} if arguments is None else arguments),
        position=0,
        call_id_derived=False,
    )


def test_the_installed_module_runs_the_lean_runtime():
    text = Path(generated.__file__).read_text(encoding="utf-8")
    assert text.startswith(lean_runtime.MARK)
    assert generated._UniffiRustBufferBuilder.__slots__ == ("buf",)
    assert generated._UniffiRustBufferStream.__slots__ == ("data", "len", "offset")
    assert "contextmanager" not in text.split("class _UniffiConverterRustBuffer:")[1][:800]


class _Everything(generated._UniffiConverterRustBuffer):
    """Writes and reads back one value of every primitive kind and strings."""

    INTS = (("i8", -(2**7)), ("u8", 2**8 - 1), ("i16", -(2**15)), ("u16", 2**16 - 1),
            ("i32", -(2**31)), ("u32", 2**32 - 1), ("i64", -(2**63)), ("u64", 2**64 - 1))

    @staticmethod
    def write(value, buf):
        for kind, number in _Everything.INTS:
            getattr(buf, "write_" + kind)(number)
        buf.write_float(value["float"])
        buf.write_double(value["double"])
        for s in value["strings"]:
            generated._UniffiFfiConverterString.write(s, buf)

    @staticmethod
    def read(buf):
        ints = [getattr(buf, "read_" + kind)() for kind, _ in _Everything.INTS]
        assert ints == [n for _, n in _Everything.INTS]
        out = {"float": buf.read_float(), "double": buf.read_double(), "strings": []}
        while buf.remaining():
            out["strings"].append(generated._UniffiFfiConverterString.read(buf))
        return out


def test_primitives_and_strings_round_trip_through_a_rust_buffer():
    value = {"float": 1.5, "double": -2.0**-1074, "strings": ["", ODD, BIG, ""]}
    rbuf = _Everything.lower(value)
    # One Rust-owned buffer of the exact size (nothing grown in steps).
    expected_size = 1 + 1 + 2 + 2 + 4 + 4 + 8 + 8 + 4 + 8 + sum(4 + len(s.encode()) for s in value["strings"])
    assert rbuf.len == expected_size
    assert _Everything.lift(rbuf) == value


def test_strings_lower_and_lift_exactly_including_empty_and_large():
    for s in ("", ODD, BIG, "\x01"):
        rbuf = generated._UniffiFfiConverterString.lower(s)
        assert rbuf.len == len(s.encode("utf-8"))
        if s == "":
            assert not rbuf.data  # the null buffer: no crossing to allocate it
        assert generated._UniffiFfiConverterString.lift(rbuf) == s


def test_junk_left_in_a_lifted_buffer_is_an_error_and_the_buffer_is_freed():
    rbuf = generated._UniffiFfiConverterString.lower("not a record")

    class Empty(generated._UniffiConverterRustBuffer):
        @staticmethod
        def read(buf):
            return None

    with pytest.raises(RuntimeError, match="junk data left"):
        Empty.lift(rbuf)


def test_reading_past_the_end_is_an_internal_error():
    rbuf = generated._UniffiFfiConverterString.lower("abc")

    class TooLong(generated._UniffiConverterRustBuffer):
        @staticmethod
        def read(buf):
            return buf.read_u64()

    with pytest.raises(generated.InternalError, match="read past end"):
        TooLong.lift(rbuf)


def test_records_enums_and_optionals_round_trip_through_the_library():
    # parse_tool_calls: a string argument in, a list of nested records out.
    response = {
        "choices": [{"message": {"tool_calls": [
            {"id": "call_é", "type": "function",
             "function": {"name": "send_email", "arguments": json.dumps({"body": BIG})}},
            {"id": "call_2", "type": "function",
             "function": {"name": "noop", "arguments": "{}"}},
        ]}}]
    }
    calls = tl.parse_tool_calls(tl.Provider.OPEN_AI_CHAT, json.dumps(response), 3)
    assert [(c.call_id, c.tool_name, c.position, c.provider) for c in calls] == [
        ("call_é", "send_email", 0, tl.Provider.OPEN_AI_CHAT),
        ("call_2", "noop", 1, tl.Provider.OPEN_AI_CHAT),
    ]
    assert json.loads(calls[0].arguments) == {"body": BIG}
    assert calls[1].arguments == "{}"

    # An optional string: present and absent.
    request = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
               "params": {"name": "send_email", "arguments": {"body": ODD},
                          "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}
    assert tl.mcp_request_protocol_version(json.dumps(request)) == "2026-07-28"
    [mcp_call] = tl.parse_tool_calls(tl.Provider.MCP, json.dumps(request), 0)
    assert json.loads(mcp_call.arguments) == {"body": ODD}
    del request["params"]["_meta"]
    assert tl.mcp_request_protocol_version(json.dumps(request)) is None

    # A record and an absent optional string in, a large non-ASCII string out.
    rendered = tl.render_mcp_result(mcp_call, json.dumps({"echo": BIG}, ensure_ascii=False), False, None)
    [content] = json.loads(rendered)["result"]["content"]
    assert json.loads(content["text"]) == {"echo": BIG}


def test_a_ledger_record_keeps_large_non_ascii_values_and_absent_fields(ledger):
    arguments = {"body": BIG, "subject": ODD, "empty": ""}
    spec = tl.CallSpec(call=email_call(call_id="call_" + ODD[:3], arguments=arguments), tool_version=1)
    begun = ledger.begin("op_" + ODD[:2], 0, spec)
    assert begun.is_EXECUTE(), begun
    ticket = begun.ticket
    assert ticket.args_json == spec.call.arguments
    assert ticket.external_id is None

    result = json.dumps({"echo": BIG, "empty": ""}, ensure_ascii=False)
    stored = ledger.commit(ticket, result, None)
    assert (stored.result_json, stored.external_id, stored.partial) == (result, None, False)

    record = ledger.get(ticket.execution_id)
    assert record.execution_id == ticket.execution_id
    assert (record.args_json, record.result_json) == (spec.call.arguments, result)
    assert (record.external_id, record.compensates, record.last_reason, record.retryable) == (None, None, None, None)
    assert record.provider_call_id == "call_" + ODD[:3]
    assert record.status == tl.ExecutionStatus.COMMITTED
    replay = ledger.begin("op_" + ODD[:2], 0, spec)
    assert replay.is_REPLAY() and replay.result.result_json == result


def test_library_errors_arrive_with_their_payloads(ledger):
    spec = tl.CallSpec(call=email_call(), tool_version=1, requires_approval=True)
    waiting = ledger.begin("op_err", 0, spec)
    assert waiting.is_NEEDS_APPROVAL(), waiting
    execution_id = waiting.request.execution_id
    record = ledger.get(execution_id)
    assert waiting.request.args_digest == record.args_digest
    wrong = "f" * 64
    with pytest.raises(tl.LedgerError.DigestMismatch) as err:
        ledger.approve(execution_id, wrong, None)
    assert (err.value.execution_id, err.value.stored, err.value.given) == (execution_id, record.args_digest, wrong)

    with pytest.raises(tl.LedgerError.InvalidInput) as err:
        ledger.get("")
    assert str(err.value)  # a message, not an empty or mangled payload

    plain = tl.CallSpec(call=email_call(call_id="call_stale"), tool_version=1)
    t1 = ledger.begin("op_err", 0, plain).ticket
    ledger.mark_outcome_unknown(t1, "timed out " + ODD)
    retry = ledger.resolve_unknown(t1.execution_id, 1, tl.Resolution.NOT_FOUND_RETRY())
    assert retry.is_RETRY()
    with pytest.raises(tl.LedgerError.StaleAttempt) as err:
        ledger.commit(t1, '{"late":true}', "msg_" + ODD)
    stale = err.value
    assert (stale.execution_id, stale.attempt, stale.current_attempt, stale.status) == (
        t1.execution_id, 1, 2, tl.ExecutionStatus.EXECUTING)


# --- the patch step -------------------------------------------------------------


def _installed_text():
    return Path(generated.__file__).read_text(encoding="utf-8")


def test_the_patch_refuses_a_module_it_already_rewrote():
    with pytest.raises(lean_runtime.PatchError, match="already rewritten"):
        lean_runtime.patch(_installed_text())


def test_the_patch_refuses_a_missing_anchor():
    text = _installed_text().replace(lean_runtime.MARK, "")
    for region in lean_runtime.REGIONS:
        if region.start in text:
            text = text.replace(region.start, "class _RenamedByAnUpgrade:\n")
            break
    with pytest.raises(lean_runtime.PatchError, match="found 0 times"):
        lean_runtime.patch(text)


def test_the_patch_refuses_a_region_whose_text_changed():
    # The lean text sits where the generated one was: same anchors, other
    # contents, as after a template change.
    text = _installed_text().replace(lean_runtime.MARK, "")
    with pytest.raises(lean_runtime.PatchError, match="the generated text changed"):
        lean_runtime.patch(text)


def test_the_patch_command_fails_loudly_and_leaves_the_file(tmp_path):
    module = tmp_path / "toolledger.py"
    original = "# not a generated module\n"
    module.write_text(original)
    done = subprocess.run([sys.executable, str(BUILD_BACKEND / "lean_runtime.py"), str(module)],
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert "lean_runtime" in done.stderr and "found 0 times" in done.stderr
    assert module.read_text() == original
