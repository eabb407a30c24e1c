"""What every framework adapter shares: a framework's tool call run through
the ledger's executor, with the tool's own code run by the caller — in its
thread (sync frameworks) or its task (async ones), with its ``contextvars``
— so the framework's config, callbacks and connections still work.

The three adapters only differ in where they find a call's identity
(operation, round, call id) and how they hand a result or an unknown outcome
back to their framework. What happens to a call — durable intent, replay,
reconciliation by key or lookup, unknown outcomes — is the executor's
(``toolledger.Executor``), not decided here.

How a call travels (:meth:`LedgerRuntime.call` / :meth:`LedgerRuntime.acall`):

1. The caller registers an *invocation* under the call's execution id and
   starts ``executor.execute`` (async callers: a task on their own loop;
   sync callers: on the package's loop thread, ``toolledger._loop``).
2. When the executor runs the tool (its intent durable), the handler's
   ``perform`` posts the work to the invocation; the caller runs it and
   posts the answer back. A lookup during reconciliation travels the same
   way, so it can use the caller's connection (an MCP session).
3. The caller returns the executor's ``toolledger.Completed`` (run now or
   replayed) or raises :class:`OutcomeUnknown` / :class:`CallNotExecuted`.

A call the executor runs with no caller waiting (``executor.recover()`` at
start-up resending under the same key) runs ``ToolSpec.run(args)`` on the
package's loop thread (async) or a worker thread (sync), with no framework
context.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import enum
import inspect
import json
import logging
import queue
import unicodedata
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Union

import toolledger as tl
from toolledger import ffi as _ffi
from toolledger._loop import bridge_loop as _bridge_loop

log = logging.getLogger("toolledger.adapters")

# How long a caller waits for one message of a call (the tool's run, a
# lookup, the outcome) before it stops waiting. The executor still finishes
# the call and records it; the same call asked for again replays or
# reconciles it.
DEFAULT_CALL_TIMEOUT_S = 300.0


class Downstream(enum.Enum):
    """What the service behind a tool offers after a crash or timeout."""

    KEY = "key"
    """It deduplicates requests by an idempotency key: send
    ``current_call().downstream_key``. After an unknown outcome the executor
    resends under the same key."""

    LOOKUP = "lookup"
    """It can find an effect by a reference the tool sent (the downstream
    key): give the wrapper a ``lookup``. After an unknown outcome the
    executor looks the effect up; it resends only after the landing window,
    once the lookup proved the effect absent."""

    NEITHER = "neither"
    """Neither: after an unknown outcome nothing is resent; the app gets
    :class:`OutcomeUnknown` and settles it (``executor.resolve_unknown``)."""


_CURRENT: contextvars.ContextVar[Optional[tl.ToolRequest]] = contextvars.ContextVar(
    "toolledger_adapters_current_call", default=None
)


def current_call() -> tl.ToolRequest:
    """The attempt the ledger is running now (``execution_id``,
    ``downstream_key``, ``attempt``, ...); only inside a wrapped tool.

    Raises ``LookupError`` outside one."""
    request = _CURRENT.get()
    if request is None:
        raise LookupError("current_call(): not inside a tool run by the ledger")
    return request


class OutcomeUnknown(tl.Error):
    """The effect may or may not have happened and the ledger could not
    tell (a downstream with neither keys nor lookup, or a lookup inside the
    landing window). Nothing was resent. ``outcome`` is the executor's
    ``toolledger.Unknown``: settle it with ``executor.resolve_unknown(
    execution_id, attempt, resolution)``, or ask again after
    ``retry_after_ms`` when that is set."""

    def __init__(self, outcome: tl.Unknown):
        text = f"outcome unknown for {outcome.execution_id} (attempt {outcome.attempt}): {outcome.reason}"
        if outcome.retry_after_ms is not None:
            text += f"; ask again in {outcome.retry_after_ms} ms"
        super().__init__(
            text,
            outcome=outcome,
            execution_id=outcome.execution_id,
            attempt=outcome.attempt,
            reason=outcome.reason,
            retry_after_ms=outcome.retry_after_ms,
        )


class CallNotExecuted(tl.Error):
    """The ledger did not run the call and has no result for it.
    ``outcome`` is the executor's answer (``toolledger.Conflict``,
    ``Failed``, ``InFlight``, ``NeedsApproval``, ``Pending``, ``Rejected``
    or ``Cancelled``)."""

    def __init__(self, outcome: tl.CallOutcome):
        super().__init__(
            f"{type(outcome).__name__}: {outcome.execution_id}",
            outcome=outcome,
            execution_id=outcome.execution_id,
        )


def result_of(outcome: tl.CallOutcome) -> tl.Completed:
    """The executor's outcome as a result for the framework, or raises."""
    if isinstance(outcome, tl.Completed):
        return outcome
    if isinstance(outcome, tl.Unknown):
        raise OutcomeUnknown(outcome)
    raise CallNotExecuted(outcome)


def _escape(component: str) -> str:
    # As the ledger escapes an id component: '%', ':', '#' and the C0/C1
    # control characters become %XX.
    out = []
    for ch in component:
        if ch in "%:#" or (ord(ch) < 0x100 and unicodedata.category(ch) == "Cc"):
            out.append("%%%02X" % ord(ch))
        else:
            out.append(ch)
    return "".join(out)


def execution_id_of(operation_id: str, round_: int, call_id: str, tool_name: str, version: int) -> str:
    """The id the ledger derives for a call (``op:round_N:call:tool:vN``,
    each component escaped). The library does not export this derivation,
    so it is repeated here; ``tests/adapters/test_core.py`` checks it
    against the ledger's own ids."""
    return f"{_escape(operation_id)}:round_{round_}:{_escape(call_id)}:{_escape(tool_name)}:v{version}"


@dataclass
class ToolSpec:
    """A side-effecting tool under the ledger, as the adapters register it.

    ``run(args)`` makes the effect when no caller waits (see the module
    docs); ``lookup(args, request)`` finds an effect made under
    ``request.downstream_key`` and returns its result (what a run would have
    returned), or ``None`` when there is none (``Downstream.LOOKUP`` only).
    Either may be ``async``.
    """

    name: str
    run: Callable[[Any], Any]
    downstream: Downstream
    lookup: Optional[Callable[[Any, tl.ToolRequest], Any]] = None
    version: int = 1
    landing_window_ms: Optional[int] = None

    def __post_init__(self):
        if self.downstream is Downstream.LOOKUP and self.lookup is None:
            raise ValueError(f"tool {self.name!r}: Downstream.LOOKUP needs a lookup function")

    def descriptor(self) -> Any:
        extra = {}
        if self.landing_window_ms is not None:
            extra["landing_window_ms"] = self.landing_window_ms
        return _ffi.ToolDescriptor(
            name=self.name,
            version=self.version,
            effect=_ffi.EffectClass.SIDE_EFFECT,
            batch=_ffi.BatchMode.ATOMIC,
            idempotency_key=self.downstream is Downstream.KEY,
            lookup=self.downstream is Downstream.LOOKUP,
            **extra,
        )


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _request(native: Any) -> tl.ToolRequest:
    return tl.ToolRequest(
        execution_id=native.execution_id,
        downstream_key=native.downstream_key,
        tool_name=native.tool_name,
        arguments_json=native.arguments_json,
        attempt=native.attempt,
        item_index=native.item_index,
        external_id=native.external_id,
    )


class _Invocation:
    """One call that a caller in this process waits for. The executor's
    callbacks post work here (from the library's threads); the caller runs
    it and posts the answer back."""

    DONE = object()

    def __init__(self, body: Callable[[], Any], loop: Optional[asyncio.AbstractEventLoop]):
        self.body = body
        self.loop = loop  # the async caller's loop; None for a sync caller
        self._items: Union["queue.Queue", asyncio.Queue] = queue.Queue() if loop is None else asyncio.Queue()

    def post(self, item: Any) -> None:
        if self.loop is None:
            self._items.put(item)
        else:
            self.loop.call_soon_threadsafe(self._items.put_nowait, item)

    async def run_in_caller(self, fn: Callable[[], Any], request: tl.ToolRequest) -> Any:
        """From a library thread's loop: has the caller run ``fn()``."""
        reply: concurrent.futures.Future = concurrent.futures.Future()
        self.post((fn, request, reply))
        return await asyncio.wrap_future(reply)

    def serve(self, done: Callable[[], Any], timeout: float) -> Any:
        """A sync caller: runs posted work until the outcome is there."""
        while True:
            item = self._items.get(timeout=timeout)
            if item is self.DONE:
                return done()
            fn, request, reply = item
            token = _CURRENT.set(request)
            try:
                reply.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to perform, which classifies it
                reply.set_exception(exc)
            finally:
                _CURRENT.reset(token)

    async def aserve(self, done: Callable[[], Any], timeout: float) -> Any:
        """An async caller: runs posted work in its own task until the
        outcome is there."""
        while True:
            item = await asyncio.wait_for(self._items.get(), timeout)
            if item is self.DONE:
                return done()
            fn, request, reply = item
            token = _CURRENT.set(request)
            try:
                value = fn()
                if inspect.isawaitable(value):
                    value = await value
                reply.set_result(value)
            except BaseException as exc:  # noqa: BLE001 - handed to perform, which classifies it
                reply.set_exception(exc)
            finally:
                _CURRENT.reset(token)


class _Handler(_ffi.ToolHandler):
    """The executor's view of one wrapped tool."""

    def __init__(self, spec: ToolSpec, runtime: "LedgerRuntime"):
        self.spec = spec
        self.runtime = runtime
        self._descriptor = spec.descriptor()

    def descriptor(self) -> Any:
        return self._descriptor

    async def _run(self, native: Any, caller_fn: Callable[[tl.ToolRequest], Callable[[], Any]],
                   detached_fn: Callable[[Any, tl.ToolRequest], Any]) -> Any:
        request = _request(native)
        invocation = self.runtime._invocations.get(request.execution_id)
        if invocation is not None:
            return await invocation.run_in_caller(caller_fn(request), request)
        return await self.runtime._run_detached(lambda: detached_fn(request.arguments, request), request)

    async def perform(self, native: Any) -> Any:
        try:
            value = await self._run(
                native, lambda request: self.runtime._invocations[request.execution_id].body,
                lambda args, request: self.spec.run(args),
            )
        except tl.NotCommitted as e:
            return _ffi.PerformOutcome.FAILED_BEFORE_COMMIT(reason=e.reason, retryable=e.retryable)
        except BaseException as e:  # noqa: BLE001 - it may have happened: unknown, never failed
            log.warning("tool %s raised %s: outcome unknown", self.spec.name, type(e).__name__)
            return _ffi.PerformOutcome.UNKNOWN(reason=f"{type(e).__name__} raised by the tool")
        try:
            text = _json(value)
        except (TypeError, ValueError) as e:
            log.error("tool %s returned a result that is not JSON: %s", self.spec.name, type(e).__name__)
            return _ffi.PerformOutcome.UNKNOWN(reason="the tool's result is not JSON-serializable")
        return _ffi.PerformOutcome.COMMITTED(result_json=text, external_id=None)

    async def lookup(self, native: Any) -> Any:
        lookup = self.spec.lookup
        if lookup is None:
            return _ffi.LookupOutcome.UNSUPPORTED()
        try:
            found = await self._run(
                native, lambda request: (lambda: lookup(request.arguments, request)),
                lambda args, request: lookup(args, request),
            )
        except BaseException as e:  # noqa: BLE001 - a failed lookup leaves the outcome unknown
            log.warning("lookup of tool %s raised %s", self.spec.name, type(e).__name__)
            raise _ffi.ToolCallError.Tool(f"{type(e).__name__} raised by the lookup") from None
        if found is None:
            return _ffi.LookupOutcome.NOT_FOUND()
        return _ffi.LookupOutcome.FOUND(result_json=_json(found), external_id=None)

    def approval_preview(self, arguments_json: str) -> Optional[str]:
        return None


class LedgerRuntime:
    """A ledger and the executor the adapters register their tools with.
    One per process and ledger file; share it between adapters.

    ``LedgerRuntime("ledger.db")`` opens (or creates) the file and closes it
    in :meth:`close`; ``LedgerRuntime(ledger)`` uses an open
    ``toolledger.Ledger``. ``executor_settings`` are ``ExecutorConfig``'s
    fields as keywords (``max_attempts``, ``perform_timeout_ms``, ...).
    """

    def __init__(self, ledger: Union[str, "tl.Ledger"], *, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
                 **executor_settings: Any):
        self._owns_ledger = not isinstance(ledger, tl.Ledger)
        self.ledger = tl.Ledger.open(ledger) if self._owns_ledger else ledger
        self.executor = tl.Executor(self.ledger, **executor_settings)
        self.call_timeout_s = call_timeout_s
        self._specs: dict[str, ToolSpec] = {}
        self._invocations: dict[str, _Invocation] = {}

    # -- tools --------------------------------------------------------------

    def register(self, spec: ToolSpec) -> None:
        """Registers a tool's spec with the executor (once per name)."""
        if spec.name in self._specs:
            raise ValueError(f"a tool named {spec.name!r} is already registered")
        self.executor.register(_Handler(spec, self))
        self._specs[spec.name] = spec

    def registered(self, name: str) -> bool:
        return name in self._specs

    # -- calls --------------------------------------------------------------

    def call(self, operation_id: str, round_: int, call_id: str, tool_name: str, arguments_json: str,
             body: Callable[[], Any]) -> tl.Completed:
        """One call from synchronous code: ``body()`` runs the tool in this
        thread when the executor runs it. Returns the result or raises."""
        execution_id, invocation = self._claim(operation_id, round_, call_id, tool_name, body, None)
        try:
            call = tl.ToolCall(call_id, tool_name, arguments_json)
            done = asyncio.run_coroutine_threadsafe(
                self.executor.execute(operation_id, round_, call), self._sync_loop())
            done.add_done_callback(lambda _f: invocation.post(_Invocation.DONE))
            return result_of(invocation.serve(done.result, self.call_timeout_s))
        except queue.Empty:
            raise TimeoutError(f"toolledger: no outcome for {execution_id} within {self.call_timeout_s} s") from None
        finally:
            self._release(execution_id, invocation)

    async def acall(self, operation_id: str, round_: int, call_id: str, tool_name: str, arguments_json: str,
                    body: Callable[[], Awaitable[Any]]) -> tl.Completed:
        """One call from async code: ``body()`` (``async``, or plain) runs
        the tool in this task when the executor runs it."""
        loop = asyncio.get_running_loop()
        execution_id, invocation = self._claim(operation_id, round_, call_id, tool_name, body, loop)
        try:
            call = tl.ToolCall(call_id, tool_name, arguments_json)
            done = loop.create_task(self.executor.execute(operation_id, round_, call))
            done.add_done_callback(lambda _t: invocation._items.put_nowait(_Invocation.DONE))
            return result_of(await invocation.aserve(done.result, self.call_timeout_s))
        except asyncio.TimeoutError:
            raise TimeoutError(f"toolledger: no outcome for {execution_id} within {self.call_timeout_s} s") from None
        finally:
            self._release(execution_id, invocation)

    def _claim(self, operation_id, round_, call_id, tool_name, body, loop):
        spec = self._specs[tool_name]
        execution_id = execution_id_of(operation_id, round_, call_id, tool_name, spec.version)
        invocation = _Invocation(body, loop)
        # Two callers with one identity at once: the first one runs it; the
        # executor answers the second (InFlight), which runs nothing.
        self._invocations.setdefault(execution_id, invocation)
        return execution_id, invocation

    def _release(self, execution_id: str, invocation: _Invocation) -> None:
        if self._invocations.get(execution_id) is invocation:
            del self._invocations[execution_id]

    def _sync_loop(self) -> asyncio.AbstractEventLoop:
        # The package's bridge loop: the library already calls tools back on
        # it, so a sync caller's execute runs on the thread its callbacks use.
        return _bridge_loop()

    async def _run_detached(self, fn: Callable[[], Any], request: tl.ToolRequest) -> Any:
        """No caller waits: a coroutine runs on the package's loop thread, a
        plain function in a worker thread, with ``current_call()`` set."""
        context = contextvars.copy_context()
        context.run(_CURRENT.set, request)
        value = await asyncio.to_thread(context.run, fn)
        if inspect.isawaitable(value):
            async def awaited():
                _CURRENT.set(request)
                return await value
            value = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(awaited(), self._sync_loop()))
        return value

    # -- start-up and shutdown ----------------------------------------------

    async def recover(self) -> tl.Recovery:
        """``executor.recover()``: once at start-up, after the tools are
        registered."""
        return await self.executor.recover()

    def close(self) -> None:
        """Closes the ledger if this runtime opened it."""
        if self._owns_ledger:
            self.ledger.close()

    def __enter__(self) -> "LedgerRuntime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
