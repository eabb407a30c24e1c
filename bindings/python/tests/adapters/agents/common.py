"""What the agent processes under test share: arguments, the email tool's
effect at the loopback downstream, the crash, and the one-line report.

An agent process prints one JSON line last: ``{"status": "ok", ...}``,
``{"status": "unknown", "execution_id": ..., "attempt": ...}`` or
``{"status": "error", "error": ...}``. With ``TL_CRASH_AFTER_EFFECT=1`` the
email tool SIGKILLs its own process right after the downstream answered:
the effect exists, the framework (and the ledger) never heard of it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from downstream import Client  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["first", "resume"], required=True)
    p.add_argument("--adapter", choices=["on", "off", "tools-only"], required=True)
    p.add_argument("--downstream", choices=["key", "lookup", "neither"], required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--dir", required=True)
    return p.parse_args(argv)


def crash_if_asked() -> None:
    if os.environ.get("TL_CRASH_AFTER_EFFECT") == "1":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def send_email(client: Client, cls: str, body: dict, key: str | None) -> str:
    """The side effect: one request to the downstream of class ``cls``. A
    tool without the ledger has no key to send (``key`` None)."""
    if cls == "key":
        answer = client.send("key", body, key=key)
    elif cls == "lookup":
        answer = client.send("lookup", body, ref=key)
    else:
        answer = client.send("neither", body)
    crash_if_asked()
    return f"sent {answer['id']}"


def find_email(client: Client, key: str):
    found = client.find(key)
    return None if found is None else f"sent {found['id']}"


def report(**fields) -> None:
    print(json.dumps(fields), flush=True)


def report_exception(exc: BaseException) -> None:
    from toolledger.adapters import OutcomeUnknown

    if isinstance(exc, OutcomeUnknown):
        report(status="unknown", execution_id=exc.execution_id, attempt=exc.attempt, reason=exc.reason)
    else:
        report(status="error", error=f"{type(exc).__name__}: {exc}")
