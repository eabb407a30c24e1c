"""A side-effecting tool whose result is larger than the ledger stores
(1 MiB): the library commits the call with a marker
({"toolledger_error": "result too large to store", ...}) instead of the
result. The call that ran the tool has its result in hand; the adapters
read the marker as their own stored shape and crash after the effect.
"""

import asyncio
import pytest

import toolledger as tl
from toolledger.adapters import Downstream, LedgerRuntime, current_call


@pytest.fixture
def runtime(tmp_path):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2)
    yield rt
    rt.close()


BIG = "x" * 1_100_000


def test_langgraph_large_result(runtime):
    from langchain_core.tools import tool

    from toolledger.adapters.langgraph import ledger_tool

    effects = []

    @tool
    def make_report(title: str) -> str:
        """Files a report and returns it."""
        effects.append(1)
        return BIG

    wrapped = ledger_tool(make_report, runtime, downstream=Downstream.KEY)
    call = {"type": "tool_call", "name": "make_report", "args": {"title": "q"}, "id": "call_1"}
    config = {"configurable": {"thread_id": "t"}, "metadata": {"langgraph_step": 1}}
    first = wrapped.invoke(call, config)
    assert effects == [1]
    assert first.content == BIG


def test_langgraph_large_result_replay_is_a_clear_message(runtime):
    from langchain_core.tools import tool

    from toolledger.adapters.langgraph import ledger_tool

    runs = []

    @tool
    def make_report(title: str) -> str:
        """Files a report and returns it."""
        runs.append(title)
        return BIG

    wrapped = ledger_tool(make_report, runtime, downstream=Downstream.KEY)
    call = {"type": "tool_call", "name": "make_report", "args": {"title": "q"}, "id": "call_1"}
    config = {"configurable": {"thread_id": "t"}, "metadata": {"langgraph_step": 1}}
    first = wrapped.invoke(call, config)  # the call that ran gets its own output
    assert first.content == BIG
    again = wrapped.invoke(call, config)  # a resumed graph asks again
    assert "too large" in str(again.content)
    assert runs == ["q"], "the replay ran nothing"


def test_mcp_large_result(runtime):
    from mcp.client._memory import InMemoryTransport
    from mcp.server.mcpserver import MCPServer

    from toolledger.adapters.mcp import MCPLedger

    server = MCPServer("reports")
    effects = []

    @server.tool()
    def make_report(title: str) -> str:
        """Files a report and returns it."""
        effects.append(1)
        return BIG

    ledger_mcp = MCPLedger(runtime, server="reports")
    ledger_mcp.tool("make_report", downstream=Downstream.KEY)

    async def main():
        async with InMemoryTransport(server) as (read, write):
            async with ledger_mcp.session(read, write) as session:
                await session.initialize()
                return await ledger_mcp.call_tool(session, "make_report", {"title": "q"},
                                                  operation_id="conv:1", round=0, call_id="call_1")

    done = asyncio.run(asyncio.wait_for(main(), 60))
    assert effects == [1]
    assert done.result.content[0].text == BIG


def test_agents_large_result(runtime):
    """OpenAI Agents SDK: the call that ran the tool hands the model the
    tool's own output, not the marker the library stored in its place; a
    replay says the result was too large to keep."""
    from agents import function_tool
    from agents.tool_context import ToolContext

    from toolledger.adapters import openai_agents as oa

    effects = []

    @function_tool(failure_error_function=None)
    def make_report(title: str) -> str:
        """Files a report and returns it."""
        effects.append(1)
        return BIG

    agents = oa.AgentsLedger(runtime)
    wrapped = agents.tool(make_report, downstream=Downstream.KEY)

    async def call():
        token = oa._SCOPE.set(oa._RunScope(run_id="conv:1", turn=1))
        try:
            ctx = ToolContext(context=None, tool_name="make_report", tool_call_id="call_1",
                              tool_arguments='{"title":"q"}')
            return await wrapped.on_invoke_tool(ctx, '{"title":"q"}')
        finally:
            oa._SCOPE.reset(token)

    first = asyncio.run(call())
    assert first == BIG
    again = asyncio.run(call())
    assert effects == [1]
    assert isinstance(again, str) and "too large" in again
