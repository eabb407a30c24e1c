"""The child process of the caller-driven crash test.

    python driven_child.py LEDGER_DB DOWNSTREAM_DB MARKER

Starts one call through the caller-driven steps (``ToolExecutor.start``),
performs its effect downstream itself, creates MARKER and hangs: the parent
SIGKILLs it, so the effect happened and its report never came.
"""

import sys
import time

import toolledger as tl
from toolledger import ffi
from tools import Downstream, email_call


@tl.tool(name="send_email")
def send_email(request):
    raise AssertionError("the child performs the effect itself")


def kind(value):
    return type(value).__name__.rsplit(".", 1)[-1]


def main(ledger_path, downstream_path, marker):
    ledger = ffi.Ledger.open(ledger_path, ffi.LedgerConfig())
    executor = ffi.ToolExecutor(ledger, ffi.ExecutorConfig())
    executor.register(tl.tools.Adapter(send_email, lambda: None))
    step = executor.start("op_crash", 0, email_call())
    assert kind(step) == "PERFORM", step
    Downstream(downstream_path).perform(step.attempt.request.downstream_key, step.attempt.request.arguments_json)
    open(marker, "w").close()
    time.sleep(120)
    sys.exit("unreachable: the parent kills this process")


if __name__ == "__main__":
    main(*sys.argv[1:4])
