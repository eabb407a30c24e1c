"""How each adapter maps its framework's identities onto the ledger's
rules, in process (no crash): an executor retry is the same execution (its
effect is not repeated), a new model response is a new execution (it runs),
and the MCP adapter's correlation metadata reaches the server and the
result."""

import asyncio
import json
import uuid

import pytest

import toolledger as tl
from toolledger.adapters import Downstream, LedgerRuntime, current_call


@pytest.fixture
def runtime(tmp_path):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2)
    yield rt
    rt.close()


# -- LangGraph -------------------------------------------------------------------


def _langgraph_app(runtime, effects, flaky_failures):
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import RetryPolicy

    from toolledger.adapters.langgraph import ledger_tool

    @tool
    def send_email(to: str) -> str:
        """Sends an email."""
        effects.append(current_call().downstream_key)
        return f"sent {len(effects)}"

    @tool
    def flaky() -> str:
        """Fails the first times it is called."""
        if flaky_failures:
            flaky_failures.pop()
            raise ValueError("flaky")
        return "fine"

    def model(state):
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(content="done")]}
        calls = [
            {"name": "send_email", "args": {"to": "a@example.com"}, "id": f"call_{uuid.uuid4().hex[:8]}"},
            {"name": "flaky", "args": {}, "id": f"call_{uuid.uuid4().hex[:8]}"},
        ]
        return {"messages": [AIMessage(content="", tool_calls=calls)]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    tools = ToolNode([ledger_tool(send_email, runtime, downstream=Downstream.KEY), flaky], handle_tool_errors=False)
    graph.add_node("tools", tools, retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False,
                                                            retry_on=ValueError))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=InMemorySaver())


def test_langgraph_a_retried_tools_node_does_not_send_again(runtime):
    effects = []
    app = _langgraph_app(runtime, effects, flaky_failures=[1])
    out = app.invoke({"messages": [("user", "go")]}, {"configurable": {"thread_id": "t"}})
    assert out["messages"][-1].content == "done"
    assert len(effects) == 1, "the node's retry replayed the committed call"
    stored = runtime.ledger.list("langgraph:t")
    assert [e.status for e in stored] in ([tl.ExecutionStatus.COMMITTED], [tl.ExecutionStatus.RESULT_DELIVERED])
    # The ToolMessage the model saw is the stored result.
    sent = [m for m in out["messages"] if getattr(m, "name", None) == "send_email"]
    assert [m.content for m in sent] == ["sent 1"]


def test_langgraph_a_new_model_response_is_a_new_call(runtime):
    effects = []
    app = _langgraph_app(runtime, effects, flaky_failures=[])
    config = {"configurable": {"thread_id": "t"}}
    app.invoke({"messages": [("user", "go")]}, config)
    app.invoke({"messages": [("user", "once more")]}, config)
    assert len(effects) == 2 and effects[0] != effects[1]
    assert len(runtime.ledger.list("langgraph:t")) == 2


# -- OpenAI Agents SDK --------------------------------------------------------------


def test_openai_agents_same_run_id_replays_a_new_one_runs(runtime):
    from agents import Agent, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from toolledger.adapters.openai_agents import AgentsLedger

    set_tracing_disabled(True)
    effects, model_calls = [], []

    class Scripted(Model):
        async def get_response(self, system_instructions, input, *args, **kwargs):
            model_calls.append(1)
            if isinstance(input, list) and input[-1].get("type") == "function_call_output":
                return ModelResponse(output=[ResponseOutputMessage(
                    id="m", type="message", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text="done", annotations=[])])],
                    usage=Usage(), response_id=None)
            return ModelResponse(output=[ResponseFunctionToolCall(
                type="function_call", call_id=f"call_{uuid.uuid4().hex[:8]}", name="send_email",
                arguments='{"to":"a@example.com"}', status="completed")], usage=Usage(), response_id=None)

        def stream_response(self, *args, **kwargs):
            raise NotImplementedError

    @function_tool(failure_error_function=None)
    def send_email(to: str) -> str:
        """Sends an email."""
        effects.append(current_call().downstream_key)
        return f"sent {len(effects)}"

    agents = AgentsLedger(runtime)
    agent = Agent(name="mailer", model=agents.model(Scripted()),
                  tools=[agents.tool(send_email, downstream=Downstream.KEY)])

    async def main():
        first = await agents.run(agent, "go", run_id="conv:1")
        again = await agents.run(agent, "go", run_id="conv:1")  # a retried run: replayed
        other = await agents.run(agent, "go", run_id="conv:2")  # a regenerated answer: runs
        return first, again, other

    first, again, other = asyncio.run(main())
    assert first.final_output == again.final_output == other.final_output == "done"
    assert len(effects) == 2
    assert len(model_calls) == 4, "the retried run asked the model nothing"
    tools_run = [e for e in runtime.ledger.list("openai-agents:conv:1") if e.tool_name == "send_email"]
    assert len(tools_run) == 1


# -- MCP ------------------------------------------------------------------------------


def _request_meta(ctx):
    """The `_meta` entries of the request an MCP tool is serving (a dict, or
    the model's extra fields, by MCP version)."""
    meta = ctx.request_context.meta
    return meta if isinstance(meta, dict) else (meta.model_extra or {})


def test_mcp_correlation_metadata_reaches_the_server_and_the_result(runtime):
    from mcp.client._memory import InMemoryTransport
    from mcp.server.mcpserver import Context, MCPServer

    from toolledger.adapters.mcp import META_EXECUTION_ID, META_IDEMPOTENCY_KEY, MCPLedger

    server = MCPServer("mail")
    seen = []

    @server.tool()
    def send_email(to: str, ctx: Context) -> str:
        """Sends an email."""
        extra = _request_meta(ctx)
        seen.append((ctx.request_id, extra.get(META_EXECUTION_ID), extra.get(META_IDEMPOTENCY_KEY)))
        return f"sent {len(seen)} ✓"  # not ASCII: stored as UTF-8, read back the same

    ledger_mcp = MCPLedger(runtime, server="mail")
    ledger_mcp.tool("send_email", downstream=Downstream.KEY)

    async def main():
        async with InMemoryTransport(server) as (read, write):
            async with ledger_mcp.session(read, write) as session:
                await session.initialize()
                ids = dict(operation_id="conv:1", round=0, call_id="call_1")
                first = await ledger_mcp.call_tool(session, "send_email", {"to": "a@example.com"}, **ids)
                again = await ledger_mcp.call_tool(session, "send_email", {"to": "a@example.com"}, **ids)
                return first, again

    first, again = asyncio.run(main())
    assert len(seen) == 1, "the repeated call was answered from the ledger"
    request_id, execution_id, key = seen[0]
    assert execution_id == first.execution_id
    assert key == runtime.ledger.get(first.execution_id).downstream_key
    assert str(first.jsonrpc_id) == str(request_id)
    assert not first.replayed and again.replayed
    assert again.jsonrpc_id == first.jsonrpc_id
    assert again.result.content[0].text == first.result.content[0].text == "sent 1 ✓"
    # The first is the session's own result (the ledger committed exactly its
    # text), the replay is read back from the ledger: the same result.
    assert again.result == first.result
    stored = json.loads(runtime.ledger.get(first.execution_id).result_json)
    assert stored["result"] == first.result.model_dump(mode="json", by_alias=True, exclude_none=True)


def test_mcp_jsonrpc_id_text_is_what_json_writes():
    # An int id (what ClientSession gives) is written without the encoder;
    # anything else goes through it: the same text `json.dumps` writes.
    import enum

    from toolledger.adapters.mcp import _id_json

    class Code(enum.IntEnum):
        A = 3

    cases = [(7, "7"), (0, "0"), (-12, "-12"), (2**70, str(2**70)), ("req-1", '"req-1"'),
             ('q"\\é', '"q\\"\\\\\\u00e9"'), (None, "null"), (True, "true"), (Code.A, "3")]
    for value, text in cases:
        assert _id_json(value) == text == json.dumps(value, separators=(",", ":")), value


def test_mcp_call_on_a_session_it_did_not_make_keeps_no_jsonrpc_id(runtime):
    # A plain ClientSession: the id is not seen, stored as null; the first
    # call hands back the session's own result, the replay the stored one.
    from mcp import ClientSession
    from mcp.client._memory import InMemoryTransport
    from mcp.server.mcpserver import MCPServer

    from toolledger.adapters.mcp import MCPLedger

    server = MCPServer("mail")
    sent = []

    @server.tool()
    def send_email(to: str) -> str:
        """Sends an email."""
        sent.append(to)
        return f"sent {len(sent)}"

    ledger_mcp = MCPLedger(runtime, server="mail")
    ledger_mcp.tool("send_email", downstream=Downstream.KEY)

    async def main():
        async with InMemoryTransport(server) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                ids = dict(operation_id="conv:2", round=0, call_id="call_1")
                first = await ledger_mcp.call_tool(session, "send_email", {"to": "b@example.com"}, **ids)
                again = await ledger_mcp.call_tool(session, "send_email", {"to": "b@example.com"}, **ids)
                return first, again

    first, again = asyncio.run(main())
    assert sent == ["b@example.com"]
    assert first.jsonrpc_id is None and again.jsonrpc_id is None
    assert not first.replayed and again.replayed
    assert again.result == first.result and first.result.content[0].text == "sent 1"
    stored = runtime.ledger.get(first.execution_id).result_json
    assert stored.endswith(',"jsonrpc_id":null}')
    assert json.loads(stored) == {"result": first.result.model_dump(mode="json", by_alias=True, exclude_none=True),
                                  "jsonrpc_id": None}


def test_mcp_call_keeps_the_apps_own_meta_and_sets_the_ledgers_entries(runtime):
    from mcp.client._memory import InMemoryTransport
    from mcp.server.mcpserver import Context, MCPServer

    from toolledger.adapters.mcp import META_EXECUTION_ID, META_IDEMPOTENCY_KEY, MCPLedger

    server = MCPServer("mail")
    seen = []

    @server.tool()
    def send_email(to: str, ctx: Context) -> str:
        """Sends an email."""
        extra = _request_meta(ctx)
        seen.append({k: extra.get(k) for k in ("app/trace", META_EXECUTION_ID, META_IDEMPOTENCY_KEY)})
        return "sent"

    ledger_mcp = MCPLedger(runtime, server="mail")
    ledger_mcp.tool("send_email", downstream=Downstream.KEY)
    app_meta = {"app/trace": "t-1", META_EXECUTION_ID: "not-the-ledgers"}

    async def main():
        async with InMemoryTransport(server) as (read, write):
            async with ledger_mcp.session(read, write) as session:
                await session.initialize()
                return await ledger_mcp.call_tool(session, "send_email", {"to": "a@example.com"}, meta=app_meta,
                                                  operation_id="conv:3", round=0, call_id="call_1")

    done = asyncio.run(main())
    key = runtime.ledger.get(done.execution_id).downstream_key
    assert seen == [{"app/trace": "t-1", META_EXECUTION_ID: done.execution_id, META_IDEMPOTENCY_KEY: key}]
    assert app_meta == {"app/trace": "t-1", META_EXECUTION_ID: "not-the-ledgers"}, "the app's dict is left as it was"


def test_openai_agents_a_run_resumed_from_its_state_asks_the_model_for_the_next_turn(runtime):
    # Human in the loop: a tool with needs_approval interrupts the run at
    # turn 1; the app approves and resumes from the RunState. The resumed
    # run is at the SDK's turn 1, so its next model call is turn 2: it must
    # not get turn 1's recorded response back (its message would become the
    # run's final answer, and the model would never see the tool's output).
    from agents import Agent, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from toolledger.adapters.openai_agents import AgentsLedger

    set_tracing_disabled(True)
    effects, model_calls = [], []

    def message(text):
        return ResponseOutputMessage(id="m", type="message", role="assistant", status="completed",
                                     content=[ResponseOutputText(type="output_text", text=text, annotations=[])])

    class Scripted(Model):
        async def get_response(self, system_instructions, input, *args, **kwargs):
            model_calls.append(1)
            if isinstance(input, list) and input[-1].get("type") == "function_call_output":
                return ModelResponse(output=[message("done")], usage=Usage(), response_id=None)
            return ModelResponse(output=[message("sending it"), ResponseFunctionToolCall(
                type="function_call", call_id=f"call_{uuid.uuid4().hex[:8]}", name="send_email",
                arguments='{"to":"a@example.com"}', status="completed")], usage=Usage(), response_id=None)

        def stream_response(self, *args, **kwargs):
            raise NotImplementedError

    @function_tool(failure_error_function=None, needs_approval=True)
    def send_email(to: str) -> str:
        """Sends an email."""
        effects.append(current_call().execution_id)
        return "sent"

    agents = AgentsLedger(runtime)
    agent = Agent(name="mailer", model=agents.model(Scripted()),
                  tools=[agents.tool(send_email, downstream=Downstream.NEITHER)])

    async def main():
        paused = await agents.run(agent, "go", run_id="conv:hitl")
        assert len(paused.interruptions) == 1 and effects == []
        state = paused.to_state()
        state.approve(paused.interruptions[0])
        return await agents.run(agent, state, run_id="conv:hitl")

    resumed = asyncio.run(main())
    assert resumed.final_output == "done", "the resumed run was handed turn 1's response again"
    assert len(model_calls) == 2, "the model was asked for the turn after the tool's output"
    assert len(effects) == 1
    # The tool ran under the turn whose response asked for it (as a run
    # without the pause names it), and that turn's response was asked once.
    assert ":round_1:" in effects[0]
    stored = sorted(e.execution_id for e in runtime.ledger.list("openai-agents:conv:hitl"))
    assert [s for s in stored if "model_response" in s] == [
        "openai-agents%3Aconv%3Ahitl:round_1:model:toolledger.model_response:v1",
        "openai-agents%3Aconv%3Ahitl:round_2:model:toolledger.model_response:v1",
    ]
