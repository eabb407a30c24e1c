"""LangGraph: tools whose calls run through the ledger.

Tested with ``langgraph`` 1.2.22 (``langgraph-prebuilt`` 1.1.3,
``langgraph-checkpoint-sqlite`` 3.1.2) and ``langchain-core`` 1.8.1.

::

    runtime = LedgerRuntime("ledger.db")                          # once per process
    send = ledger_tool(send_email, runtime, downstream=Downstream.KEY)
    graph.add_node("tools", ToolNode([send]))                     # instead of [send_email]

Identity. A call's execution is ``(thread, model message, tool-call id,
arguments)``:

* operation = ``langgraph:<thread_id>`` (with the parent graph's namespace
  for a tool called inside a subgraph);
* round = 0, and call id = ``<tool-call id>@<message id>@<digest>``: the id
  of the ``AIMessage`` in the graph's ``messages`` state (or the key given as
  ``ledger_tool(..., messages_key=...)``, for a ``ToolNode`` made with its own
  ``messages_key``) that holds the call
  (``add_messages`` gives every message one; one longer than 64 characters
  by 32 hex digits of its SHA-256) and the first 16 hex digits of the
  SHA-256 of the model's arguments;
* outside a graph (the tool invoked by hand with a ``langgraph_step``), or
  with no message holding the call under that key: round = the graph's step
  (``langgraph_step``), call id = the model's tool-call id (inside a graph
  logged once per tool as a warning: those calls are not protected against
  a re-run at a later step, below).

A graph resumed from its checkpointer (``graph.invoke(None, config)`` after a
crash) runs the tools node again with the same ``AIMessage``: same
identity, so a committed call is replayed and one left running by the dead
process is reconciled (resent under the same key, looked up, or raised as
:class:`OutcomeUnknown`). A retry of the node (``RetryPolicy``) is the same
execution too, and so are the calls of a message the tools node runs again
at a later step: after ``update_state`` while a tool waits in
``interrupt()``, or in a fork from an earlier checkpoint (time travel). The
step would have named them anew and sent them again. A call whose
arguments were edited in the state is another call (it runs). A regenerated
model turn is a new ``AIMessage`` with new tool-call ids, hence new
executions: it runs again, as it should.

The tool's own code reads ``current_call().downstream_key`` and sends it as
the idempotency key (``Downstream.KEY``) or reference (``Downstream.LOOKUP``,
with ``lookup=`` a function ``(args, call) -> result | None``).

What is handed back: a ``ToolMessage`` with the tool's content (``content``,
``status`` and a JSON-able ``artifact`` are stored; on a replay the stored
ones come back). The call that ran the tool gets the tool's own
``ToolMessage`` (what the graph gets without the ledger) when the ledger
committed exactly what it made of it. An unknown outcome raises
:class:`OutcomeUnknown` out of the graph (``ToolNode``'s default error
handling re-raises it): nothing is resent. A ``ToolNode`` made with
``handle_tool_errors=True`` (or a tuple holding ``OutcomeUnknown`` or one of
its bases) hands it to the model instead, as an error ``ToolMessage``
("Error: OutcomeUnknown(...) Please fix your mistakes."); a model that then
asks again makes a new tool call, which the ledger cannot tie to the
first: keep ``OutcomeUnknown`` out of what the ``ToolNode`` handles.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Callable, Optional

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, messages_from_dict, messages_to_dict
from langchain_core.runnables import RunnableConfig, ensure_config
from langchain_core.runnables.config import CONFIG_KEYS
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, PrivateAttr

try:  # where ToolNode's own state reader sits in the tested versions
    from langgraph._internal._constants import CONFIG_KEY_READ
except ImportError:  # another layout: no state reader, calls are named by the step
    CONFIG_KEY_READ = None
from langgraph.errors import GraphInterrupt
from langgraph.types import Command

from .. import _driven
from ._core import (  # noqa: F401
    Downstream, LedgerRuntime, ToolSpec, _json, _JsonText, _recorded_text, _too_large, current_call,
)

# `interrupt()` inside a tool raises through it: LangGraph's human-in-the-loop
# pause, not the tool failing after its effect. Recorded as not committed
# (retryable) and re-raised; the resumed graph runs the tool again from its
# start (the next attempt, under the same key), as LangGraph documents, so a
# tool must call `interrupt()` before its effect. (A `Command` sent to the
# parent graph, `ParentCommand`, is the tool's answer, not a pause: it is
# not taken as one.)
if GraphInterrupt not in _driven.CONTROL_FLOW:
    _driven.CONTROL_FLOW = _driven.CONTROL_FLOW + (GraphInterrupt,)

log = logging.getLogger("toolledger.adapters")

TESTED_VERSIONS = {"langgraph": "1.2.22", "langchain-core": "1.8.1", "langgraph-prebuilt": "1.1.3"}

_CONFIG_KEYS = frozenset(CONFIG_KEYS)

# The state key ToolNode reads the model's message from by default.
_MESSAGES_KEY = "messages"

# ``json.dumps(value, sort_keys=True)`` with one encoder built once: the
# same text (a call's arguments as part of its identity).
_sorted_json = json.JSONEncoder(sort_keys=True).encode


def ledger_tool(
    tool: BaseTool,
    runtime: LedgerRuntime,
    *,
    downstream: Downstream,
    lookup: Optional[Callable[[dict, Any], Any]] = None,
    version: int = 1,
    landing_window_ms: Optional[int] = None,
    messages_key: str = _MESSAGES_KEY,
) -> BaseTool:
    """Wraps a side-effecting LangChain tool (``@tool`` or any ``BaseTool``)
    so that each call runs through ``runtime``'s executor. Use the returned
    tool in ``ToolNode`` (and ``bind_tools``) in place of the original.

    ``lookup(args, call)`` (for ``Downstream.LOOKUP``) returns what the tool
    would have returned for the effect made under ``call.downstream_key``
    (a string, or a ``ToolMessage``), or None when there is none.

    ``messages_key`` is the state key that holds the model's messages: the
    ``ToolNode``'s own ``messages_key`` when it was made with one. A call is
    named by the model's message there; a graph with no such key names its
    calls by the step, and then a call the tools node runs again at a later
    step (after ``update_state``, in a fork) is sent again (logged once per
    tool as a warning)."""
    if not isinstance(messages_key, str) or not messages_key:
        raise ValueError(f"ledger_tool({tool.name!r}): messages_key must be a non-empty str, not {messages_key!r}")

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
        messages_key=messages_key,
        return_direct=tool.return_direct,
    )


class LedgerTool(BaseTool):
    """A tool whose calls run through the ledger (made by :func:`ledger_tool`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    runtime: Any
    messages_key: str = _MESSAGES_KEY
    # Whether the warning that a call inside a graph is named by the step
    # (no messages state under `messages_key` holding it) was logged.
    _warned_step_naming: bool = PrivateAttr(default=False)
    # The names of the arguments the model sends (`_arguments`), read from
    # the inner tool's schema once: building that schema costs more than
    # the rest of a call's identity.
    _model_arguments: Optional[frozenset] = PrivateAttr(default=None)

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - invoke is overridden
        raise NotImplementedError("LedgerTool runs through invoke()")

    # -- identity ---------------------------------------------------------

    def _identity(self, call: dict, config: RunnableConfig) -> tuple[str, int, str, str]:
        configurable, metadata = _identity_sources(config)
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
        arguments = self._arguments(call.get("args") or {})
        response = _model_response_id(configurable, str(call_id), self.messages_key)
        if response is _IN_NO_MESSAGES:
            self._warn_step_naming()
            response = None
        if response is not None:
            # The model's message names the call, not the step: the same
            # message after a resume, an edit of the state or a fork (which
            # run the tools node at a later step), a new one for a
            # regenerated turn. With the arguments' digest: a call whose
            # arguments the app edited in the state is another call.
            digest = hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest()[:16]
            if len(response) > 64:  # the ledger's call id holds 256 bytes: a long message id by its digest
                response = hashlib.sha256(response.encode("utf-8", "surrogatepass")).hexdigest()[:32]
            return operation, 0, f"{call_id}@{response}@{digest}", arguments
        return operation, int(step), str(call_id), arguments

    def _warn_step_naming(self) -> None:
        if not self._warned_step_naming:
            self._warned_step_naming = True
            log.warning(
                "ledger tool %s: the graph's state has no message holding the call under %r, so its calls "
                "are named by the step: one the tools node runs again at a later step (after update_state, "
                "in a fork) is sent again. Pass ledger_tool(..., messages_key=...) the ToolNode's messages_key.",
                self.name, self.messages_key,
            )

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
        if not names.issuperset(args):
            args = {k: v for k, v in args.items() if k in names}
        return _sorted_json(args)

    # -- calls ------------------------------------------------------------

    def invoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        call = self._as_call(input)
        operation, step, ledger_call_id, arguments = self._identity(call, config)
        call_id = str(call["id"])  # the model's: what the ToolMessage answers
        produced: list = []

        def body():
            output = self.inner.invoke(input, config, **kwargs)
            return _recorded(output, call_id, produced)

        done = self.runtime.call(operation, step, ledger_call_id, self.name, arguments, body)
        return self._message(done, call_id, produced)

    async def ainvoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        call = self._as_call(input)
        operation, step, ledger_call_id, arguments = self._identity(call, config)
        call_id = str(call["id"])  # the model's: what the ToolMessage answers
        produced: list = []

        async def body():
            output = await self.inner.ainvoke(input, config, **kwargs)
            return _recorded(output, call_id, produced)

        done = await self.runtime.acall(operation, step, ledger_call_id, self.name, arguments, body)
        return self._message(done, call_id, produced)

    def _as_call(self, input: Any) -> dict:
        if not (isinstance(input, dict) and input.get("type") == "tool_call"):
            raise ValueError(f"{self.name}: invoke a ledger tool with a tool call (ToolNode does)")
        return input

    def _message(self, done, call_id: str, produced: list) -> ToolMessage:
        # The tool's own message when this call ran it and the ledger
        # committed exactly its text (what the graph gets without the
        # ledger); otherwise — a replay, another attempt's result — the
        # message is made from what the ledger stored.
        text = _recorded_text(done.result_json)
        if produced and not done.replayed and text == produced[0]:
            output = produced[1]
            if type(output) is ToolMessage and output.tool_call_id == call_id and output.name == self.name:
                return output
            if type(output) is Command:
                return output
        stored = json.loads(text)
        if _too_large(stored):
            if produced and not done.replayed:
                # This call ran the tool: its own output, which the ledger could not keep.
                output = produced[1]
                if type(output) is ToolMessage and output.tool_call_id == call_id and output.name == self.name:
                    return output
                stored = json.loads(produced[0])
            else:
                return ToolMessage(
                    content=f"toolledger: the tool ran; its result ({stored.get('bytes')} bytes) was too large "
                            "to store", status="error", tool_call_id=call_id, name=self.name)
        if "command" in stored:
            return _command(stored["command"])
        return ToolMessage(
            content=stored["content"],
            artifact=stored.get("artifact"),
            status=stored.get("status", "success"),
            tool_call_id=call_id,
            name=self.name,
        )


def _recorded(output: Any, call_id: str, produced: list) -> Any:
    """What the ledger records for ``output``: its JSON text, kept in
    ``produced`` with the output (to recognise it in the call's outcome),
    or, when it is not JSON, the stored form for the core to refuse."""
    stored = _stored(output, call_id)
    try:
        text = _JsonText(_json(stored))
    except (TypeError, ValueError):
        return stored
    produced[:] = [text, output]
    return text


# What `_model_response_id` answers inside a graph whose state has no
# message holding the call under the key.
_IN_NO_MESSAGES = object()


def _model_response_id(configurable: dict, call_id: str, messages_key: str) -> Any:
    """The id of the model's message (``AIMessage``) in the graph's state
    under ``messages_key`` that holds the tool call ``call_id``, read the way
    ``ToolNode`` reads a graph's state (the task's ``CONFIG_KEY_READ``); None
    outside a graph, ``_IN_NO_MESSAGES`` inside one without that channel or
    when no message with an id there holds the call."""
    read = configurable.get(CONFIG_KEY_READ) if CONFIG_KEY_READ is not None else None
    if read is None:
        return None
    try:
        messages = read(messages_key)
    except Exception:  # noqa: BLE001 - no such channel: the step names the round
        return _IN_NO_MESSAGES
    if not isinstance(messages, (list, tuple)):
        return _IN_NO_MESSAGES
    for message in reversed(messages):
        if isinstance(message, AIMessage) and message.id:
            for tool_call in message.tool_calls:
                if tool_call.get("id") == call_id:
                    return str(message.id)
    return _IN_NO_MESSAGES


def _identity_sources(config: Optional[RunnableConfig]) -> tuple[dict, dict]:
    """``configurable`` and ``metadata`` as ``ensure_config(config)`` gives
    them (it merges the config of the node running now, from a context
    variable, under the one passed).

    Read straight from ``config`` when that is what ``ensure_config`` would
    give: both present as dicts (a key set replaces the context's wholesale)
    and no key outside the config keys (those would be moved into
    ``configurable``). ``ToolNode`` passes such a config."""
    if config is not None:
        configurable = config.get("configurable")
        metadata = config.get("metadata")
        if type(configurable) is dict and type(metadata) is dict and _CONFIG_KEYS.issuperset(config):
            return configurable, metadata
    ensured = ensure_config(config)
    return ensured.get("configurable") or {}, ensured.get("metadata") or {}


_MESSAGES = "toolledger/messages"


def _stored_command(command: Command) -> dict:
    """What the ledger keeps of a ``Command`` a tool returned (its state
    update, with messages as ``messages_to_dict`` writes them, the graph it
    goes to and a node name or names to go to); raises TypeError for what
    it cannot keep (a ``Send``, a resume value)."""
    if command.resume is not None or not isinstance(command.update, (dict, type(None))):
        raise TypeError("a tool's Command can be kept with a dict update, a graph and node names only")
    goto = command.goto
    if not (isinstance(goto, str) or (isinstance(goto, (list, tuple)) and all(isinstance(g, str) for g in goto))):
        raise TypeError("a tool's Command can be kept with node names to go to only (no Send)")
    update = {}
    for key, value in (command.update or {}).items():
        if isinstance(value, (list, tuple)) and value and all(isinstance(m, BaseMessage) for m in value):
            value = {_MESSAGES: messages_to_dict(value)}
        elif isinstance(value, BaseMessage):
            value = {_MESSAGES: messages_to_dict([value]), "single": True}
        update[key] = value
    return {"graph": command.graph, "update": update, "goto": list(goto) if not isinstance(goto, str) else goto}


def _command(stored: dict) -> Command:
    update = {}
    for key, value in stored["update"].items():
        if isinstance(value, dict) and _MESSAGES in value:
            messages = messages_from_dict(value[_MESSAGES])
            value = messages[0] if value.get("single") else messages
        update[key] = value
    return Command(graph=stored.get("graph"), update=update, goto=stored.get("goto") or ())


def _stored(output: Any, call_id: Optional[str]) -> dict:
    """What the ledger keeps of a tool's output."""
    if isinstance(output, Command):
        return {"command": _stored_command(output)}
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
