"""A process forked from the app while its ledger is open (``os.fork()``, a
``multiprocessing`` pool with the ``fork`` start method, the default on
Linux before Python 3.14) has a copy of the open ledger: the parent's SQLite
connection (which SQLite forbids using across a fork) and the parent's
session, whose lock and handed-out attempts are the parent's. Every use of
that copy is refused with ``StorageError`` of kind ``FORKED`` and nothing
is written or run; so is opening the same file again in the child (SQLite's
lock state for it is the parent's copy there), while a file of its own
opens. The parent is not disturbed: its call runs once and commits, its
session is still its own (suspend and resume work)."""

import asyncio
import json
import os
import time

import pytest

import toolledger as tl


class Pay(tl.Tool):
    name = "pay"

    def __init__(self, effects_path):
        self.effects_path = effects_path

    def perform(self, request):
        # One line per effect, appended by whichever process ran the tool.
        with open(self.effects_path, "a") as f:
            f.write(f"{os.getpid()} {request.execution_id}\n")
        return {"paid": True}


def _effects(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f if line.strip()]


def _wait(pid, seconds=30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung using its parent's ledger")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")
def test_a_forked_child_is_refused_its_parents_ledger_and_the_parent_runs_once(ledger_path, tmp_path):
    effects = str(tmp_path / "effects.txt")
    report = str(tmp_path / "child.json")
    ledger = tl.Ledger.open(ledger_path)
    executor = tl.Executor(ledger, tools=[Pay(effects)])
    first = executor.execute_sync("op", 0, tl.ToolCall("c0", "pay", {"amount": 1}))
    assert isinstance(first, tl.Completed), first

    pid = os.fork()
    if pid == 0:  # the child: every step on the inherited ledger
        seen = {}
        try:
            steps = {
                "new_call": lambda: executor.execute_sync("op", 0, tl.ToolCall("c1", "pay", {"amount": 2})),
                "replay": lambda: executor.execute_sync("op", 0, tl.ToolCall("c0", "pay", {"amount": 1})),
                "async_call": lambda: asyncio.run(
                    asyncio.wait_for(executor.execute("op", 0, tl.ToolCall("c2", "pay", {"amount": 3})), 10)),
                "get": lambda: ledger.get(first.execution_id),
                "suspend": lambda: ledger.suspend(),
                "resume": lambda: ledger.resume(),
                "open_again": lambda: tl.Ledger.open(ledger_path),
            }
            for name, step in steps.items():
                try:
                    step()
                    seen[name] = "ran"
                except tl.StorageError as e:
                    seen[name] = e.kind.name
                except Exception as e:  # noqa: BLE001 - reported to the parent
                    seen[name] = f"{type(e).__name__}: {e}"
            try:  # a ledger of the child's own, in another file
                with tl.Ledger.open(str(tmp_path / "child.db")) as own:
                    own_executor = tl.Executor(own, tools=[Pay(effects + ".child")])
                    done = own_executor.execute_sync("child", 0, tl.ToolCall("k1", "pay", {"amount": 4}))
                    seen["own_file"] = "ran" if isinstance(done, tl.Completed) else repr(done)
            except Exception as e:  # noqa: BLE001 - reported to the parent
                seen["own_file"] = f"{type(e).__name__}: {e}"
            with open(report, "w") as f:
                json.dump(seen, f)
        finally:
            os._exit(0)

    assert _wait(pid) == 0
    with open(report) as f:
        seen = json.load(f)
    refused = ("new_call", "replay", "async_call", "get", "suspend", "resume", "open_again")
    assert seen == {**{name: "FORKED" for name in refused}, "own_file": "ran"}, seen
    assert len(_effects(effects + ".child")) == 1
    # Nothing of the child's reached the tool or the ledger.
    assert [pid_ for pid_, _ in _effects(effects)] == [str(os.getpid())]
    assert ledger.get(first.execution_id).status is tl.ExecutionStatus.COMMITTED
    assert [r.execution_id for r in ledger.list("op")] == [first.execution_id]
    # The parent's own calls and lifecycle go on.
    second = executor.execute_sync("op", 0, tl.ToolCall("c1", "pay", {"amount": 2}))
    assert isinstance(second, tl.Completed), second
    ledger.suspend()
    ledger.resume()
    again = executor.execute_sync("op", 0, tl.ToolCall("c1", "pay", {"amount": 2}))
    assert isinstance(again, tl.Completed) and again.replayed, again
    assert len(_effects(effects)) == 2
    ledger.close()
