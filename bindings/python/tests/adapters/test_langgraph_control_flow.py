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


def _two_calls_app(runtime, effects):
    # One model response with two calls: send_email (no pause) and book
    # (asks a human first, with interrupt()). ToolNode runs both in one task.
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import interrupt

    from toolledger.adapters.langgraph import ledger_tool

    @tool
    def send_email(to: str) -> str:
        """Sends an email."""
        effects.append(("send_email", current_call().execution_id))
        return "sent"

    @tool
    def book(what: str) -> str:
        """Books, once a human approved."""
        answer = interrupt({"approve": what})
        effects.append(("book", current_call().execution_id))
        return f"booked {what}: {answer}"

    def model(state):
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [AIMessage(content="done")]}
        return {"messages": [AIMessage(content="", tool_calls=[
            {"name": "send_email", "args": {"to": "a@example.com"}, "id": "call_1"},
            {"name": "book", "args": {"what": "x"}, "id": "call_2"}])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([ledger_tool(send_email, runtime, downstream=Downstream.NEITHER),
                                      ledger_tool(book, runtime, downstream=Downstream.NEITHER)]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=InMemorySaver())


def test_a_state_edit_during_a_pause_does_not_run_a_committed_call_again(runtime):
    # LangGraph's review-and-edit pattern: while `book` waits for the human,
    # the app edits the model's message (here `book`'s arguments) with
    # update_state(as_node="model") and resumes. The edit makes a new
    # checkpoint, so the tools node runs one step later: `send_email`, which
    # committed before the pause, is the same call and must not be sent again.
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.types import Command

    effects = []
    app = _two_calls_app(runtime, effects)
    config = {"configurable": {"thread_id": "t"}}
    paused = app.invoke({"messages": [("user", "go")]}, config)
    assert "__interrupt__" in paused and [name for name, _ in effects] == ["send_email"]
    message = app.get_state(config).values["messages"][-1]
    edited = AIMessage(content="", id=message.id, tool_calls=[
        message.tool_calls[0], {**message.tool_calls[1], "args": {"what": "y"}}])
    app.update_state(config, {"messages": [edited]}, as_node="model")
    out = app.invoke(Command(resume="yes"), config)
    assert out["messages"][-1].content == "done"
    assert [name for name, _ in effects] == ["send_email", "book"], effects
    answers = [(m.name, m.tool_call_id, m.content) for m in out["messages"] if isinstance(m, ToolMessage)]
    assert answers == [("send_email", "call_1", "sent"), ("book", "call_2", "booked y: yes")]


def test_a_fork_from_before_the_tools_ran_does_not_run_them_again(runtime):
    # Time travel: the graph ran to the end; the app goes back to the
    # checkpoint where the tools were next, replays it, then forks from it
    # (update_state on it makes the fork, one step later) and runs the fork.
    # The model's message is the same one: its call is replayed, not sent
    # again.
    from langchain_core.messages import ToolMessage

    app, effects = _one_email_graph(runtime)
    config = {"configurable": {"thread_id": "t"}}
    app.invoke({"messages": [("user", "go")]}, config)
    assert len(effects) == 1
    before_tools = next(s for s in app.get_state_history(config) if s.next == ("tools",))
    replayed = app.invoke(None, before_tools.config)
    assert replayed["messages"][-1].content == "done"
    fork = app.update_state(before_tools.config, {"messages": []}, as_node="model")
    forked = app.invoke(None, fork)
    assert forked["messages"][-1].content == "done"
    assert [(m.tool_call_id, m.content) for m in forked["messages"] if isinstance(m, ToolMessage)] == [
        ("call_1", "sent")]
    assert len(effects) == 1, effects


def test_parallel_calls_sent_one_task_each_keep_their_ids_and_replay_in_a_fork(runtime):
    # The prebuilt agent (version="v2") sends each tool call of a message to
    # the tools node as its own task (`Send`). Each gets its own execution,
    # the ToolMessages answer the model's ids (a chat model refuses a
    # history where they do not), and a fork from before the tools replays
    # both.
    import uuid
    import warnings

    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    from toolledger.adapters.langgraph import ledger_tool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

    class Scripted(BaseChatModel):
        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            if isinstance(messages[-1], ToolMessage):
                message = AIMessage(content="done")
            else:
                message = AIMessage(content="", tool_calls=[
                    {"name": "send_email", "args": {"to": to}, "id": f"call_{uuid.uuid4().hex[:8]}"}
                    for to in ("a", "b")])
            return ChatResult(generations=[ChatGeneration(message=message)])

        def bind_tools(self, tools, **kwargs):
            return self

        @property
        def _llm_type(self):
            return "scripted"

    effects = []

    @tool
    def send_email(to: str) -> str:
        """Sends an email."""
        effects.append(to)
        return f"sent {to}"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(Scripted(), [ledger_tool(send_email, runtime, downstream=Downstream.NEITHER)],
                                   checkpointer=InMemorySaver(), version="v2")
    config = {"configurable": {"thread_id": "t"}}
    out = agent.invoke({"messages": [("user", "go")]}, config)
    asked = out["messages"][1].tool_calls
    answers = {m.tool_call_id: m.content for m in out["messages"] if isinstance(m, ToolMessage)}
    assert answers == {asked[0]["id"]: "sent a", asked[1]["id"]: "sent b"}
    assert out["messages"][-1].content == "done" and sorted(effects) == ["a", "b"]
    assert len(runtime.ledger.list("langgraph:t")) == 2
    before_tools = next(s for s in agent.get_state_history(config) if s.next and s.next[0] == "tools")
    forked = agent.invoke(None, before_tools.config)
    assert forked["messages"][-1].content == "done"
    assert sorted(effects) == ["a", "b"], "the fork sent again"


def test_a_model_message_with_a_long_id_still_names_its_calls(runtime):
    # The message id goes into the ledger's call id (at most 256 bytes): a
    # provider's long message id must not make every call refused.
    app, effects = _one_email_graph(runtime, message_id="m" * 300)
    config = {"configurable": {"thread_id": "t"}}
    out = app.invoke({"messages": [("user", "go")]}, config)
    assert out["messages"][-1].content == "done" and len(effects) == 1
    before_tools = next(s for s in app.get_state_history(config) if s.next == ("tools",))
    app.invoke(None, app.update_state(before_tools.config, {"messages": []}, as_node="model"))
    assert len(effects) == 1


def _one_email_graph(runtime, message_id=None, state_key="messages", **ledger_kwargs):
    """A model that asks for one email (its ``AIMessage`` with
    ``message_id``, or an id ``add_messages`` gives it) and then says
    "done", the tool through the ledger (``NEITHER``, wrapped with
    ``ledger_kwargs``), compiled with an in-memory checkpointer: (the app,
    the execution ids the tool ran for). The messages are under
    ``state_key`` (``MessagesState`` for ``messages``; otherwise
    ``ToolNode`` and ``tools_condition`` are made with that
    ``messages_key``)."""
    from typing import Annotated

    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.prebuilt import ToolNode, tools_condition
    from typing_extensions import TypedDict

    from toolledger.adapters.langgraph import ledger_tool

    effects = []

    @tool
    def send_email(to: str) -> str:
        """Sends an email."""
        effects.append(current_call().execution_id)
        return "sent"

    def model(state):
        if isinstance(state[state_key][-1], ToolMessage):
            return {state_key: [AIMessage(content="done")]}
        return {state_key: [AIMessage(content="", id=message_id, tool_calls=[
            {"name": "send_email", "args": {"to": "a@example.com"}, "id": "call_1"}])]}

    if state_key == "messages":
        graph = StateGraph(MessagesState)
        node = ToolNode([ledger_tool(send_email, runtime, downstream=Downstream.NEITHER, **ledger_kwargs)])
        route = tools_condition
    else:
        graph = StateGraph(TypedDict("Chat", {state_key: Annotated[list, add_messages]}))
        node = ToolNode([ledger_tool(send_email, runtime, downstream=Downstream.NEITHER, **ledger_kwargs)],
                        messages_key=state_key)

        def route(state):
            return tools_condition(state, messages_key=state_key)
    graph.add_node("model", model)
    graph.add_node("tools", node)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=InMemorySaver()), effects


def _run_and_fork(app):
    """Runs the graph to the end, then forks from the checkpoint where the
    tools were next and runs the fork (as in the fork test above)."""
    config = {"configurable": {"thread_id": "t"}}
    app.invoke({"chat": [("user", "go")]}, config)
    before_tools = next(s for s in app.get_state_history(config) if s.next == ("tools",))
    fork = app.update_state(before_tools.config, {"chat": []}, as_node="model")
    return app.invoke(None, fork)


def test_a_tool_node_with_its_own_messages_key_is_protected_when_the_key_is_given(runtime, caplog):
    from langchain_core.messages import ToolMessage

    app, effects = _one_email_graph(runtime, state_key="chat", messages_key="chat")
    with caplog.at_level("WARNING", logger="toolledger.adapters"):
        forked = _run_and_fork(app)
    assert [(m.tool_call_id, m.content) for m in forked["chat"] if isinstance(m, ToolMessage)] == [
        ("call_1", "sent")]
    assert len(effects) == 1, effects
    assert "@" in effects[0]  # named by the model's message, not the step
    assert not [r for r in caplog.records if "named by the step" in r.getMessage()]


def test_a_graph_without_the_messages_key_is_named_by_the_step_and_says_so(runtime, caplog):
    # The ToolNode reads "chat"; the ledger tool, not told, finds no
    # "messages" state: its calls are named by the step, which a fork moves,
    # so the fork sends the email again. Logged once, naming the fix.
    app, effects = _one_email_graph(runtime, state_key="chat")
    with caplog.at_level("WARNING", logger="toolledger.adapters"):
        _run_and_fork(app)
    assert len(effects) == 2, effects
    warnings = [r.getMessage() for r in caplog.records if "named by the step" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "messages_key" in warnings[0] and "'messages'" in warnings[0]


@pytest.mark.parametrize("bad", ["", None, 3])
def test_a_bad_messages_key_is_refused_before_anything_is_registered(runtime, bad):
    from langchain_core.tools import tool

    from toolledger.adapters.langgraph import ledger_tool

    @tool
    def send_email(to: str) -> str:
        """Sends an email."""
        return "sent"

    with pytest.raises(ValueError, match="messages_key"):
        ledger_tool(send_email, runtime, downstream=Downstream.KEY, messages_key=bad)
    assert not runtime.registered("send_email")
    ledger_tool(send_email, runtime, downstream=Downstream.KEY)  # the name is still free
    assert runtime.registered("send_email")
