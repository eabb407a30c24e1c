"""`Ledger` and `Executor`: the library's objects with Python manners.

* `Ledger.open(path, **config)` is a context manager (`with` and
  `async with`); `close()` lets the database go (see `Ledger.close`).
* Every `Ledger` method is a short SQLite transaction that blocks until it
  is durable. Each one has an awaitable twin with an `a` prefix
  (`await ledger.arecover()`, `await ledger.aget(id)`) that runs it in a
  worker thread, so an event loop never waits on the disk.
* `Executor`'s protocol methods are coroutines (`await executor.execute(...)`);
  tools run on the event loop that awaits them, found automatically.
* Outcomes are the dataclasses of `toolledger.outcomes`; every error is a
  `toolledger.Error`.

The step API (`begin`, `commit`, ...) takes and returns the generated
records (`Ticket`, `Begin`, `CallSpec`, ...), documented in the library.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import weakref
from typing import Any, Iterable, List, Optional

from . import outcomes
from ._native import toolledger as _ffi
from .errors import InvalidInput, LedgerClosed, translated
from .tools import Adapter, Tool

# The Ledger methods, forwarded as they are (errors translated), each with an
# awaitable `a`-prefixed twin.
_LEDGER_METHODS = (
    "session_id",
    "begin_round",
    "begin",
    "approve",
    "reject",
    "mark_executing",
    "record_external_id",
    "unknown_for_ms",
    "owns",
    "commit",
    "fail_before_commit",
    "mark_outcome_unknown",
    "resolve_unknown",
    "mark_delivered",
    "cancel",
    "cancel_operation",
    "complete_operation",
    "compensate",
    "get",
    "list",
    "compensations",
    "operation_status",
    "operations",
    "transitions",
    "stats",
    "recover",
    "suspend",
    "resume",
)


class ToolCall(_ffi.ToolCall):
    """One tool call, built by the app: `ToolCall("call_1", "send_email",
    {"to": "a@example.com"})`. `arguments` may be a Python object (encoded as
    compact JSON) or JSON text, kept as given. Calls parsed from a provider's
    response (`parse_tool_calls`) are the library's `ToolCall`s and can be
    passed wherever this one is."""

    def __init__(
        self,
        call_id: str,
        tool_name: str,
        arguments: Any = None,
        *,
        provider: Any = _ffi.Provider.CUSTOM,
        position: int = 0,
        call_id_derived: bool = False,
    ) -> None:
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, separators=(",", ":"))
        super().__init__(
            provider=provider,
            call_id=call_id,
            tool_name=tool_name,
            arguments=arguments,
            position=position,
            call_id_derived=call_id_derived,
        )

    def __repr__(self) -> str:
        # No argument values: they may be personal data.
        return f"ToolCall(call_id={self.call_id!r}, tool_name={self.tool_name!r})"


def _config(cls: Any, config: Any, settings: dict) -> Any:
    if config is not None and settings:
        raise TypeError("pass either a config object or keyword settings, not both")
    if config is not None:
        return config
    try:
        return cls(**settings)
    except TypeError as e:
        raise InvalidInput(f"{cls.__name__}: {e}") from None


class Ledger:
    """The durable execution ledger: one SQLite file.

    Open it with `Ledger.open(path)`, once per file per process, and close it
    with `close()` or a `with` block. Settings are `LedgerConfig`'s fields as
    keywords (`lease_ms`, `busy_timeout_ms`, ...) or a `LedgerConfig`.
    """

    def __init__(self, native: Any) -> None:
        """Wraps an open generated `Ledger` (use `Ledger.open`)."""
        self._native: Optional[Any] = native
        self._executors: "weakref.WeakSet[Executor]" = weakref.WeakSet()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Any, config: Any = None, **settings: Any) -> "Ledger":
        """Opens (creating if needed) the ledger at `path` (str or path-like).

        Raises `StorageError` for a file that is not a database, a corrupt
        file, a newer schema or an unusable path; the file is never modified
        then.
        """
        cfg = _config(_ffi.LedgerConfig, config, settings)
        with translated():
            return cls(_ffi.Ledger.open(str(path), cfg))

    @classmethod
    async def aopen(cls, path: Any, config: Any = None, **settings: Any) -> "Ledger":
        """`open` in a worker thread."""
        return await asyncio.to_thread(cls.open, path, config, **settings)

    @property
    def native(self) -> Any:
        """The generated `Ledger` underneath (raises `LedgerClosed` after `close`)."""
        native = self._native
        if native is None:
            raise LedgerClosed("the ledger is closed")
        return native

    @property
    def closed(self) -> bool:
        """True after `close()`."""
        return self._native is None

    def close(self) -> None:
        """Lets the database go: this object and the `Executor`s over it
        drop their references, and the library closes the file and releases
        its session lock once nothing else uses it. A tool call still running
        inside the library keeps it open until it ends (its outcome is
        recorded). Closing twice is harmless. Every later call raises
        `LedgerClosed`."""
        with self._lock:
            executors = list(self._executors)
            self._executors.clear()
            self._native = None
        for executor in executors:
            executor._drop()

    async def aclose(self) -> None:
        """`close` in a worker thread (the last reference closes the file)."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "Ledger":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<toolledger.Ledger {'closed' if self.closed else 'open'}>"

    def _attach(self, executor: "Executor") -> Any:
        with self._lock:
            native = self.native
            self._executors.add(executor)
            return native


def _forward(name: str) -> Any:
    target = getattr(_ffi.Ledger, name)

    @functools.wraps(target)
    def method(self: Ledger, *args: Any, **kwargs: Any) -> Any:
        with translated():
            return getattr(self.native, name)(*args, **kwargs)

    @functools.wraps(target)
    async def amethod(self: Ledger, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(method, self, *args, **kwargs)

    amethod.__name__ = amethod.__qualname__ = "a" + name
    amethod.__doc__ = f"`{name}` in a worker thread (awaitable).\n\n{target.__doc__ or ''}"
    return method, amethod


for _name in _LEDGER_METHODS:
    _m, _am = _forward(_name)
    setattr(Ledger, _name, _m)
    setattr(Ledger, "a" + _name, _am)
del _name, _m, _am


class Executor:
    """Runs registered tools under the effectively-once protocol.

    `Executor(ledger, tools=[...], **settings)`: settings are
    `ExecutorConfig`'s fields as keywords (`perform_timeout_ms`,
    `max_attempts`, ...) or an `ExecutorConfig`. The protocol methods are
    coroutines; a tool's `async` methods run on the event loop that awaits
    them. Raw generated `ToolHandler`s can be registered too.
    """

    def __init__(
        self, ledger: Ledger, tools: Iterable[Any] = (), config: Any = None, **settings: Any
    ) -> None:
        cfg = _config(_ffi.ExecutorConfig, config, settings)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ledger = ledger
        with translated():
            self._native: Optional[Any] = _ffi.ToolExecutor(ledger._attach(self), cfg)
        for t in tools:
            self.register(t)

    def _drop(self) -> None:
        self._native = None

    @property
    def native(self) -> Any:
        """The generated `ToolExecutor` underneath."""
        native = self._native
        if native is None:
            raise LedgerClosed("the ledger under this executor is closed")
        return native

    def _app_loop(self) -> Optional[asyncio.AbstractEventLoop]:
        return self._loop

    def _enter(self) -> Any:
        # The loop awaiting this call is where the tools' coroutines run.
        self._loop = asyncio.get_running_loop()
        return self.native

    def register(self, tool: Any) -> None:
        """Registers a `Tool` (or a `@tool` function, or a generated
        `ToolHandler`). Raises `InvalidInput` for a name registered twice."""
        handler = Adapter(tool, self._app_loop) if isinstance(tool, Tool) else tool
        with translated():
            self.native.register(handler)

    async def execute(self, operation_id: str, round: int, call: Any) -> outcomes.CallOutcome:
        """Runs one tool call: replays a stored result, asks for approval, or
        runs the tool with a durable intent first and a durable result after."""
        native = self._enter()
        with translated():
            return outcomes.from_ffi(await native.execute(operation_id, round, call))

    async def execute_round(
        self, operation_id: str, round: int, calls: List[Any]
    ) -> List[outcomes.CallOutcome]:
        """Runs every call of one model response (one durable begin, run in
        parallel); outcomes in call order."""
        native = self._enter()
        with translated():
            return [outcomes.from_ffi(o) for o in await native.execute_round(operation_id, round, calls)]

    async def approve(
        self, execution_id: str, args_digest: str, preview: Any = None
    ) -> outcomes.CallOutcome:
        """Approves a waiting call for exactly `args_digest` and runs it.
        `preview` (a Python object) records what the human saw."""
        native = self._enter()
        preview_json = None if preview is None else json.dumps(preview, separators=(",", ":"))
        with translated():
            return outcomes.from_ffi(await native.approve(execution_id, args_digest, preview_json))

    async def run_existing(self, execution_id: str) -> outcomes.CallOutcome:
        """Runs an execution that may run now, or reports where it stands."""
        native = self._enter()
        with translated():
            return outcomes.from_ffi(await native.run_existing(execution_id))

    async def recover(self) -> outcomes.Recovery:
        """At start-up (after registering every tool) and after `resume`:
        reconciles what a dead process left and hands back what the model
        has not seen."""
        native = self._enter()
        with translated():
            return outcomes.recovery_from_ffi(await native.recover())

    async def resolve_unknown(
        self, execution_id: str, attempt: int, resolution: Any
    ) -> outcomes.CallOutcome:
        """Settles an unknown outcome of `attempt` (a `Resolution`)."""
        native = self._enter()
        with translated():
            return outcomes.from_ffi(await native.resolve_unknown(execution_id, attempt, resolution))

    async def compensate(
        self, original: str, operation_id: str, round: int, call: Any
    ) -> outcomes.CallOutcome:
        """Runs a compensation (a refund) of the committed `original`."""
        native = self._enter()
        with translated():
            return outcomes.from_ffi(await native.compensate(original, operation_id, round, call))

    def metrics(self) -> Any:
        """Counters and latency figures so far (`MetricsSnapshot`)."""
        return self.native.metrics()

    def cancel_operation(self, operation_id: str) -> Any:
        """Cancels an operation (`OperationStatus`)."""
        with translated():
            return self.native.cancel_operation(operation_id)

    def ingest_webhook(self, source: str, event_id: str, execution_id: str, update: Any) -> Any:
        """Applies a webhook event to its execution exactly once."""
        with translated():
            return self.native.ingest_webhook(source, event_id, execution_id, update)

    def record_job_update(self, execution_id: str, update: Any) -> Any:
        """Applies a background job's state obtained by polling."""
        with translated():
            return self.native.record_job_update(execution_id, update)


