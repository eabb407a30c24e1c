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
the library's caller-driven steps (``toolledger._driven``), all on the
caller's thread (or in its task), with no hop to the library's threads:

1. ``start``: the durable intent (or, at once, a replay, ``InFlight`` for a
   call another caller is running, an unknown outcome ...).
2. The caller runs the tool (``body()``) with ``current_call()`` set and
   reports what it did (``report``: the durable result). A new call's
   attempt is run and reported right there; whatever that report answers
   other than a finished call goes through ``toolledger._driven``'s walk:
   after an unknown outcome the library asks for a lookup (run the same
   way, so it can use the caller's connection: an MCP session) or a
   same-key resend.
3. The caller returns the ``toolledger.Completed`` (run now or replayed) or
   raises :class:`OutcomeUnknown` / :class:`CallNotExecuted`.

A call the executor runs with no caller (``executor.recover()`` at start-up
resending under the same key) runs ``ToolSpec.run(args)`` on the package's
loop thread (async) or a worker thread (sync), with no framework context.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import inspect
import json
import logging
import unicodedata
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Union

import toolledger as tl
from toolledger import _driven
from toolledger import ffi as _ffi
from toolledger import outcomes as _outcomes
from toolledger._loop import TOOL_RAISED as _TOOL_RAISED
from toolledger._loop import bridge_loop as _bridge_loop
from toolledger.errors import translate as _translate

log = logging.getLogger("toolledger.adapters")

# Kept for callers that passed it: a call now runs on the caller's own
# thread, so there is no hand-over to wait for (see LedgerRuntime).
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


# ``json.dumps(value, separators=(",", ":"))``, without building a new
# encoder for every call (what ``json.dumps`` does for any non-default
# option). The same text.
_json = json.JSONEncoder(separators=(",", ":")).encode

# The errors of the generated module, re-raised as ``toolledger.Error``s
# (what ``toolledger.errors.translated()`` does, without a context manager
# per call).
_LIBRARY_ERRORS = (_ffi.LedgerError, _ffi.InternalError)


_PERFORM_STEP = _ffi.CallerStep.PERFORM


def _request(native: Any) -> tl.ToolRequest:
    return tl.ToolRequest._from_ffi(native)


_TOO_LARGE = "result too large to store"


def _too_large(stored: Any) -> bool:
    """The marker the library commits in place of a result larger than it
    stores (``{"toolledger_error": "result too large to store", "bytes": N}``):
    the call ran and is committed, its result is not kept."""
    return type(stored) is dict and stored.get("toolledger_error") == _TOO_LARGE


def _recorded_text(result_json: str) -> str:
    """The JSON text an adapter recorded for a result whose stored form is
    always an object (LangGraph's and MCP's). The library keeps a recorded
    text that is not JSON by its rules (the escape of a lone surrogate,
    ``NaN`` or ``Infinity``, nesting past its depth limit) as a JSON string
    of that text, so such a result comes back as a string: the recorded text
    is inside, and Python's ``json`` reads it."""
    if result_json[:1] == '"':
        return json.loads(result_json)
    return result_json


class _JsonText(str):
    """A tool's value already serialised to JSON text by the adapter (which
    keeps the text, to recognise its own result in the call's outcome):
    recorded as it is."""

    __slots__ = ()


def _performed(name: str, value: Any) -> Any:
    """The library's ``PerformOutcome`` for what a wrapped tool returned."""
    if type(value) is _JsonText:
        return _ffi.PerformOutcome.COMMITTED(result_json=str(value), external_id=None)
    try:
        text = _json(value)
    except (TypeError, ValueError) as e:
        log.error("tool %s returned a result that is not JSON: %s", name, type(e).__name__)
        return _ffi.PerformOutcome.UNKNOWN(reason="the tool's result is not JSON-serializable")
    return _ffi.PerformOutcome.COMMITTED(result_json=text, external_id=None)


def _raised(name: str, e: BaseException) -> Any:
    """The library's ``PerformOutcome`` for an exception a wrapped tool raised."""
    if isinstance(e, tl.NotCommitted):
        return _ffi.PerformOutcome.FAILED_BEFORE_COMMIT(reason=e.reason, retryable=e.retryable)
    log.warning("tool %s raised %s: outcome unknown", name, type(e).__name__)
    # Its type only, after "tool error": recorded unknown with reason kind
    # TOOL_ERROR, which observers and logs see.
    return _ffi.PerformOutcome.UNKNOWN(reason=f"tool error: {type(e).__name__} raised by the tool")


def _found(value: Any) -> Any:
    if value is None:
        return _ffi.LookupOutcome.NOT_FOUND()
    return _ffi.LookupOutcome.FOUND(result_json=_json(value), external_id=None)


class _Handler(_ffi.ToolHandler):
    """The executor's view of one wrapped tool."""

    def __init__(self, spec: ToolSpec, runtime: "LedgerRuntime"):
        self.spec = spec
        self.runtime = runtime
        self._descriptor = spec.descriptor()

    def descriptor(self) -> Any:
        return self._descriptor

    async def perform(self, native: Any) -> Any:
        # Only calls with no caller in this process come here (``recover``).
        request = _request(native)
        try:
            value = await self.runtime._run_detached(lambda: self.spec.run(request.arguments), request)
        except _TOOL_RAISED as e:  # it may have happened: unknown, never failed
            return _raised(self.spec.name, e)
        return _performed(self.spec.name, value)

    async def lookup(self, native: Any) -> Any:
        lookup = self.spec.lookup
        if lookup is None:
            return _ffi.LookupOutcome.UNSUPPORTED()
        request = _request(native)
        try:
            found = await self.runtime._run_detached(lambda: lookup(request.arguments, request), request)
        except _TOOL_RAISED as e:  # a failed lookup leaves the outcome unknown
            log.warning("lookup of tool %s raised %s", self.spec.name, type(e).__name__)
            raise _ffi.ToolCallError.Tool(f"{type(e).__name__} raised by the lookup") from None
        return _found(found)

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
        # ``call_timeout_s`` is accepted and unused: calls run on the
        # caller's thread, with the tool's own deadlines.
        self._owns_ledger = not isinstance(ledger, tl.Ledger)
        self.ledger = tl.Ledger.open(ledger) if self._owns_ledger else ledger
        self.executor = tl.Executor(self.ledger, **executor_settings)
        self.call_timeout_s = call_timeout_s
        self._specs: dict[str, ToolSpec] = {}

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
        thread, if the ledger runs it. Returns the result or raises."""
        spec = self._specs[tool_name]

        def perform(request: Any) -> Any:
            token = _CURRENT.set(_request(request))
            try:
                value = body()
            except Exception as e:  # noqa: BLE001 - classified: refused, or "may have happened"
                if _driven.CONTROL_FLOW and isinstance(e, _driven.CONTROL_FLOW):
                    raise  # reported by the walk as not committed
                return _raised(spec.name, e)
            finally:
                _CURRENT.reset(token)
            return _performed(spec.name, value)

        def lookup(request: Any) -> Any:
            if spec.lookup is None:
                return _ffi.LookupOutcome.UNSUPPORTED()
            req = _request(request)
            token = _CURRENT.set(req)
            try:
                found = spec.lookup(req.arguments, req)
                if inspect.isawaitable(found):
                    found = asyncio.run_coroutine_threadsafe(_awaited(found), self._sync_loop()).result()
            finally:
                _CURRENT.reset(token)
            return _found(found)

        try:
            # One native call per step (toolledger._direct); a replay comes
            # back from `begin` already as its outcome.
            steps = self.executor._driven_steps()
            step = steps.begin(operation_id, round_, tl.ToolCall(call_id, tool_name, arguments_json))
            if type(step) is _PERFORM_STEP and not step.attempt.read_only:
                # A new call's attempt: run and reported here (see `acall`).
                step = self._first_attempt_sync(steps, step.attempt, spec.name, body)
            if not isinstance(step, tl.CallOutcome):
                step = _driven.run(steps, step, perform, lookup)
        except _LIBRARY_ERRORS as e:
            raise _translate(e) from e
        return result_of(_outcomes.from_ffi(step))

    async def acall(self, operation_id: str, round_: int, call_id: str, tool_name: str, arguments_json: str,
                    body: Callable[[], Awaitable[Any]]) -> tl.Completed:
        """One call from async code: ``body()`` (``async``, or plain) runs
        the tool in this task, if the ledger runs it."""
        spec = self._specs[tool_name]

        async def perform(request: Any) -> Any:
            token = _CURRENT.set(_request(request))
            try:
                value = body()
                if inspect.isawaitable(value):
                    value = await value
            except Exception as e:  # noqa: BLE001 - classified: refused, or "may have happened"
                if _driven.CONTROL_FLOW and isinstance(e, _driven.CONTROL_FLOW):
                    raise  # reported by the walk as not committed
                return _raised(spec.name, e)
            finally:
                _CURRENT.reset(token)
            return _performed(spec.name, value)

        async def lookup(request: Any) -> Any:
            if spec.lookup is None:
                return _ffi.LookupOutcome.UNSUPPORTED()
            req = _request(request)
            token = _CURRENT.set(req)
            try:
                found = spec.lookup(req.arguments, req)
                if inspect.isawaitable(found):
                    found = await found
            finally:
                _CURRENT.reset(token)
            return _found(found)

        try:
            steps = self.executor._driven_steps()
            step = steps.begin(operation_id, round_, tl.ToolCall(call_id, tool_name, arguments_json))
            if type(step) is _PERFORM_STEP and not step.attempt.read_only:
                # A new call's attempt (every new call's path): the tool runs
                # in this task and its outcome is reported here, as
                # `_driven.arun` does for this step, without its walk; any
                # other answer of the report goes on through the walk.
                step = await self._first_attempt(steps, step.attempt, spec.name, body)
            if not isinstance(step, tl.CallOutcome):
                step = await _driven.arun(steps, step, perform, lookup)
        except _LIBRARY_ERRORS as e:
            raise _translate(e) from e
        return result_of(_outcomes.from_ffi(step))

    @staticmethod
    async def _first_attempt(steps: Any, attempt: Any, name: str, body: Callable[[], Any]) -> Any:
        """Runs ``body()`` for a side-effecting ``Perform`` attempt and
        reports what it did by its fencing token: ``perform`` and the
        report of ``_driven.arun`` in one step (an interruption is reported
        as an unknown outcome before it goes on, as there)."""
        request = attempt.request
        # The outer handler is `_driven.arun`'s around `perform`: whatever
        # escapes — an interruption, or an error while the outcome is
        # classified (a result the encoder gives up on) — is reported unknown
        # before it goes on, never left in flight.
        try:
            token = _CURRENT.set(_request(request))
            try:
                value = body()
                if inspect.isawaitable(value):
                    value = await value
            except Exception as e:  # noqa: BLE001 - classified: refused, or "may have happened"
                _CURRENT.reset(token)
                if _driven.CONTROL_FLOW and isinstance(e, _driven.CONTROL_FLOW):
                    raise  # the framework's control flow: reported below, re-raised
                outcome = _raised(name, e)
            except BaseException:
                _CURRENT.reset(token)
                raise
            else:
                _CURRENT.reset(token)
                outcome = _performed(name, value)
        except BaseException as e:
            _driven._report_raised(steps, attempt, e)
            raise
        return steps.settle_attempt(request.execution_id, request.attempt, outcome)

    @staticmethod
    def _first_attempt_sync(steps: Any, attempt: Any, name: str, body: Callable[[], Any]) -> Any:
        """:meth:`_first_attempt` for a synchronous ``body()``: ``perform``
        and the report of ``_driven.run`` in one step."""
        request = attempt.request
        try:  # as in `_first_attempt`: nothing escapes unreported
            token = _CURRENT.set(_request(request))
            try:
                value = body()
            except Exception as e:  # noqa: BLE001 - classified: refused, or "may have happened"
                _CURRENT.reset(token)
                if _driven.CONTROL_FLOW and isinstance(e, _driven.CONTROL_FLOW):
                    raise  # the framework's control flow: reported below, re-raised
                outcome = _raised(name, e)
            except BaseException:
                _CURRENT.reset(token)
                raise
            else:
                _CURRENT.reset(token)
                outcome = _performed(name, value)
        except BaseException as e:
            _driven._report_raised(steps, attempt, e)
            raise
        return steps.settle_attempt(request.execution_id, request.attempt, outcome)

    def _sync_loop(self) -> asyncio.AbstractEventLoop:
        # The package's bridge loop: where a coroutine runs for a caller (or
        # a callback) that has no loop of its own.
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


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
