"""Privacy by construction, as a Python app using the generated API sees it: a canary planted in
arguments, results, previews, external ids and tool exceptions shows up in
no printed object, no error message, nothing on stdout/stderr and no log
line; the files are the owner's only; an encrypted ledger keeps the canary
off the disk and refuses a wrong key."""

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from toolledger import ffi as tl  # the generated API as it is
from toolledger.events import LoggingObserver
from conftest import run

CANARY = "CANARY-py-4111-1111-1111"


class CanaryTool(tl.ToolHandler):
    """Puts the canary in its result, external id, preview and exceptions."""

    def __init__(self, name, raise_with=None):
        self.name = name
        self.raise_with = raise_with

    def descriptor(self):
        return tl.ToolDescriptor(
            name=self.name,
            version=1,
            effect=tl.EffectClass.SIDE_EFFECT,
            batch=tl.BatchMode.ATOMIC,
        )

    async def perform(self, request):
        assert CANARY in request.arguments_json
        if self.raise_with is not None:
            raise self.raise_with
        return tl.PerformOutcome.COMMITTED(
            result_json=json.dumps({"receipt": CANARY}), external_id="ext-" + CANARY
        )

    def approval_preview(self, arguments_json):
        return json.dumps({"to": CANARY})


def canary_call(call_id, tool):
    return tl.ToolCall(
        provider=tl.Provider.CUSTOM,
        call_id=call_id,
        tool_name=tool,
        arguments=json.dumps({"iban": CANARY, "amount": "$50"}),
    )


def printed(*objects):
    out = []
    for o in objects:
        out += [str(o), repr(o), f"{o}", f"{o!r}", str([o]), repr({"k": o})]
    return out


def assert_clean(texts):
    for text in texts:
        assert CANARY not in text, text


def test_no_printed_object_error_output_or_log_line_shows_the_canary(
    tmp_path, capfd, caplog
):
    ledger = tl.Ledger.open(str(tmp_path / "l.db"), tl.LedgerConfig())
    ledger.set_observer(LoggingObserver())
    caplog.set_level(logging.DEBUG, logger="toolledger")
    executor = tl.ToolExecutor(ledger, tl.ExecutorConfig(max_attempts=1))
    executor.register(CanaryTool("pay"))
    executor.register(CanaryTool("boom", raise_with=RuntimeError("socket closed " + CANARY)))
    executor.register(
        CanaryTool("declined", raise_with=tl.ToolCallError.Tool("declined for " + CANARY))
    )

    done = run(lambda: executor.execute("op", 0, canary_call("c1", "pay")))
    boom = run(lambda: executor.execute("op", 0, canary_call("c2", "boom")))
    declined = run(lambda: executor.execute("op", 0, canary_call("c3", "declined")))
    assert done.is_COMPLETED() and CANARY in done.result_json  # reachable
    assert done.external_id == "ext-" + CANARY
    assert boom.is_UNKNOWN() and declined.is_UNKNOWN()
    assert CANARY in declined.reason  # what the app's own tool said, explicitly

    # Ledger steps: tickets, approvals, stored results, replays.
    spec = tl.CallSpec(call=canary_call("c4", "pay"), tool_version=1, requires_approval=True)
    approval = ledger.begin("op2", 0, spec)
    assert approval.is_NEEDS_APPROVAL()
    ledger.approve(
        approval.request.execution_id,
        approval.request.args_digest,
        json.dumps({"shown": CANARY}),
    )
    ticket = ledger.mark_executing(approval.request.execution_id)
    ledger.record_external_id(ticket, "ext-" + CANARY)
    stored = ledger.commit(ticket, json.dumps({"r": CANARY}), "ext-" + CANARY)
    replay = ledger.begin("op2", 0, spec)
    executions = ledger.list("op") + ledger.list("op2")
    transitions = [t for e in executions for t in ledger.transitions(e.execution_id)]

    texts = printed(
        done, boom, declined, approval, approval.request, ticket, stored, replay,
        spec, spec.call, *executions, *transitions,
        tl.PerformOutcome.COMMITTED(result_json=CANARY, external_id=CANARY),
        tl.LookupOutcome.FOUND(result_json=CANARY, external_id=None),
        tl.Resolution.FOUND(result_json=CANARY, external_id=CANARY),
    )
    # Not checked: a `ToolCallError` the app's tool builds itself. UniFFI's
    # Python errors are exceptions whose args are their fields (its error
    # template takes no exported Display), so it prints what the app put in.
    # Errors carry ids and digests, never the arguments.
    other = tl.CallSpec(call=canary_call("c1", "pay"), tool_version=1)
    other.call.arguments = json.dumps({"iban": CANARY + "-changed"})
    conflict = ledger.begin("op", 0, tl.CallSpec(call=other.call, tool_version=1))
    texts += printed(conflict)
    with pytest.raises(tl.LedgerError) as err:
        ledger.commit(ticket, json.dumps({"other": CANARY}), None)
    texts += printed(err.value) + [str(err.value.args)]

    captured = capfd.readouterr()
    texts += [captured.out, captured.err]
    texts += [r.getMessage() for r in caplog.records] + [caplog.text]
    assert_clean(texts)
    assert "bytes>" in str(done)

    # The log says why the calls ended unknown, without what the tool said.
    unknown = [
        r for r in caplog.records if "->outcome_unknown" in r.getMessage()
    ]
    assert len(unknown) == 2, caplog.text
    assert all(r.levelno == logging.WARNING for r in unknown)
    assert {r.reason_kind for r in unknown} == {"tool_error"}
    assert all(r.tool in ("boom", "declined") for r in unknown)


class Recorder(tl.LedgerObserver):
    def __init__(self):
        self.events = []

    def on_event(self, event):
        self.events.append(event)


def test_the_observer_hears_every_committed_move_and_a_failing_one_is_ignored(tmp_path):
    ledger = tl.Ledger.open(str(tmp_path / "l.db"), tl.LedgerConfig())
    recorder = Recorder()
    ledger.set_observer(recorder)
    spec = tl.CallSpec(call=canary_call("c1", "pay"), tool_version=1)
    ticket = ledger.begin("op", 0, spec).ticket
    ledger.commit(ticket, "{}", None)
    moves = [(e.from_status, e.to_status) for e in recorder.events]
    assert moves == [
        (None, tl.ExecutionStatus.EXECUTING),
        (tl.ExecutionStatus.EXECUTING, tl.ExecutionStatus.COMMITTED),
    ]
    assert recorder.events[0].tool_name == "pay" and recorder.events[1].attempt == 1

    class Throws(tl.LedgerObserver):
        def on_event(self, event):
            raise RuntimeError("observer bug " + CANARY)

    ledger.set_observer(Throws())
    ticket = ledger.begin("op", 0, tl.CallSpec(call=canary_call("c2", "pay"), tool_version=1)).ticket
    assert ledger.commit(ticket, "{}", None).result_json == "{}"  # the move stands
    ledger.set_observer(None)


def disk(path):
    data = Path(path).read_bytes()
    wal = Path(str(path) + "-wal")
    return data + (wal.read_bytes() if wal.exists() else b"")


def test_an_encrypted_ledger_keeps_the_canary_off_the_disk(tmp_path):
    path = str(tmp_path / "l.db")
    key = tl.generate_ledger_key()
    assert len(key) == 32
    ledger = tl.Ledger.open(path, tl.LedgerConfig(), key)
    assert ledger.is_encrypted()
    spec = tl.CallSpec(call=canary_call("c1", "pay"), tool_version=1)
    ticket = ledger.begin("op", 0, spec).ticket
    ledger.commit(ticket, json.dumps({"r": CANARY}), "ext-" + CANARY)
    assert CANARY.encode() not in disk(path)
    assert CANARY in ledger.begin("op", 0, spec).result.result_json
    del ledger, ticket

    with pytest.raises(tl.LedgerError.Storage) as err:
        tl.Ledger.open(path, tl.LedgerConfig(), tl.generate_ledger_key())
    assert err.value.kind == tl.StorageKind.WRONG_KEY
    with pytest.raises(tl.LedgerError.Storage) as err:
        tl.Ledger.open(path, tl.LedgerConfig())
    assert err.value.kind == tl.StorageKind.KEY_REQUIRED

    new_key = tl.generate_ledger_key()
    tl.rotate_ledger_key(path, tl.LedgerConfig(), key, new_key)
    with pytest.raises(tl.LedgerError.Storage) as err:
        tl.Ledger.open(path, tl.LedgerConfig(), key)
    assert err.value.kind == tl.StorageKind.WRONG_KEY
    again = tl.Ledger.open(path, tl.LedgerConfig(), new_key)
    assert CANARY in again.begin("op", 0, spec).result.result_json


def test_a_plain_ledger_is_encrypted_in_place(tmp_path):
    path = str(tmp_path / "l.db")
    ledger = tl.Ledger.open(path, tl.LedgerConfig())
    spec = tl.CallSpec(call=canary_call("c1", "pay"), tool_version=1)
    ledger.commit(ledger.begin("op", 0, spec).ticket, json.dumps({"r": CANARY}), None)
    with pytest.raises(tl.LedgerError.Storage) as err:
        tl.encrypt_ledger(path, tl.LedgerConfig(), tl.generate_ledger_key())
    assert err.value.kind == tl.StorageKind.IN_USE  # the ledger is open here
    del ledger
    assert CANARY.encode() in disk(path)
    key = tl.generate_ledger_key()
    tl.encrypt_ledger(path, tl.LedgerConfig(), key)
    assert CANARY.encode() not in disk(path)
    ledger = tl.Ledger.open(path, tl.LedgerConfig(), key)
    assert ledger.begin("op", 0, spec).is_REPLAY()


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_the_ledger_files_are_the_owners_only_under_umask_022(tmp_path):
    previous = os.umask(0o022)
    try:
        path = tmp_path / "l.db"
        ledger = tl.Ledger.open(str(path), tl.LedgerConfig())
        spec = tl.CallSpec(call=canary_call("c1", "pay"), tool_version=1)
        ledger.commit(ledger.begin("op", 0, spec).ticket, "{}", None)
        mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
        assert mode(path) == 0o600
        assert mode(str(path) + "-wal") == 0o600
        assert mode(str(path) + "-shm") == 0o600
        sessions = Path(str(path) + "-sessions")
        assert mode(sessions) == 0o700
        assert [mode(p) for p in sessions.iterdir()] == [0o600]
    finally:
        os.umask(previous)
