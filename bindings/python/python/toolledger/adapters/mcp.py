"""MCP clients: ``call_tool`` through the ledger.

Tested with ``mcp`` 2.3.0 (``ClientSession`` over stdio).

::

    runtime = LedgerRuntime("ledger.db")                            # once per process
    ledger_mcp = MCPLedger(runtime, server="mail")
    async with ledger_mcp.session(read, write) as session:          # instead of ClientSession(read, write)
        await session.initialize()
        ledger_mcp.tool("send_email", downstream=Downstream.KEY)
        result = await ledger_mcp.call_tool(session, "send_email", {"to": "a@example.com"},
                                            operation_id="conv42:msg7", round=0, call_id="call_abc")

Identity. An MCP client has no identity of its own that survives a restart:
its JSON-RPC ids count from 1 again in every session. So the execution is
named by the app, from the model's tool call that led to this MCP call
(``operation_id`` = the turn, ``round`` = the model response, ``call_id`` =
the model's tool-call id): a resumed turn that repeats the call replays or
reconciles it, a regenerated turn (new ids) runs it again. An
executor retry is the same execution.

The JSON-RPC id is correlation metadata, not identity: the request carries
``_meta`` entries ``io.toolledger/execution-id`` and
``io.toolledger/idempotency-key`` (the downstream key, which the server
should use to deduplicate: ``Downstream.KEY``, or store as a reference for
its lookup tool: ``Downstream.LOOKUP``), and the JSON-RPC id the session
gave the request is kept with the result (``LedgerToolResult.jsonrpc_id``)
when the session was made by :meth:`MCPLedger.session`, which watches the
requests it writes.

A result with ``isError`` is the server's answer and is recorded as the
call's result. An exception from the session (timeout, closed transport)
after the request may have left is an unknown outcome: the executor
reconciles it, and with neither key nor lookup ``call_tool`` raises
:class:`OutcomeUnknown` instead of sending it again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from mcp import ClientSession
from mcp.types import CallToolResult, TextContent

from ..outcomes import redacted_repr
from ._core import (  # noqa: F401
    _CURRENT, Downstream, LedgerRuntime, ToolSpec, _json, _JsonText, _recorded_text, _too_large, current_call,
)

TESTED_VERSIONS = {"mcp": "2.3.0"}

META_EXECUTION_ID = "io.toolledger/execution-id"
META_IDEMPOTENCY_KEY = "io.toolledger/idempotency-key"


@dataclass(frozen=True)
class LedgerToolResult:
    """What :meth:`MCPLedger.call_tool` returns. Printed, it shows the ids
    and flags, not the tool's result (read it from ``result``)."""

    def __repr__(self) -> str:
        return redacted_repr(self, {"result"})

    result: CallToolResult
    execution_id: str
    replayed: bool
    """True when the stored result of an earlier call came back (nothing was sent now)."""
    jsonrpc_id: Any
    """The JSON-RPC id of the request that produced the result (None when
    unknown: a session not made by :meth:`MCPLedger.session`)."""


class _WatchedWrite:
    """The session's write stream, noting the JSON-RPC id of each
    ``tools/call`` request that carries a ledger execution id."""

    def __init__(self, inner, seen: dict):
        self._inner = inner
        self._seen = seen

    async def send(self, item) -> None:
        message = getattr(item, "message", None)
        if getattr(message, "method", None) == "tools/call":
            meta = ((getattr(message, "params", None) or {}).get("_meta") or {})
            execution_id = meta.get(META_EXECUTION_ID)
            if execution_id is not None:
                self._seen[execution_id] = message.id
        await self._inner.send(item)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def __aenter__(self):
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._inner.__aexit__(*exc)


class MCPLedger:
    """``call_tool`` through the ledger for one MCP server's tools."""

    def __init__(self, runtime: LedgerRuntime, *, server: str):
        self.runtime = runtime
        self.server = server
        self._jsonrpc_ids: dict[str, Any] = {}

    def session(self, read_stream, write_stream, **kwargs) -> ClientSession:
        """A ``ClientSession`` whose ``tools/call`` JSON-RPC ids are noted."""
        return ClientSession(read_stream, _WatchedWrite(write_stream, self._jsonrpc_ids), **kwargs)

    def ledger_name(self, tool: str) -> str:
        return f"mcp:{self.server}/{tool}"

    def tool(
        self,
        name: str,
        *,
        downstream: Downstream,
        lookup: Optional[Callable[[dict, Any], Awaitable[Any]]] = None,
        version: int = 1,
        landing_window_ms: Optional[int] = None,
    ) -> None:
        """Declares a side-effecting tool of this server.
        ``lookup(args, call)`` (async) finds an effect made under
        ``call.downstream_key`` — usually by calling a lookup tool of the
        server on the session — and returns a ``CallToolResult`` to hand
        back as the call's result, or None when there is none. It runs in
        the task that called ``call_tool``, so it can use the session.

        Declaring the tool again (in each new session's block) is fine:
        the latest ``lookup`` is the one used (on the latest session). A
        declaration with another ``downstream``, ``version`` or
        ``landing_window_ms`` raises ``ValueError``: the first one's would
        go on deciding whether the call is resent."""
        spec_name = self.ledger_name(name)
        lookups = self.runtime._mcp_lookups = getattr(self.runtime, "_mcp_lookups", {})
        if self.runtime.registered(spec_name):
            spec = self.runtime._specs[spec_name]
            declared = (spec.downstream, spec.version, spec.landing_window_ms)
            if declared != (downstream, version, landing_window_ms):
                raise ValueError(
                    f"tool {name!r} of MCP server {self.server!r} is already declared with downstream="
                    f"{spec.downstream}, version={spec.version}, landing_window_ms={spec.landing_window_ms}"
                )
            if downstream is Downstream.LOOKUP and lookup is None:
                raise ValueError(f"tool {spec_name!r}: Downstream.LOOKUP needs a lookup function")
            lookups[spec_name] = lookup
            return

        def run_detached(args: dict) -> Any:
            raise RuntimeError(
                f"{name}: cannot resend without a session; repeat the call_tool (same ids) instead"
            )

        async def stored_lookup(args: dict, call: Any) -> Any:
            found = await lookups[spec_name](args, call)  # the latest declaration's
            if found is None:
                return None
            return {"result": found.model_dump(mode="json", by_alias=True, exclude_none=True), "jsonrpc_id": None}

        self.runtime.register(
            ToolSpec(
                name=spec_name,
                run=run_detached,
                downstream=downstream,
                lookup=stored_lookup if lookup is not None else None,
                version=version,
                landing_window_ms=landing_window_ms,
            )
        )
        lookups[spec_name] = lookup

    async def call_tool(
        self,
        session: ClientSession,
        name: str,
        arguments: Optional[dict] = None,
        *,
        operation_id: str,
        round: int,
        call_id: str,
        **kwargs,
    ) -> LedgerToolResult:
        """``session.call_tool(name, arguments, **kwargs)`` through the
        ledger. Raises :class:`OutcomeUnknown` or :class:`CallNotExecuted`
        when there is no result to hand back."""
        if arguments is None:
            arguments = {}
        elif not isinstance(arguments, dict):
            # mcp refuses it before the request is written: refused here,
            # before the ledger records a call that could never be sent.
            raise TypeError(f"call_tool({name!r}): arguments must be a dict, not {type(arguments).__name__}")
        spec_name = self.ledger_name(name)
        if not self.runtime.registered(spec_name):
            raise ValueError(
                f"call_tool({name!r}): not declared; call MCPLedger.tool({name!r}, downstream=...) first"
            )
        user_meta = kwargs.pop("meta", None)

        # What this call's own request got back and the JSON text recorded
        # for it: (text, result, JSON-RPC id). When the call's outcome is that
        # text, byte for byte, the result is handed back as the session
        # returned it (no second conversion); any other outcome (a replay,
        # another attempt's result) is read from what the ledger stored.
        produced = None

        async def body():
            nonlocal produced
            call = _CURRENT.get()  # set by the runtime around this body
            execution_id = call.execution_id
            if user_meta:
                meta = dict(user_meta)
                meta[META_EXECUTION_ID] = execution_id
                meta[META_IDEMPOTENCY_KEY] = call.downstream_key
            else:
                meta = {META_EXECUTION_ID: execution_id, META_IDEMPOTENCY_KEY: call.downstream_key}
            try:
                result = await session.call_tool(name, arguments, meta=meta, **kwargs)
            finally:  # the id noted for this request, whether or not an answer came
                jsonrpc_id = self._jsonrpc_ids.pop(execution_id, None)
            # {"result": <the result as MCP writes it>, "jsonrpc_id": <id>},
            # the result serialised by pydantic in one step.
            text = _JsonText(
                '{"result":' + result.model_dump_json(by_alias=True, exclude_none=True)
                + ',"jsonrpc_id":' + _id_json(jsonrpc_id) + "}"
            )
            produced = (text, result, jsonrpc_id)
            return text

        done = await self.runtime.acall(
            operation_id, round, call_id, spec_name, json.dumps(arguments), body
        )
        text = _recorded_text(done.result_json)
        if produced is not None and not done.replayed and text == produced[0]:
            return _tool_result(produced[1], done.execution_id, False, produced[2])
        stored = json.loads(text)
        if _too_large(stored):
            if produced is not None and not done.replayed:
                # This call's own result, which the ledger could not keep.
                return _tool_result(produced[1], done.execution_id, False, produced[2])
            text = f"toolledger: the tool ran; its result ({stored.get('bytes')} bytes) was too large to store"
            return _tool_result(CallToolResult(content=[TextContent(type="text", text=text)], isError=True),
                                done.execution_id, done.replayed, None)
        return _tool_result(
            CallToolResult.model_validate(stored["result"]), done.execution_id, done.replayed,
            stored.get("jsonrpc_id"),
        )


def _id_json(jsonrpc_id: Any) -> str:
    """The JSON text of a JSON-RPC id: an ``int`` (what ``ClientSession``
    numbers its requests with) as ``str`` writes it, which is the text
    ``json`` writes for it; anything else (a string id, None when the id was
    not seen, a bool or an int subclass) through the JSON encoder."""
    if type(jsonrpc_id) is int:
        return str(jsonrpc_id)
    return _json(jsonrpc_id)


def _tool_result(result: CallToolResult, execution_id: str, replayed: bool, jsonrpc_id: Any) -> LedgerToolResult:
    # The fields set in one step (what the frozen dataclass's __init__ does
    # one `object.__setattr__` at a time); it has no `__post_init__`.
    made = object.__new__(LedgerToolResult)
    made.__dict__.update(result=result, execution_id=execution_id, replayed=replayed, jsonrpc_id=jsonrpc_id)
    return made
