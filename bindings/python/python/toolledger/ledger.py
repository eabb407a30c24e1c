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
import inspect
import json
import threading
import types
import weakref
from typing import Any, Iterable, List, Optional

from . import _direct, _driven, events, outcomes
from ._native import toolledger as _ffi
from .errors import InvalidInput, LedgerClosed, translate, translated
from .tools import (
    Adapter,
    Tool,
    ToolRequest,
    _is_async,
    found_of_value,
    outcome_of_error,
    outcome_of_value,
)

# `asyncio.timeout_at` (3.11+) bounds a coroutine without a task of its own.
_timeout_at = getattr(asyncio, "timeout_at", None)

# The Ledger methods, forwarded as they are (errors translated), each with an
# awaitable `a`-prefixed twin.
_LEDGER_METHODS = (
    "sync",
    "has_unsynced_commits",
    "session_id",
    "is_encrypted",
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


def generate_ledger_key() -> bytes:
    """A new random 32-byte key from the operating system's generator. Store
    it where the app keeps secrets before opening a ledger with it."""
    with translated():
        return bytes(_ffi.generate_ledger_key())


def encrypt_ledger(path: Any, key: bytes, config: Any = None, **settings: Any) -> None:
    """Encrypts the plain ledger at `path` under `key`, in place (every value
    sealed, every digest keyed). Call it once, while no other process has
    the ledger open, then open it with `Ledger.open(path, key=key)`. Raises
    `StorageError` (`IN_USE`, `KEY_REQUIRED` if already encrypted, ...); the
    ledger is left as it was then."""
    cfg = _config(_ffi.LedgerConfig, config, settings)
    with translated():
        _ffi.encrypt_ledger(str(path), cfg, bytes(key))


def rotate_ledger_key(
    path: Any, old_key: bytes, new_key: bytes, config: Any = None, **settings: Any
) -> None:
    """Re-keys the encrypted ledger at `path`: afterwards only `new_key`
    opens it. Needs the ledger alone, like `encrypt_ledger`. Raises
    `StorageError` (`WRONG_KEY` for a wrong `old_key`, ...); the ledger stays
    under the old key then."""
    cfg = _config(_ffi.LedgerConfig, config, settings)
    with translated():
        _ffi.rotate_ledger_key(str(path), cfg, bytes(old_key), bytes(new_key))


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
    def open(
        cls, path: Any, config: Any = None, *, key: Optional[bytes] = None, **settings: Any
    ) -> "Ledger":
        """Opens (creating if needed) the ledger at `path` (str or path-like),
        readable by its owner only.

        With `key` (32 bytes, e.g. from `generate_ledger_key()`, kept where
        the app keeps secrets), the ledger is encrypted at rest: a new one is
        created encrypted, an encrypted one opens only with its key. A plain
        ledger with records is encrypted once with `encrypt_ledger`.

        Raises `StorageError` for a file that is not a database, a corrupt
        file, a newer schema or an unusable path, and for a wrong or missing
        key (`kind` `WRONG_KEY`, `KEY_REQUIRED`, `NOT_ENCRYPTED`,
        `INVALID_KEY`); the file is never modified then.
        """
        cfg = _config(_ffi.LedgerConfig, config, settings)
        with translated():
            native = _ffi.Ledger.open(str(path), cfg, None if key is None else bytes(key))
        return cls(native)

    @classmethod
    async def aopen(
        cls, path: Any, config: Any = None, *, key: Optional[bytes] = None, **settings: Any
    ) -> "Ledger":
        """`open` in a worker thread."""
        return await asyncio.to_thread(functools.partial(cls.open, path, config, key=key, **settings))

    def set_observer(self, observer: Any) -> None:
        """Registers (or, with None, removes) the observer of every committed
        status move: a `LedgerObserver` (e.g. `toolledger.events.LoggingObserver()`)
        or a function taking a `LedgerEvent`. An event carries ids, tool,
        statuses, attempt, elapsed time and the reason's kind, never a
        value. It replaces the earlier `set_observer`'s; streams from
        `events()` and `add_observer` keep hearing."""
        with translated():
            self.native.set_observer(None if observer is None else events.as_observer(observer))

    def add_observer(self, observer: Any) -> int:
        """Adds an observer (a `LedgerObserver` or a function taking a
        `LedgerEvent`) beside the others; returns its token for
        `remove_observer`. It is called on the thread that made the move,
        after the commit: keep it short. What it raises is dropped."""
        with translated():
            return self.native.add_observer(events.as_observer(observer))

    def remove_observer(self, token: int) -> None:
        """Removes the observer `add_observer` returned `token` for."""
        with translated():
            self.native.remove_observer(token)

    def events(self, *, max_buffered: int = 10_000) -> "events.EventStream":
        """The ledger's status moves as an async iterator of `LedgerEvent`s,
        from now until the stream is closed (`async with`, `aclose()`, or
        leaving an `async for` early by `break` and closing it):

            async with ledger.events() as stream:
                async for event in stream:
                    print(event)   # ids, tool, statuses, reason kind: no value

        Call it inside the event loop that reads it. Events are buffered
        until read, at most `max_buffered` (the newest beyond are dropped and
        counted in `stream.dropped`)."""
        return events.EventStream(self, max_buffered)

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
        native = self._native
        if native is None:
            raise LedgerClosed("the ledger is closed")
        try:
            return getattr(native, name)(*args, **kwargs)
        except (_ffi.LedgerError, _ffi.InternalError) as e:
            raise translate(e) from e

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

    `execute` of a `Tool` registered here runs the tool in the awaiting task
    itself (the library's caller-driven steps, `toolledger._driven`): no
    hop to the library's threads and back, the task's context variables
    seen by the tool. Each step is a short SQLite transaction run on the
    loop's thread (one durable commit before the tool runs, one after), as
    `execute_sync` runs them on the caller's thread, and one native call
    (`toolledger._direct`); a replay is answered by the first step, with
    nothing awaited. An `async def` tool's deadline (`perform_timeout_ms`)
    is armed only if the tool suspends, counted from its start.
    `execute_round` does the same for a round of such tools (one begin for
    the round, each call walked in its own task). `approve`,
    `run_existing`, `recover`, `resolve_unknown` and `compensate`, and raw
    `ToolHandler`s, go through the library's async executor, which calls
    the tools back.
    """

    def __init__(
        self, ledger: Ledger, tools: Iterable[Any] = (), config: Any = None, **settings: Any
    ) -> None:
        cfg = _config(_ffi.ExecutorConfig, config, settings)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ledger = ledger
        # Tools this layer can run itself (caller-driven): name -> Tool.
        self._own: dict = {}
        # Names of those whose perform and lookup are plain functions
        # (`execute_sync` runs only these).
        self._sync: set = set()
        timeout_ms = cfg.perform_timeout_ms
        self._max_parallel = cfg.max_parallel
        self._perform_timeout = None if timeout_ms is None else timeout_ms / 1000
        with translated():
            self._native: Optional[Any] = _ffi.ToolExecutor(ledger._attach(self), cfg)
        # The caller-driven steps, one native call each (`toolledger._direct`).
        self._steps: Optional[_direct.Steps] = _direct.Steps(self._native)
        for t in tools:
            self.register(t)

    def _drop(self) -> None:
        self._native = None
        self._steps = None

    @property
    def native(self) -> Any:
        """The generated `ToolExecutor` underneath."""
        native = self._native
        if native is None:
            raise LedgerClosed("the ledger under this executor is closed")
        return native

    def _app_loop(self) -> Optional[asyncio.AbstractEventLoop]:
        return self._loop

    def _driven_steps(self) -> "_direct.Steps":
        steps = self._steps
        if steps is None:
            raise LedgerClosed("the ledger under this executor is closed")
        return steps

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
        if isinstance(tool, Tool) and not tool.independent_items:
            name = tool._tool_name()
            self._own[name] = tool
            if not (_is_async(tool, "perform") or (tool._has_lookup() and _is_async(tool, "lookup"))):
                self._sync.add(name)

    async def execute(self, operation_id: str, round: int, call: Any) -> outcomes.CallOutcome:
        """Runs one tool call: replays a stored result, asks for approval, or
        runs the tool with a durable intent first and a durable result after."""
        native = self._enter()
        tool = self._own.get(call.tool_name)
        # try/except rather than `translated()`: this is every call's path.
        try:
            if tool is None:
                outcome = await native.execute(operation_id, round, call)
            else:
                steps = self._driven_steps()
                step = steps.begin(operation_id, round, call)
                if isinstance(step, outcomes.CallOutcome):  # a replay, ...: nothing to await
                    return step
                outcome = await _driven.arun(
                    steps, step,
                    functools.partial(self._aperform, tool), functools.partial(self._alookup, tool))
        except (_ffi.LedgerError, _ffi.InternalError) as e:
            raise translate(e) from e
        return outcomes.from_ffi(outcome)

    def execute_sync(self, operation_id: str, round: int, call: Any) -> outcomes.CallOutcome:
        """`execute` for synchronous code and tools: every step, and the
        tool's plain-`def` `perform` (and `lookup`), run on this thread; no
        event loop is used. The executor's `perform_timeout_ms` cannot stop a
        running function: the tool keeps its own deadlines. Raises
        `InvalidInput` (nothing recorded) for a tool whose `perform` or
        `lookup` is `async`, or that this layer did not register."""
        name = call.tool_name
        if name not in self._sync:
            raise InvalidInput(
                f"execute_sync: {name!r} is not a registered Tool with plain-def "
                "perform and lookup; use execute")
        tool = self._own[name]
        steps = self._driven_steps()
        try:
            step = steps.begin(operation_id, round, call)
            if isinstance(step, outcomes.CallOutcome):  # a replay, ...
                return step
            outcome = _driven.run(
                steps, step,
                functools.partial(self._perform, tool), functools.partial(self._lookup, tool))
        except (_ffi.LedgerError, _ffi.InternalError) as e:
            raise translate(e) from e
        return outcomes.from_ffi(outcome)

    # The tool run by the caller, its answers classified as `Adapter` does.

    @staticmethod
    def _perform(tool: Tool, request: Any) -> Any:
        name = tool._tool_name()
        try:
            value = tool.perform(ToolRequest._from_ffi(request))
        except Exception as e:  # noqa: BLE001 — classified: refused, or "may have happened"
            return outcome_of_error(name, e)
        return outcome_of_value(name, value)

    @staticmethod
    def _lookup(tool: Tool, request: Any) -> Any:
        if not tool._has_lookup():
            return _ffi.LookupOutcome.UNSUPPORTED()
        return found_of_value(tool.lookup(ToolRequest._from_ffi(request)))

    async def _aperform(self, tool: Tool, request: Any) -> Any:
        name = tool._tool_name()
        try:
            if _is_async(tool, "perform"):
                value = await _bounded(tool.perform(ToolRequest._from_ffi(request)), self._perform_timeout)
            elif self._perform_timeout is None:
                value = await _acall(tool, "perform", ToolRequest._from_ffi(request))
            else:
                value = await _bounded(_acall(tool, "perform", ToolRequest._from_ffi(request)),
                                       self._perform_timeout)
        except asyncio.TimeoutError:
            return _ffi.PerformOutcome.UNKNOWN(reason="timed out waiting for the downstream")
        except Exception as e:  # noqa: BLE001 — classified: refused, or "may have happened"
            return outcome_of_error(name, e)
        return outcome_of_value(name, value)

    async def _alookup(self, tool: Tool, request: Any) -> Any:
        if not tool._has_lookup():
            return _ffi.LookupOutcome.UNSUPPORTED()
        return found_of_value(await _acall(tool, "lookup", ToolRequest._from_ffi(request)))

    async def execute_round(
        self, operation_id: str, round: int, calls: List[Any]
    ) -> List[outcomes.CallOutcome]:
        """Runs every call of one model response (one durable begin, run in
        parallel, at most `max_parallel` tools at a time); outcomes in call
        order. A bad call anywhere (an unknown tool, invalid arguments)
        stops the whole round with nothing recorded or run.

        When every call's tool is a `Tool` this layer registered, the round
        is begun by the library's caller-driven `start_round` and each call
        walked in its own task of this loop, as `execute` walks one (the
        tools' coroutines see this task's context); otherwise the library's
        async executor runs the round and calls the tools back."""
        native = self._enter()
        tools = [self._own.get(c.tool_name) for c in calls]
        if not tools or None in tools:
            with translated():
                return [outcomes.from_ffi(o) for o in await native.execute_round(operation_id, round, calls)]
        steps = self._driven_steps()
        try:
            first = native.start_round(operation_id, round, calls)
            ended = await _driven.arun_round(
                steps, first,
                [(functools.partial(self._aperform, t), functools.partial(self._alookup, t)) for t in tools],
                self._max_parallel)
        except (_ffi.LedgerError, _ffi.InternalError) as e:
            raise translate(e) from e
        return [outcomes.from_ffi(o) for o in ended]

    async def approve(
        self, execution_id: str, args_digest: str, preview: Any = None
    ) -> outcomes.CallOutcome:
        """Approves a waiting call for exactly `args_digest` and runs it.
        `preview` (a Python object) records what the human saw. Approving
        again a call already approved for the same digest (a double tap)
        approves nothing more and answers where it stands (`InFlight` while
        it runs, its stored result once committed)."""
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


async def _bounded(aw: Any, timeout: Optional[float]) -> Any:
    """Awaits a tool's `perform` in this task within `timeout` seconds
    (None: no bound), as `asyncio.timeout` does, without arming a timer for
    a coroutine that finishes without suspending: its first step runs at
    once, and only if it suspends (awaits something the loop must wait for)
    is the rest awaited under a deadline counted from before that first
    step. A coroutine that never suspends cannot be interrupted by a
    deadline in any case: the loop never regains control while it runs."""
    if type(aw) is not types.CoroutineType:
        if timeout is None:
            return await aw
        return await _within(aw, asyncio.get_running_loop().time() + timeout)
    start = asyncio.get_running_loop().time()
    try:
        yielded = aw.send(None)
    except StopIteration as done:
        return done.value
    rest = _resumed(aw, yielded)
    if timeout is None:
        return await rest
    return await _within(rest, start + timeout)


async def _within(aw: Any, deadline: float) -> Any:
    if _timeout_at is not None:
        async with _timeout_at(deadline):
            return await aw
    # Python < 3.11: `wait_for` runs it in a task of its own.
    remaining = max(0.0, deadline - asyncio.get_running_loop().time())

    async def rest() -> Any:
        return await aw

    return await asyncio.wait_for(rest(), remaining)


@types.coroutine
def _resumed(coro: Any, yielded: Any) -> Any:
    """The rest of a started coroutine, awaitable: hands what it yielded to
    the awaiting task, and what the task sends or throws back to it (what
    `await coro` does after the first step)."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:  # a cancellation (the deadline), or any throw
            try:
                yielded = coro.throw(e)
            except StopIteration as done:
                return done.value
            continue
        try:
            yielded = coro.send(sent)
        except StopIteration as done:
            return done.value


async def _acall(tool: Tool, which: str, request: ToolRequest) -> Any:
    """Runs a tool's `perform` or `lookup` for an awaiting caller: a
    coroutine in this task, a plain function in a worker thread (it may
    block), an awaitable it returns awaited here."""
    method = getattr(tool, which)
    if _is_async(tool, which):
        return await method(request)
    value = await asyncio.get_running_loop().run_in_executor(None, method, request)
    if inspect.isawaitable(value):
        value = await value
    return value
