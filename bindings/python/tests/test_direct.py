"""The caller-driven steps through one native call each
(``toolledger._direct``, the library's ``toolledger_direct_step_borrowed``):
``execute`` and ``execute_sync`` walk every call through them. Each test
runs the same steps through the generated methods and through
``_direct.Steps`` and asserts the same answers and the same exception
types; effects are counted at the downstream."""

import asyncio
import contextvars
import json
import threading
import time

import pytest

import toolledger as tl
from toolledger import _direct, ffi
from toolledger._native import toolledger as generated
from tools import email_call
from test_driven import kind, sending

CALLER = contextvars.ContextVar("caller", default=None)


def both(native):
    """The generated methods, then the direct ones, over one executor."""
    return [("generated", native), ("direct", _direct.Steps(native))]


def test_a_replay_through_the_fast_path_returns_exactly_the_stored_result_and_runs_nothing(ledger_path, downstream):
    tool, calls = sending(downstream)
    with tl.Ledger.open(ledger_path) as ledger:
        executor = tl.Executor(ledger, tools=[tool])
        first = executor.execute_sync("op_1", 0, email_call())
        assert isinstance(first, tl.Completed) and not first.replayed
        stored = ledger.get(first.execution_id).result_json
        assert stored == first.result_json
        for _ in range(3):
            again = executor.execute_sync("op_1", 0, email_call())
            assert again == tl.Completed(first.execution_id, stored, None, True, False)
        again = asyncio.run(executor.execute("op_1", 0, email_call()))
        assert again == tl.Completed(first.execution_id, stored, None, True, False)
        # The generated step and the direct one answer the same replay.
        (_, generated), (_, direct) = both(executor.native)
        assert direct.start("op_1", 0, email_call()) == generated.start("op_1", 0, email_call())
    assert calls["perform"] == 1
    assert downstream.count() == 1


def test_the_same_typed_errors_through_both_paths_and_nothing_recorded(ledger_path, downstream):
    tool, calls = sending(downstream, key=True, lookup=False)
    with tl.Ledger.open(ledger_path) as ledger:
        executor = tl.Executor(ledger, tools=[tool])
        done = executor.execute_sync("op_1", 0, email_call())
        eid = done.execution_id
        for name, steps in both(executor.native):
            # An unknown tool, a malformed operation id: typed, nothing recorded.
            with pytest.raises(ffi.LedgerError.UnknownTool):
                steps.start("op_1", 0, tl.ToolCall("c_x", "nobody", {}))
            with pytest.raises(ffi.LedgerError.InvalidInput):
                steps.start("", 0, email_call("c_y"))
            # Arguments of the wrong type are refused before anything crosses.
            with pytest.raises(TypeError):
                steps.start(7, 0, email_call("c_z"))
            with pytest.raises((ValueError, OverflowError)):
                steps.start("op_1", -1, email_call("c_z"))
            # A foreign token (an attempt the execution never had), an
            # unknown execution id, a malformed one.
            with pytest.raises(ffi.LedgerError.InvalidInput):
                steps.report_attempt(eid, 9, ffi.PerformOutcome.COMMITTED("1", None))
            with pytest.raises(ffi.LedgerError.NotFound):
                steps.report_attempt("nobody:round_0:c:send_email:v1", 1, ffi.PerformOutcome.COMMITTED("1", None))
            with pytest.raises(ffi.LedgerError.InvalidInput):
                steps.report_attempt("", 1, ffi.PerformOutcome.COMMITTED("1", None))
            # Another result for the committed attempt: refused, the stored one stands.
            with pytest.raises(ffi.LedgerError.AlreadyCommitted):
                steps.report_attempt(eid, 1, ffi.PerformOutcome.COMMITTED('{"late":1}', None))
            assert ledger.get(eid).result_json == done.result_json, name
        # The Pythonic layer translates them on the fast path (its own
        # tools only: another name is not the fast path's).
        with pytest.raises(tl.InvalidInput):
            executor.execute_sync("", 0, email_call("c_y"))
        with pytest.raises(tl.InvalidInput):
            asyncio.run(executor.execute("", 0, email_call("c_y")))
        with pytest.raises(tl.InvalidInput):
            executor.execute_sync("op_1", 0, tl.ToolCall("c_x", "send_email", "not json"))
        assert [r.execution_id for r in ledger.list("op_1")] == [eid]
        assert ledger.get(eid).result_json == done.result_json
    assert calls["perform"] == 1
    assert downstream.count() == 1


def test_a_stale_report_gets_the_same_answer_through_both_paths(ledger_path, downstream):
    tool, _ = sending(downstream, key=True, lookup=False)
    with tl.Ledger.open(ledger_path) as ledger:
        native = tl.Executor(ledger, tools=[tool]).native
        answers = {}
        for n, (name, steps) in enumerate(both(native)):
            call = email_call(f"call_{n}")
            a1 = steps.start("op_1", 0, call).attempt
            step = steps.report(a1, ffi.PerformOutcome.UNKNOWN("timed out"))
            assert kind(step) == "PERFORM" and step.attempt.request.attempt == 2
            a2 = step.attempt
            late = steps.report_attempt(a1.request.execution_id, 1, ffi.PerformOutcome.COMMITTED('{"late":1}', None))
            assert kind(late.outcome) == "IN_FLIGHT"
            done = steps.report_attempt(a2.request.execution_id, 2, ffi.PerformOutcome.COMMITTED('{"fresh":2}', None))
            again = steps.report(a1, ffi.PerformOutcome.COMMITTED('{"late":1}', None))
            assert again.outcome.replayed and again.outcome.result_json == '{"fresh":2}'
            record = ledger.get(a1.request.execution_id)
            answers[name] = (kind(late.outcome), done.outcome.result_json, record.status, record.attempt_count)
        assert answers["direct"] == answers["generated"] == (
            "IN_FLIGHT", '{"fresh":2}', ffi.ExecutionStatus.COMMITTED, 2)


@pytest.mark.parametrize("size", [100_000, 400_000])
def test_a_result_larger_than_the_buffer_comes_back_whole(ledger_path, downstream, size):
    # 100 KB: the thread's buffer grows and is kept; 400 KB: a buffer of its
    # own for that answer (the library keeps it for `toolledger_direct_take`).
    big = "é" + "x" * size

    @tl.tool(name="echo", idempotency_key=True)
    def echo(request):
        return {"text": big}

    with tl.Ledger.open(ledger_path) as ledger:
        executor = tl.Executor(ledger, tools=[echo])
        call = tl.ToolCall("c_big", "echo", {"n": size})
        first = executor.execute_sync("op_1", 0, call)
        assert first.result == {"text": big}
        again = executor.execute_sync("op_1", 0, call)
        assert again.replayed and again.result_json == first.result_json
        assert ledger.get(first.execution_id).result_json == first.result_json
        # The next small call on this thread still answers.
        small = executor.execute_sync("op_1", 1, tl.ToolCall("c_small", "echo", {}))
        assert small.execution_id != first.execution_id


def test_threads_replaying_at_once_each_get_their_own_answer(ledger_path, downstream):
    tool, calls = sending(downstream)
    with tl.Ledger.open(ledger_path) as ledger:
        executor = tl.Executor(ledger, tools=[tool])
        firsts = [executor.execute_sync("op_1", 0, email_call(f"c_{i}", body=f"b{i}")) for i in range(4)]
        wrong = []

        def replay(i):
            for _ in range(50):
                out = executor.execute_sync("op_1", 0, email_call(f"c_{i}", body=f"b{i}"))
                if out != tl.Completed(firsts[i].execution_id, firsts[i].result_json, None, True, False):
                    wrong.append((i, out))

        threads = [threading.Thread(target=replay, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        assert wrong == []
    assert calls["perform"] == 4
    assert downstream.count() == 4


def test_a_closed_ledger_refuses_the_fast_path(ledger_path, downstream):
    tool, calls = sending(downstream)
    ledger = tl.Ledger.open(ledger_path)
    executor = tl.Executor(ledger, tools=[tool])
    executor.execute_sync("op_1", 0, email_call())
    ledger.close()
    with pytest.raises(tl.LedgerClosed):
        executor.execute_sync("op_1", 0, email_call())
    with pytest.raises(tl.LedgerClosed):
        asyncio.run(executor.execute("op_1", 0, email_call()))
    assert calls["perform"] == 1


def test_the_perform_deadline_holds_for_a_tool_that_suspends_and_costs_nothing_for_one_that_does_not(ledger_path, downstream):
    state = {"runs": 0}

    @tl.tool(name="instant", idempotency_key=True)
    async def instant(request):
        state["runs"] += 1
        return {"caller": CALLER.get()}

    @tl.tool(name="suspends", idempotency_key=True)
    async def suspends(request):
        state["runs"] += 1
        await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        return {"caller": CALLER.get()}

    @tl.tool(name="hangs")
    async def hangs(request):
        state["runs"] += 1
        await asyncio.sleep(30)
        return "never"

    async def main():
        CALLER.set("app task")
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[instant, suspends, hangs], perform_timeout_ms=300)
            a = await executor.execute("op_1", 0, tl.ToolCall("c_1", "instant", {}))
            b = await executor.execute("op_1", 0, tl.ToolCall("c_2", "suspends", {}))
            started = time.monotonic()
            c = await executor.execute("op_1", 0, tl.ToolCall("c_3", "hangs", {}))
            waited = time.monotonic() - started
            return a, b, c, waited, ledger.get(c.execution_id).status

    a, b, c, waited, status = asyncio.run(main())
    assert a.result == {"caller": "app task"} and b.result == {"caller": "app task"}
    assert isinstance(c, tl.Unknown) and "timed out" in c.reason
    assert 0.25 <= waited < 10
    assert status == ffi.ExecutionStatus.OUTCOME_UNKNOWN
    assert state["runs"] == 3



def generated_start_request(operation_id, round, call):
    b = generated._UniffiRustBufferBuilder()
    generated._UniffiFfiConverterTypeOperationId.write(operation_id, b)
    generated._UniffiFfiConverterUInt32.write(round, b)
    generated._UniffiFfiConverterTypeToolCall.write(call, b)
    return bytes(b.buf)


def test_the_hot_writer_writes_the_generated_bytes_and_leaves_other_types_to_the_generated_path():
    calls = [
        tl.ToolCall("c", "t", "{}"),
        tl.ToolCall("çà_1", "tööl", '{"x":"日本"}', provider=ffi.Provider.ANTHROPIC, position=7,
                    call_id_derived=True),
        tl.ToolCall("c" * 300, "t", "[" + "1," * 40_000 + "1]", position=2**32 - 1),
    ] + [tl.ToolCall("c", "t", "{}", provider=p) for p in ffi.Provider]
    for call in calls:
        for op, round_ in (("op_1", 0), ("ópé", 2**32 - 1), ("", 5)):
            assert _direct._start_request(op, round_, call) == generated_start_request(op, round_, call)

    class Text(str):
        pass

    # Not the usual types: left to the generated converters (which check them).
    assert _direct._start_request(Text("op"), 0, calls[0]) is None
    assert _direct._start_request("op", -1, calls[0]) is None
    assert _direct._start_request("op", 2**32, calls[0]) is None
    assert _direct._start_request("op", True, calls[0]) is None
    odd = tl.ToolCall("c", "t", "{}")
    odd.position = -1
    assert _direct._start_request("op", 0, odd) is None
    odd = tl.ToolCall("c", "t", "{}")
    odd.provider = 6
    assert _direct._start_request("op", 0, odd) is None


def test_the_hot_reader_reads_what_the_generated_reader_reads():
    cases = [
        ffi.CallOutcome.COMPLETED("ex_1", '{"a":1}', None, True, False),
        ffi.CallOutcome.COMPLETED("ex_é", '"日本"', "ext_9", False, True),
        ffi.CallOutcome.COMPLETED("e" * 70_000, "", "", True, True),
    ]
    for outcome in cases:
        b = generated._UniffiRustBufferBuilder()
        generated._UniffiFfiConverterTypeCallerStep.write(ffi.CallerStep.DONE(outcome), b)
        data = bytes(b.buf)
        assert data.startswith(_direct._DONE_COMPLETED)
        made = _direct._completed(data)
        assert type(made) is tl.Completed
        assert made == tl.outcomes.from_ffi(outcome)
        # Cut short or with junk after it: not read here (the generated
        # reader refuses it).
        assert _direct._completed(data[:-1]) is None
        assert _direct._completed(data + b"\0") is None
        with pytest.raises(ffi.InternalError):
            _direct._answer(_direct._OK, data + b"\0")
    b = generated._UniffiRustBufferBuilder()
    generated._UniffiFfiConverterTypeCallerStep.write(ffi.CallerStep.DONE(ffi.CallOutcome.REJECTED("ex_1")), b)
    assert not bytes(b.buf).startswith(_direct._DONE_COMPLETED)


def test_the_hot_report_writer_writes_the_generated_bytes():
    def generated_request(execution_id, attempt, outcome):
        b = generated._UniffiRustBufferBuilder()
        generated._UniffiFfiConverterTypeExecutionId.write(execution_id, b)
        generated._UniffiFfiConverterUInt32.write(attempt, b)
        generated._UniffiFfiConverterTypePerformOutcome.write(outcome, b)
        return bytes(b.buf)

    for eid, attempt, outcome in [
        ("ex_1", 1, ffi.PerformOutcome.COMMITTED('"ok"', None)),
        ("ex_é", 2**32 - 1, ffi.PerformOutcome.COMMITTED('{"a":"日本"}', "ext_ü")),
        ("e" * 500, 3, ffi.PerformOutcome.COMMITTED("x" * 100_000, "")),
    ]:
        assert _direct._report_request(eid, attempt, outcome) == generated_request(eid, attempt, outcome)
    # Other variants and types: the generated path.
    assert _direct._report_request("ex_1", 1, ffi.PerformOutcome.UNKNOWN("timed out")) is None
    assert _direct._report_request("ex_1", -1, ffi.PerformOutcome.COMMITTED("1", None)) is None
    assert _direct._report_request("ex_1", 1, ffi.PerformOutcome.COMMITTED(b"1", None)) is None


def test_a_report_through_the_fast_path_settles_as_the_generated_one_does(ledger_path, downstream):
    tool, _ = sending(downstream, key=True, lookup=False)
    with tl.Ledger.open(ledger_path) as ledger:
        executor = tl.Executor(ledger, tools=[tool])
        steps = executor._steps
        results = []
        for n, settle in enumerate([executor.native.report_attempt, steps.settle_attempt]):
            request = steps.start("op_1", 0, email_call(f"c_{n}")).attempt.request
            done = settle(request.execution_id, 1, ffi.PerformOutcome.COMMITTED('{"n":1}', "ext_1"))
            results.append(tl.outcomes.from_ffi(done.outcome if kind(done) == "DONE" else done))
            # A foreign token: the same exception type on both.
            with pytest.raises(ffi.LedgerError.InvalidInput):
                settle(request.execution_id, 7, ffi.PerformOutcome.COMMITTED("1", None))
            assert ledger.get(request.execution_id).result_json == '{"n":1}'
        generated_done, direct_done = results
        assert type(direct_done) is tl.Completed
        assert (direct_done.result_json, direct_done.external_id, direct_done.replayed) == (
            generated_done.result_json, generated_done.external_id, generated_done.replayed) == ('{"n":1}', "ext_1", False)
