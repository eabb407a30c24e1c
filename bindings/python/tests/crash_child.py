"""The child process of the crash-recovery test.

    python crash_child.py LEDGER_DB DOWNSTREAM_DB MARKER

Opens the ledger, registers a tool that performs its effect downstream and
then hangs, and executes one call. The parent SIGKILLs this process once the
marker file exists: the effect happened, the ledger never heard back.
"""

import asyncio
import sys

from toolledger import ffi as tl  # the generated API as it is
from tools import Downstream, SendThenHang, email_call


async def main(ledger_path, downstream_path, marker):
    tl.uniffi_set_event_loop(asyncio.get_running_loop())
    ledger = tl.Ledger.open(ledger_path, tl.LedgerConfig())
    executor = tl.ToolExecutor(ledger, tl.ExecutorConfig(perform_timeout_ms=None))
    executor.register(SendThenHang(Downstream(downstream_path), marker))
    await executor.execute("op_crash", 0, email_call())
    sys.exit("unreachable: the tool never returns")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
