"""Privacy through the Pythonic layer (`import toolledger`), as a new user
tries it: `print(outcome)`, a tool that raises with user data in the
message, logging left at Python's defaults (warnings reach stderr), an
encrypted ledger opened with `key=`; and the ledger's events as an async
iterator and as callbacks, which carry no values."""

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import toolledger as tl

CANARY = "CANARY-pylayer-5500-0000"


def printed(*objects):
    out = []
    for o in objects:
        out += [str(o), repr(o), f"{o}", f"{o!r}", str([o]), repr({"k": o})]
    return out


def canary_tools():
    @tl.tool(name="pay", idempotency_key=True)
    async def pay(request):
        assert CANARY in request.arguments_json
        # A printed request shows no argument.
        assert CANARY not in repr(request) and "bytes>" in repr(request)
        return tl.Committed({"receipt": CANARY}, external_id="ext-" + CANARY)

    @tl.tool(name="boom")
    async def boom(request):
        raise ConnectionResetError("socket closed while sending " + CANARY)

    @tl.tool(name="declined")
    async def declined(request):
        raise tl.NotCommitted("declined for " + CANARY)

    @tl.tool(name="render")
    async def render(request):
        return tl.JobStarted("job-" + CANARY)

    class Transfer(tl.Tool):
        requires_approval = True

        async def perform(self, request):
            return {"ok": CANARY}

        def approval_preview(self, arguments):
            return {"to": arguments["iban"]}

    return [pay, boom, declined, render, Transfer()]


def call(call_id, tool):
    return tl.ToolCall(call_id, tool, {"iban": CANARY, "amount": "$50"})


def test_printed_outcomes_errors_stderr_and_logs_never_show_the_canary(tmp_path, capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="toolledger")
    path = tmp_path / "l.db"

    async def main():
        with tl.Ledger.open(path) as ledger:
            ledger.set_observer(tl.LoggingObserver())
            executor = tl.Executor(ledger, tools=canary_tools(), max_attempts=1)
            done = await executor.execute("op", 0, call("c1", "pay"))
            unsure = await executor.execute("op", 0, call("c2", "boom"))
            refused = await executor.execute("op", 0, call("c3", "declined"))
            pending = await executor.execute("op", 0, call("c4", "render"))
            waiting = await executor.execute("op", 0, call("c5", "transfer"))
            approved = await executor.approve(
                waiting.execution_id, waiting.args_digest, preview=waiting.preview
            )
            replay = await executor.execute("op", 0, call("c1", "pay"))
            changed = tl.ToolCall("c1", "pay", {"iban": CANARY + "-2"})
            conflict = await executor.execute("op", 0, changed)
            with pytest.raises(tl.Error) as err:
                await executor.approve(waiting.execution_id, "0" * 64, preview={"x": CANARY})
            records = ledger.list("op")
            recovery = await executor.recover()
            return [done, unsure, refused, pending, waiting, approved, replay, conflict,
                    err.value, *records, recovery]

    objects = asyncio.run(main())
    done, unsure, refused, pending, waiting = objects[:5]
    # The values stay reachable through the fields.
    assert done.result == {"receipt": CANARY} and done.external_id == "ext-" + CANARY
    assert isinstance(unsure, tl.Unknown) and isinstance(refused, tl.Failed)
    assert CANARY in refused.reason and pending.job_id == "job-" + CANARY
    assert waiting.preview == {"to": CANARY}

    texts = printed(*objects, tl.Committed({"r": CANARY}, external_id=CANARY),
                    tl.JobStarted(CANARY), call("c9", "pay"))
    captured = capfd.readouterr()
    texts += [captured.out, captured.err, caplog.text] + [r.getMessage() for r in caplog.records]
    for text in texts:
        assert CANARY not in text, text
    assert "bytes>" in repr(done) and done.execution_id in repr(done)
    # The log says why the call ended unknown (the tool raised), without
    # the exception's text.
    assert "ConnectionResetError" in caplog.text
    unknown = [r for r in caplog.records if "->outcome_unknown" in r.getMessage()]
    assert [r.reason_kind for r in unknown] == ["tool_error"], caplog.text
    assert unknown[0].levelno == logging.WARNING


# Run as a fresh process with Python's logging defaults (no handler: the
# package's warnings reach stderr through logging's last-resort handler).
# Tools raise through both the Pythonic layer and the generated API, whose
# UniFFI template would print the exception and its traceback to stderr.
CHILD = """
import asyncio, sys
import toolledger as tl
from toolledger import ffi

CANARY = sys.argv[2]

@tl.tool(name="boom")
async def boom(request):
    raise ConnectionResetError("socket closed " + CANARY)

class RawBoom(ffi.ToolHandler):
    def descriptor(self):
        return ffi.ToolDescriptor(name="raw_boom", version=1,
                                  effect=ffi.EffectClass.SIDE_EFFECT, batch=ffi.BatchMode.ATOMIC)
    async def perform(self, request):
        raise ValueError("card " + CANARY)
    async def lookup(self, request):
        raise ValueError("lookup " + CANARY)
    def approval_preview(self, arguments_json):
        return None

async def main():
    with tl.Ledger.open(sys.argv[1]) as ledger:
        ledger.set_observer(tl.LoggingObserver())
        executor = tl.Executor(ledger, tools=[boom], max_attempts=1)
        out = await executor.execute("op", 0, tl.ToolCall("c1", "boom", {"iban": CANARY}))
        print(out)
        raw = ffi.ToolExecutor(ledger.native, ffi.ExecutorConfig(max_attempts=1))
        raw.register(RawBoom())
        call = ffi.ToolCall(provider=ffi.Provider.CUSTOM, call_id="c2", tool_name="raw_boom",
                            arguments='{"iban": "%s"}' % CANARY)
        print(await raw.execute("op", 0, call))
        print(await executor.recover())

asyncio.run(main())
"""


def test_a_fresh_process_prints_no_canary_on_stdout_or_stderr(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "l.db"), CANARY],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert CANARY not in done.stdout and CANARY not in done.stderr, done.stderr
    # Something was said, and it says why: two unknown outcomes, tool errors.
    # The Pythonic outcome and the generated one, both printed redacted.
    assert "Unknown(execution_id='op:round_0:c1:boom:v1'" in done.stdout, done.stdout
    assert 'Unknown { execution_id: "op:round_0:c2:raw_boom:v1"' in done.stdout, done.stdout
    assert done.stderr.count("reason_kind=tool_error") == 2, done.stderr
    assert "Traceback" not in done.stderr


def test_an_encrypted_ledger_opens_with_its_key_only(tmp_path):
    path = tmp_path / "l.db"
    key = tl.generate_ledger_key()

    async def main(key):
        with tl.Ledger.open(path, key=key) as ledger:
            assert ledger.is_encrypted()
            out = await tl.Executor(ledger, tools=canary_tools()).execute(
                "op", 0, call("c1", "pay"))
            return out

    out = asyncio.run(main(key))
    assert out.result == {"receipt": CANARY}
    data = path.read_bytes() + (Path(str(path) + "-wal").read_bytes()
                                if Path(str(path) + "-wal").exists() else b"")
    assert CANARY.encode() not in data

    with pytest.raises(tl.StorageError) as err:
        tl.Ledger.open(path, key=tl.generate_ledger_key())
    assert err.value.kind == tl.StorageKind.WRONG_KEY
    new_key = tl.generate_ledger_key()
    tl.rotate_ledger_key(path, key, new_key)
    with pytest.raises(tl.StorageError) as err:
        tl.Ledger.open(path, key=key)
    assert err.value.kind == tl.StorageKind.WRONG_KEY
    replay = asyncio.run(main(new_key))
    assert replay.replayed and replay.result == {"receipt": CANARY}


def test_events_arrive_as_an_async_iterator_without_values(tmp_path):
    async def main():
        with tl.Ledger.open(tmp_path / "l.db") as ledger:
            executor = tl.Executor(ledger, tools=canary_tools(), max_attempts=1)
            async with ledger.events() as stream:
                done = await executor.execute("op", 0, call("c1", "pay"))
                unsure = await executor.execute("op", 0, call("c2", "boom"))
                events = []
                async for event in stream:
                    events.append(event)
                    if len(events) == 4:
                        break
            # Closed: moves after this reach nobody, the iterator has ended.
            await executor.execute("op", 0, call("c3", "pay"))
            rest = [e async for e in stream]
            return done, unsure, events, rest, stream

    done, unsure, events, rest, stream = asyncio.run(main())
    moves = [(e.execution_id, e.from_status, e.to_status) for e in events]
    assert moves == [
        (done.execution_id, None, tl.ExecutionStatus.EXECUTING),
        (done.execution_id, tl.ExecutionStatus.EXECUTING, tl.ExecutionStatus.COMMITTED),
        (unsure.execution_id, None, tl.ExecutionStatus.EXECUTING),
        (unsure.execution_id, tl.ExecutionStatus.EXECUTING, tl.ExecutionStatus.OUTCOME_UNKNOWN),
    ]
    assert events[3].reason_kind == tl.ReasonKind.TOOL_ERROR
    assert events[1].tool_name == "pay" and events[1].attempt == 1
    assert rest == [] and stream.dropped == 0
    for text in printed(*events):
        assert CANARY not in text


def test_events_reach_every_subscriber_from_a_worker_thread_and_stop_when_removed(tmp_path):
    heard = []

    async def main():
        with tl.Ledger.open(tmp_path / "l.db") as ledger:
            ledger.set_observer(tl.LoggingObserver())
            token = ledger.add_observer(heard.append)  # a plain function
            async with ledger.events() as first, ledger.events() as second:
                # A move made on a worker thread reaches the loop's streams.
                spec = tl.CallSpec(call=call("c1", "pay"), tool_version=1)
                begun = await ledger.abegin("op", 0, spec)
                await ledger.acommit(begun.ticket, json.dumps({"r": CANARY}), None)
                a = [await asyncio.wait_for(first.__anext__(), 10) for _ in range(2)]
                b = [await asyncio.wait_for(second.__anext__(), 10) for _ in range(2)]
            ledger.remove_observer(token)
            begun = ledger.begin("op", 0, tl.CallSpec(call=call("c2", "pay"), tool_version=1))
            ledger.commit(begun.ticket, "{}", None)
            return a, b

    a, b = asyncio.run(main())
    statuses = [e.to_status for e in a]
    assert statuses == [tl.ExecutionStatus.EXECUTING, tl.ExecutionStatus.COMMITTED]
    assert [e.to_status for e in b] == statuses
    assert [e.to_status for e in heard] == statuses  # none after remove_observer


def test_a_full_stream_drops_the_newest_and_counts_them(tmp_path):
    async def main():
        with tl.Ledger.open(tmp_path / "l.db") as ledger:
            async with ledger.events(max_buffered=1) as stream:
                spec = tl.CallSpec(call=call("c1", "pay"), tool_version=1)
                ledger.commit(ledger.begin("op", 0, spec).ticket, "{}", None)
                first = await asyncio.wait_for(stream.__anext__(), 10)
                return first, stream.dropped

    first, dropped = asyncio.run(main())
    assert first.to_status == tl.ExecutionStatus.EXECUTING and dropped == 1


def test_events_need_a_running_loop(tmp_path):
    with tl.Ledger.open(tmp_path / "l.db") as ledger:
        with pytest.raises(RuntimeError, match="running event loop"):
            ledger.events()


def test_an_mcp_adapter_result_prints_without_the_tools_content():
    from mcp.types import CallToolResult, TextContent

    from toolledger.adapters.mcp import LedgerToolResult

    result = LedgerToolResult(
        result=CallToolResult(content=[TextContent(type="text", text=CANARY)]),
        execution_id="op:round_0:c1:pay:v1",
        replayed=True,
        jsonrpc_id=3,
    )
    for text in printed(result):
        assert CANARY not in text, text
    assert "execution_id='op:round_0:c1:pay:v1'" in repr(result) and "replayed=True" in repr(result)
    assert result.result.content[0].text == CANARY
