"""A tool that raises ``KeyboardInterrupt`` or ``SystemExit`` while the
library runs it on its own threads (an approved call, ``recover()``): in a
library thread neither is a signal, just what the tool raised. It escaped
the handlers (they caught ``Exception``) and stopped the package's bridge
loop; every later call of every tool in the process then waited out the
perform timeout (30 s) and was recorded unknown ("timeout"). It is the
tool's error now (an unknown outcome: it may have happened), and the next
call runs."""

import asyncio

import pytest

import toolledger as tl


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_tool_raising_a_base_exception_leaves_later_calls_working(ledger_path, raised, kind):
    runs = []

    if kind == "sync":
        class Boom(tl.Tool):
            name = "boom"
            requires_approval = True

            def perform(self, request):
                runs.append("boom")
                raise raised()
    else:
        class Boom(tl.Tool):
            name = "boom"
            requires_approval = True

            async def perform(self, request):
                runs.append("boom")
                raise raised()

    class Transfer(tl.Tool):
        name = "transfer"
        requires_approval = True

        async def perform(self, request):
            runs.append("transfer")
            return {"ok": True}

    path = ledger_path

    async def one(call_id, tool):
        with tl.Ledger.open(path) as ledger:
            executor = tl.Executor(ledger, tools=[Boom(), Transfer()], max_attempts=1)
            waiting = await executor.execute("op", 0, tl.ToolCall(call_id, tool, {}))
            assert isinstance(waiting, tl.NeedsApproval), waiting
            return await executor.approve(waiting.execution_id, waiting.args_digest, preview=waiting.preview)

    outcomes = []
    for call_id, tool in (("c1", "boom"), ("c2", "transfer"), ("c3", "boom"), ("c4", "transfer")):
        try:
            outcomes.append(asyncio.run(asyncio.wait_for(one(call_id, tool), 60)))
        except raised:
            # An async tool runs on the app's own loop, where asyncio hands a
            # KeyboardInterrupt or SystemExit to the app as it would a signal.
            assert kind == "async" and tool == "boom"
            outcomes.append(None)
    assert runs == ["boom", "transfer", "boom", "transfer"]
    boom1, transfer1, boom2, transfer2 = outcomes
    assert isinstance(transfer1, tl.Completed) and transfer1.result == {"ok": True}, transfer1
    assert isinstance(transfer2, tl.Completed), transfer2
    for boom in (boom1, boom2):
        if kind == "sync":
            assert isinstance(boom, tl.Unknown), boom
            assert raised.__name__ in boom.reason and "timeout" not in boom.reason, boom.reason
    with tl.Ledger.open(path) as ledger:
        stored = {r.execution_id.split(":")[2]: r for r in ledger.list("op")}
    for c in ("c1", "c3"):
        assert stored[c].status is tl.ExecutionStatus.OUTCOME_UNKNOWN, stored[c]
        assert "timeout" not in (stored[c].last_reason or ""), stored[c].last_reason
