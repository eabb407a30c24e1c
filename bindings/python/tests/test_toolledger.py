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

import toolledger as tl
from conftest import run
from tools import Downstream, SendEmail, Weather, email_call

HERE = Path(__file__).resolve().parent


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
    assert tool.calls == 1
    assert ledger.get(out.execution_id).status == tl.ExecutionStatus.OUTCOME_UNKNOWN
    assert executor.metrics().outcome_unknown == 1

    # The app settles it; the stored result is then what every retry sees.
    settled = run(
        lambda: executor.resolve_unknown(
            out.execution_id, tl.Resolution.FOUND(result_json='{"sent":true}', external_id=None)
        )
    )
    assert settled.is_COMPLETED() and settled.result_json == '{"sent":true}'
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
        ledger.commit("op_1:round_0:nope:send_email:v1", "{}", None)
    assert err.value.execution_id == "op_1:round_0:nope:send_email:v1"


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

    stored = ledger.commit(ticket.execution_id, '{"sent":true}', "msg_9")
    assert stored.result_json == '{"sent":true}'
    with pytest.raises(tl.LedgerError.AlreadyCommitted):
        ledger.commit(ticket.execution_id, '{"sent":false}', None)

    again = ledger.begin("op_1", 0, spec)
    assert again.is_REPLAY() and again.result.result_json == '{"sent":true}'
    ledger.mark_delivered([ticket.execution_id])
    assert ledger.get(ticket.execution_id).status == tl.ExecutionStatus.RESULT_DELIVERED
    steps = [t.transition for t in ledger.transitions(ticket.execution_id)]
    assert steps[-2:] == ["commit", "deliver"]


# --- crash recovery across processes -----------------------------------------


def test_a_killed_process_is_recovered_and_reconciled_exactly_once(tmp_path):
    ledger_path = str(tmp_path / "ledger.db")
    downstream = Downstream(tmp_path / "downstream.db")
    marker = tmp_path / "effect-done"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(HERE), *sys.path, env.get("PYTHONPATH", "")] if p
    )
    child = subprocess.Popen(
        [sys.executable, str(HERE / "crash_child.py"), ledger_path, downstream.path, str(marker)],
        env=env,
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
    outcomes = run(executor.recover)
    assert len(outcomes) == 1 and outcomes[0].is_COMPLETED(), outcomes
    assert outcomes[0].execution_id == execution_id
    assert outcomes[0].external_id == "msg_1"
    assert (tool.lookups, tool.calls) == (1, 0)
    assert ledger.get(execution_id).status == tl.ExecutionStatus.COMMITTED

    again = run(lambda: executor.execute("op_crash", 0, email_call()))
    assert again.replayed is True and again.result_json == outcomes[0].result_json
    assert tool.calls == 0
    assert downstream.count() == 1


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
