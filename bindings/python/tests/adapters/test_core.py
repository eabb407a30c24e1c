"""The adapters' shared core, without any framework: identities as the
ledger derives them, the caller running the tool in its own thread or task,
replay, and an exception from the tool as an unknown outcome."""

import asyncio
import threading

import pytest

import toolledger as tl
from toolledger.adapters import Downstream, LedgerRuntime, OutcomeUnknown, ToolSpec, current_call, execution_id_of


@pytest.fixture
def runtime(tmp_path):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2)
    yield rt
    rt.close()


@pytest.mark.parametrize(
    "operation, call_id, tool",
    [("op_1", "call_1", "send"), ("a:b#c%d", "call:2#x", "mcp:mail/send"), ("sp ace", "\x01ctl\x7f", "é✓")],
)
def test_execution_ids_are_the_ledgers(tmp_path, operation, call_id, tool):
    with tl.Ledger.open(tmp_path / "ids.db") as ledger:
        call = tl.ToolCall(call_id, tool, "{}")
        begin = ledger.begin(operation, 7, tl.CallSpec(call=call, tool_version=3))
    assert begin.ticket.execution_id == execution_id_of(operation, 7, call_id, tool, 3)


def test_a_sync_caller_runs_the_tool_in_its_own_thread_once(runtime):
    effects = []

    def body():
        effects.append((threading.get_ident(), current_call().downstream_key))
        return {"sent": len(effects)}

    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.KEY))
    first = runtime.call("op", 0, "c1", "send", '{"to":"a"}', body)
    again = runtime.call("op", 0, "c1", "send", '{"to":"a"}', body)
    assert effects == [(threading.get_ident(), effects[0][1])] and effects[0][1].startswith("tl_")
    assert not first.replayed and again.replayed
    assert again.result_json == first.result_json == '{"sent":1}'


def test_an_async_caller_runs_the_tool_in_its_own_task(runtime):
    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.KEY))

    async def main():
        task = asyncio.current_task()
        seen = []

        async def body():
            seen.append(asyncio.current_task() is task)
            return "ok"

        done = await runtime.acall("op", 0, "c1", "send", "{}", body)
        return seen, done

    seen, done = asyncio.run(main())
    assert seen == [True] and done.result_json == '"ok"'


def test_a_tool_that_raises_with_neither_is_unknown_and_not_retried(runtime):
    calls = []

    def body():
        calls.append(1)
        raise ConnectionResetError("after the request left")

    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.NEITHER))
    with pytest.raises(OutcomeUnknown) as unknown:
        runtime.call("op", 0, "c1", "send", "{}", body)
    assert calls == [1]
    assert isinstance(unknown.value, tl.Error) and isinstance(unknown.value.outcome, tl.Unknown)
    stored = runtime.ledger.get(unknown.value.execution_id)
    assert stored.status == tl.ExecutionStatus.OUTCOME_UNKNOWN
