"""The child process of the "two SQLite libraries in one process" test.

    python sqlite_child.py LEDGER_DB

The ledger links its own SQLite; Python's `sqlite3` module is another one.
POSIX file locks belong to the process, so when this process opens the
ledger file with `sqlite3` and closes it, that library thinks it is the last
connection: it checkpoints, deletes the WAL the ledger's connection still
writes to, and closing its descriptor drops the ledger connection's locks.

The child commits one call through the ledger, does exactly that, then
begins and commits CALLS_AFTER more calls through the ledger, and SIGKILLs
itself (no clean close, no final checkpoint). The parent reopens the ledger
and checks that every call is committed.

Stdout, one JSON object per line: {"wal_gone": bool} after the foreign close,
then {"committed": [execution ids], "wal_back": bool} just before the SIGKILL.
"""

import json
import os
import signal
import sqlite3
import sys

from toolledger import ffi as tl  # the generated API as it is
from tools import email_call

OPERATION = "op_sqlite"
CALLS_AFTER = 10


def result_for(i):
    return json.dumps({"sent": True, "n": i})


def commit_one(ledger, i):
    spec = tl.CallSpec(call=email_call(call_id=f"call_{i}"), tool_version=1)
    begun = ledger.begin(OPERATION, 0, spec)
    if not begun.is_EXECUTE():
        sys.exit(f"sqlite child: call_{i}: expected Execute, got {begun}")
    ledger.commit(begun.ticket, result_for(i), f"msg_{i}")
    return begun.ticket.execution_id


def report(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main(ledger_path):
    ledger = tl.Ledger.open(ledger_path, tl.LedgerConfig())
    committed = [commit_one(ledger, 0)]
    wal = ledger_path + "-wal"
    if not os.path.exists(wal):
        sys.exit("sqlite child: the ledger wrote no WAL")

    # Another SQLite library in this process opens, reads and closes the file.
    foreign = sqlite3.connect(ledger_path)
    foreign.execute("SELECT count(*) FROM sqlite_master").fetchone()
    foreign.close()
    report(wal_gone=not os.path.exists(wal))

    for i in range(1, CALLS_AFTER + 1):
        committed.append(commit_one(ledger, i))
    # A connection that noticed and reopened writes to a new WAL at the path;
    # one that did not still appends to the deleted file.
    report(committed=committed, wal_back=os.path.exists(wal))
    os.kill(os.getpid(), signal.SIGKILL)
    sys.exit("sqlite child: still alive after SIGKILL")


if __name__ == "__main__":
    main(sys.argv[1])
