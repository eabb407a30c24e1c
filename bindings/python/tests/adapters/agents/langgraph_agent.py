"""A LangGraph agent (StateGraph + ToolNode, SQLite checkpointer,
``durability="sync"``) whose model is scripted: asked by the user, it calls
``send_email`` with a fresh tool-call id (as a real model does); shown the
tool's answer, it ends. ``--phase resume`` resumes the thread as LangGraph
documents: ``graph.invoke(None, config)``."""

import os
import sqlite3
import sys
import uuid

from common import Client, find_email, parse_args, report, report_exception, send_email
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


def scripted_model(state):
    last = state["messages"][-1]
    if isinstance(last, ToolMessage):
        return {"messages": [AIMessage(content=f"done: {last.content}")]}
    call = {"name": "send_email", "args": {"to": "a@example.com", "body": "hi"}, "id": f"call_{uuid.uuid4().hex[:12]}"}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


def main():
    args = parse_args()
    client = Client(args.url)
    adapter = args.adapter == "on"

    @tool
    def send_email_tool(to: str, body: str) -> str:
        """Sends an email."""
        key = None
        if adapter:
            from toolledger.adapters import current_call

            key = current_call().downstream_key
        return send_email(client, args.downstream, {"to": to, "body": body}, key)

    send_email_tool.name = "send_email"
    tools = [send_email_tool]
    if adapter:
        from toolledger.adapters import Downstream, LedgerRuntime
        from toolledger.adapters.langgraph import ledger_tool

        runtime = LedgerRuntime(os.path.join(args.dir, "ledger.db"))
        lookup = (lambda a, call: find_email(client, call.downstream_key)) if args.downstream == "lookup" else None
        tools = [ledger_tool(send_email_tool, runtime, downstream=Downstream(args.downstream), lookup=lookup)]

    graph = StateGraph(MessagesState)
    graph.add_node("model", scripted_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    saver = SqliteSaver(sqlite3.connect(os.path.join(args.dir, "checkpoints.db"), check_same_thread=False))
    app = graph.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "thread-1"}}
    try:
        if args.phase == "first":
            out = app.invoke({"messages": [HumanMessage("email a@example.com")]}, config, durability="sync")
        else:
            out = app.invoke(None, config, durability="sync")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report_exception(exc)
        return
    report(status="ok", final=out["messages"][-1].content)


if __name__ == "__main__":
    sys.exit(main())
