"""The exceptions of the package: every one is a `toolledger.Error`.

The library's own error (`LedgerError` in the generated module, one variant
per case an app acts on) is translated into the classes below at every call
of the Pythonic layer, so `except toolledger.Error` catches whatever the
package raises. The fields are the library's (`execution_id`, `kind`, ...).
Messages carry no argument or result values.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, TypeVar

from ._native import toolledger as _ffi

F = TypeVar("F", bound=Callable[..., Any])


class Error(Exception):
    """Base class of every exception toolledger raises."""

    def __init__(self, text: str = "", /, **fields: Any) -> None:
        super().__init__(text or (self.__class__.__doc__ or self.__class__.__name__).split("\n")[0])
        for name, value in fields.items():
            setattr(self, name, value)


class InvalidInput(Error):
    """Bad input: JSON that is not strict JSON or too large, a malformed id,
    a malformed provider response, a tool registered twice. Nothing was
    recorded. `message` says what was wrong."""


class NotFound(Error):
    """No execution has this id (`execution_id`)."""


class InvalidTransition(Error):
    """The execution's status (`from_status`) does not allow this step
    (`transition`). Read it again with `get` to see where it stands."""


class DigestMismatch(Error):
    """An approval named other arguments (`given`) than the recorded ones
    (`stored`): nothing was unlocked."""


class AlreadyCommitted(Error):
    """A different result was offered for an execution that already has
    one; the stored one stands."""


class StorageError(Error):
    """The database could not be used (`kind`: a `StorageKind`). Nothing was
    written, except for `StorageKind.FOREIGN_CONNECTION` (the last write may
    be lost) and `StorageKind.IO` (the disk failed a sync: the write may be
    in the ledger without being durable; nothing was sent on its strength,
    and the ledger writes its log again before its next write) and
    `StorageKind.NOT_SCRUBBED` (encrypting or re-keying committed: the
    ledger is under the new key; only the scrub of earlier bytes is left).
    `StorageKind.FORKED`: the ledger is open in the parent this process
    was forked from (`os.fork()`, a `multiprocessing` pool with the `fork`
    start method): neither its copy nor the file can be used here; start
    workers with the `spawn` (or `forkserver`) start method and open the
    ledger in them."""


class UnknownTool(Error):
    """No tool named `name` is registered; nothing was recorded or run."""


class StaleAttempt(Error):
    """The step named an attempt (`attempt`) that another attempt
    (`current_attempt`) superseded. Nothing changed."""


class OperationCancelled(Error):
    """The execution's operation was cancelled: nothing starts in it."""


class Suspended(Error):
    """The ledger is suspended; call `resume()` first."""


class InternalError(Error):
    """A bug or an internal failure of the library."""


class LedgerClosed(Error):
    """The ledger (or the executor over it) was closed with `close()`."""


class NoEventLoop(Error):
    """An async tool had to run, but the event loop of the call that started
    the work is closed or stopped. The tool did not run."""


_MESSAGES = {
    "InvalidInput": (InvalidInput, "invalid input: {message}"),
    "NotFound": (NotFound, "no execution {execution_id}"),
    "InvalidTransition": (
        InvalidTransition,
        "execution {execution_id}: {transition} is not allowed from {from_status}",
    ),
    "DigestMismatch": (
        DigestMismatch,
        "execution {execution_id}: digest {given} does not match the recorded {stored}",
    ),
    "AlreadyCommitted": (
        AlreadyCommitted,
        "execution {execution_id} already committed with a different result",
    ),
    "Storage": (StorageError, "storage ({kind}): {message}"),
    "UnknownTool": (UnknownTool, "no tool named {name} is registered"),
    "StaleAttempt": (
        StaleAttempt,
        "execution {execution_id}: attempt {attempt} is stale "
        "(now at attempt {current_attempt}, {status})",
    ),
    "OperationCancelled": (
        OperationCancelled,
        "execution {execution_id}: its operation was cancelled",
    ),
    "Suspended": (Suspended, "the ledger is suspended; call resume() first"),
    "Internal": (InternalError, "internal error: {message}"),
}


def translate(error: BaseException) -> BaseException:
    """The `toolledger.Error` for a generated-module error; anything else is
    returned unchanged."""
    if isinstance(error, _ffi.LedgerError):
        entry = _MESSAGES.get(type(error).__name__.rsplit(".", 1)[-1])
        if entry is not None:
            cls, template = entry
            fields = {k: v for k, v in vars(error).items() if not k.startswith("_")}
            try:
                message = template.format(**fields)
            except (KeyError, IndexError):
                message = cls.__name__
            return cls(message, **fields)
        return InternalError(f"unknown library error {type(error).__name__}")
    if isinstance(error, _ffi.InternalError):
        return InternalError(f"internal error: {error}")
    return error


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raises generated-module errors as `toolledger.Error`s."""
    try:
        yield
    except (_ffi.LedgerError, _ffi.InternalError) as e:
        raise translate(e) from e


def translating(fn: F) -> F:
    """Decorates a sync function so its generated-module errors are translated."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with translated():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
