"""LangGraph: a ledger tool that asks a human first (`interrupt()` inside the
tool, LangGraph's documented human-in-the-loop pattern), resumed with
Command(resume=...).

LangGraph: a tool that returns a `Command` (LangGraph's documented way
for a tool to update the graph state) is run by the ledger tool; its
effect happened and the tool returned.
"""

import pytest

import toolledger as tl
from toolledger.adapters import Downstream, LedgerRuntime, current_call


@pytest.fixture
def runtime(tmp_path):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2)
    yield rt
    rt.close()


def _app(runtime, effects, downstream):
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import interrupt

    from toolledger.adapters.langgraph import ledger_tool

    @tool
    def send_email(to: str) -> str:
        """Sends an email once a human approved it."""
        answer = interrupt({"approve": to})
        if answer != "yes":
            return "not sent"
        effects.append(current_call().downstream_key)
        return "sent"

    def model(state):
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(content="done")]}
        return {"messages": [AIMessage(content="", tool_calls=[
            {"name": "send_email", "args": {"to": "a@example.com"}, "id": "call_1"}])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([ledger_tool(send_email, runtime, downstream=downstream)]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=InMemorySaver())


def _run(runtime, downstream):
    from langgraph.types import Command
    effects = []
    app = _app(runtime, effects, downstream)
    config = {"configurable": {"thread_id": "t"}}
    first = app.invoke({"messages": [("user", "go")]}, config)
    assert "__interrupt__" in first, f"the graph waits for the human: {list(first)}"
    out = app.invoke(Command(resume="yes"), config)
    return effects, out


def test_interrupt_in_a_ledger_tool_key(runtime):
    effects, out = _run(runtime, Downstream.KEY)
    assert out["messages"][-1].content == "done"
    assert len(effects) == 1


def test_interrupt_in_a_ledger_tool_neither(runtime):
    effects, out = _run(runtime, Downstream.NEITHER)
    assert out["messages"][-1].content == "done"
    assert len(effects) == 1


def test_langgraph_tool_returning_command(runtime):
    from typing import Annotated

    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import InjectedToolCallId, tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import Command

    from toolledger.adapters.langgraph import ledger_tool

    effects = []

    @tool
    def send_email(to: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Sends an email and notes it in the state."""
        effects.append(current_call().downstream_key)
        return Command(update={"messages": [ToolMessage("sent", tool_call_id=tool_call_id)]})

    def model(state):
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [AIMessage(content="done")]}
        return {"messages": [AIMessage(content="", tool_calls=[
            {"name": "send_email", "args": {"to": "a@example.com"}, "id": "call_1"}])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([ledger_tool(send_email, runtime, downstream=Downstream.KEY)]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    app = graph.compile(checkpointer=InMemorySaver())
    try:
        out = app.invoke({"messages": [("user", "go")]}, {"configurable": {"thread_id": "t"}})
    except Exception as e:  # noqa: BLE001
        out = e
    stored = [(e.status, e.attempt_count) for e in runtime.ledger.list("langgraph:t")]
    assert len(effects) == 1, f"the tool ran {len(effects)} times; stored {stored}; out {out!r}"[:600]
    assert not isinstance(out, Exception), f"{type(out).__name__}: {out}; stored {stored}"
    assert out["messages"][-1].content == "done"


def test_langgraph_tool_returning_command_replays_it(runtime):
    # The stored Command comes back on a replay (a node retried after it).
    from typing import Annotated

    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import InjectedToolCallId, tool
    from langgraph.types import Command

    from toolledger.adapters.langgraph import ledger_tool

    effects = []

    @tool
    def send_email(to: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Sends an email and notes it in the state."""
        effects.append(1)
        return Command(update={"messages": [ToolMessage("sent", tool_call_id=tool_call_id)], "sent": 1})

    wrapped = ledger_tool(send_email, runtime, downstream=Downstream.KEY)
    call = {"type": "tool_call", "name": "send_email", "args": {"to": "a"}, "id": "call_1"}
    config = {"configurable": {"thread_id": "t"}, "metadata": {"langgraph_step": 1}}
    first = wrapped.invoke(call, config)
    again = wrapped.invoke(call, config)
    assert effects == [1]
    assert isinstance(again, Command) and again.update["sent"] == 1
    assert again.update["messages"][0].content == "sent" == first.update["messages"][0].content
    assert again.update["messages"][0].tool_call_id == "call_1"
