"""MCP: arguments that are not a dict (an app passing the model's raw
arguments, a list) never leave the client: mcp's own validation refuses
them before the request is written. The ledger must not record that as an
unknown outcome (with neither key nor lookup: an OutcomeUnknown to settle
by hand for a request that provably never left).
"""

import asyncio
import pytest

import toolledger as tl

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


def test_mcp_a_tool_declared_again_otherwise_is_refused_not_ignored(runtime):
    # The README declares tools inside `async with ledger_mcp.session(...)`,
    # so a second session declares them again: the same declaration is
    # accepted. A different one (here NEITHER, "never resend", after KEY)
    # was silently ignored: the call kept KEY's resend after a timeout, and a
    # server that does not dedupe applied the request twice.
    from mcp.client._memory import InMemoryTransport
    from mcp.server.mcpserver import MCPServer

    from toolledger.adapters import OutcomeUnknown
    from toolledger.adapters.mcp import MCPLedger

    server = MCPServer("mail")
    sent = []

    @server.tool()
    async def send_email(to: str) -> str:
        """Sends an email (no dedupe); the first request answers late."""
        sent.append(to)
        if len(sent) == 1:
            await asyncio.sleep(0.5)
        return "sent"

    ledger_mcp = MCPLedger(runtime, server="mail")
    ledger_mcp.tool("send_email", downstream=Downstream.KEY)
    ledger_mcp.tool("send_email", downstream=Downstream.KEY)  # the same again: fine
    with pytest.raises(ValueError, match="send_email"):
        ledger_mcp.tool("send_email", downstream=Downstream.NEITHER)
    with pytest.raises(ValueError, match="send_email"):
        ledger_mcp.tool("send_email", downstream=Downstream.KEY, version=2)

    # Declared NEITHER first, the call is NEITHER's: unknown, never resent.
    other = MCPLedger(runtime, server="other")
    other.tool("send_email", downstream=Downstream.NEITHER)
    with pytest.raises(ValueError):
        other.tool("send_email", downstream=Downstream.KEY)

    async def main():
        async with InMemoryTransport(server) as (read, write):
            async with other.session(read, write) as session:
                await session.initialize()
                with pytest.raises(OutcomeUnknown):
                    await other.call_tool(session, "send_email", {"to": "a"}, operation_id="conv:1", round=0,
                                          call_id="call_1", read_timeout_seconds=0.1)
                # The JSON-RPC id noted for the request that raised is not kept.
                assert other._jsonrpc_ids == {}
                await asyncio.sleep(0.6)  # the late first request finishes server-side

    asyncio.run(asyncio.wait_for(main(), 30))
    assert sent == ["a"], "a NEITHER tool's call was sent again"


def test_mcp_a_tool_declared_again_for_a_new_session_uses_that_sessions_lookup(runtime):
    # The lookup runs "on the session" (README): an app that reconnects
    # declares the tool again in the new session's block, with a lookup on
    # the new session. The first declaration's lookup (on the closed session)
    # was kept: the reconciliation failed and the call stayed unknown.
    from mcp.client._memory import InMemoryTransport
    from mcp.server.mcpserver import Context, MCPServer

    from toolledger.adapters.mcp import META_IDEMPOTENCY_KEY, MCPLedger

    server = MCPServer("mail")
    effects = {}

    @server.tool()
    async def send_email(to: str, ctx: Context) -> str:
        """Sends an email (no dedupe, keeps the reference); the first request answers late."""
        meta = ctx.request_context.meta
        ref = (meta if isinstance(meta, dict) else (meta.model_extra or {}))[META_IDEMPOTENCY_KEY]
        effects[ref] = len(effects) + 1
        if len(effects) == 1:
            await asyncio.sleep(0.3)
        return f"sent {effects[ref]}"

    @server.tool()
    def find_email(ref: str) -> str:
        """Finds an email by its reference."""
        return f"sent {effects[ref]}" if ref in effects else ""

    ledger_mcp = MCPLedger(runtime, server="mail")

    def declare(session):
        async def lookup(_args, call):
            found = await session.call_tool("find_email", {"ref": call.downstream_key})
            return found if found.content and found.content[0].text else None

        ledger_mcp.tool("send_email", downstream=Downstream.LOOKUP, lookup=lookup)

    async def main():
        async with InMemoryTransport(server) as (read, write):
            async with ledger_mcp.session(read, write) as session:
                await session.initialize()
                declare(session)
        async with InMemoryTransport(server) as (read, write):
            async with ledger_mcp.session(read, write) as session:
                await session.initialize()
                declare(session)
                # The first attempt times out; the executor looks the effect up.
                return await ledger_mcp.call_tool(session, "send_email", {"to": "a"}, operation_id="conv:1",
                                                  round=0, call_id="call_1", read_timeout_seconds=0.1)

    done = asyncio.run(asyncio.wait_for(main(), 30))
    assert len(effects) == 1, "found by the lookup, not sent again"
    assert done.result.content[0].text == "sent 1" and not done.replayed
    assert runtime.ledger.get(done.execution_id).status in (
        tl.ExecutionStatus.COMMITTED, tl.ExecutionStatus.RESULT_DELIVERED)
