"""What every framework adapter shares: a tool wrapped so that each call runs
through the ledger's executor, with the tool's own code run in the caller's
thread (or task), in the caller's context.

The three adapters only differ in where they find a call's identity
(operation, round, call id) and how they hand a result or an unknown outcome
back to their framework. Everything that decides what happens to a call —
durable intent, replay, reconciliation by key or lookup, unknown outcomes —
is the executor's (``ToolExecutor`` in the core), not ours.

How a call travels (``LedgerRuntime.call`` / ``acall``):

1. The caller registers an *invocation* under the call's execution id and
   asks the executor to execute the call on the runtime's own event loop
   thread (UniFFI schedules the tool's async callbacks there).
2. When the executor decides to run the tool (after its intent is durable),
   the handler's ``perform`` posts the work back to the caller, which runs
   the tool's code itself (same thread or task, same ``contextvars``, so a
   framework's callbacks and config lookups still work) and posts the answer
   back.
3. The caller returns the executor's outcome: a result (run now or replayed),
   or raises :class:`OutcomeUnknown` / :class:`CallNotExecuted`.

A call the executor runs with no caller waiting (``recover()`` at start-up
resending under the same key, a lookup) runs the tool's code on the
runtime's loop thread with no framework context.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import enum
import inspect
import json
import queue
import threading
import unicodedata
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Union

from ._bindings import tl

# How long a caller waits for one call, at most, before it stops waiting
# (the executor still finishes the call and records it; a later call with
# the same identity replays or reconciles it).
DEFAULT_CALL_TIMEOUT_S = 300.0


class Downstream(enum.Enum):
    """What the service behind a tool offers after a crash or timeout."""

    KEY = "key"
    """It deduplicates requests by an idempotency key: send
    ``current_call().downstream_key``. After an unknown outcome the executor
    resends under the same key."""

    LOOKUP = "lookup"
    """It can find an effect by a reference the tool sent (the downstream
    key): give the wrapper a ``lookup`` function. After an unknown outcome
    the executor looks the effect up; it resends only once the landing
    window has passed and the lookup proved the effect absent."""

    NEITHER = "neither"
    """Neither: after an unknown outcome nothing is resent; the app gets
    :class:`OutcomeUnknown` and settles it (``resolve_unknown``)."""


@dataclass(frozen=True)
class LedgerCall:
    """The ledger's view of the call being run, for the tool's code
    (``current_call()``)."""

    execution_id: str
    downstream_key: str
    """Send this as the idempotency key (or reference) downstream."""
    attempt: int
    tool_name: str
    external_id: Optional[str]
    """The downstream's id for the effect, if an earlier attempt learnt it."""


_CURRENT: contextvars.ContextVar[Optional[LedgerCall]] = contextvars.ContextVar(
    "toolledger_current_call", default=None
)


def current_call() -> LedgerCall:
    """The call the ledger is running now; only inside a wrapped tool.

    Raises ``LookupError`` outside one."""
    call = _CURRENT.get()
    if call is None:
        raise LookupError("current_call(): not inside a tool run by the ledger")
    return call


class OutcomeUnknown(Exception):
    """The effect may or may not have happened, and the ledger could not
    tell (a downstream with neither keys nor lookup, or a lookup inside the
    landing window). Nothing was resent. Settle it with
    ``executor.resolve_unknown(execution_id, attempt, resolution)``, or ask
    again after ``retry_after_ms`` when that is set."""

    def __init__(self, execution_id: str, attempt: int, reason: str, retry_after_ms: Optional[int]):
        super().__init__(
            f"outcome unknown for {execution_id} (attempt {attempt}): {reason}"
            + (f"; ask again in {retry_after_ms} ms" if retry_after_ms is not None else "")
        )
        self.execution_id = execution_id
        self.attempt = attempt
        self.reason = reason
        self.retry_after_ms = retry_after_ms


class CallNotExecuted(Exception):
    """The ledger did not run the call and has no result for it: ``kind`` is
    one of ``conflict`` (same identity, other arguments), ``failed``,
    ``in_flight``, ``needs_approval``, ``pending``, ``rejected``,
    ``cancelled``. ``outcome`` is the executor's ``CallOutcome``."""

    def __init__(self, kind: str, execution_id: str, outcome: Any, detail: str = ""):
        super().__init__(f"{kind}: {execution_id}" + (f" ({detail})" if detail else ""))
        self.kind = kind
        self.execution_id = execution_id
        self.outcome = outcome


@dataclass(frozen=True)
class Completed:
    """A result for the framework: ``result_json`` as committed (byte for
    byte on a replay)."""

    execution_id: str
    result_json: str
    replayed: bool
    external_id: Optional[str]


def outcome_to_result(outcome: Any) -> Completed:
    """Maps a ``CallOutcome`` to a result, or raises."""
    if outcome.is_COMPLETED():
        return Completed(outcome.execution_id, outcome.result_json, outcome.replayed, outcome.external_id)
    if outcome.is_UNKNOWN():
        raise OutcomeUnknown(outcome.execution_id, outcome.attempt, outcome.reason, outcome.retry_after_ms)
    for kind, test in (
        ("conflict", "is_CONFLICT"),
        ("failed", "is_FAILED"),
        ("in_flight", "is_IN_FLIGHT"),
        ("needs_approval", "is_NEEDS_APPROVAL"),
        ("pending", "is_PENDING"),
        ("rejected", "is_REJECTED"),
        ("cancelled", "is_CANCELLED"),
    ):
        if getattr(outcome, test)():
            detail = getattr(outcome, "reason", "") or ""
            raise CallNotExecuted(kind, outcome.execution_id, outcome, detail)
    raise CallNotExecuted("unexpected", getattr(outcome, "execution_id", "?"), outcome)


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
    each component escaped). The ledger does not export this derivation, so
    it is repeated here; ``tests/adapters/test_core.py`` checks it against
    the ledger's own ids."""
    return f"{_escape(operation_id)}:round_{round_}:{_escape(call_id)}:{_escape(tool_name)}:v{version}"


# ---------------------------------------------------------------------------
# Tools as the executor sees them.

Body = Callable[[dict], Any]  # sync or async; returns a JSON-able result
LookupFn = Callable[[dict, "LedgerCall"], Any]  # returns a result or None


@dataclass
class ToolSpec:
    """A side-effecting tool under the ledger.

    ``run(args)`` does the effect (reading ``current_call()`` for the key);
    its return value is the result (a ``str`` is stored as a JSON string,
    anything else with ``json.dumps``). ``lookup(args, call)`` finds an
    effect made under ``call.downstream_key`` and returns its result, or
    ``None`` when there is none (only for ``Downstream.LOOKUP``).
    """

    name: str
    run: Body
    downstream: Downstream
    lookup: Optional[LookupFn] = None
    version: int = 1
    landing_window_ms: Optional[int] = None

    def __post_init__(self):
        if self.downstream is Downstream.LOOKUP and self.lookup is None:
            raise ValueError(f"tool {self.name!r}: Downstream.LOOKUP needs a lookup function")

    def descriptor(self):
        extra = {}
        if self.landing_window_ms is not None:
            extra["landing_window_ms"] = self.landing_window_ms
        return tl.ToolDescriptor(
            name=self.name,
            version=self.version,
            effect=tl.EffectClass.SIDE_EFFECT,
            batch=tl.BatchMode.ATOMIC,
            idempotency_key=self.downstream is Downstream.KEY,
            lookup=self.downstream is Downstream.LOOKUP,
            **extra,
        )


def _to_json(value: Any) -> str:
    # A result is JSON text in the ledger; a string result stays a string.
    return json.dumps(value)


def _ledger_call(request) -> LedgerCall:
    return LedgerCall(
        execution_id=request.execution_id,
        downstream_key=request.downstream_key,
        attempt=request.attempt,
        tool_name=request.tool_name,
        external_id=request.external_id,
    )


class _Invocation:
    """One call of a wrapped tool that a caller in this process waits for.

    The executor's callbacks (on the runtime's loop) post work here; the
    caller runs it in its own thread or task and posts the answer back."""

    DONE = object()

    def __init__(self, body: Callable[[], Any], origin: Optional[asyncio.AbstractEventLoop]):
        self.body = body  # runs the tool for this call, with the framework's context
        self.origin = origin  # the caller's loop, None for a sync caller
        if origin is None:
            self._sync: "queue.Queue" = queue.Queue()
        else:
            self._async: asyncio.Queue = asyncio.Queue()

    def post(self, item) -> None:
        if self.origin is None:
            self._sync.put(item)
        else:
            self.origin.call_soon_threadsafe(self._async.put_nowait, item)

    async def run_in_caller(self, fn: Callable[[], Any], call: "LedgerCall") -> Any:
        """From the runtime's loop: has the caller run ``fn`` and waits for it."""
        reply: concurrent.futures.Future = concurrent.futures.Future()
        self.post((fn, call, reply))
        return await asyncio.wrap_future(reply)

    def serve_sync(self, done: concurrent.futures.Future, timeout: float) -> Any:
        """In a sync caller: runs posted work until the executor is done."""
        while True:
            item = self._sync.get(timeout=timeout)
            if item is self.DONE:
                return done.result()
            fn, call, reply = item
            token = _CURRENT.set(call)
            try:
                value = fn()
            except BaseException as exc:  # noqa: BLE001 - the executor records it as unknown
                reply.set_exception(exc)
            else:
                reply.set_result(value)
            finally:
                _CURRENT.reset(token)

    async def serve_async(self, done: concurrent.futures.Future, timeout: float) -> Any:
        """In an async caller: runs posted work (in this task) until the
        executor is done."""
        while True:
            item = await asyncio.wait_for(self._async.get(), timeout)
            if item is self.DONE:
                return done.result()
            fn, call, reply = item
            token = _CURRENT.set(call)
            try:
                value = fn()
                if inspect.isawaitable(value):
                    value = await value
            except BaseException as exc:  # noqa: BLE001 - the executor records it as unknown
                reply.set_exception(exc)
            else:
                reply.set_result(value)
            finally:
                _CURRENT.reset(token)


class _Handler(tl.ToolHandler):
    """The executor's view of one wrapped tool."""

    def __init__(self, spec: ToolSpec, runtime: "LedgerRuntime"):
        self.spec = spec
        self.runtime = runtime

    def descriptor(self):
        return self.spec.descriptor()

    async def perform(self, request):
        call = _ledger_call(request)
        invocation = self.runtime._invocations.get(request.execution_id)
        if invocation is not None:
            result = await invocation.run_in_caller(invocation.body, call)
        else:
            # No caller waits (recover() resending under the same key): run
            # the tool from its arguments alone.
            args = json.loads(request.arguments_json)
            result = await _run_detached(lambda: self.spec.run(args), call)
        return tl.PerformOutcome.COMMITTED(result_json=_to_json(result), external_id=None)

    async def lookup(self, request):
        if self.spec.lookup is None:
            return tl.LookupOutcome.UNSUPPORTED()
        call = _ledger_call(request)
        args = json.loads(request.arguments_json)
        invocation = self.runtime._invocations.get(request.execution_id)
        if invocation is not None:
            # In the caller's context: a lookup may need its connection.
            found = await invocation.run_in_caller(lambda: self.spec.lookup(args, call), call)
        else:
            found = await _run_detached(lambda: self.spec.lookup(args, call), call)
        if found is None:
            return tl.LookupOutcome.NOT_FOUND()
        return tl.LookupOutcome.FOUND(result_json=_to_json(found), external_id=None)

    def approval_preview(self, arguments_json):
        return None


async def _run_detached(fn: Callable[[], Any], call: LedgerCall) -> Any:
    """Runs ``fn`` (sync: in a worker thread; async: on this loop) with
    ``current_call()`` set."""

    def sync_run():
        token = _CURRENT.set(call)
        try:
            return fn()
        finally:
            _CURRENT.reset(token)

    if _is_async_callable(fn):
        token = _CURRENT.set(call)
        try:
            return await fn()
        finally:
            _CURRENT.reset(token)
    value = await asyncio.to_thread(sync_run)
    if inspect.isawaitable(value):
        token = _CURRENT.set(call)
        try:
            return await value
        finally:
            _CURRENT.reset(token)
    return value


def _is_async_callable(fn) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


class LedgerRuntime:
    """A ledger, its executor and the event loop thread the executor calls
    tools back on. One per process and ledger file; share it between the
    adapters.

    ``LedgerRuntime("app-ledger.db")`` opens (or creates) the file.
    """

    def __init__(
        self,
        ledger: Union[str, Any],
        *,
        executor_config: Any = None,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ):
        self.ledger = tl.Ledger.open(ledger, tl.LedgerConfig()) if isinstance(ledger, str) else ledger
        self.executor = tl.ToolExecutor(self.ledger, executor_config or tl.ExecutorConfig())
        self.call_timeout_s = call_timeout_s
        self._specs: dict[str, ToolSpec] = {}
        self._invocations: dict[str, _Invocation] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="toolledger-adapters", daemon=True)
        self._thread.start()
        tl.uniffi_set_event_loop(self._loop)

    # -- tools ------------------------------------------------------------

    def register(self, spec: ToolSpec) -> None:
        """Registers a tool (once per name; the same spec again is a no-op)."""
        known = self._specs.get(spec.name)
        if known is spec:
            return
        if known is not None:
            raise ValueError(f"a tool named {spec.name!r} is already registered")
        self.executor.register(_Handler(spec, self))
        self._specs[spec.name] = spec

    def spec(self, name: str) -> ToolSpec:
        return self._specs[name]

    # -- calls ------------------------------------------------------------

    def _submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(
        self,
        operation_id: str,
        round_: int,
        call_id: str,
        tool_name: str,
        arguments_json: str,
        body: Callable[[], Any],
        provider: Any = None,
    ) -> Completed:
        """Runs one call from synchronous code; ``body()`` (sync) runs the
        tool in this thread. Returns the result or raises."""
        spec = self._specs[tool_name]
        execution_id = execution_id_of(operation_id, round_, call_id, tool_name, spec.version)
        invocation = _Invocation(body, None)
        self._claim(execution_id, invocation)
        try:
            done = self._submit(self.executor.execute(operation_id, round_, self._tool_call(call_id, tool_name, arguments_json, provider)))
            done.add_done_callback(lambda _f: invocation.post(_Invocation.DONE))
            return outcome_to_result(invocation.serve_sync(done, self.call_timeout_s))
        except queue.Empty:
            raise TimeoutError(f"toolledger: no outcome for {execution_id} within {self.call_timeout_s} s") from None
        finally:
            self._release(execution_id, invocation)

    async def acall(
        self,
        operation_id: str,
        round_: int,
        call_id: str,
        tool_name: str,
        arguments_json: str,
        body: Callable[[], Awaitable[Any]],
        provider: Any = None,
    ) -> Completed:
        """Runs one call from async code; ``body()`` (a coroutine function,
        or a sync function) runs the tool in this task."""
        spec = self._specs[tool_name]
        execution_id = execution_id_of(operation_id, round_, call_id, tool_name, spec.version)
        loop = asyncio.get_running_loop()
        invocation = _Invocation(body, loop)
        self._claim(execution_id, invocation)
        try:
            done = self._submit(self.executor.execute(operation_id, round_, self._tool_call(call_id, tool_name, arguments_json, provider)))
            done.add_done_callback(lambda _f: invocation.post(_Invocation.DONE))
            return outcome_to_result(await invocation.serve_async(done, self.call_timeout_s))
        except asyncio.TimeoutError:
            raise TimeoutError(f"toolledger: no outcome for {execution_id} within {self.call_timeout_s} s") from None
        finally:
            self._release(execution_id, invocation)

    @staticmethod
    def _tool_call(call_id, tool_name, arguments_json, provider):
        return tl.ToolCall(
            provider=provider if provider is not None else tl.Provider.CUSTOM,
            call_id=call_id,
            tool_name=tool_name,
            arguments=arguments_json,
        )

    def _claim(self, execution_id: str, invocation: _Invocation) -> None:
        # Two callers in this process with one identity: the second is an
        # in-flight duplicate; the executor answers it, without running it.
        self._invocations.setdefault(execution_id, invocation)

    def _release(self, execution_id: str, invocation: _Invocation) -> None:
        if self._invocations.get(execution_id) is invocation:
            del self._invocations[execution_id]

    # -- start-up and shutdown ----------------------------------------------

    def recover(self):
        """``executor.recover()``: call once at start-up, after the tools are
        registered (reconciles calls a killed process left running)."""
        return self._submit(self.executor.recover()).result(timeout=self.call_timeout_s)

    def close(self) -> None:
        """Stops the loop thread (the ledger closes when collected)."""
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
