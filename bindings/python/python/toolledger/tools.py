"""Tools in plain Python: a small base class or a decorator.

A read-only tool is one method::

    class Weather(tl.Tool):
        name = "weather"
        read_only = True

        async def perform(self, request):
            return {"celsius": 21}

or one decorated function::

    @tl.tool(read_only=True)
    async def weather(request):
        return {"celsius": 21}

What `perform` returns is the result for the model, as a Python object (it
is stored as JSON). Return `Committed(result, external_id=...)` to record the
downstream's id too, or `JobStarted(job_id)` for a background job. Raise
`NotCommitted(reason, retryable=...)` when the downstream provably did not
commit (it refused, nothing was sent). Any other exception means "may have
happened": the call becomes an unknown outcome and the executor reconciles
it (through `lookup`, or a resend under the same key), never a blind resend.

`lookup` (optional) finds the effect of an earlier attempt by
`request.downstream_key`: return the result (or `Committed`) when found,
`None` when provably absent. A tool without `lookup` declares none.

`perform` and `lookup` may be `async def` (run on the event loop of the app
call that started the work) or plain `def` (run in a worker thread).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import _loop
from ._native import toolledger as _ffi
from .errors import NoEventLoop
from .outcomes import redacted_repr

log = logging.getLogger("toolledger")


@dataclass(frozen=True)
class ToolRequest:
    """One attempt (or one lookup) of one execution. Printed, it shows ids,
    tool and attempt and the arguments' size only."""

    def __repr__(self) -> str:
        return redacted_repr(self, {"arguments_json", "external_id"})

    execution_id: str
    #: The idempotency key to send downstream (the same on every attempt).
    downstream_key: str
    tool_name: str
    #: The arguments as the model sent them (for a batch item: the item).
    arguments_json: str
    #: Attempt number, from 1.
    attempt: int
    #: The batch item index, for independent batches.
    item_index: Optional[int] = None
    #: The downstream's id for the effect, if an earlier attempt learnt it.
    external_id: Optional[str] = None

    @property
    def arguments(self) -> Any:
        """The arguments as a Python object."""
        return json.loads(self.arguments_json)

    @classmethod
    def _from_ffi(cls, request: Any) -> "ToolRequest":
        # Every call's path: the fields set in one step (what the frozen
        # dataclass's __init__ does one `object.__setattr__` at a time).
        made = object.__new__(cls)
        made.__dict__.update(
            execution_id=request.execution_id,
            downstream_key=request.downstream_key,
            tool_name=request.tool_name,
            arguments_json=request.arguments_json,
            attempt=request.attempt,
            item_index=request.item_index,
            external_id=request.external_id,
        )
        return made


@dataclass(frozen=True)
class Committed:
    """A result with the downstream's id for the effect. `result` is any
    JSON-serializable object; `result_json` (exact JSON text) wins over it
    when given."""

    result: Any = None
    external_id: Optional[str] = None
    result_json: Optional[str] = None

    def __repr__(self) -> str:
        return redacted_repr(self, {"result", "external_id", "result_json"})

    def _json(self) -> str:
        if self.result_json is not None:
            return self.result_json
        return json.dumps(self.result, separators=(",", ":"))


@dataclass(frozen=True)
class JobStarted:
    """The downstream accepted a background job; its result arrives later."""

    job_id: str

    def __repr__(self) -> str:
        return redacted_repr(self, {"job_id"})


class NotCommitted(Exception):
    """Raise from `perform` when the downstream provably did not commit
    (refused, validation error, never sent). `retryable`: whether trying
    again may succeed. Keep argument values out of `reason`: it is stored."""

    def __init__(self, reason: str, retryable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Tool:
    """Base class of a tool: set `name` (default: the class name in
    snake_case) and implement `perform`. Everything else has a default."""

    #: The name the model calls the tool by.
    name: str = ""
    #: Contract version: part of the call's identity and digest.
    version: int = 1
    #: No durable side effect (weather, search): nothing is recorded.
    read_only: bool = False
    #: The downstream deduplicates requests by `request.downstream_key`.
    idempotency_key: bool = False
    #: A human must approve the exact arguments first.
    requires_approval: bool = False
    #: The arguments hold an `items` array; each item commits on its own.
    independent_items: bool = False
    #: Seconds after an unknown outcome during which a request already sent
    #: may still land downstream (None: the library's default, 120 s).
    landing_window: Optional[float] = None

    async def perform(self, request: ToolRequest) -> Any:
        """Runs one attempt; returns the result for the model."""
        raise NotImplementedError(f"{type(self).__name__}.perform")

    async def lookup(self, request: ToolRequest) -> Any:
        """Finds the effect of an earlier attempt: the result, or None when
        provably absent. Override it to declare a lookup."""
        raise NotImplementedError

    def approval_preview(self, arguments: Any) -> Any:
        """What an approver sees for these arguments (a JSON-serializable
        object), or None."""
        return None

    # --- what the executor reads ----------------------------------------------

    def _tool_name(self) -> str:
        return self.name or _snake(type(self).__name__)

    def _has_lookup(self) -> bool:
        return type(self).lookup is not Tool.lookup

    def _descriptor(self) -> Any:
        extra = {}
        if self.landing_window is not None:
            extra["landing_window_ms"] = int(round(self.landing_window * 1000))
        return _ffi.ToolDescriptor(
            name=self._tool_name(),
            version=self.version,
            effect=_ffi.EffectClass.READ_ONLY if self.read_only else _ffi.EffectClass.SIDE_EFFECT,
            batch=_ffi.BatchMode.INDEPENDENT if self.independent_items else _ffi.BatchMode.ATOMIC,
            idempotency_key=self.idempotency_key,
            lookup=self._has_lookup(),
            requires_approval=self.requires_approval,
            **extra,
        )


class FunctionTool(Tool):
    """A tool made by `@tool` from a function (and optional lookup and
    preview functions)."""

    def __init__(
        self,
        perform: Callable[..., Any],
        *,
        name: str,
        lookup: Optional[Callable[..., Any]] = None,
        approval_preview: Optional[Callable[..., Any]] = None,
        **settings: Any,
    ) -> None:
        self.name = name
        self._perform = perform
        self._lookup = lookup
        self._preview = approval_preview
        for key, value in settings.items():
            if not hasattr(Tool, key) or callable(getattr(Tool, key)):
                raise TypeError(f"tool(): unknown setting {key!r}")
            setattr(self, key, value)
        self.__doc__ = perform.__doc__
        self.__wrapped__ = perform

    def perform(self, request: ToolRequest) -> Any:  # type: ignore[override]
        return self._perform(request)

    def lookup(self, request: ToolRequest) -> Any:  # type: ignore[override]
        if self._lookup is None:
            raise NotImplementedError
        return self._lookup(request)

    def approval_preview(self, arguments: Any) -> Any:
        return None if self._preview is None else self._preview(arguments)

    def _has_lookup(self) -> bool:
        return self._lookup is not None

    def _is_async(self, which: str) -> bool:
        fn = self._perform if which == "perform" else self._lookup
        return inspect.iscoroutinefunction(fn)

    def __call__(self, request: ToolRequest) -> Any:
        """Calls the decorated function itself (for tests)."""
        return self._perform(request)


def tool(
    fn: Optional[Callable[..., Any]] = None,
    *,
    name: Optional[str] = None,
    version: int = 1,
    read_only: bool = False,
    idempotency_key: bool = False,
    requires_approval: bool = False,
    independent_items: bool = False,
    landing_window: Optional[float] = None,
    lookup: Optional[Callable[..., Any]] = None,
    approval_preview: Optional[Callable[..., Any]] = None,
) -> Any:
    """Makes a tool of a function `(request) -> result`, `async` or not.

    Use it bare (`@tool`: the name is the function's) or with settings
    (`@tool(name="send_email", idempotency_key=True, lookup=find_email)`);
    the settings are `Tool`'s attributes.
    """

    def make(perform: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(
            perform,
            name=name or perform.__name__,
            lookup=lookup,
            approval_preview=approval_preview,
            version=version,
            read_only=read_only,
            idempotency_key=idempotency_key,
            requires_approval=requires_approval,
            independent_items=independent_items,
            landing_window=landing_window,
        )

    return make(fn) if fn is not None else make


# --- the adapter the library calls ------------------------------------------------


def _is_async(tool_: Tool, which: str) -> bool:
    if isinstance(tool_, FunctionTool):
        return tool_._is_async(which)
    return inspect.iscoroutinefunction(getattr(tool_, which))


class Adapter(_ffi.ToolHandler):
    """The generated `ToolHandler` over a `Tool`: runs it where the app's
    coroutines run and turns what it returns or raises into the library's
    outcomes. `app_loop()` names the loop of the app call that started the
    work (kept by the `Executor`)."""

    def __init__(self, tool_: Tool, app_loop: Callable[[], Optional[asyncio.AbstractEventLoop]]):
        self.tool = tool_
        self._app_loop = app_loop
        self._descriptor_value = tool_._descriptor()

    def descriptor(self) -> Any:
        return self._descriptor_value

    async def _run(self, which: str, request: ToolRequest) -> Any:
        method = getattr(self.tool, which)
        if _is_async(self.tool, which):
            loop = self._app_loop()
            if not _loop.usable(loop):
                raise NoEventLoop(
                    f"{self.tool._tool_name()}.{which} is async, but the event loop of the "
                    "call that started this work is closed or not running: the tool did not run"
                )
            return await _on(loop, method(request))  # type: ignore[arg-type]
        value = await asyncio.get_running_loop().run_in_executor(None, method, request)
        if inspect.isawaitable(value):
            loop = self._app_loop()
            if not _loop.usable(loop):
                raise NoEventLoop(f"{self.tool._tool_name()}.{which} returned an awaitable, "
                                  "but no event loop is running to await it")
            value = await _on(loop, _await(value))  # type: ignore[arg-type]
        return value

    async def perform(self, request: Any) -> Any:
        name = self.tool._tool_name()
        try:
            value = await self._run("perform", ToolRequest._from_ffi(request))
        except NoEventLoop as e:
            # The tool never ran: provably not committed.
            log.error("%s", e)
            return _ffi.PerformOutcome.FAILED_BEFORE_COMMIT(reason=str(e), retryable=True)
        except _loop.TOOL_RAISED as e:  # classified: refused, or "may have happened"
            return outcome_of_error(name, e)
        return outcome_of_value(name, value)

    async def lookup(self, request: Any) -> Any:
        if not self.tool._has_lookup():
            return _ffi.LookupOutcome.UNSUPPORTED()
        try:
            value = await self._run("lookup", ToolRequest._from_ffi(request))
        except _loop.TOOL_RAISED as e:  # a failed lookup leaves the outcome unknown
            name = self.tool._tool_name()
            log.warning("lookup of tool %s raised %s", name, type(e).__name__)
            raise _ffi.ToolCallError.Tool(f"{type(e).__name__} raised by the lookup") from None
        return found_of_value(value)

    def approval_preview(self, arguments_json: str) -> Optional[str]:
        preview = self.tool.approval_preview(json.loads(arguments_json))
        return None if preview is None else json.dumps(preview, separators=(",", ":"))


def outcome_of_value(name: str, value: Any) -> Any:
    """The library's `PerformOutcome` for what a tool's `perform` returned."""
    if isinstance(value, JobStarted):
        return _ffi.PerformOutcome.JOB_STARTED(job_id=value.job_id)
    external_id = None
    try:
        if isinstance(value, Committed):
            text = value._json()
            external_id = value.external_id
        else:  # a plain value: what `Committed(value)._json()` gives
            text = _dumps(value)
    except (TypeError, ValueError) as e:
        log.error("tool %s returned a result that is not JSON: %s", name, type(e).__name__)
        return _ffi.PerformOutcome.UNKNOWN(reason="the tool's result is not JSON-serializable")
    return _ffi.PerformOutcome.COMMITTED(result_json=text, external_id=external_id)


_dumps = json.JSONEncoder(separators=(",", ":")).encode


def outcome_of_error(name: str, error: Exception) -> Any:
    """The library's `PerformOutcome` for an exception a tool's `perform`
    raised: `NotCommitted` is a refusal; anything else "may have happened"."""
    if isinstance(error, NotCommitted):
        return _ffi.PerformOutcome.FAILED_BEFORE_COMMIT(reason=error.reason, retryable=error.retryable)
    # The type only: an exception's text and traceback (its frames'
    # arguments) may hold the call's values.
    log.warning("tool %s raised %s: outcome unknown", name, type(error).__name__)
    # "tool error" first: the ledger classifies the reason as TOOL_ERROR
    # (what observers and logs see), as for a ToolCallError in the callback path.
    return _ffi.PerformOutcome.UNKNOWN(reason=f"tool error: {type(error).__name__} raised by the tool")


def found_of_value(value: Any) -> Any:
    """The library's `LookupOutcome` for what a tool's `lookup` returned."""
    if value is None:
        return _ffi.LookupOutcome.NOT_FOUND()
    committed = value if isinstance(value, Committed) else Committed(value)
    return _ffi.LookupOutcome.FOUND(result_json=committed._json(), external_id=committed.external_id)


async def _await(awaitable: Any) -> Any:
    return await awaitable


class ToolInterrupted(Exception):
    """The tool's coroutine was cancelled on the app's loop (the loop shut
    down, or app code cancelled it): it may have done its effect."""


async def _on(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    """Runs `coro` on `loop` (another thread's) and waits for it here.

    If the app's side cancels it, that is `ToolInterrupted` (an unknown
    outcome at once, not a wait for the perform timeout). If this side is
    cancelled (the library dropped the call), the app's task is cancelled
    too.
    """
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    wrapped = asyncio.wrap_future(future)
    try:
        return await asyncio.shield(wrapped)
    except asyncio.CancelledError:
        if wrapped.cancelled() or future.cancelled():
            raise ToolInterrupted("the tool's task was cancelled on its event loop") from None
        future.cancel()
        raise
