"""Tools and a fake downstream shared by the tests and the crash child.

The "downstream" is a separate SQLite file (not the ledger): every effect the
tool performs is one row, so tests can count real side effects, and `lookup`
can find an effect by its downstream key as a real service would.
"""

import asyncio
import json
import os
import sqlite3

from toolledger import ffi as tl  # the generated API as it is


class Downstream:
    """A remote service that records effects; no deduplication of its own."""

    def __init__(self, path):
        self.path = str(path)
        with sqlite3.connect(self.path) as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS effects ("
                " n INTEGER PRIMARY KEY, downstream_key TEXT, args TEXT)"
            )

    def perform(self, key, args_json):
        with sqlite3.connect(self.path) as db:
            cur = db.execute(
                "INSERT INTO effects (downstream_key, args) VALUES (?, ?)", (key, args_json)
            )
            return f"msg_{cur.lastrowid}"

    def find(self, key):
        with sqlite3.connect(self.path) as db:
            row = db.execute(
                "SELECT n FROM effects WHERE downstream_key = ? ORDER BY n LIMIT 1", (key,)
            ).fetchone()
        return None if row is None else f"msg_{row[0]}"

    def count(self):
        with sqlite3.connect(self.path) as db:
            return db.execute("SELECT COUNT(*) FROM effects").fetchone()[0]


class SendEmail(tl.ToolHandler):
    """A side-effecting tool, as an app would write it: async perform."""

    def __init__(
        self,
        downstream,
        *,
        lookup=True,
        requires_approval=False,
        fail_with=None,
        fail_times=None,
        landing_window_ms=None,
        name="send_email",
    ):
        """`fail_with` is raised by `perform` before any effect, on every
        call or only on the first `fail_times` calls. `landing_window_ms`
        None keeps the descriptor's default (120000)."""
        self.downstream = downstream
        self.calls = 0
        self.lookups = 0
        self.can_lookup = lookup
        self.requires_approval = requires_approval
        self.fail_with = fail_with
        self.fail_times = fail_times
        self.landing_window_ms = landing_window_ms
        self.name = name

    def descriptor(self):
        extra = {}
        if self.landing_window_ms is not None:
            extra["landing_window_ms"] = self.landing_window_ms
        return tl.ToolDescriptor(
            name=self.name,
            version=1,
            effect=tl.EffectClass.SIDE_EFFECT,
            batch=tl.BatchMode.ATOMIC,
            lookup=self.can_lookup,
            requires_approval=self.requires_approval,
            **extra,
        )

    async def perform(self, request):
        self.calls += 1
        await asyncio.sleep(0)  # a real await on the app's loop
        if self.fail_with is not None and (self.fail_times is None or self.calls <= self.fail_times):
            raise self.fail_with
        msg_id = self.downstream.perform(request.downstream_key, request.arguments_json)
        return tl.PerformOutcome.COMMITTED(
            result_json=json.dumps({"sent": True, "id": msg_id}), external_id=msg_id
        )

    async def lookup(self, request):
        self.lookups += 1
        msg_id = self.downstream.find(request.downstream_key)
        if msg_id is None:
            return tl.LookupOutcome.NOT_FOUND()
        return tl.LookupOutcome.FOUND(
            result_json=json.dumps({"sent": True, "id": msg_id}), external_id=msg_id
        )

    def approval_preview(self, arguments_json):
        to = json.loads(arguments_json).get("to", "?")
        return json.dumps({"to": to})


class Weather(tl.ToolHandler):
    """A read-only tool: nothing is recorded for it."""

    def __init__(self):
        self.calls = 0

    def descriptor(self):
        return tl.ToolDescriptor(
            name="weather", version=1, effect=tl.EffectClass.READ_ONLY, batch=tl.BatchMode.ATOMIC
        )

    async def perform(self, request):
        self.calls += 1
        return tl.PerformOutcome.COMMITTED(result_json='{"celsius":21}', external_id=None)

    async def lookup(self, request):
        return tl.LookupOutcome.UNSUPPORTED()

    def approval_preview(self, arguments_json):
        return None


class SendThenHang(SendEmail):
    """Performs the effect downstream, signals it, then never returns: the
    process is killed before the ledger learns the result (the
    `after-remote-commit` crash boundary)."""

    def __init__(self, downstream, marker):
        super().__init__(downstream)
        self.marker = marker

    async def perform(self, request):
        self.calls += 1
        self.downstream.perform(request.downstream_key, request.arguments_json)
        with open(self.marker, "w") as f:
            f.write(str(os.getpid()))
        await asyncio.Event().wait()  # until SIGKILL


def email_call(call_id="call_1", to="a@example.com", body="hi"):
    return tl.ToolCall(
        provider=tl.Provider.CUSTOM,
        call_id=call_id,
        tool_name="send_email",
        arguments=json.dumps({"to": to, "body": body}),
    )
