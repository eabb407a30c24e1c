"""What each adapter hands back to its framework, fresh and replayed, and
how a call's identity is read: the call that ran the tool gets the tool's
own result when the ledger committed exactly what the adapter made of it,
a replay gets the stored one (equal to it), and the library's errors reach
the app as ``toolledger`` errors with nothing run."""

import asyncio
import json

import pytest

import toolledger as tl
from toolledger.adapters import Downstream, LedgerRuntime, ToolSpec, current_call


@pytest.fixture
def runtime(tmp_path):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2)
    yield rt
    rt.close()


# -- the shared core ---------------------------------------------------------------


def test_a_library_error_reaches_the_app_as_a_toolledger_error_and_nothing_runs(runtime):
    ran = []
    runtime.register(ToolSpec(name="send", run=lambda a: None, downstream=Downstream.KEY))
    with pytest.raises(tl.InvalidInput):
        runtime.call("op", 0, "c1", "send", "{not json", lambda: ran.append(1))

    async def main():
        runtime.ledger.suspend()
        try:
            await runtime.acall("op", 0, "c2", "send", "{}", lambda: ran.append(2))
        finally:
            runtime.ledger.resume()

    with pytest.raises(tl.Suspended):
        asyncio.run(main())
    assert ran == []
    assert runtime.ledger.list("op") == []


# -- LangGraph ------------------------------------------------------------------------


def _langgraph_tools(runtime, effects):
    from langchain_core.tools import tool

    from toolledger.adapters.langgraph import ledger_tool

    @tool(response_format="content_and_artifact")
    def send_email(to: str) -> tuple:
        """Sends an email."""
        effects.append(current_call().downstream_key)
        # The artifact: a JSON-able part and, with to="object", one that is not.
        artifact = {"n": len(effects)} if to != "object" else object()
        return f"sent {len(effects)} ✓", artifact

    return ledger_tool(send_email, runtime, downstream=Downstream.KEY)


def _tool_call(call_id="call_1", to="a@example.com"):
    return {"type": "tool_call", "name": "send_email", "args": {"to": to}, "id": call_id}


def _config(step=1, thread="t"):
    return {"configurable": {"thread_id": thread}, "metadata": {"langgraph_step": step}}


def test_langgraph_fresh_call_gets_the_tools_message_a_replay_the_stored_one(runtime):
    from langchain_core.messages import ToolMessage

    effects = []
    send = _langgraph_tools(runtime, effects)
    first = send.invoke(_tool_call(), _config())
    again = send.invoke(_tool_call(), _config())
    assert len(effects) == 1
    assert type(first) is ToolMessage and type(again) is ToolMessage
    for message in (first, again):
        assert (message.content, message.artifact, message.status) == ("sent 1 ✓", {"n": 1}, "success")
        assert (message.tool_call_id, message.name) == ("call_1", "send_email")
    stored = runtime.ledger.get(runtime.ledger.list("langgraph:t")[0].execution_id)
    assert json.loads(stored.result_json) == {"content": "sent 1 ✓", "status": "success", "artifact": {"n": 1}}


def test_langgraph_an_artifact_that_is_not_json_is_not_replayed(runtime):
    effects = []
    send = _langgraph_tools(runtime, effects)
    first = send.invoke(_tool_call(to="object"), _config())
    again = send.invoke(_tool_call(to="object"), _config())
    assert len(effects) == 1
    # The call that ran gets the tool's own message, as without the ledger;
    # the replay only what was stored.
    assert type(first.artifact) is object and again.artifact is None
    assert first.content == again.content == "sent 1 ✓"


def test_langgraph_async_fresh_and_replayed_results_are_equal(runtime):
    effects = []
    send = _langgraph_tools(runtime, effects)

    async def main():
        return (await send.ainvoke(_tool_call(), _config()), await send.ainvoke(_tool_call(), _config()))

    first, again = asyncio.run(main())
    assert len(effects) == 1
    assert (first.content, first.artifact) == (again.content, again.artifact) == ("sent 1 ✓", {"n": 1})


@pytest.mark.parametrize(
    "config, operation",
    [
        # ToolNode's kind of config: read as it is.
        (_config(), "langgraph:t"),
        # A key outside the config keys goes into `configurable` (as
        # ensure_config does), here the thread id itself.
        ({"thread_id": "t", "metadata": {"langgraph_step": 1}}, "langgraph:t"),
        ({"configurable": {"thread_id": "other"}, "thread_id": "t", "metadata": {"langgraph_step": 1}},
         "langgraph:t"),
        # A subgraph's namespace: the parent's part names the operation.
        ({"configurable": {"thread_id": "t", "checkpoint_ns": "outer:1|inner:2"},
          "metadata": {"langgraph_step": 1}}, "langgraph:t|outer:1"),
    ],
)
def test_langgraph_identity_is_read_as_ensure_config_gives_it(runtime, config, operation):
    effects = []
    send = _langgraph_tools(runtime, effects)
    send.invoke(_tool_call(), config)
    send.invoke(_tool_call(), _config())  # the same call named the plain way
    executions = runtime.ledger.list(operation)
    assert [e.execution_id.split(":round_")[1] for e in executions] == ["1:call_1:send_email:v1"]
    assert len(effects) == (1 if operation == "langgraph:t" else 2)


def test_langgraph_other_arguments_under_the_same_identity_are_refused(runtime):
    from toolledger.adapters import CallNotExecuted

    effects = []
    send = _langgraph_tools(runtime, effects)
    send.invoke(_tool_call(), _config())
    with pytest.raises(CallNotExecuted) as refused:
        send.invoke(_tool_call(to="b@example.com"), _config())
    assert len(effects) == 1
    assert isinstance(refused.value.outcome, tl.Conflict)


# -- OpenAI Agents SDK --------------------------------------------------------------


@pytest.mark.parametrize(
    "returned, expected",
    [("sent", "sent"), (7, 7), (2.5, 2.5), (True, True), (None, None),
     ({"sent": [1, 2]}, {"sent": [1, 2]}), (("a", 1), ["a", 1])],
)
def test_openai_agents_fresh_and_replayed_outputs_are_equal(runtime, returned, expected):
    first, again, effects = _agents_call_twice(runtime, returned, Downstream.KEY)
    assert len(effects) == 1
    assert first == again == expected
    assert type(first) is type(again) is type(expected)
    stored = runtime.ledger.list("openai-agents:r")[0]
    assert json.loads(runtime.ledger.get(stored.execution_id).result_json) == expected


def _deep(depth):
    value = "bottom"
    for _ in range(depth):
        value = {"d": value}
    return value


@pytest.mark.parametrize(
    "content, artifact",
    [("sent \ud83d", None),  # a lone surrogate: half an emoji, as a string cut in UTF-16 gives
     ("sent", {"ratio": float("inf")}),  # what json writes as Infinity
     ("sent", _deep(80))],  # nested deeper than the ledger's JSON limit (64)
    ids=["lone-surrogate", "infinity", "deep"],
)
def test_langgraph_a_result_the_ledger_keeps_as_text_is_handed_back_fresh_and_replayed(runtime, content, artifact):
    # The library stores a result text that is not JSON by its rules as a
    # JSON string of that text (the effect is committed all the same); the
    # adapter must read it back, not fail on it after the effect.
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool

    from toolledger.adapters.langgraph import ledger_tool

    effects = []

    @tool(response_format="content_and_artifact")
    def send_email(to: str) -> tuple:
        """Sends an email."""
        effects.append(current_call().downstream_key)
        return content, artifact

    send = ledger_tool(send_email, runtime, downstream=Downstream.NEITHER)
    first = send.invoke(_tool_call(), _config())
    again = send.invoke(_tool_call(), _config())
    assert len(effects) == 1
    assert [e.status for e in runtime.ledger.list("langgraph:t")] in (
        [tl.ExecutionStatus.COMMITTED], [tl.ExecutionStatus.RESULT_DELIVERED])
    for message in (first, again):
        assert type(message) is ToolMessage
        assert (message.content, message.artifact, message.status) == (content, artifact, "success")
        assert message.tool_call_id == "call_1"


def test_mcp_a_result_the_ledger_keeps_as_text_is_handed_back_fresh_and_replayed(runtime):
    from mcp.client._memory import InMemoryTransport
    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult, TextContent

    from toolledger.adapters.mcp import MCPLedger

    server = MCPServer("mail")
    sent = []

    @server.tool()
    def send_email(to: str) -> CallToolResult:
        """Sends an email; its receipt is nested deeper than the ledger's JSON limit."""
        sent.append(to)
        return CallToolResult(content=[TextContent(type="text", text="sent")],
                              structured_content={"receipt": _deep(80)})

    ledger_mcp = MCPLedger(runtime, server="mail")
    ledger_mcp.tool("send_email", downstream=Downstream.NEITHER)

    async def main():
        async with InMemoryTransport(server) as (read, write):
            async with ledger_mcp.session(read, write) as session:
                await session.initialize()
                ids = dict(operation_id="conv:deep", round=0, call_id="call_1")
                first = await ledger_mcp.call_tool(session, "send_email", {"to": "a"}, **ids)
                again = await ledger_mcp.call_tool(session, "send_email", {"to": "a"}, **ids)
                return first, again

    first, again = asyncio.run(asyncio.wait_for(main(), 60))
    assert sent == ["a"]
    assert not first.replayed and again.replayed
    assert again.result == first.result
    assert first.result.structured_content == {"receipt": _deep(80)}
    assert first.jsonrpc_id is not None and again.jsonrpc_id == first.jsonrpc_id


@pytest.mark.parametrize(
    "returned",
    ["sent \ud83d", {"note": "half an emoji \udc00"}, [1.5, float("inf")], _deep(80)],
    ids=["lone-surrogate", "surrogate-in-dict", "infinity-in-list", "deep"],
)
def test_openai_agents_an_output_the_ledger_keeps_as_text_is_handed_back_as_it_was(runtime, returned):
    # The library keeps a recorded text that is not JSON by its rules as a
    # JSON string of that text. The run got that JSON text (quotes and
    # escapes, '"sent \\ud83d"') in place of the tool's output, fresh and
    # replayed.
    first, again, effects = _agents_call_twice(runtime, returned, Downstream.NEITHER)
    assert len(effects) == 1
    assert first == returned and again == returned
    assert type(first) is type(again) is type(returned)


def _agents_call_twice(runtime, returned, downstream):
    """An Agents SDK function tool returning ``returned``, wrapped with
    ``downstream``, invoked twice as the runner does with one tool-call id:
    (the first output, the replayed one, the downstream keys it ran for)."""
    from agents import function_tool
    from agents.tool_context import ToolContext

    from toolledger.adapters import openai_agents as oa

    effects = []

    @function_tool(failure_error_function=None)
    def send(to: str):
        """Sends."""
        effects.append(current_call().downstream_key)
        return returned

    wrapped = oa.AgentsLedger(runtime).tool(send, downstream=downstream)

    async def main():
        oa._SCOPE.set(oa._RunScope(run_id="r", turn=1))
        out = []
        for _ in range(2):
            ctx = ToolContext(context=None, tool_name="send", tool_call_id="call_1", tool_arguments='{"to":"a"}')
            out.append(await wrapped.on_invoke_tool(ctx, '{"to":"a"}'))
        return out

    first, again = asyncio.run(main())
    return first, again, effects
