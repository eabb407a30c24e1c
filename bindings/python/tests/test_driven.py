"""Caller-driven calls from Python: ``tl.Executor.execute`` and
``execute_sync`` run the tool in the caller's task or thread through the
library's ``start`` / ``report`` steps, and the exactly-once rules hold: one
perform per call, a stale report refused with the current attempt's result
standing, a process killed between the effect and its report reconciled.
Effects are counted at the downstream."""

import asyncio
import contextvars
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import toolledger as tl
from toolledger import ffi
from tools import Downstream, email_call
from test_toolledger import child_env

HERE = Path(__file__).parent
CALLER = contextvars.ContextVar("caller", default=None)


def kind(value):
    """The variant name of a generated enum value (`PERFORM`, `IN_FLIGHT` ...)."""
    return type(value).__name__.rsplit(".", 1)[-1]


def sending(downstream, *, key=False, lookup=True, is_async=False, seen=None):
    """A send_email tool over `downstream`; `seen` collects (thread, context)."""
    calls = {"perform": 0, "lookup": 0}

    def run(request):
        calls["perform"] += 1
        if seen is not None:
            seen.append((threading.current_thread(), CALLER.get()))
        return tl.Committed({"id": downstream.perform(request.downstream_key, request.arguments_json)})

    def find(request):
        calls["lookup"] += 1
        found = downstream.find(request.downstream_key)
        return None if found is None else {"id": found}

    if is_async:
        async def perform(request):
            return run(request)
    else:
        perform = run
    tool = tl.tool(perform, name="send_email", idempotency_key=key, lookup=find if lookup else None)
    return tool, calls


def test_execute_runs_a_tool_in_the_awaiting_task_once_and_a_repeat_replays(ledger_path, downstream):
    seen = []
    tool, calls = sending(downstream, is_async=True, seen=seen)

    async def main():
        CALLER.set("the app's task")
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[tool])
            first = await executor.execute("op_1", 0, email_call())
            again = await executor.execute("op_1", 0, email_call())
            return first, again

    first, again = asyncio.run(main())
    assert isinstance(first, tl.Completed) and not first.replayed
    assert isinstance(again, tl.Completed) and again.replayed
    assert again.result_json == first.result_json
    assert seen == [(threading.current_thread(), "the app's task")]
    assert calls["perform"] == 1
    assert downstream.count() == 1


def test_execute_sync_runs_a_plain_tool_on_this_thread_and_refuses_an_async_one(ledger_path, downstream):
    seen = []
    tool, calls = sending(downstream, seen=seen)
    async_tool, _ = sending(downstream, is_async=True)
    async_tool.name = "send_email_async"
    with tl.Ledger.open(ledger_path) as ledger:
        executor = tl.Executor(ledger, tools=[tool, async_tool])
        done = executor.execute_sync("op_1", 0, email_call())
        assert isinstance(done, tl.Completed) and not done.replayed
        assert seen[0][0] is threading.current_thread()
        with pytest.raises(tl.InvalidInput):
            executor.execute_sync("op_1", 0, tl.ToolCall("call_2", "send_email_async", {"to": "b"}))
        assert ledger.list("op_1")[0].tool_name == "send_email"
        assert len(ledger.list("op_1")) == 1
    assert calls["perform"] == 1
    assert downstream.count() == 1


def test_two_callers_of_one_call_get_one_perform(ledger_path, downstream):
    tool, _ = sending(downstream)
    with tl.Ledger.open(ledger_path) as ledger:
        native = tl.Executor(ledger, tools=[tool]).native
        first = native.start("op_1", 0, email_call())
        assert kind(first) == "PERFORM"
        second = native.start("op_1", 0, email_call())
        assert kind(second) == "DONE"
        assert kind(second.outcome) == "IN_FLIGHT"
        request = first.attempt.request
        effect = downstream.perform(request.downstream_key, request.arguments_json)
        done = native.report(first.attempt, ffi.PerformOutcome.COMMITTED(json.dumps({"id": effect}), None))
        assert kind(done.outcome) == "COMPLETED" and not done.outcome.replayed
        later = native.start("op_1", 0, email_call())
        assert later.outcome.replayed
    assert downstream.count() == 1


def test_a_stale_report_is_refused_and_the_current_attempts_result_stands(ledger_path, downstream):
    tool, _ = sending(downstream, key=True, lookup=False)
    with tl.Ledger.open(ledger_path) as ledger:
        native = tl.Executor(ledger, tools=[tool]).native
        a1 = native.start("op_1", 0, email_call()).attempt
        # Attempt 1 times out: the key tool is resent as attempt 2, same key.
        step = native.report(a1, ffi.PerformOutcome.UNKNOWN("timed out"))
        assert kind(step) == "PERFORM"
        a2 = step.attempt
        assert (a2.request.attempt, a2.request.downstream_key) == (2, a1.request.downstream_key)
        # Attempt 1's answer arrives late: refused; attempt 2 still runs.
        late = native.report(a1, ffi.PerformOutcome.COMMITTED('{"late":1}', None))
        assert kind(late.outcome) == "IN_FLIGHT"
        record = ledger.get(a1.request.execution_id)
        assert (record.status, record.attempt_count) == (ffi.ExecutionStatus.EXECUTING, 2)
        done = native.report(a2, ffi.PerformOutcome.COMMITTED('{"fresh":2}', None))
        assert done.outcome.result_json == '{"fresh":2}'
        again = native.report(a1, ffi.PerformOutcome.COMMITTED('{"late":1}', None))
        assert again.outcome.replayed and again.outcome.result_json == '{"fresh":2}'
        # An attempt the execution never had is bad input.
        forged = ffi.CallerAttempt(request=ffi.ToolRequest(
            execution_id=a2.request.execution_id, downstream_key=a2.request.downstream_key,
            tool_name="send_email", arguments_json=a2.request.arguments_json, attempt=9,
            item_index=None, external_id=None), read_only=False)
        with pytest.raises(ffi.LedgerError.InvalidInput):
            native.report(forged, ffi.PerformOutcome.COMMITTED("1", None))


def test_a_report_by_fencing_token_follows_the_same_rules(ledger_path, downstream):
    # `report_attempt(execution_id, attempt, outcome)`: what the layer sends
    # for a side-effecting attempt instead of the whole attempt record.
    tool, _ = sending(downstream, key=True, lookup=False)
    with tl.Ledger.open(ledger_path) as ledger:
        native = tl.Executor(ledger, tools=[tool]).native
        a1 = native.start("op_1", 0, email_call()).attempt.request
        step = native.report_attempt(a1.execution_id, 1, ffi.PerformOutcome.UNKNOWN("timed out"))
        assert kind(step) == "PERFORM" and step.attempt.request.attempt == 2
        late = native.report_attempt(a1.execution_id, 1, ffi.PerformOutcome.COMMITTED('{"late":1}', None))
        assert kind(late.outcome) == "IN_FLIGHT"
        done = native.report_attempt(a1.execution_id, 2, ffi.PerformOutcome.COMMITTED('{"fresh":2}', None))
        assert kind(done.outcome) == "COMPLETED" and not done.outcome.replayed
        assert ledger.get(a1.execution_id).result_json == '{"fresh":2}'
        with pytest.raises(ffi.LedgerError.InvalidInput):
            native.report_attempt(a1.execution_id, 9, ffi.PerformOutcome.COMMITTED("1", None))
        with pytest.raises(ffi.LedgerError.NotFound):
            native.report_attempt("nobody:round_0:c:send_email:v1", 1, ffi.PerformOutcome.COMMITTED("1", None))
        assert ledger.get(a1.execution_id).result_json == '{"fresh":2}'


def test_an_interrupted_caller_reports_the_attempt_unknown_and_the_next_ask_reconciles(ledger_path, downstream):
    tool, calls = sending(downstream, lookup=True)

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[tool])
            started = asyncio.Event()

            @tl.tool(name="send_email_slow", lookup=lambda r: None)
            async def slow(request):
                downstream.perform(request.downstream_key, request.arguments_json)
                started.set()
                await asyncio.sleep(60)

            executor.register(slow)
            task = asyncio.ensure_future(
                executor.execute("op_1", 0, tl.ToolCall("call_s", "send_email_slow", {"to": "a"})))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            record = ledger.list("op_1")[0]
            return record.status

    assert asyncio.run(main()) == ffi.ExecutionStatus.OUTCOME_UNKNOWN
    assert downstream.count() == 1


def test_a_process_killed_between_the_effect_and_its_report_is_reconciled_by_a_lookup(tmp_path, ledger_path):
    downstream = Downstream(tmp_path / "downstream.db")
    marker = tmp_path / "effect-done"
    child = subprocess.Popen(
        [sys.executable, str(HERE / "driven_child.py"), ledger_path, downstream.path, str(marker)],
        env=child_env(),
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, f"child exited early with {child.returncode}"
            assert time.monotonic() < deadline, "child never performed the effect"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    assert downstream.count() == 1
    tool, calls = sending(downstream, lookup=True)
    with tl.Ledger.open(ledger_path) as ledger:
        done = tl.Executor(ledger, tools=[tool]).execute_sync("op_crash", 0, email_call())
    assert isinstance(done, tl.Completed) and not done.replayed
    assert calls == {"perform": 0, "lookup": 1}
    assert downstream.count() == 1


@pytest.mark.parametrize("is_async", [False, True])
def test_a_walk_past_the_step_limit_leaves_nothing_in_flight(ledger_path, is_async):
    # 600 retryable refusals take 1,200 steps, past the walk's 1,024: the
    # attempt handed out last is recorded as never sent before the walk
    # raises, so the next ask goes on instead of answering InFlight for the
    # life of the process (with a limit of 64 it was left executing).
    calls = {"perform": 0}

    if is_async:
        @tl.tool(name="refused")
        async def refused(request):
            calls["perform"] += 1
            raise tl.NotCommitted("503", retryable=True)
    else:
        @tl.tool(name="refused")
        def refused(request):
            calls["perform"] += 1
            raise tl.NotCommitted("503", retryable=True)

    with tl.Ledger.open(ledger_path) as ledger:
        executor = tl.Executor(ledger, tools=[refused], max_attempts=600, backoff_base_ms=0, backoff_max_ms=0)
        call = tl.ToolCall("call_1", "refused", {})
        run = (lambda: asyncio.run(executor.execute("op_1", 0, call))) if is_async else (
            lambda: executor.execute_sync("op_1", 0, call))
        with pytest.raises(RuntimeError, match="did not settle"):
            run()
        assert calls["perform"] == 512
        assert ledger.list("op_1")[0].status != ffi.ExecutionStatus.EXECUTING
        # The next ask goes on with the attempts left, to the last one's refusal.
        again = run()
        assert isinstance(again, tl.Failed), again
        assert calls["perform"] == 599  # attempt 513 was handed out and never run
