"""The ledger's status moves, without values: a `logging` adapter and an
async iterator.

Every committed move of a ledger is a `LedgerEvent`: `execution_id`,
`tool_name`, `from_status`, `to_status`, `attempt`, `elapsed_ms`, and for
failures, unknown outcomes and rejections a `reason_kind` (`TIMEOUT`,
`TOOL_ERROR`, `OWNER_DIED`, ...). Never an argument, a result or a reason's
text, so events can go to any log; `str(event)` is one log line.

    import logging
    import toolledger as tl
    from toolledger.events import LoggingObserver

    with tl.Ledger.open("ledger.db") as ledger:
        ledger.set_observer(LoggingObserver())      # the `toolledger` logger
        ...

    async with ledger.events() as stream:           # an async iterator
        async for event in stream:
            if event.to_status == tl.ExecutionStatus.OUTCOME_UNKNOWN:
                print("unknown:", event.reason_kind)
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

from ._native import toolledger as _ffi

if TYPE_CHECKING:  # pragma: no cover
    from .ledger import Ledger

LedgerEvent = _ffi.LedgerEvent
LedgerObserver = _ffi.LedgerObserver
ReasonKind = _ffi.ReasonKind

_WARN = {_ffi.ExecutionStatus.OUTCOME_UNKNOWN, _ffi.ExecutionStatus.FAILED_BEFORE_COMMIT}


class LoggingObserver(_ffi.LedgerObserver):
    """A `LedgerObserver` that writes each move to a `logging.Logger`
    (default: `logging.getLogger("toolledger")`): unknown outcomes and
    failures at WARNING, the rest at DEBUG. The message is the event's line;
    `extra` carries its fields for structured handlers."""

    def __init__(self, logger: Optional[logging.Logger] = None) -> None:
        self.logger = logger or logging.getLogger("toolledger")

    def on_event(self, event: Any) -> None:
        level = logging.WARNING if event.to_status in _WARN else logging.DEBUG
        self.logger.log(
            level,
            "%s",
            event.line,
            extra={
                "execution_id": event.execution_id,
                "tool": event.tool_name,
                "to_status": event.to_status.name.lower(),
                "attempt": event.attempt,
                "elapsed_ms": event.elapsed_ms,
                "reason_kind": event.reason_kind.name.lower() if event.reason_kind else None,
            },
        )


class _FunctionObserver(_ffi.LedgerObserver):
    """A plain function as a `LedgerObserver`."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def on_event(self, event: Any) -> None:
        self.fn(event)


def as_observer(observer: Any) -> Any:
    """`observer` as a `LedgerObserver` (a function taking an event is wrapped)."""
    if isinstance(observer, _ffi.LedgerObserver):
        return observer
    if callable(observer):
        return _FunctionObserver(observer)
    raise TypeError("an observer is a LedgerObserver or a function taking a LedgerEvent")


class EventStream:
    """The moves of one ledger as an async iterator (`Ledger.events()`).

    Subscribed when created, unsubscribed by `close()`/`aclose()` or the end
    of an `async with` block; after that the iterator ends once the events
    already buffered are read. Events are handed to the event loop that was
    running when the stream was created, from whatever thread made the move.
    """

    def __init__(self, ledger: "Ledger", max_buffered: int = 10_000) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "Ledger.events() needs a running event loop: call it in the coroutine that "
                "reads the stream"
            ) from None
        self._queue: "asyncio.Queue[Any]" = asyncio.Queue()
        self._max = max_buffered
        self._lock = threading.Lock()
        self._pending = 0
        self._closed = False
        #: Events dropped because `max_buffered` were waiting to be read.
        self.dropped = 0
        self._ledger = ledger
        self._token: Optional[int] = ledger.add_observer(_FunctionObserver(self._hear))

    def _hear(self, event: Any) -> None:
        with self._lock:
            if self._closed:
                return
            if self._pending >= self._max:
                self.dropped += 1
                return
            self._pending += 1
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:
            pass  # the loop is closed: nobody reads this stream any more

    def close(self) -> None:
        """Unsubscribes; the iterator ends after the buffered events."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        token, self._token = self._token, None
        if token is not None and not self._ledger.closed:
            self._ledger.remove_observer(token)
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, _END)
        except RuntimeError:
            pass

    async def aclose(self) -> None:
        """`close()` (for `contextlib.aclosing` and async generators' manners)."""
        self.close()

    def __aiter__(self) -> "EventStream":
        return self

    async def __anext__(self) -> Any:
        item = await self._queue.get()
        if item is _END:
            # Keep ending for any later reader.
            self._queue.put_nowait(_END)
            raise StopAsyncIteration
        with self._lock:
            self._pending -= 1
        return item

    async def __aenter__(self) -> "EventStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<toolledger.EventStream {'closed' if self._closed else 'open'}>"


_END = object()
