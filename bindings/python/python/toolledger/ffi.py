"""The generated UniFFI module as it is: every exported type and function
of the library, with the library's own names (`ToolExecutor`,
`ToolHandler`, `LedgerError`, `CallOutcome.COMPLETED`, ...).

The Pythonic layer (`import toolledger`) covers what an app needs; this
module is for what it does not wrap. Importing `toolledger` first also
makes the generated async machinery find an event loop by itself (see
`toolledger._loop`), so `uniffi_set_event_loop` is optional here.
"""

from . import _loop
from ._native.toolledger import *  # noqa: F401,F403
from ._native.toolledger import uniffi_set_event_loop  # noqa: F401

_loop.install()
