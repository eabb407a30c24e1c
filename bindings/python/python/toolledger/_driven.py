"""Caller-driven calls: the tool runs in the caller's thread or task.

``ToolExecutor.execute`` (async in the library) hops to the library's tokio
threads and calls the tool back into Python from there: a GIL hand-over, a
hop to the bridge loop and one to the app's loop, each way. The library's
caller-driven methods (``start`` / ``report`` / ``report_lookup`` /
``retry``) are synchronous and never call back: ``start`` answers a replay
at once, or hands out an attempt; the caller runs the tool itself and
reports what it did. Every rule is the library's (the intent is durable
before an attempt is handed out; a report names its attempt and a stale one
is refused; a second caller of the same call gets ``InFlight``; a crash
between the effect and the report is reconciled by the next ask).

This module walks those steps for one call. ``native`` is the generated
``ToolExecutor`` or anything with its caller-driven methods (the
``Executor`` passes ``toolledger._direct.Steps``: one native call a step). ``perform(request)`` returns
the library's ``PerformOutcome`` for what the tool did (it classifies the
tool's own exceptions); ``lookup(request)`` returns a ``LookupOutcome`` or
raises (a failed lookup: the outcome stays unknown). If the caller itself is
interrupted while the tool runs (``KeyboardInterrupt``, a cancelled task),
the attempt is reported as an unknown outcome before the interruption goes
on: it may have happened, and it must not stay "in flight" in this process.

Each step is one short SQLite transaction on the caller's thread (a
durable commit where the protocol needs one), like the ``Ledger`` methods;
an async caller holds its event loop for that long.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, List

from . import outcomes as _outcomes
from ._native import toolledger as _ffi

# The library bounds every call by its attempts; a walk longer than this is
# a bug, reported rather than looped on.
_MAX_STEPS = 1024  # two per retried attempt

_INTERRUPTED = "the caller was interrupted while the tool ran; the outcome is unknown"


_DONE = _ffi.CallerStep.DONE
_PERFORM = _ffi.CallerStep.PERFORM
_LOOKUP = _ffi.CallerStep.LOOKUP
_RETRY = _ffi.CallerStep.RETRY


def _kind(step: Any) -> str:
    return type(step).__name__.rsplit(".", 1)[-1]


def _report(native: Any, attempt: Any, outcome: Any) -> Any:
    """Reports a ``Perform`` attempt: a side-effecting one by its fencing
    token alone (execution id and attempt number: lowering the whole
    attempt again costs more than the report), a read-only one whole."""
    if attempt.read_only:
        return native.report(attempt, outcome)
    request = attempt.request
    return native.report_attempt(request.execution_id, request.attempt, outcome)


# The framework's own control flow raised through a tool (LangGraph's
# ``GraphInterrupt``: the tool paused for a human before it did anything;
# on resume the framework runs the tool again from its start). Registered
# by the adapters: reported as not sent, then re-raised.
CONTROL_FLOW: tuple = ()

_PAUSED = "the framework paused the tool (control flow, not an error); it runs again on resume"



def _report_raised(native: Any, attempt: Any, e: BaseException) -> None:
    """Reports a ``Perform`` attempt out of which ``e`` escapes. A report
    that cannot be recorded (the ledger suspended meanwhile, a storage
    error) is logged, never raised in place of ``e``: the caller gets its
    ``KeyboardInterrupt`` or ``CancelledError``, and the library keeps the
    attempt whose report failed as its orphan (the next ask reconciles it;
    it is not left in flight)."""
    try:
        if CONTROL_FLOW and isinstance(e, CONTROL_FLOW):
            _abandon(native, attempt, _PAUSED)
        else:
            _report_interrupted(native, attempt)
    except Exception as failed:  # noqa: BLE001 - `e` goes on; this one is logged
        _log.error("toolledger: the report of an interrupted attempt (%s) could not be recorded: "
                   "%s; the next ask reconciles it", type(e).__name__, type(failed).__name__)


def _abandon(native: Any, attempt: Any, reason: str) -> Any:
    """Reports a side-effecting ``Perform`` attempt that was never sent
    (``abandon_attempt``): nothing more is handed out; the next ask runs it
    (a first attempt) or reconciles it (a same-key resend after an unknown
    outcome: still unknown)."""
    if attempt.read_only:
        return native.report(attempt, _ffi.PerformOutcome.FAILED_BEFORE_COMMIT(reason=reason, retryable=True))
    request = attempt.request
    return native.abandon_attempt(request.execution_id, request.attempt, reason)


_log = logging.getLogger("toolledger")


def _report_interrupted(native: Any, attempt: Any) -> None:
    """Reports an interrupted ``Perform`` attempt as an unknown outcome (the
    request may have left), with ``report_interrupted``: unlike a report of
    ``UNKNOWN``, it hands nothing out (for a key tool, a same-key resend that
    this caller would never run), so the call is unknown, not ``InFlight`` in
    this process, even if a second interruption arrives as the report
    returns; the next ask reconciles it (for a key tool: the same key sent
    again, which the downstream dedupes)."""
    if attempt.read_only:
        _report(native, attempt, _ffi.PerformOutcome.UNKNOWN(reason=_INTERRUPTED))
        return
    request = attempt.request
    native.report_interrupted(request.execution_id, request.attempt, _INTERRUPTED)


def _settler(native: Any) -> Any:
    # `Steps.settle_attempt` answers a finished call as the layer's outcome.
    return getattr(native, "settle_attempt", None) or native.report_attempt


def run(native: Any, step: Any, perform: Callable[[Any], Any], lookup: Callable[[Any], Any]) -> Any:
    """Walks one call's steps on this thread; returns the library's
    ``CallOutcome`` (or, through ``Steps``, the layer's ``CallOutcome``
    for a side-effecting report that finished the call: ``outcomes.from_ffi``
    takes either)."""
    settle = _settler(native)
    for _ in range(_MAX_STEPS):
        kind = type(step)
        if kind is _DONE:
            return step.outcome
        if isinstance(step, _outcomes.CallOutcome):
            return step
        attempt = step.attempt
        if kind is _PERFORM:
            request = attempt.request
            try:
                outcome = perform(request)
            except BaseException as e:
                _report_raised(native, attempt, e)
                raise
            if attempt.read_only:
                step = native.report(attempt, outcome)
            else:
                step = settle(request.execution_id, request.attempt, outcome)
        elif kind is _LOOKUP:
            try:
                found = lookup(attempt.request)
            except Exception as e:  # noqa: BLE001 - a failed lookup leaves the outcome unknown
                step = native.report_lookup_error(attempt, f"{type(e).__name__} raised by the lookup")
                continue
            step = native.report_lookup(attempt, found)
        elif kind is _RETRY:
            time.sleep(step.after_ms / 1000)
            step = native.retry(attempt)
        else:
            raise RuntimeError(f"toolledger: unexpected step {_kind(step)}")
    return _at_the_step_limit(native, step)


def _at_the_step_limit(native: Any, step: Any) -> Any:
    """A walk that took ``_MAX_STEPS`` steps (a library bug, or more
    attempts than the walk allows) ends here with ``step``, the library's
    last answer: a finished call is returned; a handed-out ``Perform`` is
    recorded as never sent (the tool did not run it) and a ``Lookup``
    reported as failed (the outcome stays unknown), so that nothing is left
    in flight; then raises."""
    kind = type(step)
    if kind is _DONE:
        return step.outcome
    if isinstance(step, _outcomes.CallOutcome):
        return step
    error = RuntimeError("toolledger: a call did not settle within its steps")
    try:
        if kind is _PERFORM:
            _abandon(native, step.attempt, "the caller's step limit was reached")
        elif kind is _LOOKUP:
            native.report_lookup_error(step.attempt, "the caller's step limit was reached")
    except Exception as failed:  # noqa: BLE001 - `error` goes on; this one is logged
        _log.error("toolledger: the attempt left at the step limit could not be recorded: %s", type(failed).__name__)
    raise error


async def _inline(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


async def arun(native: Any, step: Any, perform: Callable[[Any], Awaitable[Any]],
               lookup: Callable[[Any], Awaitable[Any]],
               io: Callable[..., Awaitable[Any]] = _inline) -> Any:
    """Walks one call's steps in this task (the tool's coroutine is awaited
    here, with this task's context); returns the library's ``CallOutcome``.
    ``io(fn, *args)`` runs each library step (default: inline, on this
    loop's thread; ``asyncio.to_thread`` keeps the loop off the disk at the
    price of a thread hop per step). ``step`` is the answer of ``start``.
    Returns as ``run`` does."""
    settle = _settler(native)
    for _ in range(_MAX_STEPS):
        kind = type(step)
        if kind is _DONE:
            return step.outcome
        if isinstance(step, _outcomes.CallOutcome):
            return step
        attempt = step.attempt
        if kind is _PERFORM:
            request = attempt.request
            try:
                outcome = await perform(request)
            except BaseException as e:
                _report_raised(native, attempt, e)
                raise
            if io is _inline:  # every call's path: no coroutine per step
                if attempt.read_only:
                    step = native.report(attempt, outcome)
                else:
                    step = settle(request.execution_id, request.attempt, outcome)
            elif attempt.read_only:
                step = await io(native.report, attempt, outcome)
            else:
                step = await io(settle, request.execution_id, request.attempt, outcome)
        elif kind is _LOOKUP:
            try:
                found = await lookup(attempt.request)
            except Exception as e:  # noqa: BLE001 - a failed lookup leaves the outcome unknown
                step = await io(native.report_lookup_error, attempt, f"{type(e).__name__} raised by the lookup")
                continue
            step = await io(native.report_lookup, attempt, found)
        elif kind is _RETRY:
            await asyncio.sleep(step.after_ms / 1000)
            step = await io(native.retry, attempt)
        else:
            raise RuntimeError(f"toolledger: unexpected step {_kind(step)}")
    return _at_the_step_limit(native, step)


def give_back(native: Any, step: Any, reason: str) -> None:
    """Records a step handed out by ``start_round`` that this caller will
    not walk (its task was cancelled before the tool ran): a ``Perform``
    as never sent (``abandon_attempt``: the next ask runs it). A ``Lookup``,
    a ``Retry`` or a finished call leaves nothing outstanding. A failure to
    record it is logged; the attempt is then the library's orphan (the next
    ask reconciles it, it is not left in flight)."""
    if type(step) is not _PERFORM:
        return
    try:
        _abandon(native, step.attempt, reason)
    except Exception as failed:  # noqa: BLE001 - the cancellation goes on; this one is logged
        _log.error("toolledger: an attempt given back could not be recorded: %s", type(failed).__name__)


_NOT_WALKED = "the caller was cancelled before the tool ran"


async def arun_round(native: Any, steps: List[Any], walkers: List[Any], max_parallel: int) -> List[Any]:
    """Walks every call of a round from its first step (``start_round``'s
    answers, in call order), each in its own task, at most ``max_parallel``
    tools at a time; ``walkers[i]`` is ``(perform, lookup)`` for call i, as
    ``arun`` takes them. Returns the library's outcomes in call order once
    every walk has ended; if any walk raised, raises the first such error
    (the other calls are recorded as they ended). A cancelled caller
    cancels every walk: a tool that was running is reported as
    interrupted (``arun``), a call still waiting for its turn is given
    back (never sent)."""
    # Each step is claimed once, by its walk or by the give-back below,
    # whichever comes first. A walk's task cancelled before it first runs
    # (the caller cancelled as the round was handed out) never enters its
    # body, so its step is given back below; a walk whose step was given
    # back (an interruption while the walks' tasks are made, with some of
    # them made and not yet run) must then not run its tool on an attempt
    # recorded as never sent.
    claimed = [False] * len(steps)
    try:
        limit = asyncio.Semaphore(max(1, max_parallel))

        async def walk(index: int, step: Any, perform: Any, lookup: Any) -> Any:
            if claimed[index]:
                raise asyncio.CancelledError()
            try:
                claimed[index] = True
                if type(step) is _DONE:
                    return step.outcome
                await limit.acquire()
            except BaseException:
                give_back(native, step, _NOT_WALKED)
                raise
            try:
                return await arun(native, step, perform, lookup)
            finally:
                limit.release()

        # One task per walk, made one at a time: an interruption while they
        # are made leaves no coroutine that was created and never awaited.
        tasks = []
        for i, (step, (perform, lookup)) in enumerate(zip(steps, walkers)):
            coro = walk(i, step, perform, lookup)
            try:
                tasks.append(asyncio.ensure_future(coro))
            except BaseException:
                coro.close()
                raise
        ended = await asyncio.gather(*tasks, return_exceptions=True)
    except BaseException:
        # Every step nobody claimed is given back, even if a give-back is
        # itself interrupted (a second Ctrl-C): the first such interruption
        # goes on once all are done.
        interrupted = None
        for index, step in enumerate(steps):
            if claimed[index]:
                continue
            claimed[index] = True
            try:
                give_back(native, step, _NOT_WALKED)
            except BaseException as e:  # noqa: BLE001 - re-raised below, after the rest
                interrupted = interrupted or e
        if interrupted is not None:
            raise interrupted
        raise
    for result in ended:
        if isinstance(result, BaseException):
            raise result
    return list(ended)
