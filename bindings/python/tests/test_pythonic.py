"""The hand-written Pythonic layer (`import toolledger`), as an app uses it:
the README's quick start as written, tools as classes and decorated
functions, outcomes as dataclasses, one exception base class, the event loop
found without set-up, `with` and `close()`, awaitable ledger calls, and the
installed wheel itself."""

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import toolledger as tl
from toolledger import ffi
from toolledger.tools import Adapter

from tools import Downstream, SendEmail, email_call

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def fenced_block(markdown, heading, language):
    """The first ```language block after `heading` in `markdown`."""
    start = markdown.index(heading)
    match = re.compile(r"```" + language + r"\n(.*?)```", re.S).search(markdown, start)
    assert match, f"no ```{language} block after {heading!r}"
    return match.group(1), match.end()


# --- the package itself ----------------------------------------------------------------


def test_the_package_is_the_installed_wheel_not_the_source_tree():
    location = Path(tl.__file__).resolve()
    assert "site-packages" in location.parts, location
    assert REPO not in location.parents
    native = Path(ffi.__file__).resolve().parent / "_native"
    assert (native / "libtoolledger.so").exists() or (native / "libtoolledger.dylib").exists()


def test_the_version_is_the_workspace_version():
    cargo = (REPO / "Cargo.toml").read_text()
    section = cargo[cargo.index("[workspace.package]"):]
    version = re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1)
    assert tl.__version__ == version


def test_the_readme_quick_start_runs_as_written(tmp_path):
    readme = (REPO / "README.md").read_text()
    code, after = fenced_block(readme, "## Python quick start", "python")
    expected, _ = fenced_block(readme[after:], "prints", "text")
    script = tmp_path / "quick_start.py"
    script.write_text(code)

    first = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout == expected

    # The README's next sentence: a second run replays both answers.
    second = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout == "{'sent': True} replayed\n{'sent': True} replayed\n"


# --- tools --------------------------------------------------------------------------------


class Weather(tl.Tool):
    read_only = True

    async def perform(self, request):
        return {"city": request.arguments["city"], "celsius": 21}


def test_a_read_only_tool_is_one_method_and_records_nothing(ledger_path):
    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[Weather()])
            out = await executor.execute("op_1", 0, tl.ToolCall("w1", "weather", {"city": "Oslo"}))
            return out, ledger.get(out.execution_id)

    out, record = asyncio.run(main())
    assert isinstance(out, tl.Completed) and isinstance(out, tl.CallOutcome)
    assert out.result == {"city": "Oslo", "celsius": 21}
    assert json.loads(out.result_json) == out.result
    assert record is None  # read-only: nothing recorded


def test_a_decorated_tool_runs_on_the_callers_event_loop_without_any_set_up(ledger_path):
    seen = {}

    @tl.tool(name="send_email", idempotency_key=True)
    async def send(request):
        seen["loop"] = asyncio.get_running_loop()
        seen["thread"] = threading.get_ident()
        return tl.Committed({"id": "m1"}, external_id="m1")

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[send])
            out = await asyncio.wait_for(executor.execute("op_1", 0, email_call()), 30)
            return out, asyncio.get_running_loop(), threading.get_ident()

    out, loop, thread = asyncio.run(main())
    assert isinstance(out, tl.Completed) and out.external_id == "m1"
    assert out.result == {"id": "m1"}
    assert (seen["loop"], seen["thread"]) == (loop, thread)


def test_a_plain_def_tool_runs_in_a_worker_thread(ledger_path):
    threads = []

    @tl.tool
    def send_email(request):
        threads.append(threading.get_ident())
        return {"sent": request.arguments["to"]}

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            out = await tl.Executor(ledger, tools=[send_email]).execute("op_1", 0, email_call())
            return out, threading.get_ident()

    out, main_thread = asyncio.run(main())
    assert out.result == {"sent": "a@example.com"}
    assert threads and threads[0] != main_thread


def test_the_raw_generated_api_needs_no_event_loop_set_up_either(ledger_path, tmp_path):
    # Without toolledger's loop lookup this call waited for the perform
    # timeout (or forever, with perform_timeout_ms=None).
    downstream = Downstream(tmp_path / "downstream.db")
    ledger = ffi.Ledger.open(ledger_path, ffi.LedgerConfig())
    executor = ffi.ToolExecutor(ledger, ffi.ExecutorConfig(perform_timeout_ms=None))
    executor.register(SendEmail(downstream))

    async def main():
        return await asyncio.wait_for(executor.execute("op_1", 0, email_call()), 30)

    out = asyncio.run(main())
    assert out.is_COMPLETED() and downstream.count() == 1


def test_raising_not_committed_is_a_failure_and_any_other_exception_is_unknown(ledger_path):
    @tl.tool(name="pay")
    async def pay(request):
        if request.arguments["card"] == "declined":
            raise tl.NotCommitted("card declined", retryable=False)
        raise ConnectionResetError("reset by peer after sending")

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[pay])
            refused = await executor.execute("op_1", 0, tl.ToolCall("c1", "pay", {"card": "declined"}))
            unsure = await executor.execute("op_1", 0, tl.ToolCall("c2", "pay", {"card": "ok"}))
            return refused, unsure

    refused, unsure = asyncio.run(main())
    assert refused == tl.Failed(refused.execution_id, "card declined", False)
    assert isinstance(unsure, tl.Unknown)
    assert unsure.attempt == 1 and unsure.retry_after is None
    assert "reset by peer" not in unsure.reason  # exception text may hold user data
    assert "ConnectionResetError" in unsure.reason


def test_an_unknown_outcome_is_reconciled_through_the_tools_lookup(ledger_path):
    sent = {}

    class SendEmail(tl.Tool):
        landing_window = 0  # this fake downstream applies requests at once

        async def perform(self, request):
            sent[request.downstream_key] = "m1"
            raise TimeoutError("no answer")  # the effect happened anyway

        async def lookup(self, request):
            found = sent.get(request.downstream_key)
            return None if found is None else tl.Committed({"id": found}, external_id=found)

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[SendEmail()], backoff_base_ms=1)
            return await executor.execute("op_1", 0, email_call())

    out = asyncio.run(main())
    assert isinstance(out, tl.Completed), out
    assert out.result == {"id": "m1"} and out.external_id == "m1"
    assert len(sent) == 1


def test_approval_shows_the_preview_and_runs_the_approved_arguments(ledger_path):
    runs = []

    class Transfer(tl.Tool):
        requires_approval = True

        async def perform(self, request):
            runs.append(request.arguments)
            return {"ok": True}

        def approval_preview(self, arguments):
            return {"amount": arguments["amount"]}

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[Transfer()])
            call = tl.ToolCall("t1", "transfer", {"amount": "12.50 EUR", "to": "Bob"})
            waiting = await executor.execute("op_1", 0, call)
            assert isinstance(waiting, tl.NeedsApproval) and runs == []
            with pytest.raises(tl.DigestMismatch) as wrong:
                await executor.approve(waiting.execution_id, "0" * 64, preview=waiting.preview)
            assert isinstance(wrong.value, tl.Error) and wrong.value.given == "0" * 64
            done = await executor.approve(waiting.execution_id, waiting.args_digest, preview=waiting.preview)
            return waiting, done

    waiting, done = asyncio.run(main())
    assert waiting.tool_name == "transfer" and waiting.preview == {"amount": "12.50 EUR"}
    assert isinstance(done, tl.Completed) and done.result == {"ok": True}
    assert runs == [{"amount": "12.50 EUR", "to": "Bob"}]


def started_job(ledger_path, job_id, then=lambda ledger, executor, out: None):
    """A `render_video` tool that starts a job `job_id`, called once; then
    `then(ledger, executor, outcome)` in the same open ledger. Returns the
    outcome and what `then` returned."""
    @tl.tool(name="render_video")
    async def render(request):
        return tl.JobStarted(job_id)

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[render])
            out = await executor.execute("op_1", 0, tl.ToolCall("v1", "render_video", {}))
            return out, then(ledger, executor, out)

    return asyncio.run(main())


def test_a_job_started_is_pending(ledger_path):
    out, _ = started_job(ledger_path, "job_7")
    assert out == tl.Pending(out.execution_id, "job_7")


def test_a_job_started_under_an_empty_id_is_an_unknown_outcome_that_says_why(ledger_path):
    out, record = started_job(ledger_path, "", lambda ledger, _, out: ledger.get(out.execution_id))
    assert isinstance(out, tl.Unknown), out
    assert "job id must not be empty" in out.reason
    assert record.status is tl.ExecutionStatus.OUTCOME_UNKNOWN


def test_a_webhook_without_an_event_id_is_refused_and_the_real_one_applies(ledger_path):
    def webhooks(ledger, executor, out):
        done = ffi.JobUpdate.SUCCEEDED(result_json='{"url":"u"}')
        for source, event_id in [("render", ""), ("", "evt_1"), ("render", "e" * 2049)]:
            with pytest.raises(tl.InvalidInput):
                executor.ingest_webhook(source, event_id, out.execution_id, done)
        pending = ledger.get(out.execution_id).status
        applied = executor.ingest_webhook("render", "evt_1", out.execution_id, done)
        again = executor.ingest_webhook("render", "evt_1", out.execution_id, done)
        return pending, applied, again, ledger.get(out.execution_id)

    _, (pending, applied, again, record) = started_job(ledger_path, "job_7", webhooks)
    assert pending is tl.ExecutionStatus.EXECUTING
    assert applied.is_COMMITTED() and again.is_DUPLICATE_EVENT()
    assert record.status is tl.ExecutionStatus.COMMITTED
    assert record.result_json == '{"url":"u"}'


# --- the event loop going away ---------------------------------------------------------


def test_a_tool_whose_loop_is_closed_does_not_run_and_says_why():
    ran = []

    class Send(tl.Tool):
        name = "send_email"

        async def perform(self, request):
            ran.append(1)
            return {}

    closed = asyncio.new_event_loop()
    closed.close()
    adapter = Adapter(Send(), lambda: closed)
    request = ffi.ToolRequest(
        execution_id="op_1:round_0:call_1:send_email:v1",
        downstream_key="tl_" + "0" * 32,
        tool_name="send_email",
        arguments_json="{}",
        attempt=1,
        item_index=None,
        external_id=None,
    )
    outcome = asyncio.run(adapter.perform(request))
    assert isinstance(outcome, ffi.PerformOutcome.FAILED_BEFORE_COMMIT)
    assert outcome.retryable is True and "closed or not running" in outcome.reason
    assert ran == []


def test_a_tool_cancelled_by_its_loop_shutting_down_is_unknown_at_once(ledger_path):
    started = threading.Event()

    class Hangs(tl.Tool):
        name = "send_email"

        async def perform(self, request):
            started.set()
            await asyncio.Event().wait()  # until asyncio.run() cancels it

    ledger = tl.Ledger.open(ledger_path)
    # A perform timeout far longer than the test waits: the outcome must not
    # come from it.
    executor = tl.Executor(ledger, tools=[Hangs()], perform_timeout_ms=600_000)

    async def caller():
        asyncio.ensure_future(executor.execute("op_1", 0, email_call()))
        while not started.is_set():
            await asyncio.sleep(0.01)
        # Returning ends asyncio.run(), which cancels the tool's task.

    asyncio.run(caller())
    execution_id = "op_1:round_0:call_1:send_email:v1"
    deadline = time.monotonic() + 20
    while ledger.get(execution_id).status == tl.ExecutionStatus.EXECUTING:
        assert time.monotonic() < deadline, "the interrupted call never became unknown"
        time.sleep(0.05)
    assert ledger.get(execution_id).status == tl.ExecutionStatus.OUTCOME_UNKNOWN
    ledger.close()


# --- errors -----------------------------------------------------------------------------


def test_every_error_is_a_toolledger_error(ledger_path, tmp_path):
    not_a_db = tmp_path / "notes.txt"
    not_a_db.write_text("not a database " * 100)
    with pytest.raises(tl.StorageError) as storage:
        tl.Ledger.open(not_a_db)
    assert storage.value.kind == tl.StorageKind.NOT_A_DATABASE
    assert not_a_db.read_text().startswith("not a database")  # untouched

    with pytest.raises(tl.InvalidInput):
        tl.parse_tool_calls(tl.Provider.OPEN_AI_CHAT, "{not json", 0)

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, tools=[Weather()])
            with pytest.raises(tl.UnknownTool) as unknown:
                await executor.execute("op_1", 0, tl.ToolCall("c1", "nope", {}))
            assert unknown.value.name == "nope"
            with pytest.raises(tl.InvalidInput):
                await executor.execute("op_1", 0, tl.ToolCall("c2", "weather", "{bad json"))
            with pytest.raises(tl.InvalidInput):  # a tool registered twice
                executor.register(Weather())
            with pytest.raises(tl.NotFound):
                ledger.mark_executing("op_1:round_0:nope:weather:v1")
        with pytest.raises(tl.LedgerClosed):
            ledger.get("op_1:round_0:c1:weather:v1")
        with pytest.raises(tl.LedgerClosed):
            await executor.execute("op_1", 0, tl.ToolCall("c3", "weather", {"city": "Oslo"}))

    asyncio.run(main())
    for cls in (tl.StorageError, tl.InvalidInput, tl.UnknownTool, tl.NotFound, tl.LedgerClosed,
                tl.NoEventLoop, tl.Suspended, tl.StaleAttempt, tl.InternalError):
        assert issubclass(cls, tl.Error)


# --- the ledger as a resource -------------------------------------------------------------


def test_closing_the_ledger_releases_its_session_at_once(ledger_path):
    call = tl.CallSpec(call=tl.ToolCall("c1", "send_email", {"to": "a"}), tool_version=1)
    with tl.Ledger.open(ledger_path) as first:
        begun = first.begin("op_1", 0, call)
        assert isinstance(begun, tl.Begin.EXECUTE)
        assert first.recover()[0].status == tl.ExecutionStatus.EXECUTING  # ours, alive
    assert first.closed

    with tl.Ledger.open(ledger_path) as second:
        # The first session's lock is free: its running call is taken over.
        [record] = second.recover()
        assert record.status == tl.ExecutionStatus.OUTCOME_UNKNOWN
    first.close()  # closing twice is harmless


def test_awaitable_ledger_calls(ledger_path):
    call = tl.CallSpec(call=tl.ToolCall("c1", "send_email", {"to": "a"}), tool_version=1)

    async def main():
        async with await tl.Ledger.aopen(ledger_path, lease_ms=1000) as ledger:
            begun = await ledger.abegin("op_1", 0, call)
            ticket = begun.ticket
            stored = await ledger.acommit(ticket, '{"id":"m1"}', "m1")
            record = await ledger.aget(ticket.execution_id)
            await ledger.asuspend()
            with pytest.raises(tl.Suspended):
                await ledger.aget(ticket.execution_id)
            await ledger.aresume()
            return stored, record, ledger

    stored, record, ledger = asyncio.run(main())
    assert stored.result_json == '{"id":"m1"}'
    assert record.status == tl.ExecutionStatus.COMMITTED
    assert ledger.closed
    assert "worker thread" in tl.Ledger.arecover.__doc__


def test_the_idle_checkpoint_syncs_waiting_commits_once_the_ledger_pauses(tmp_path):
    # 70 calls of a lookup tool (deferred commits: 140 write transactions,
    # past the 128 that make a checkpoint worth it), then a pause: with
    # idle_checkpoint_ms the ledger's own thread syncs the last commit and
    # checkpoints, long before its hour-long deadline; with 0 nothing does.
    for idle_ms, expect_synced in ((50, True), (0, False)):
        path = str(tmp_path / f"idle_{idle_ms}.db")
        with tl.Ledger.open(path, deferred_deadline_ms=3_600_000, idle_checkpoint_ms=idle_ms) as ledger:
            for i in range(70):
                spec = tl.CallSpec(call=email_call(call_id=f"c{i}"), tool_version=1, lookup=True)
                begin = ledger.begin("op", 0, spec)
                ledger.commit(begin.ticket, '"sent"', None)
            deadline = time.monotonic() + 10
            while ledger.has_unsynced_commits() and time.monotonic() < deadline and expect_synced:
                time.sleep(0.01)
            if not expect_synced:
                time.sleep(0.3)
            assert ledger.has_unsynced_commits() is not expect_synced, idle_ms


def test_sync_makes_a_deferred_commit_durable_and_says_so(ledger_path):
    # A tool whose downstream can be looked up gets its commit deferred (one
    # sync per call); the deadline is an hour, so only `sync` can flush it.
    with tl.Ledger.open(ledger_path, deferred_deadline_ms=3_600_000) as ledger:
        assert not ledger.has_unsynced_commits()
        spec = tl.CallSpec(call=email_call(call_id="c_sync"), tool_version=1, lookup=True)
        begin = ledger.begin("op", 0, spec)
        assert not ledger.has_unsynced_commits()  # the intent is durable before it returns
        ledger.commit(begin.ticket, '"sent"', None)
        assert ledger.has_unsynced_commits()
        ledger.sync()
        assert not ledger.has_unsynced_commits()
        assert ledger.get(begin.ticket.execution_id).status == tl.ExecutionStatus.COMMITTED
        # A neither-tool's commit is durable when it returns.
        plain = ledger.begin("op", 0, tl.CallSpec(call=email_call(call_id="c_plain"), tool_version=1))
        ledger.commit(plain.ticket, '"sent"', None)
        assert not ledger.has_unsynced_commits()
        ledger.suspend()
        with pytest.raises(tl.Suspended):
            ledger.sync()
