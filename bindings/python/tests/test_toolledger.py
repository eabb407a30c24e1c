"""The Python bindings as an app sees them: tools written in Python, the
executor's outcomes, the ledger's errors, and recovery after a killed process.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolledger import ffi as tl  # the generated API as it is
from conftest import run
from tools import Downstream, SendEmail, Weather, email_call

HERE = Path(__file__).resolve().parent


def made_up_ticket(execution_id, attempt=1):
    """A ticket the ledger never handed out (for error paths)."""
    return tl.Ticket(
        execution_id=execution_id,
        downstream_key="tl_" + "0" * 32,
        attempt=attempt,
        tool_name="send_email",
        tool_version=1,
        args_json="{}",
        args_digest="0" * 64,
        external_id=None,
    )


def child_env():
    """The environment of a child Python that imports the bindings and tools."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(HERE), *sys.path, env.get("PYTHONPATH", "")] if p
    )
    return env


def executor_with(ledger, *tools, config=None):
    executor = tl.ToolExecutor(ledger, config or tl.ExecutorConfig())
    for tool in tools:
        executor.register(tool)
    return executor


# --- the happy path and replay ----------------------------------------------


def test_execute_runs_a_python_tool_and_commits(ledger, downstream):
    tool = SendEmail(downstream)
    executor = executor_with(ledger, tool)

    out = run(lambda: executor.execute("op_1", 0, email_call()))

    assert out.is_COMPLETED()
    assert out.replayed is False
    assert json.loads(out.result_json) == {"sent": True, "id": "msg_1"}
    assert out.external_id == "msg_1"
    assert out.execution_id == "op_1:round_0:call_1:send_email:v1"
    assert (tool.calls, downstream.count()) == (1, 1)
    record = ledger.get(out.execution_id)
    assert record.status == tl.ExecutionStatus.COMMITTED
    assert record.result_json == out.result_json
    assert record.attempt_count == 1


def test_replay_returns_the_stored_result_without_running_the_tool(ledger, downstream):
    tool = SendEmail(downstream)
    executor = executor_with(ledger, tool)

    first = run(lambda: executor.execute("op_1", 0, email_call()))
    again = run(lambda: executor.execute("op_1", 0, email_call()))

    assert again.is_COMPLETED()
    assert again.replayed is True
    assert again.result_json == first.result_json
    assert again.external_id == first.external_id
    assert (tool.calls, downstream.count()) == (1, 1)
    metrics = executor.metrics()
    assert (metrics.attempts, metrics.replays, metrics.prevented_duplicates) == (1, 1, 1)


def test_replay_survives_reopening_the_ledger(ledger_path, downstream):
    first_tool = SendEmail(downstream)
    ledger = tl.Ledger.open(ledger_path, tl.LedgerConfig())
    first = run(lambda: executor_with(ledger, first_tool).execute("op_1", 0, email_call()))
    del ledger

    reopened = tl.Ledger.open(ledger_path, tl.LedgerConfig())
    tool = SendEmail(downstream)
    again = run(lambda: executor_with(reopened, tool).execute("op_1", 0, email_call()))

    assert again.replayed is True
    assert again.result_json == first.result_json
    assert (tool.calls, downstream.count()) == (0, 1)


def test_changed_arguments_under_the_same_call_id_conflict(ledger, downstream):
    tool = SendEmail(downstream)
    executor = executor_with(ledger, tool)

    run(lambda: executor.execute("op_1", 0, email_call(to="a@example.com")))
    out = run(lambda: executor.execute("op_1", 0, email_call(to="b@example.com")))

    assert out.is_CONFLICT()
    assert out.stored_digest != out.new_digest
    assert (tool.calls, downstream.count()) == (1, 1)


def test_read_only_tools_run_and_record_nothing(ledger):
    weather = Weather()
    executor = executor_with(ledger, weather)
    call = tl.ToolCall(
        provider=tl.Provider.CUSTOM, call_id="w1", tool_name="weather", arguments='{"city":"Oslo"}'
    )

    out = run(lambda: executor.execute("op_1", 0, call))

    assert out.is_COMPLETED() and out.result_json == '{"celsius":21}'
    assert weather.calls == 1
    assert ledger.list("op_1") == []


# --- approval ----------------------------------------------------------------


def test_approval_binds_to_the_digest(ledger, downstream):
    tool = SendEmail(downstream, requires_approval=True)
    executor = executor_with(ledger, tool)

    waiting = run(lambda: executor.execute("op_1", 0, email_call(to="bob@example.com")))
    assert waiting.is_NEEDS_APPROVAL()
    assert json.loads(waiting.preview_json) == {"to": "bob@example.com"}
    assert tool.calls == 0

    wrong = "0" * 64
    with pytest.raises(tl.LedgerError.DigestMismatch) as err:
        run(lambda: executor.approve(waiting.execution_id, wrong, None))
    assert err.value.stored == waiting.args_digest
    assert err.value.given == wrong
    with pytest.raises(tl.LedgerError.InvalidInput):
        run(lambda: executor.approve(waiting.execution_id, "not-a-digest", None))
    assert tool.calls == 0
    assert ledger.get(waiting.execution_id).status == tl.ExecutionStatus.PREPARED

    done = run(lambda: executor.approve(waiting.execution_id, waiting.args_digest, waiting.preview_json))
    assert done.is_COMPLETED() and done.replayed is False
    assert (tool.calls, downstream.count()) == (1, 1)

    with pytest.raises(tl.LedgerError.InvalidTransition) as err:
        ledger.approve(waiting.execution_id, waiting.args_digest, None)
    assert err.value.from_status == tl.ExecutionStatus.COMMITTED
    assert err.value.transition == "approve"
    # The executor's approve of the same call again (a double tap) answers
    # with its stored result; nothing runs again.
    again = run(lambda: executor.approve(waiting.execution_id, waiting.args_digest, None))
    assert again.is_COMPLETED() and again.replayed is True
    assert again.result_json == done.result_json
    assert (tool.calls, downstream.count()) == (1, 1)


# --- foreign exceptions --------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [RuntimeError("socket closed"), tl.ToolCallError.Transport("connection reset")],
    ids=["python-exception", "ToolCallError"],
)
def test_an_exception_in_perform_is_an_unknown_outcome_not_a_crash(ledger, downstream, exc):
    tool = SendEmail(downstream, lookup=False, fail_with=exc)
    executor = executor_with(ledger, tool)

    out = run(lambda: executor.execute("op_1", 0, email_call()))

    assert out.is_UNKNOWN(), out
    assert "socket closed" not in out.reason  # foreign text may hold user data
    # No lookup and no idempotency key: nothing can settle it by waiting.
    assert (out.attempt, out.retry_after_ms) == (1, None)
    assert tool.calls == 1
    assert ledger.get(out.execution_id).status == tl.ExecutionStatus.OUTCOME_UNKNOWN
    assert executor.metrics().outcome_unknown == 1

    # The app settles it; the stored result is then what every retry sees.
    settled = run(
        lambda: executor.resolve_unknown(
            out.execution_id,
            out.attempt,
            tl.Resolution.FOUND(result_json='{"sent":true}', external_id=None),
        )
    )
    assert settled.is_COMPLETED() and settled.result_json == '{"sent":true}'
    assert settled.partial is False
    assert run(lambda: executor.execute("op_1", 0, email_call())).replayed is True
    assert tool.calls == 1


def test_a_tool_returning_garbage_is_an_unknown_outcome_not_a_crash(ledger, downstream):
    class Garbage(SendEmail):
        async def perform(self, request):
            self.calls += 1
            return {"sent": True}  # not a PerformOutcome

    tool = Garbage(downstream, lookup=False)
    out = run(lambda: executor_with(ledger, tool).execute("op_1", 0, email_call()))
    assert out.is_UNKNOWN(), out
    assert tool.calls == 1


def test_a_descriptor_that_throws_is_an_error_not_a_crash(ledger, downstream):
    class Broken(SendEmail):
        def descriptor(self):
            raise ValueError("no descriptor")

    with pytest.raises(tl.LedgerError.InvalidInput):
        tl.ToolExecutor(ledger, tl.ExecutorConfig()).register(Broken(downstream))


# --- bad input and bad storage ------------------------------------------------


def test_bad_json_arguments_are_invalid_input_and_nothing_is_recorded(ledger, downstream):
    tool = SendEmail(downstream)
    executor = executor_with(ledger, tool)
    bad = tl.ToolCall(
        provider=tl.Provider.CUSTOM, call_id="c1", tool_name="send_email", arguments="{not json"
    )

    with pytest.raises(tl.LedgerError.InvalidInput) as err:
        run(lambda: executor.execute("op_1", 0, bad))
    assert "not json" not in err.value.message
    with pytest.raises(tl.LedgerError.InvalidInput):
        ledger.begin("op_1", 0, tl.CallSpec(call=bad, tool_version=1))

    assert ledger.list("op_1") == []
    assert ledger.stats().operations == 0
    assert tool.calls == 0


def test_bad_identifiers_are_invalid_input(ledger, downstream):
    executor = executor_with(ledger, SendEmail(downstream))
    with pytest.raises(tl.LedgerError.InvalidInput):
        run(lambda: executor.execute("", 0, email_call()))
    with pytest.raises(tl.LedgerError.InvalidInput):
        ledger.get("op_1:round_0:\x00:send_email:v1")
    with pytest.raises(tl.LedgerError.InvalidInput):
        ledger.get("")
    with pytest.raises(tl.LedgerError.NotFound) as err:
        ledger.commit(made_up_ticket("op_1:round_0:nope:send_email:v1"), "{}", None)
    assert err.value.execution_id == "op_1:round_0:nope:send_email:v1"
    # A ticket is validated on the way in like any id.
    with pytest.raises(tl.LedgerError.InvalidInput):
        ledger.commit(made_up_ticket(""), "{}", None)
    with pytest.raises(tl.LedgerError.InvalidInput):
        ledger.owns(made_up_ticket("op_1:round_0:\x00:send_email:v1"))


def test_unknown_tool_is_reported_and_nothing_is_recorded(ledger):
    executor = tl.ToolExecutor(ledger, tl.ExecutorConfig())
    with pytest.raises(tl.LedgerError.UnknownTool) as err:
        run(lambda: executor.execute("op_1", 0, email_call()))
    assert err.value.name == "send_email"
    assert ledger.list("op_1") == []


def test_a_file_that_is_not_a_database_is_a_storage_error(tmp_path):
    path = tmp_path / "notes.db"
    content = b"these are my notes, not a database\n" * 200
    path.write_bytes(content)

    with pytest.raises(tl.LedgerError.Storage) as err:
        tl.Ledger.open(str(path), tl.LedgerConfig())

    assert err.value.kind == tl.StorageKind.NOT_A_DATABASE
    assert path.read_bytes() == content  # left untouched


def test_extreme_configuration_values_do_not_panic(tmp_path, downstream):
    huge = 2**64 - 1
    ledger = tl.Ledger.open(
        str(tmp_path / "ledger.db"),
        tl.LedgerConfig(lease_ms=huge, busy_timeout_ms=huge, max_json_depth=2**32 - 1, max_json_bytes=huge),
    )
    config = tl.ExecutorConfig(
        max_attempts=0, perform_timeout_ms=huge, backoff_base_ms=huge, backoff_max_ms=huge, max_parallel=0
    )
    executor = executor_with(ledger, SendEmail(downstream), config=config)
    assert run(lambda: executor.execute("op_1", 0, email_call())).is_COMPLETED()
    assert run(lambda: executor.execute("op_1", 0, email_call())).replayed is True


def test_suspended_ledger_refuses_until_resumed(ledger, downstream):
    run(lambda: executor_with(ledger, SendEmail(downstream)).execute("op_1", 0, email_call()))
    ledger.suspend()
    with pytest.raises(tl.LedgerError.Suspended):
        ledger.list("op_1")
    ledger.resume()
    assert [r.status for r in ledger.list("op_1")] == [tl.ExecutionStatus.COMMITTED]


# --- the step API without the executor ----------------------------------------


def test_ledger_steps_begin_commit_replay_deliver(ledger):
    spec = tl.CallSpec(call=email_call(), tool_version=1)

    begun = ledger.begin("op_1", 0, spec)
    assert begun.is_EXECUTE()
    ticket = begun.ticket
    assert ticket.attempt == 1 and ticket.downstream_key.startswith("tl_")

    assert ticket.args_json == email_call().arguments  # as the model sent them
    assert ledger.owns(ticket) is True
    stored = ledger.commit(ticket, '{"sent":true}', "msg_9")
    assert stored.result_json == '{"sent":true}' and stored.partial is False
    assert ledger.owns(ticket) is False  # committed: no longer running
    assert ledger.commit(ticket, '{"sent":true}', "msg_9").result_json == '{"sent":true}'  # idempotent
    with pytest.raises(tl.LedgerError.AlreadyCommitted):
        ledger.commit(ticket, '{"sent":false}', None)

    again = ledger.begin("op_1", 0, spec)
    assert again.is_REPLAY() and again.result.result_json == '{"sent":true}'
    ledger.mark_delivered([ticket.execution_id])
    assert ledger.get(ticket.execution_id).status == tl.ExecutionStatus.RESULT_DELIVERED
    steps = [t.transition for t in ledger.transitions(ticket.execution_id)]
    # The refused other result is kept as evidence, with a note in the log.
    assert steps[-3:] == ["commit", "found_after_settled", "deliver"]


# --- fencing: every step names its attempt ----------------------------------


def test_a_superseded_attempt_is_fenced_off(ledger):
    spec = tl.CallSpec(call=email_call(), tool_version=1)
    begun = ledger.begin("op_fence", 0, spec)
    assert begun.is_EXECUTE()
    t1 = begun.ticket
    execution_id = t1.execution_id
    assert t1.attempt == 1 and ledger.owns(t1) is True

    # The request timed out: its outcome is unknown. The app checked
    # downstream, found nothing, and retries under the same key.
    ledger.mark_outcome_unknown(t1, "timed out")
    assert ledger.owns(t1) is False
    unknown = ledger.get(execution_id)
    assert (unknown.status, unknown.attempt_count) == (tl.ExecutionStatus.OUTCOME_UNKNOWN, 1)
    resolved = ledger.resolve_unknown(execution_id, unknown.attempt_count, tl.Resolution.NOT_FOUND_RETRY())
    assert resolved.is_RETRY(), resolved
    t2 = resolved.ticket
    assert (t2.execution_id, t2.attempt) == (execution_id, 2)
    assert t2.downstream_key == t1.downstream_key  # the same key on every attempt
    assert ledger.owns(t2) is True and ledger.owns(t1) is False

    # The first attempt's late answer arrives: refused, nothing changes.
    with pytest.raises(tl.LedgerError.StaleAttempt) as err:
        ledger.commit(t1, '{"sent":"late"}', "msg_late")
    stale = err.value
    assert stale.execution_id == execution_id
    assert (stale.attempt, stale.current_attempt) == (1, 2)
    assert stale.status == tl.ExecutionStatus.EXECUTING
    for step in (
        lambda: ledger.fail_before_commit(t1, "refused", False),
        lambda: ledger.mark_outcome_unknown(t1, "timed out again"),
        lambda: ledger.record_external_id(t1, "msg_late"),
        lambda: ledger.resolve_unknown(execution_id, 1, tl.Resolution.NOT_FOUND_RETRY()),
    ):
        with pytest.raises(tl.LedgerError.StaleAttempt) as err:
            step()
        assert (err.value.attempt, err.value.current_attempt) == (1, 2)
    record = ledger.get(execution_id)
    assert (record.status, record.attempt_count) == (tl.ExecutionStatus.EXECUTING, 2)
    assert (record.result_json, record.external_id) == (None, None)
    assert record.owner_session == ledger.session_id()

    # The current attempt commits; a repeated call replays its result.
    stored = ledger.commit(t2, '{"sent":true}', "msg_2")
    assert (stored.result_json, stored.external_id, stored.partial) == ('{"sent":true}', "msg_2", False)
    replay = ledger.begin("op_fence", 0, spec)
    assert replay.is_REPLAY(), replay
    assert (replay.result.result_json, replay.result.external_id) == ('{"sent":true}', "msg_2")
    with pytest.raises(tl.LedgerError.StaleAttempt) as err:
        ledger.commit(t1, '{"sent":"late"}', None)
    assert err.value.status == tl.ExecutionStatus.COMMITTED
    assert ledger.get(execution_id).result_json == '{"sent":true}'


def test_a_live_session_owns_its_call_until_it_ends_whatever_the_lease(ledger_path):
    # lease_ms only covers suspended sessions: a running one owns its calls
    # for as long as it holds its session lock, however long that is.
    first = tl.Ledger.open(ledger_path, tl.LedgerConfig(lease_ms=1))
    other = tl.Ledger.open(ledger_path, tl.LedgerConfig(lease_ms=1))
    spec = tl.CallSpec(call=email_call(), tool_version=1)
    t1 = first.begin("op_1", 0, spec).ticket
    time.sleep(0.05)  # far past the lease

    busy = other.begin("op_1", 0, spec)
    assert busy.is_IN_FLIGHT(), busy
    assert busy.retry_after_ms is None  # alive: no lapse to wait for
    assert first.owns(t1) is True
    assert other.owns(t1) is False  # not this session's attempt

    # The first session ends (its process would have died): the other one
    # finds the call abandoned, its outcome unknown, and takes it over.
    del first
    found = other.begin("op_1", 0, spec)
    assert found.is_RECONCILE(), found
    assert found.ticket.attempt == 1
    record = other.get(t1.execution_id)
    assert record.status == tl.ExecutionStatus.OUTCOME_UNKNOWN
    resolved = other.resolve_unknown(t1.execution_id, 1, tl.Resolution.NOT_FOUND_RETRY())
    assert resolved.is_RETRY() and resolved.ticket.attempt == 2
    assert other.owns(resolved.ticket) is True
    assert other.get(t1.execution_id).owner_session == other.session_id()
    other.commit(resolved.ticket, '{"sent":true}', None)
    assert other.begin("op_1", 0, spec).is_REPLAY()


def test_cancelling_an_operation_with_a_call_running_reports_a_possible_side_effect(ledger):
    begun = ledger.begin("op_c", 0, tl.CallSpec(call=email_call(), tool_version=1))
    assert begun.is_EXECUTE()

    # Nothing committed yet, but the request may be on its way.
    assert ledger.cancel_operation("op_c") == tl.OperationStatus.CANCELLED_AFTER_SIDE_EFFECT
    assert ledger.operation_status("op_c") == tl.OperationStatus.CANCELLED_AFTER_SIDE_EFFECT
    assert ledger.cancel(begun.ticket.execution_id) == tl.CancelOutcome.NOT_CANCELLABLE
    # The call in flight finishes honestly.
    ledger.commit(begun.ticket, '{"sent":true}', None)
    assert ledger.get(begun.ticket.execution_id).status == tl.ExecutionStatus.COMMITTED

    idle = ledger.begin("op_idle", 0, tl.CallSpec(call=email_call(), tool_version=1, requires_approval=True))
    assert idle.is_NEEDS_APPROVAL()
    assert ledger.cancel_operation("op_idle") == tl.OperationStatus.CANCELLED
    assert ledger.get(idle.request.execution_id).status == tl.ExecutionStatus.CANCELLED_BEFORE_COMMIT


# --- the landing window ---------------------------------------------------------


@pytest.mark.parametrize("window_ms", [None, 0], ids=["default-window", "no-window"])
def test_not_found_inside_the_landing_window_is_not_resent(ledger, downstream, fast_config, window_ms):
    # The first perform fails before reaching the downstream, but the
    # executor cannot know that: the outcome is unknown and lookup finds
    # nothing. This fake downstream applies requests synchronously, so with
    # landing_window_ms = 0 nothing can still land and the resend is safe.
    tool = SendEmail(
        downstream, fail_with=tl.ToolCallError.Transport("reset"), fail_times=1, landing_window_ms=window_ms
    )
    executor = executor_with(ledger, tool, config=fast_config)

    out = run(lambda: executor.execute("op_1", 0, email_call()))

    if window_ms is None:  # the default window, 120 s: wait, send nothing
        assert out.is_UNKNOWN(), out
        assert out.attempt == 1
        assert out.retry_after_ms is not None and 0 < out.retry_after_ms <= 120_000
        assert (tool.calls, tool.lookups, downstream.count()) == (1, 1, 0)
        record = ledger.get(out.execution_id)
        assert (record.status, record.attempt_count) == (tl.ExecutionStatus.OUTCOME_UNKNOWN, 1)
        # Asking again inside the window still sends nothing.
        again = run(lambda: executor.execute("op_1", 0, email_call()))
        assert again.is_UNKNOWN() and again.retry_after_ms is not None
        assert (tool.calls, downstream.count()) == (1, 0)
    else:  # resent at once under the same key, as attempt 2
        assert out.is_COMPLETED() and out.replayed is False, out
        assert (tool.calls, tool.lookups, downstream.count()) == (2, 1, 1)
        record = ledger.get(out.execution_id)
        assert (record.status, record.attempt_count) == (tl.ExecutionStatus.COMMITTED, 2)


# --- compensation ------------------------------------------------------------------


def test_compensate_runs_under_the_compensating_tools_own_descriptor(ledger, downstream):
    send = SendEmail(downstream)
    recall = SendEmail(downstream, name="recall_email", requires_approval=True)
    executor = executor_with(ledger, send, recall)
    original = run(lambda: executor.execute("op_1", 0, email_call()))
    assert original.is_COMPLETED()
    refund = tl.ToolCall(
        provider=tl.Provider.CUSTOM, call_id="recall_1", tool_name="recall_email", arguments='{"id":"msg_1"}'
    )

    waiting = run(lambda: executor.compensate(original.execution_id, "op_1", 1, refund))

    # recall_email requires approval: nothing ran yet.
    assert waiting.is_NEEDS_APPROVAL(), waiting
    assert waiting.tool_name == "recall_email"
    assert recall.calls == 0
    [linked] = ledger.compensations(original.execution_id)
    assert linked.execution_id == waiting.execution_id
    assert linked.compensates == original.execution_id
    done = run(lambda: executor.approve(waiting.execution_id, waiting.args_digest, None))
    assert done.is_COMPLETED() and done.replayed is False
    assert (send.calls, recall.calls, downstream.count()) == (1, 1, 2)

    # Nothing to compensate for a call that never committed.
    pending = ledger.begin("op_2", 0, tl.CallSpec(call=email_call(), tool_version=1, requires_approval=True))
    with pytest.raises(tl.LedgerError.InvalidInput):
        run(lambda: executor.compensate(pending.request.execution_id, "op_2", 1, refund))


# --- crash recovery across processes -----------------------------------------


def test_a_killed_process_is_recovered_and_reconciled_exactly_once(tmp_path):
    ledger_path = str(tmp_path / "ledger.db")
    downstream = Downstream(tmp_path / "downstream.db")
    marker = tmp_path / "effect-done"
    child = subprocess.Popen(
        [sys.executable, str(HERE / "crash_child.py"), ledger_path, downstream.path, str(marker)],
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

    # A fresh process-level ledger: the dead owner's row is an unknown outcome.
    ledger = tl.Ledger.open(ledger_path, tl.LedgerConfig())
    pending = ledger.recover()
    assert [r.status for r in pending] == [tl.ExecutionStatus.OUTCOME_UNKNOWN]
    execution_id = pending[0].execution_id

    # Reconcile through the tool's lookup: found downstream, so committed,
    # and the tool never performs again.
    tool = SendEmail(downstream)
    executor = executor_with(ledger, tool)
    recovery = run(executor.recover)
    assert recovery.failed == []
    outcomes = recovery.outcomes
    assert len(outcomes) == 1 and outcomes[0].is_COMPLETED(), outcomes
    assert outcomes[0].replayed is False and outcomes[0].partial is False
    assert outcomes[0].execution_id == execution_id
    assert outcomes[0].external_id == "msg_1"
    assert (tool.lookups, tool.calls) == (1, 0)
    assert ledger.get(execution_id).status == tl.ExecutionStatus.COMMITTED

    again = run(lambda: executor.execute("op_crash", 0, email_call()))
    assert again.replayed is True and again.result_json == outcomes[0].result_json
    assert tool.calls == 0
    assert downstream.count() == 1


def test_recover_reports_a_row_whose_tool_is_not_registered_and_recovers_the_rest(ledger, downstream):
    # A committed result the model never got (a registered tool) ...
    sent = ledger.begin("op_r", 0, tl.CallSpec(call=email_call(), tool_version=1))
    ledger.commit(sent.ticket, '{"sent":true}', "msg_7")
    # ... and an unknown outcome of a tool this build no longer registers.
    fax_call = tl.ToolCall(provider=tl.Provider.CUSTOM, call_id="call_2", tool_name="send_fax", arguments="{}")
    fax = ledger.begin("op_r", 0, tl.CallSpec(call=fax_call, tool_version=1))
    ledger.mark_outcome_unknown(fax.ticket, "timed out")

    tool = SendEmail(downstream)
    recovery = run(executor_with(ledger, tool).recover)

    assert [f.execution_id for f in recovery.failed] == [fax.ticket.execution_id]
    assert "send_fax" in recovery.failed[0].error
    [replay] = recovery.outcomes
    assert replay.is_COMPLETED(), replay
    assert replay.execution_id == sent.ticket.execution_id
    assert (replay.result_json, replay.external_id, replay.replayed) == ('{"sent":true}', "msg_7", True)
    assert (tool.calls, tool.lookups) == (0, 0)
    # The failed row is left as it was, for a build that knows its tool.
    assert ledger.get(fax.ticket.execution_id).status == tl.ExecutionStatus.OUTCOME_UNKNOWN


# --- two SQLite libraries in one process ----------------------------------------


def test_a_foreign_sqlite_closing_the_ledger_file_loses_no_commit(tmp_path):
    ledger_path = str(tmp_path / "ledger.db")
    try:
        child = subprocess.run(
            [sys.executable, str(HERE / "sqlite_child.py"), ledger_path],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired as e:  # run() has killed the child
        pytest.fail(f"the child did not finish within {e.timeout} s: {e.stderr!r}")
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stderr)
    lines = [json.loads(line) for line in child.stdout.splitlines()]
    assert lines[0] == {"wal_gone": True}, "sqlite3's close did not delete the WAL: nothing was tested"
    committed = lines[1]["committed"]
    assert len(committed) == 11
    assert lines[1]["wal_back"] is True, "the ledger kept writing to the deleted WAL"

    ledger = tl.Ledger.open(ledger_path, tl.LedgerConfig())
    records = ledger.list("op_sqlite")
    assert sorted(r.execution_id for r in records) == sorted(committed)
    assert {r.status for r in records} == {tl.ExecutionStatus.COMMITTED}
    for i in range(11):
        spec = tl.CallSpec(call=email_call(call_id=f"call_{i}"), tool_version=1)
        again = ledger.begin("op_sqlite", 0, spec)
        assert again.is_REPLAY(), (i, again)
        assert json.loads(again.result.result_json) == {"sent": True, "n": i}
        assert again.result.external_id == f"msg_{i}"


# --- provider formats --------------------------------------------------------

OPENAI_RESPONSE = {
    "id": "chatcmpl-1",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_abc",
                        "type": "function",
                        "function": {
                            "name": "send_email",
                            "arguments": '{"to":"a@example.com","body":"hi"}',
                        },
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
}

ANTHROPIC_RESPONSE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "content": [
        {"type": "text", "text": "Sending."},
        {"type": "tool_use", "id": "toolu_1", "name": "send_email", "input": {"to": "a@example.com"}},
        {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Oslo"}},
    ],
    "stop_reason": "tool_use",
}


def test_openai_parse_execute_render_round_trip(ledger, downstream):
    calls = tl.parse_tool_calls(tl.Provider.OPEN_AI_CHAT, json.dumps(OPENAI_RESPONSE), 0)
    assert [(c.call_id, c.tool_name, c.position) for c in calls] == [("call_abc", "send_email", 0)]
    assert json.loads(calls[0].arguments) == {"to": "a@example.com", "body": "hi"}

    tool = SendEmail(downstream)
    executor = executor_with(ledger, tool)
    [out] = run(lambda: executor.execute_round("op_1", 0, calls))
    message = json.loads(tl.render_tool_result(calls[0], out.result_json, False))
    assert message["role"] == "tool" and message["tool_call_id"] == "call_abc"
    assert json.loads(message["content"]) == json.loads(out.result_json)

    # A replay renders byte-identical JSON.
    [replayed] = run(lambda: executor.execute_round("op_1", 0, calls))
    assert replayed.replayed
    assert tl.render_tool_result(calls[0], replayed.result_json, False) == tl.render_tool_result(
        calls[0], out.result_json, False
    )
    assert tool.calls == 1


def test_anthropic_whole_turn_and_malformed_responses():
    calls = tl.parse_tool_calls(tl.Provider.ANTHROPIC, json.dumps(ANTHROPIC_RESPONSE), 3)
    assert [c.call_id for c in calls] == ["toolu_1", "toolu_2"]
    results = [
        tl.ToolResult(call=calls[1], output_json='{"celsius":21}'),
        tl.ToolResult(call=calls[0], output_json='"failed"', is_error=True),
    ]
    turn = json.loads(tl.render_anthropic_user_message(results))
    assert turn["role"] == "user"
    assert [b["tool_use_id"] for b in turn["content"]] == ["toolu_1", "toolu_2"]
    assert turn["content"][0].get("is_error") is True

    with pytest.raises(tl.LedgerError.InvalidInput):
        tl.parse_tool_calls(tl.Provider.ANTHROPIC, "{not json", 0)
    with pytest.raises(tl.LedgerError.InvalidInput):
        tl.render_tool_result(calls[0], "{not json", False)
    with pytest.raises(tl.LedgerError.InvalidInput):
        tl.render_anthropic_user_message([])


ANTHROPIC_STREAM = [
    {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "send_email", "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "input_json_delta", "partial_json": '{"to":"a@example.com",'},
    },
    {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '"n":1.50}'}},
    {"type": "content_block_stop", "index": 0},
]


def test_a_streamed_response_is_assembled_into_whole_calls():
    stream = tl.ToolCallStream(tl.Provider.ANTHROPIC, 2)
    for chunk in ANTHROPIC_STREAM:
        stream.push(json.dumps(chunk))
    assert stream.is_complete() is False  # no message_stop yet
    with pytest.raises(tl.LedgerError.InvalidInput):
        tl.ToolCallStream(tl.Provider.ANTHROPIC, 2).finish()  # nothing arrived
    stream.push(json.dumps({"type": "message_stop"}))
    assert stream.is_complete() is True

    [call] = stream.finish()
    assert (call.provider, call.call_id, call.tool_name, call.position) == (
        tl.Provider.ANTHROPIC, "toolu_1", "send_email", 0
    )
    # One object, members sorted by key, the number exactly as streamed.
    assert call.arguments == '{"n":1.50,"to":"a@example.com"}'
    with pytest.raises(tl.LedgerError.InvalidInput):
        stream.finish()  # only once
    with pytest.raises(tl.LedgerError.InvalidInput):
        stream.push("{}")
    with pytest.raises(tl.LedgerError.InvalidInput):
        tl.ToolCallStream(tl.Provider.MCP, 0)  # MCP does not stream calls


# Written as text, not through json.dumps: the numbers must arrive as typed.
GEMINI_STREAM = [
    # A server-side MCP call and, one chunk later, the API's answer.
    '{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"get_forecast","args":{"city":"Oslo"}}}]}}]}',
    '{"candidates":[{"content":{"role":"model","parts":[{"functionResponse":{"name":"get_forecast","response":{"sky":"clear"}}}]}}]}',
    # A client call whose arguments stream in pieces.
    '{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"id":"fc-1","name":"pay","willContinue":true}}]}}]}',
    '{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"partialArgs":['
    '{"jsonPath":"$.amount","numberValue":224.18827276432074},'
    '{"jsonPath":"$.ref","numberValue":18446744073709551617},'
    '{"jsonPath":"$.adjust","numberValue":-0}],"willContinue":true}}]}}]}',
    '{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{}}]}}]}',
    '{"candidates":[{"content":{"role":"model","parts":[{"text":"Paid."}]},"finishReason":"STOP"}]}',
]


def test_a_gemini_stream_gives_only_the_clients_whole_calls_with_exact_numbers():
    # Chunk by chunk, no chunk is ever a runnable call: the server's call has
    # no finishReason yet, the streamed one is in pieces.
    for chunk in GEMINI_STREAM:
        try:
            assert tl.parse_tool_calls(tl.Provider.GEMINI, chunk, 0) == []
        except tl.LedgerError.InvalidInput:
            pass
    stream = tl.ToolCallStream(tl.Provider.GEMINI, 0)
    for chunk in GEMINI_STREAM:
        stream.push(chunk)
    assert stream.is_complete() is True
    [call] = stream.finish()  # get_forecast was answered by the API: not ours
    assert (call.call_id, call.tool_name, call.call_id_derived) == ("fc-1", "pay", False)
    assert call.arguments == '{"adjust":-0,"amount":224.18827276432074,"ref":18446744073709551617}'
    rendered = tl.render_tool_result(call, '{"charged": 224.18827276432074, "fee": -0}', False)
    assert rendered == (
        '{"functionResponse":{"id":"fc-1","name":"pay",'
        '"response":{"charged":224.18827276432074,"fee":-0}}}'
    )


def test_a_gemini_call_of_a_tool_the_api_ran_without_its_answer_is_refused():
    whole = (
        '{"candidates":[{"content":{"role":"model","parts":['
        '{"functionCall":{"name":"lookup","args":{"q":1}}},'
        '{"functionCall":{"name":"lookup","args":{"q":2}}},'
        '{"functionResponse":{"name":"lookup","response":{}}}]},"finishReason":"STOP"}]}'
    )
    with pytest.raises(tl.LedgerError.InvalidInput):
        tl.parse_tool_calls(tl.Provider.GEMINI, whole, 0)


MCP_REQUEST_2026 = {
    "jsonrpc": "2.0",
    "id": 5,
    "method": "tools/call",
    "params": {
        "name": "send_email",
        "arguments": {"to": "a@example.com"},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"},
    },
}


def test_mcp_results_are_rendered_for_the_requests_protocol_version():
    request = json.dumps(MCP_REQUEST_2026)
    assert tl.mcp_request_protocol_version(request) == "2026-07-28"
    older = dict(MCP_REQUEST_2026, params={"name": "send_email", "arguments": {}})
    assert tl.mcp_request_protocol_version(json.dumps(older)) is None
    [call] = tl.parse_tool_calls(tl.Provider.MCP, request, 0)

    current = json.loads(tl.render_mcp_result(call, '{"sent":true}', False, "2026-07-28"))
    assert current["id"] == 5 and current["result"]["resultType"] == "complete"
    assert current["result"]["isError"] is False
    assert tl.render_mcp_result(call, '{"sent":true}', False, None) == tl.render_tool_result(
        call, '{"sent":true}', False
    )
    with pytest.raises(tl.LedgerError.InvalidInput):
        tl.render_mcp_result(call, '{"sent":true}', False, "1999-01-01")
    with pytest.raises(tl.LedgerError.InvalidInput):
        tl.mcp_request_protocol_version("{not json")
