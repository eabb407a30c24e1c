"""The adapters' shared core, without any framework: identities as the
ledger derives them, the caller running the tool in its own thread or task,
replay, and an exception from the tool as an unknown outcome."""

import asyncio
import threading

import pytest

import toolledger as tl
from toolledger.adapters import (
    CallNotExecuted, Downstream, LedgerRuntime, OutcomeUnknown, ToolSpec, current_call, execution_id_of,
)


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
    # Recorded as a tool error (an observer sees reason kind TOOL_ERROR),
    # with the exception's type and never its text.
    assert stored.last_reason.startswith("tool error")
    assert "ConnectionResetError" in stored.last_reason
    assert "after the request left" not in stored.last_reason


# -- LedgerRuntime.acall: a new call's attempt run inline, the rest walked ------


def test_an_async_call_whose_first_attempt_is_unknown_is_resent_under_the_same_key(runtime):
    # The first attempt runs on acall's inline path; its unknown outcome
    # (the tool raised) is answered with a resend, which the walk
    # (`_driven.arun`) runs: the same key, the next attempt, one result.
    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.KEY))
    seen = []

    async def body():
        call = current_call()
        seen.append((call.attempt, call.downstream_key))
        if len(seen) == 1:
            raise ConnectionResetError("after the request left")
        return {"sent": call.attempt}

    async def main():
        done = await runtime.acall("op", 0, "c1", "send", "{}", body)
        with pytest.raises(LookupError):
            current_call()  # reset in this task after each attempt
        return done

    done = asyncio.run(main())
    assert [a for a, _ in seen] == [1, 2] and seen[0][1] == seen[1][1]
    assert done.result_json == '{"sent":2}' and not done.replayed
    stored = runtime.ledger.get(done.execution_id)
    assert stored.status == tl.ExecutionStatus.COMMITTED and stored.result_json == '{"sent":2}'


def test_an_async_call_refused_by_its_tool_is_not_run_again(runtime):
    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.KEY))
    runs = []

    async def body():
        runs.append(1)
        raise tl.NotCommitted("refused by the server", retryable=False)

    with pytest.raises(CallNotExecuted) as refused:
        asyncio.run(runtime.acall("op", 0, "c1", "send", "{}", body))
    assert runs == [1] and isinstance(refused.value.outcome, tl.Failed)
    assert runtime.ledger.get(refused.value.execution_id).status == tl.ExecutionStatus.FAILED_BEFORE_COMMIT


def test_an_async_call_cancelled_in_its_tool_is_recorded_unknown(runtime):
    # Cancelled while the inline attempt's tool runs: reported unknown before
    # the cancellation goes on (it may have happened), never left in flight.
    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.NEITHER))

    async def main():
        started = asyncio.Event()

        async def body():
            started.set()
            await asyncio.sleep(60)

        task = asyncio.ensure_future(runtime.acall("op", 0, "c1", "send", "{}", body))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    [record] = runtime.ledger.list("op")
    assert record.status == tl.ExecutionStatus.OUTCOME_UNKNOWN
    assert "interrupted" in record.last_reason
    with pytest.raises(OutcomeUnknown):
        asyncio.run(runtime.acall("op", 0, "c1", "send", "{}", lambda: "never run"))


def test_a_sync_call_whose_first_attempt_is_unknown_is_resent_under_the_same_key(runtime):
    # `LedgerRuntime.call`'s inline first attempt, then `_driven.run`'s walk.
    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.KEY))
    seen = []

    def body():
        call = current_call()
        seen.append((call.attempt, call.downstream_key))
        if len(seen) == 1:
            raise TimeoutError("no answer")
        return {"sent": call.attempt}

    done = runtime.call("op", 0, "c1", "send", "{}", body)
    with pytest.raises(LookupError):
        current_call()  # reset in this thread after each attempt
    assert [a for a, _ in seen] == [1, 2] and seen[0][1] == seen[1][1]
    assert done.result_json == '{"sent":2}' and not done.replayed
    assert runtime.ledger.get(done.execution_id).status == tl.ExecutionStatus.COMMITTED


def test_a_sync_call_interrupted_in_its_tool_is_recorded_unknown(runtime):
    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.NEITHER))

    def body():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runtime.call("op", 0, "c1", "send", "{}", body)
    with pytest.raises(LookupError):
        current_call()
    [record] = runtime.ledger.list("op")
    assert record.status == tl.ExecutionStatus.OUTCOME_UNKNOWN and "interrupted" in record.last_reason


# -- the inline first attempt: an error while its outcome is classified ---------


def _too_deep():
    # A value the JSON encoder gives up on with RecursionError (not the
    # TypeError / ValueError a result that is not JSON raises).
    value = []
    for _ in range(100_000):
        value = [value]
    return value


def test_a_sync_result_that_breaks_the_encoder_is_recorded_unknown_not_left_in_flight(runtime):
    # What `_driven.run` does for an attempt whose perform raises: reported
    # unknown before the error goes on. An error raised while the tool's
    # value is classified must not leave the attempt `executing`.
    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.NEITHER))
    with pytest.raises(RecursionError):
        runtime.call("op", 0, "c1", "send", "{}", _too_deep)
    [record] = runtime.ledger.list("op")
    assert record.status == tl.ExecutionStatus.OUTCOME_UNKNOWN and "interrupted" in record.last_reason
    with pytest.raises(OutcomeUnknown):
        runtime.call("op", 0, "c1", "send", "{}", lambda: "never run")


def test_an_async_result_that_breaks_the_encoder_is_recorded_unknown_not_left_in_flight(runtime):
    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.NEITHER))

    async def body():
        return _too_deep()

    with pytest.raises(RecursionError):
        asyncio.run(runtime.acall("op", 0, "c1", "send", "{}", body))
    [record] = runtime.ledger.list("op")
    assert record.status == tl.ExecutionStatus.OUTCOME_UNKNOWN and "interrupted" in record.last_reason
    with pytest.raises(OutcomeUnknown):
        asyncio.run(runtime.acall("op", 0, "c1", "send", "{}", lambda: "never run"))


def test_a_refusal_that_breaks_its_classification_is_recorded_unknown_not_left_in_flight(runtime):
    # A NotCommitted subclass that never set `reason`: classifying it raises
    # AttributeError; the attempt is reported unknown all the same.
    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.NEITHER))

    class Refused(tl.NotCommitted):
        def __init__(self):
            Exception.__init__(self, "refused")

    def body():
        raise Refused()

    with pytest.raises(AttributeError):
        runtime.call("op", 0, "c1", "send", "{}", body)
    [record] = runtime.ledger.list("op")
    assert record.status == tl.ExecutionStatus.OUTCOME_UNKNOWN
