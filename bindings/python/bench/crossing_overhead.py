"""What a call costs through the Python bindings, beside the same call
through the Rust API, measured in one run.

    python bindings/python/bench/crossing_overhead.py --reference PATH [--calls N] [--batches B] [--dir DIR]

``--reference`` is the ``toolledger-crossing-reference`` program (built by
``cargo build --release -p toolledger-bench``): the Rust API's side. This
script starts it and alternates batches of ``--calls`` calls between it and
each Python variant, ``--batches`` times, so both sides share the disk and
the load of the same moments. Figures (no-op tools; every side-effecting
call is a new execution):

* ``ledger``: ``begin`` → ``commit`` → ``mark_delivered`` (two durable
  commits), the Ledger API;
* ``executor``: ``execute`` of a side-effecting tool;
* ``replay``: ``execute`` of a call that committed;
* ``read_only``: ``execute`` of a read-only tool;
* ``round8`` (with ``--rounds``): ``execute_round`` of eight new calls of
  the side-effecting tool (one durable begin for the eight), against the
  Rust ``execute_round``; ``python_driven`` is ``tl.Executor.execute_round``
  now (``start_round``, each call walked in its own task), ``python_callback``
  the library's async round calling the tools back, ``python_each`` eight
  ``tl.Executor.execute`` one after another (eight durable begins).

The executor figures come in three ways: ``callback`` is the library's async
``ToolExecutor.execute``, which calls the Python tool back from its own
threads (what ``tl.Executor.execute`` did before the caller-driven steps);
``driven`` is ``tl.Executor.execute`` now (``start`` / ``report`` in the
awaiting task, an ``async def`` tool); ``sync`` is ``execute_sync`` (a
``def`` tool, no event loop). Prints ``name=value`` lines: p50 and p99 per
figure in µs, and each figure's p50 minus the Rust p50 of the same figure.
Put ``--dir`` on the disk an app would use (the default is a new directory
under the current one), not a tmpfs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time

import toolledger as tl


def pct(samples: list, q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6


class Reference:
    """The Rust side: a child process running the same figures."""

    def __init__(self, program: str, workdir: str):
        self.child = subprocess.Popen([program, workdir], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def batch(self, figure: str, n: int) -> list:
        self.child.stdin.write(f"{figure} {n}\n")
        self.child.stdin.flush()
        line = self.child.stdout.readline()
        if not line:
            raise RuntimeError("the reference program stopped")
        return [int(x) / 1e9 for x in line.split()]

    def close(self) -> None:
        self.child.stdin.close()
        self.child.wait(timeout=30)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--reference", required=True)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--dir", default=None)
    p.add_argument("--rounds", action="store_true", help="add the round8 figure")
    args = p.parse_args()
    workdir = args.dir or tempfile.mkdtemp(prefix="toolledger-crossing-", dir=os.getcwd())

    @tl.tool(name="noop", idempotency_key=True)
    async def noop(request):
        return "ok"

    @tl.tool(name="noop_sync", idempotency_key=True)
    def noop_sync(request):
        return "ok"

    @tl.tool(name="noop_read", read_only=True)
    async def noop_read(request):
        return "ok"

    @tl.tool(name="noop_read_sync", read_only=True)
    def noop_read_sync(request):
        return "ok"

    ledger = tl.Ledger.open(os.path.join(workdir, "python.db"))
    executor = tl.Executor(ledger, tools=[noop, noop_sync, noop_read, noop_read_sync])
    reference = Reference(args.reference, workdir)
    counter = iter(range(10**9))

    def new_call(tool: str) -> tl.ToolCall:
        return tl.ToolCall(f"py_{next(counter)}", tool, "{}")

    replayed = tl.ToolCall("replayed", "noop", "{}")
    replayed_sync = tl.ToolCall("replayed", "noop_sync", "{}")
    read = tl.ToolCall("read", "noop_read", "{}")
    read_sync = tl.ToolCall("read", "noop_read_sync", "{}")

    def ledger_once():
        begin = ledger.begin("crossing", 1, tl.CallSpec(call=new_call("noop"), tool_version=1))
        ledger.commit(begin.ticket, '"ok"', None)
        ledger.mark_delivered([begin.ticket.execution_id])

    async def callback(call):
        native = executor._enter()
        out = await native.execute("crossing", 2, call)
        assert type(out).__name__.endswith("COMPLETED"), out

    async def driven(call):
        out = await executor.execute("crossing", 2, call)
        assert isinstance(out, tl.Completed), out

    def sync(call):
        out = executor.execute_sync("crossing", 2, call)
        assert isinstance(out, tl.Completed), out

    async def round_callback():
        native = executor._enter()
        outs = await native.execute_round("crossing", 4, [new_call("noop") for _ in range(8)])
        assert all(type(o).__name__.endswith("COMPLETED") for o in outs), outs

    async def round_driven():
        outs = await executor.execute_round("crossing", 4, [new_call("noop") for _ in range(8)])
        assert all(isinstance(o, tl.Completed) for o in outs), outs

    async def round_each():
        for _ in range(8):
            await driven(new_call("noop"))

    variants = {
        "ledger": [("python", lambda: ledger_once())],
        "executor": [
            ("python_callback", lambda: callback(new_call("noop"))),
            ("python_driven", lambda: driven(new_call("noop"))),
            ("python_sync", lambda: sync(new_call("noop_sync"))),
        ],
        "replay": [
            ("python_callback", lambda: callback(replayed)),
            ("python_driven", lambda: driven(replayed)),
            ("python_sync", lambda: sync(replayed_sync)),
        ],
        "read_only": [
            ("python_callback", lambda: callback(read)),
            ("python_driven", lambda: driven(read)),
            ("python_sync", lambda: sync(read_sync)),
        ],
    }

    if args.rounds:
        variants["round8"] = [
            ("python_callback", round_callback),
            ("python_driven", round_driven),
            ("python_each", round_each),
        ]

    async def run() -> dict:
        samples: dict = {}
        await driven(replayed)  # the call every replay asks for
        sync(replayed_sync)
        for _ in range(args.batches):
            for figure, ways in variants.items():
                samples.setdefault((figure, "rust"), []).extend(reference.batch(figure, args.calls))
                for name, fn in ways:
                    out = samples.setdefault((figure, name), [])
                    for _ in range(args.calls):
                        t0 = time.perf_counter()
                        value = fn()
                        if asyncio.iscoroutine(value):
                            await value
                        out.append(time.perf_counter() - t0)
        return samples

    samples = asyncio.run(run())
    reference.close()
    ledger.close()
    print(f"dir={workdir} calls={args.calls} batches={args.batches} load={os.getloadavg()[0]:.1f}")
    for figure, ways in variants.items():
        rust = samples[(figure, "rust")]
        rust_p50 = pct(rust, 0.5)
        print(f"{figure}_rust_p50_us={rust_p50:.0f} {figure}_rust_p99_us={pct(rust, 0.99):.0f}")
        for name, _ in ways:
            s = samples[(figure, name)]
            p50 = pct(s, 0.5)
            print(f"{figure}_{name}_p50_us={p50:.0f} {figure}_{name}_p99_us={pct(s, 0.99):.0f} "
                  f"{figure}_{name}_over_rust_p50_us={p50 - rust_p50:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
