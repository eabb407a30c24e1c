"""MCP: arguments that are not a dict (an app passing the model's raw
arguments, a list) never leave the client: mcp's own validation refuses
them before the request is written. The ledger must not record that as an
unknown outcome (with neither key nor lookup: an OutcomeUnknown to settle
by hand for a request that provably never left).
"""

import asyncio
import pytest

from toolledger.adapters import Downstream, LedgerRuntime


@pytest.fixture
def runtime(tmp_path):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2)
    yield rt
    rt.close()


def _server(sent):
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("mail")

    @server.tool()
    def send_email(to: str) -> str:
        """Sends an email."""
        sent.append(to)
        return "sent"

    return server


@pytest.mark.parametrize("arguments", [["a@example.com"], "a@example.com"])
def test_mcp_non_dict_arguments_are_refused_before_anything_is_recorded(runtime, arguments):
    from mcp.client._memory import InMemoryTransport

    from toolledger.adapters.mcp import MCPLedger

    sent = []
    server = _server(sent)
    ledger_mcp = MCPLedger(runtime, server="mail")
    ledger_mcp.tool("send_email", downstream=Downstream.NEITHER)

    async def main():
        async with InMemoryTransport(server) as (read, write):
            async with ledger_mcp.session(read, write) as session:
                await session.initialize()
                try:
                    await ledger_mcp.call_tool(session, "send_email", arguments,
                                               operation_id="conv:1", round=0, call_id="call_1")
                except Exception as e:  # noqa: BLE001
                    return e

    error = asyncio.run(asyncio.wait_for(main(), 30))
    assert sent == []
    assert runtime.ledger.list("conv:1") == [], (
        f"a request that never left is recorded: {[e.status for e in runtime.ledger.list('conv:1')]}")
    assert isinstance(error, TypeError), f"got {type(error).__name__}: {error}"


def test_mcp_call_of_an_undeclared_tool_says_so(runtime):
    from mcp.client._memory import InMemoryTransport

    from toolledger.adapters.mcp import MCPLedger

    sent = []
    server = _server(sent)
    ledger_mcp = MCPLedger(runtime, server="mail")  # send_email never declared with .tool()

    async def main():
        async with InMemoryTransport(server) as (read, write):
            async with ledger_mcp.session(read, write) as session:
                await session.initialize()
                try:
                    await ledger_mcp.call_tool(session, "send_email", {"to": "a@example.com"},
                                               operation_id="conv:1", round=0, call_id="call_1")
                except Exception as e:  # noqa: BLE001
                    return e

    error = asyncio.run(asyncio.wait_for(main(), 30))
    assert sent == []
    assert not isinstance(error, KeyError), f"a bare KeyError: {error!r}"
    assert isinstance(error, ValueError) and "tool(" in str(error), repr(error)
