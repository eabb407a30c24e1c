"""How the library's threads reach asyncio.

The library runs tool calls on its own threads (a tokio runtime). When it
calls a tool's async method, the generated UniFFI code needs an event loop
to schedule the coroutine on; by default it uses the loop set with
`uniffi_set_event_loop` or, failing that, the thread's running loop, which a
library thread never has. Forgetting the set-up call made every tool call
hang until the executor's perform timeout.

This module replaces that lookup (the generated module's
`_uniffi_get_event_loop`, looked up by name at each call):

1. a thread with a running loop (an app awaiting a library call) gets that
   loop, as before;
2. a library thread gets the loop set with `uniffi_set_event_loop`, if one
   was set and is still open;
3. otherwise it gets the *bridge loop*: one daemon thread owned by this
   package, started on first use, that runs only short forwarding
   coroutines.

The hand-written tool adapter (`toolledger.tools`) then forwards a tool's
own coroutine from the bridge loop to the loop of the app call that started
the work, so tools run where the app's other coroutines run. If that loop is
closed or stopped, the adapter raises `NoEventLoop` instead of waiting.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Optional

from ._native import toolledger as _ffi

_lock = threading.Lock()
_bridge: Optional[asyncio.AbstractEventLoop] = None
_bridge_thread: Optional[threading.Thread] = None

# What the tools' own code may raise that is not an `Exception`: in a
# library thread neither is a signal (those reach the main thread only),
# just something the tool raised. The handlers on the library's threads
# record it as the tool's error (an unknown outcome) instead of letting it
# stop the bridge loop, which would leave every later call of every tool in
# the process waiting out the perform timeout.
TOOL_RAISED = (Exception, KeyboardInterrupt, SystemExit)


def _run_bridge(loop: asyncio.AbstractEventLoop) -> None:
    # `run_forever` re-raises a KeyboardInterrupt or SystemExit that escaped
    # a callback; the loop goes on serving the others.
    while not loop.is_closed():
        try:
            loop.run_forever()
            return  # stopped on purpose
        except (KeyboardInterrupt, SystemExit):
            continue


def bridge_loop() -> asyncio.AbstractEventLoop:
    """The package's own event loop, running on a daemon thread."""
    global _bridge, _bridge_thread
    with _lock:
        if (_bridge is None or _bridge.is_closed()
                or _bridge_thread is None or not _bridge_thread.is_alive()):
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=_run_bridge, args=(loop,), name="toolledger-asyncio-bridge", daemon=True
            )
            thread.start()
            _bridge, _bridge_thread = loop, thread
        return _bridge


def _event_loop_for_uniffi() -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    explicit = getattr(_ffi, "_UNIFFI_GLOBAL_EVENT_LOOP", None)
    if explicit is not None and not explicit.is_closed():
        return explicit
    return bridge_loop()


def usable(loop: Optional[asyncio.AbstractEventLoop]) -> bool:
    """True when coroutines handed to `loop` from another thread will run."""
    return loop is not None and not loop.is_closed() and loop.is_running()


def install() -> None:
    """Points the generated module's loop lookup at `_event_loop_for_uniffi`."""
    if not callable(getattr(_ffi, "_uniffi_get_event_loop", None)):
        raise ImportError(
            "toolledger: the generated UniFFI module has no _uniffi_get_event_loop; "
            "this package was built with another UniFFI version than it was written for"
        )
    _ffi._uniffi_get_event_loop = _event_loop_for_uniffi
