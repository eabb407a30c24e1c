"""What the executor answers, as plain frozen dataclasses.

Each `CallOutcome` variant of the library is one class here, all subclasses
of `CallOutcome`, so an app checks them with `isinstance` or `match`:

    match await executor.execute(...):
        case tl.Completed(result=result): ...
        case tl.NeedsApproval(args_digest=digest): ...
        case tl.Unknown(retry_after=seconds): ...

Results and previews are JSON text in the library; `result` and `preview`
give them as Python objects (`json.loads`), the `*_json` fields keep the
exact text. Waiting times are seconds (`retry_after`, a float, as asyncio
uses), with the library's exact milliseconds in `retry_after_ms`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, List, Optional

from ._native import toolledger as _ffi


def redacted_repr(obj: Any, values: Any) -> str:
    """`Class(field=..., ...)` with the fields named in `values` shown by
    size only: arguments, results, previews, external ids, job ids and
    reasons may be personal data and never reach a log through `repr`."""
    parts = []
    for name in obj.__dataclass_fields__:
        value = getattr(obj, name)
        if name in values and value is not None:
            if isinstance(value, str):
                shown = f"<{len(value.encode())} bytes>"
            else:
                shown = f"<{type(value).__name__}>"
        else:
            shown = repr(value)
        parts.append(f"{name}={shown}")
    return f"{type(obj).__name__}({', '.join(parts)})"


#: The fields of the outcomes that hold values.
_VALUES = frozenset({"result_json", "external_id", "preview_json", "job_id", "reason"})


class CallOutcome:
    """Base class of the outcomes of one tool call. Printed (`repr`, `str`)
    they show ids, tool, attempt and sizes, never a value: read values from
    their fields."""

    __slots__ = ()
    execution_id: str

    def __repr__(self) -> str:
        return redacted_repr(self, _VALUES)


def _seconds(ms: Optional[int]) -> Optional[float]:
    return None if ms is None else ms / 1000.0


@dataclass(frozen=True)
class Completed(CallOutcome):
    """A result for the model. `replayed` is true when it is the stored
    result of an earlier run (nothing ran now); `partial` for an independent
    batch that committed only some items."""

    __repr__ = CallOutcome.__repr__

    execution_id: str
    result_json: str
    external_id: Optional[str] = None
    replayed: bool = False
    partial: bool = False

    @property
    def result(self) -> Any:
        """The result as a Python object."""
        return json.loads(self.result_json)


@dataclass(frozen=True)
class NeedsApproval(CallOutcome):
    """The call waits for a human: show the preview, then approve exactly
    `args_digest` (`executor.approve`)."""

    __repr__ = CallOutcome.__repr__

    execution_id: str
    tool_name: str
    args_digest: str
    preview_json: Optional[str] = None

    @property
    def preview(self) -> Any:
        """The tool's approval preview as a Python object (None without one)."""
        return None if self.preview_json is None else json.loads(self.preview_json)


@dataclass(frozen=True)
class Pending(CallOutcome):
    """A background job runs downstream; its result arrives later
    (`record_job_update`, `ingest_webhook`)."""

    __repr__ = CallOutcome.__repr__

    execution_id: str
    job_id: str


@dataclass(frozen=True)
class Unknown(CallOutcome):
    """The effect may or may not have happened. With `retry_after`, ask
    again after that many seconds; without it, resolve it
    (`resolve_unknown`, naming `attempt`)."""

    __repr__ = CallOutcome.__repr__

    execution_id: str
    attempt: int
    reason: str
    retry_after_ms: Optional[int] = None

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds to wait before asking again, if waiting can settle it."""
        return _seconds(self.retry_after_ms)


@dataclass(frozen=True)
class Failed(CallOutcome):
    """Provably not committed."""

    __repr__ = CallOutcome.__repr__

    execution_id: str
    reason: str
    retryable: bool = False


@dataclass(frozen=True)
class Conflict(CallOutcome):
    """The call id is known with different arguments; nothing ran."""

    __repr__ = CallOutcome.__repr__

    execution_id: str
    stored_digest: str
    new_digest: str


@dataclass(frozen=True)
class InFlight(CallOutcome):
    """Another live session is running it (or a suspended one: ask again
    after `retry_after` seconds; its claim ends once its lease lapsed and
    its process is gone)."""

    __repr__ = CallOutcome.__repr__

    execution_id: str
    retry_after_ms: Optional[int] = None

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds to wait before asking again, if known."""
        return _seconds(self.retry_after_ms)


@dataclass(frozen=True)
class Rejected(CallOutcome):
    """A human rejected it."""

    __repr__ = CallOutcome.__repr__

    execution_id: str


@dataclass(frozen=True)
class Cancelled(CallOutcome):
    """It or its operation was cancelled and it did not happen."""

    __repr__ = CallOutcome.__repr__

    execution_id: str


@dataclass(frozen=True)
class Recovery:
    """What `Executor.recover()` did: one outcome per execution that needed
    attention, and the executions it could not deal with (`failed`, each a
    `RecoveryFailure` with `execution_id`, `kind` and `error`)."""

    outcomes: List[CallOutcome]
    failed: List["_ffi.RecoveryFailure"]


_VARIANTS = {
    "COMPLETED": Completed,
    "NEEDS_APPROVAL": NeedsApproval,
    "PENDING": Pending,
    "UNKNOWN": Unknown,
    "FAILED": Failed,
    "CONFLICT": Conflict,
    "IN_FLIGHT": InFlight,
    "REJECTED": Rejected,
    "CANCELLED": Cancelled,
}


# Generated variant class -> (dataclass, its field names), built on first use.
_BY_TYPE: dict = {}


def from_ffi(outcome: Any) -> CallOutcome:
    """The dataclass for a generated `CallOutcome` variant (one already
    made, as `toolledger._direct` reads a finished call, as it is)."""
    found = _BY_TYPE.get(type(outcome))
    if found is None and isinstance(outcome, CallOutcome):
        return outcome
    if found is None:
        cls = _VARIANTS[type(outcome).__name__.rsplit(".", 1)[-1]]
        found = _BY_TYPE[type(outcome)] = (cls, tuple(cls.__dataclass_fields__))
    cls, names = found
    # The fields set in one step (what the frozen dataclass's __init__ does
    # one `object.__setattr__` at a time); the variants have no
    # `__post_init__`.
    made = object.__new__(cls)
    made.__dict__.update([(name, getattr(outcome, name)) for name in names])
    return made


def recovery_from_ffi(recovery: Any) -> Recovery:
    """The `Recovery` for a generated one."""
    return Recovery(
        outcomes=[from_ffi(o) for o in recovery.outcomes], failed=list(recovery.failed)
    )
