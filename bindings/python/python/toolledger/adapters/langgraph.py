"""LangGraph: tools whose calls run through the ledger.

Tested with ``langgraph`` 1.2.22 (``langgraph-prebuilt`` 1.1.3,
``langgraph-checkpoint-sqlite`` 3.1.2) and ``langchain-core`` 1.8.1.

::

    runtime = LedgerRuntime("ledger.db")                          # once per process
    send = ledger_tool(send_email, runtime, downstream=Downstream.KEY)
    graph.add_node("tools", ToolNode([send]))                     # instead of [send_email]

Identity. A call's execution is ``(thread, step, tool-call id)``:

* operation = ``langgraph:<thread_id>`` (with the parent graph's namespace
  for a tool called inside a subgraph);
* round = the graph's step (``langgraph_step``);
* call id = the model's tool-call id.

A graph resumed from its checkpointer (``graph.invoke(None, config)`` after a
crash) runs the tools node again at the same step with the same
``AIMessage``: same identity, so a committed call is replayed and one left
running by the dead process is reconciled (resent under the same key, looked
up, or raised as :class:`OutcomeUnknown`). A retry of the node
(``RetryPolicy``) is the same execution too. A regenerated model turn gets
new tool-call ids from the model, hence new executions: it runs again, as it
should. A model that reuses tool-call ids across different responses breaks
this rule (the second response would get the first one's result).

The tool's own code reads ``current_call().downstream_key`` and sends it as
the idempotency key (``Downstream.KEY``) or reference (``Downstream.LOOKUP``,
with ``lookup=`` a function ``(args, call) -> result | None``).

What is handed back: a ``ToolMessage`` with the tool's content (``content``,
``status`` and a JSON-able ``artifact`` are stored; on a replay the stored
ones come back). An unknown outcome raises :class:`OutcomeUnknown` out of the
graph (``ToolNode``'s default error handling re-raises it): nothing is resent.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig, ensure_config
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, PrivateAttr

from ._core import Downstream, LedgerRuntime, ToolSpec, current_call  # noqa: F401

TESTED_VERSIONS = {"langgraph": "1.2.22", "langchain-core": "1.8.1", "langgraph-prebuilt": "1.1.3"}


def ledger_tool(
    tool: BaseTool,
    runtime: LedgerRuntime,
    *,
    downstream: Downstream,
    lookup: Optional[Callable[[dict, Any], Any]] = None,
    version: int = 1,
    landing_window_ms: Optional[int] = None,
) -> BaseTool:
    """Wraps a side-effecting LangChain tool (``@tool`` or any ``BaseTool``)
    so that each call runs through ``runtime``'s executor. Use the returned
    tool in ``ToolNode`` (and ``bind_tools``) in place of the original.

    ``lookup(args, call)`` (for ``Downstream.LOOKUP``) returns what the tool
    would have returned for the effect made under ``call.downstream_key``
    (a string, or a ``ToolMessage``), or None when there is none."""

    def run_detached(args: dict) -> Any:
        # Only when no caller waits (recover() resending under the key).
        return _stored(tool.invoke(args), None)

    def stored_lookup(args: dict, call: Any) -> Any:
        found = lookup(args, call)
        return None if found is None else _stored(found, None)

    spec = ToolSpec(
        name=tool.name,
        run=run_detached,
        downstream=downstream,
        lookup=stored_lookup if lookup is not None else None,
        version=version,
        landing_window_ms=landing_window_ms,
    )
    runtime.register(spec)
    return LedgerTool(
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        inner=tool,
        runtime=runtime,
        return_direct=tool.return_direct,
    )


class LedgerTool(BaseTool):
    """A tool whose calls run through the ledger (made by :func:`ledger_tool`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    runtime: Any
    # The names of the arguments the model sends (`_arguments`), read from
    # the inner tool's schema once: building that schema costs more than
    # the rest of a call's identity.
    _model_arguments: Optional[frozenset] = PrivateAttr(default=None)

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - invoke is overridden
        raise NotImplementedError("LedgerTool runs through invoke()")

    # -- identity ---------------------------------------------------------

    def _identity(self, call: dict, config: RunnableConfig) -> tuple[str, int, str, str]:
        configurable = config.get("configurable") or {}
        metadata = config.get("metadata") or {}
        thread_id = configurable.get("thread_id")
        step = metadata.get("langgraph_step")
        call_id = call.get("id")
        if thread_id is None or step is None or not call_id:
            raise ValueError(
                f"{self.name}: a ledger tool runs only as a tool call (with an id) inside a graph "
                "with a checkpointer and a thread_id"
            )
        namespace = str(configurable.get("checkpoint_ns") or "")
        parent = namespace.rsplit("|", 1)[0] if "|" in namespace else ""
        operation = f"langgraph:{thread_id}" + (f"|{parent}" if parent else "")
        return operation, int(step), str(call_id), self._arguments(call.get("args") or {})

    def _arguments(self, args: dict) -> str:
        # What the model sent: injected arguments (state, store, runtime) are
        # not part of the call's identity.
        names = self._model_arguments
        if names is None:
            schema = self.inner.tool_call_schema
            if isinstance(schema, dict):
                names = frozenset((schema.get("properties") or {}).keys())
            else:
                names = frozenset(schema.model_fields)
            self._model_arguments = names
        return json.dumps({k: v for k, v in args.items() if k in names}, sort_keys=True)

    # -- calls ------------------------------------------------------------

    def invoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        call, config = self._as_call(input, config)
        operation, step, call_id, arguments = self._identity(call, config)
        done = self.runtime.call(
            operation, step, call_id, self.name, arguments,
            lambda: _stored(self.inner.invoke(input, config, **kwargs), call_id),
        )
        return self._message(done, call_id)

    async def ainvoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        call, config = self._as_call(input, config)
        operation, step, call_id, arguments = self._identity(call, config)

        async def body():
            return _stored(await self.inner.ainvoke(input, config, **kwargs), call_id)

        done = await self.runtime.acall(operation, step, call_id, self.name, arguments, body)
        return self._message(done, call_id)

    def _as_call(self, input: Any, config: Optional[RunnableConfig]) -> tuple[dict, RunnableConfig]:
        if not (isinstance(input, dict) and input.get("type") == "tool_call"):
            raise ValueError(f"{self.name}: invoke a ledger tool with a tool call (ToolNode does)")
        return input, ensure_config(config)

    def _message(self, done, call_id: str) -> ToolMessage:
        stored = json.loads(done.result_json)
        return ToolMessage(
            content=stored["content"],
            artifact=stored.get("artifact"),
            status=stored.get("status", "success"),
            tool_call_id=call_id,
            name=self.name,
        )


def _stored(output: Any, call_id: Optional[str]) -> dict:
    """What the ledger keeps of a tool's output."""
    if isinstance(output, ToolMessage):
        stored = {"content": output.content, "status": output.status}
        if output.artifact is not None:
            try:
                json.dumps(output.artifact)
            except (TypeError, ValueError):
                pass  # not JSON: not kept, a replay has none
            else:
                stored["artifact"] = output.artifact
        return stored
    if isinstance(output, str):
        return {"content": output, "status": "success"}
    return {"content": json.dumps(output), "status": "success"}
