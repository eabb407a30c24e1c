"""Rounds from Python: ``tl.Executor.execute_round`` of ``Tool``s begins
every call of a model response in one durable transaction (the library's
``start_round``) and walks each call in its own task of the awaiting loop.
The exactly-once rules hold per call; effects are counted at the
downstream."""

import asyncio
import contextvars
import json

import pytest

import toolledger as tl
from toolledger import ffi
from tools import email_call

CALLER = contextvars.ContextVar("caller", default=None)


def emails(n):
    return [email_call(call_id=f"call_{i}", to=f"u{i}@example.com") for i in range(n)]


def counting_tool(downstream, *, key=False, lookup=True, hold=None, seen=None):
    """An async send_email tool; `hold(request)` may return an awaitable the
    tool waits on before its effect; `seen` collects the caller's context."""
    state = {"performs": 0, "running": 0, "most": 0}

    async def perform(request):
        state["performs"] += 1
        state["running"] += 1
        state["most"] = max(state["most"], state["running"])
        try:
            if seen is not None:
                seen.append(CALLER.get())
            if hold is not None:
                await hold(request)
            await asyncio.sleep(0)
            return tl.Committed({"id": downstream.perform(request.downstream_key, request.arguments_json)})
        finally:
            state["running"] -= 1

    def find(request):
        found = downstream.find(request.downstream_key)
        return None if found is None else {"id": found}

    tool = tl.tool(perform, name="send_email", idempotency_key=key, lookup=find if lookup else None)
    return tool, state


def test_a_round_runs_every_call_once_in_parallel_in_the_callers_context_and_replays(ledger_path, downstream):
    seen = []
    started = []

    async def hold(request):
        # Every tool of the round waits until all three have started: the
        # round runs them at once, not one after another.
        started.append(request.execution_id)
        for _ in range(200):
            if len(started) >= 3:
                return
            await asyncio.sleep(0.005)
        raise AssertionError("the round's tools did not run in parallel")

    tool, state = counting_tool(downstream, hold=hold, seen=seen)

    async def main():
        CALLER.set("the app's task")
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[tool])
            first = await executor.execute_round("op_1", 0, emails(3))
            again = await executor.execute_round("op_1", 0, emails(3))
            return first, again, [r.status for r in ledger.list("op_1")]

    first, again, statuses = asyncio.run(main())
    assert [type(o) for o in first] == [tl.Completed] * 3
    assert not any(o.replayed for o in first)
    assert all(o.replayed for o in again)
    assert [o.result_json for o in again] == [o.result_json for o in first]
    assert len({o.result_json for o in first}) == 3
    assert seen == ["the app's task"] * 3
    assert state["performs"] == 3 and state["most"] == 3
    assert downstream.count() == 3
    assert statuses == [ffi.ExecutionStatus.COMMITTED] * 3


def test_max_parallel_bounds_the_tools_running_at_once(ledger_path, downstream):
    tool, state = counting_tool(downstream)

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[tool], max_parallel=2)
            return await executor.execute_round("op_1", 0, emails(5))

    outs = asyncio.run(main())
    assert [type(o) for o in outs] == [tl.Completed] * 5
    assert state["most"] == 2
    assert downstream.count() == 5


@pytest.mark.parametrize("bad", ["unknown tool", "bad arguments"])
def test_one_bad_call_stops_the_whole_round_with_nothing_recorded(ledger_path, downstream, bad):
    tool, state = counting_tool(downstream)
    calls = emails(2)
    if bad == "unknown tool":
        calls.insert(1, tl.ToolCall("call_x", "no_such_tool", {}))
        expected = tl.UnknownTool
    else:
        calls.insert(1, tl.ToolCall(provider=tl.Provider.CUSTOM, call_id="call_j",
                                    tool_name="send_email", arguments='{"to":'))
        expected = tl.InvalidInput

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[tool])
            with pytest.raises(expected):
                await executor.execute_round("op_1", 0, calls)
            return ledger.list("op_1")

    assert asyncio.run(main()) == []
    assert state["performs"] == 0 and downstream.count() == 0


def test_a_cancelled_round_leaves_nothing_in_flight_and_the_next_ask_finishes_once_each(ledger_path, downstream):
    """max_parallel=1: call 0's tool makes its effect and hangs; calls 1 and
    2 wait for their turn. The caller is cancelled: call 0 is reported
    interrupted (unknown; its lookup finds the effect), calls 1 and 2 are
    given back (never sent). The next ask finishes all three, one effect
    each."""
    gate = {"hang": True}

    async def hold(request):
        if gate["hang"]:
            downstream.perform(request.downstream_key, request.arguments_json)
            await asyncio.Event().wait()

    tool, state = counting_tool(downstream, hold=hold)

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[tool], max_parallel=1)
            task = asyncio.ensure_future(executor.execute_round("op_1", 0, emails(3)))
            for _ in range(400):
                if downstream.count() == 1:
                    break
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            between = sorted((r.status.name, r.attempt_count) for r in ledger.list("op_1"))
            gate["hang"] = False
            outs = await executor.execute_round("op_1", 0, emails(3))
            return between, outs

    between, outs = asyncio.run(main())
    assert between == [("FAILED_BEFORE_COMMIT", 1), ("FAILED_BEFORE_COMMIT", 1), ("OUTCOME_UNKNOWN", 1)]
    assert [type(o) for o in outs] == [tl.Completed] * 3
    assert downstream.count() == 3
    assert state["performs"] == 3


def test_a_round_with_a_raw_tool_handler_goes_through_the_librarys_executor(ledger_path, downstream):
    from tools import SendEmail

    raw = SendEmail(downstream, name="send_raw")
    tool, state = counting_tool(downstream)

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[tool, raw])
            calls = emails(1) + [tl.ToolCall(provider=tl.Provider.CUSTOM, call_id="call_r",
                                             tool_name="send_raw",
                                             arguments=json.dumps({"to": "r@example.com", "body": "hi"}))]
            return await executor.execute_round("op_1", 0, calls)

    outs = asyncio.run(main())
    assert [type(o) for o in outs] == [tl.Completed] * 2
    assert state["performs"] == 1 and downstream.count() == 2


def test_a_round_cancelled_before_its_walks_start_gives_back_every_attempt(ledger_path, downstream):
    """The round's task is cancelled right after its first step
    (`start_round` handed out three Performs and one task per call was
    created), before those tasks first ran (a sibling's `task.cancel()` in
    the same loop iteration, a TaskGroup abort): a task cancelled before it
    starts never enters its body, so the round gives the attempts back
    itself (never sent), rather than leave them executing (`InFlight` for
    the life of the process). Found by a review; it failed before."""
    tool, state = counting_tool(downstream)

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[tool], max_parallel=4)
            task = asyncio.ensure_future(executor.execute_round("op_1", 0, emails(3)))
            # Runs after the task's first step, before the per-call tasks'.
            asyncio.get_running_loop().call_soon(task.cancel)
            with pytest.raises(asyncio.CancelledError):
                await task
            between = sorted((r.status.name, r.attempt_count) for r in ledger.list("op_1"))
            outs = await executor.execute_round("op_1", 0, emails(3))
            return between, outs

    between, outs = asyncio.run(main())
    assert between == [("FAILED_BEFORE_COMMIT", 1)] * 3
    assert [type(o) for o in outs] == [tl.Completed] * 3
    assert state["performs"] == 3 and downstream.count() == 3


def interrupting_at(n):
    """A task factory that raises KeyboardInterrupt at the `n`-th task it is
    asked for (a Ctrl-C landing while the round makes its walks' tasks)."""
    made = []

    def factory(loop, coro, **kw):
        made.append(coro)
        if len(made) == n:
            coro.close()
            raise KeyboardInterrupt
        return asyncio.Task(coro, loop=loop, **kw)

    return factory


def test_an_interruption_while_the_round_creates_its_tasks_gives_back_and_runs_no_tool_on_what_it_gave_back(
        ledger_path, downstream):
    """A KeyboardInterrupt raised while the round creates its per-call tasks
    (here: by the loop's task factory, at the third task), caught by the app,
    whose loop goes on: the round gives back every step no walk had
    claimed, and a task created before the interruption, run afterwards,
    does not run its tool on an attempt already recorded as never sent (the
    next ask would run it again: two effects for a tool without a key).
    Found by a review; before, the two tasks created first ran their tools."""
    tool, state = counting_tool(downstream)

    async def main():
        loop = asyncio.get_running_loop()
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[tool], max_parallel=4)
            # The round runs in this task (a KeyboardInterrupt raised in a
            # task of its own would leave the loop).
            loop.set_task_factory(interrupting_at(3))
            try:
                with pytest.raises(KeyboardInterrupt):
                    await executor.execute_round("op_1", 0, emails(3))
            finally:
                loop.set_task_factory(None)
            for _ in range(5):
                await asyncio.sleep(0.01)
            between = sorted((r.status.name, r.attempt_count) for r in ledger.list("op_1"))
            performed = state["performs"]
            outs = await executor.execute_round("op_1", 0, emails(3))
            return between, performed, outs

    between, performed, outs = asyncio.run(main())
    assert performed == 0
    assert between == [("FAILED_BEFORE_COMMIT", 1)] * 3
    assert [type(o) for o in outs] == [tl.Completed] * 3
    assert state["performs"] == 3 and downstream.count() == 3


def test_a_give_back_interrupted_by_a_second_interruption_still_gives_back_the_rest(
        ledger_path, downstream, monkeypatch):
    """A Ctrl-C lands as the round creates its first walk's task, and the
    first give-back is itself interrupted (a second Ctrl-C): the other
    steps are still given back, then the interruption goes on. (The step
    whose give-back was interrupted stays handed out: nothing can be
    recorded for it once the second interruption is raised.) Found by a
    review; before, every step after the first stayed executing."""
    from toolledger import _driven

    tool, state = counting_tool(downstream)
    real = _driven._abandon
    calls = {"n": 0}

    def abandon_once_interrupted(native, attempt, reason):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return real(native, attempt, reason)

    monkeypatch.setattr(_driven, "_abandon", abandon_once_interrupted)

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[tool], max_parallel=4)
            loop = asyncio.get_running_loop()
            loop.set_task_factory(interrupting_at(1))
            try:
                with pytest.raises(KeyboardInterrupt):
                    await executor.execute_round("op_1", 0, emails(3))
            finally:
                loop.set_task_factory(None)
            return sorted((r.status.name, r.attempt_count) for r in ledger.list("op_1"))

    between = asyncio.run(main())
    # The first give-back was interrupted before it recorded anything; the
    # other two were recorded.
    assert between == [("EXECUTING", 1), ("FAILED_BEFORE_COMMIT", 1), ("FAILED_BEFORE_COMMIT", 1)]
    assert state["performs"] == 0 and downstream.count() == 0
