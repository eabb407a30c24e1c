"""A cancelled call_tool (asyncio.wait_for's timeout: the app gave up on a
slow server that applied the request) for a tool whose server dedupes by
the idempotency key. The call must not stay InFlight for as long as this
process lives (it did: the same-key resend the unknown report handed out was
never run nor reported), and the ledger must not say anything it does not
know: the effect may have happened, so its outcome is unknown until the
call is asked again. It is reported with ``report_interrupted``, which
hands nothing out: an ``UNKNOWN`` report handed out a same-key resend that
nobody ran, and reporting that one unknown handed out the next until the
attempts ran out (the repeat could only say ``OutcomeUnknown``); reporting
it "not sent" would let the library take the earlier attempt as absent
(``test_interrupted_resends.py``). The repeat sends the same key again; the
server dedupes it and the first email's result comes back.
"""

import asyncio
import pytest

import toolledger as tl
from toolledger.adapters.mcp import LedgerToolResult
from toolledger.adapters import Downstream, LedgerRuntime
from toolledger.adapters._core import CallNotExecuted, OutcomeUnknown


@pytest.fixture
def runtime(tmp_path):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2)
    yield rt
    rt.close()


def _meta(ctx):
    meta = ctx.request_context.meta
    return meta if isinstance(meta, dict) else (meta.model_extra or {})


def test_mcp_call_cancelled_mid_request_is_not_left_in_flight(runtime):
    from mcp.client._memory import InMemoryTransport
    from mcp.server.mcpserver import Context, MCPServer

    from toolledger.adapters.mcp import META_IDEMPOTENCY_KEY, MCPLedger

    server = MCPServer("mail")
    effects = {}  # idempotency key -> email number: the server dedupes by key
    slow = [True]

    @server.tool()
    async def send_email(to: str, ctx: Context) -> str:
        """Sends an email."""
        key = _meta(ctx)[META_IDEMPOTENCY_KEY]
        effects.setdefault(key, len(effects) + 1)
        if slow[0]:
            await asyncio.sleep(2)  # applied, then slow to answer
        return f"sent {effects[key]}"

    ledger_mcp = MCPLedger(runtime, server="mail")
    ledger_mcp.tool("send_email", downstream=Downstream.KEY)
    ids = dict(operation_id="conv:1", round=0, call_id="call_1")

    async def repeat():
        async with InMemoryTransport(server) as (read, write):
            async with ledger_mcp.session(read, write) as session:
                await session.initialize()
                try:
                    return await ledger_mcp.call_tool(session, "send_email", {"to": "a@example.com"}, **ids)
                except (CallNotExecuted, OutcomeUnknown) as e:
                    return e

    cancelled = []

    async def cancelled_only():
        async with InMemoryTransport(server) as (read, write):
            async with ledger_mcp.session(read, write) as session:
                await session.initialize()
                try:
                    await asyncio.wait_for(
                        ledger_mcp.call_tool(session, "send_email", {"to": "a@example.com"}, **ids), 0.3)
                except asyncio.TimeoutError:
                    pass
                (stored,) = runtime.ledger.list("conv:1")
                cancelled.append((stored.status, stored.attempt_count))

    asyncio.run(asyncio.wait_for(cancelled_only(), 30))
    assert cancelled == [(tl.ExecutionStatus.OUTCOME_UNKNOWN, 1)], (
        f"after the cancellation: {cancelled!r} (unknown at the attempt that was sent, nothing handed out)")
    slow[0] = False
    again = asyncio.run(asyncio.wait_for(repeat(), 30))
    (stored,) = runtime.ledger.list("conv:1")
    assert isinstance(again, LedgerToolResult), f"the repeat: {again!r}"
    assert stored.status in (tl.ExecutionStatus.COMMITTED, tl.ExecutionStatus.RESULT_DELIVERED), (
        f"the repeated call is left {stored.status} (attempt {stored.attempt_count})")
    assert again.execution_id == stored.execution_id
    assert again.result.content[0].text == "sent 1", "the first email's result, from the deduped resend"
    assert len(effects) == 1, "one email: the resend carried the same key"
