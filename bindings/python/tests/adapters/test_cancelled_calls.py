"""A cancelled call_tool (asyncio.wait_for's timeout: the app gave up on a
slow server that applied the request) for a tool whose server dedupes by
the idempotency key. The repeat of the same call must resend under the same
key (one effect at the server), not be refused as InFlight for as long as
this process lives.
"""

import asyncio
import pytest

import toolledger as tl
from toolledger.adapters import Downstream, LedgerRuntime
from toolledger.adapters._core import CallNotExecuted


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

    async def main():
        async with InMemoryTransport(server) as (read, write):
            async with ledger_mcp.session(read, write) as session:
                await session.initialize()
                try:
                    await asyncio.wait_for(
                        ledger_mcp.call_tool(session, "send_email", {"to": "a@example.com"}, **ids), 0.3)
                except asyncio.TimeoutError:
                    pass
                slow[0] = False
                try:
                    return await ledger_mcp.call_tool(session, "send_email", {"to": "a@example.com"}, **ids)
                except CallNotExecuted as e:
                    return e

    again = asyncio.run(asyncio.wait_for(main(), 30))
    (stored,) = runtime.ledger.list("conv:1")
    assert stored.status is not tl.ExecutionStatus.EXECUTING, (
        f"the cancelled call is left executing (attempt {stored.attempt_count}); "
        f"the repeat got {again!r}")
    assert not isinstance(again, CallNotExecuted), f"the repeat was refused: {again!r}"
    assert again.result.content[0].text == "sent 1"
    assert len(effects) == 1
