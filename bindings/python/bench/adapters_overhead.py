"""Per-call cost of a no-op side-effecting tool in each framework, with and
without the toolledger adapter, measured in one run.

    python bindings/python/bench/adapters_overhead.py [--calls N] [--dir DIR]

For each framework the tool is called the way the framework calls it
(LangGraph: ``tool.invoke(tool_call, config)`` as ``ToolNode`` does; OpenAI
Agents SDK: ``FunctionTool.on_invoke_tool(ctx, json)`` as the runner does;
MCP: ``call_tool`` over an in-memory connection to an MCP server), every call
with a new identity (a new call id), so each one is a real execution: the
durable intent, the tool, the durable result.

The budget of the issue: the adapter adds no more than the ledger's own two
durable commits plus 150 µs. The ledger's two durable commits are measured in
the same run as ``ledger.begin`` + ``ledger.commit`` of a call (the step API,
nothing else), and the verdict per framework compares the medians:
``added = with - without`` against ``budget = floor + 150 µs``.

For reference, each round also runs the same no-op as a plain ``@tl.tool``
through ``tl.Executor`` (no framework, no adapter): the library's own round
trip for a Python tool, whose calls from the library's threads into Python
and back come on top of the two commits for every Python tool, adapter or
not. ``added_beyond_plain_python_tool`` is what the adapter itself costs.
Wall times on a busy machine count every thread hop as a wait for a core, so
the CPU time of the whole process per call (all threads, mean) is printed
too: it is what a call costs however busy the machine is.

The ledger file lives in ``--dir`` (default: a new directory under the
current one): put it on the disk an app would use, not on a tmpfs, or the
commits cost nothing. Prints one ``name=value`` line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid

import toolledger as tl
from toolledger.adapters import Downstream, LedgerRuntime

BUDGET_EXTRA_US = 150.0


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def p90_us(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=10)[-1] * 1e6


async def interleaved(callables: dict, n: int) -> dict:
    """Calls each of ``callables`` (name -> coroutine function) once per
    round, ``n`` rounds, so that a slower disk or a busy neighbour at one
    moment weighs on every variant alike. Returns name -> durations (s)."""
    out = {name: [] for name in callables}
    cpu = {name: 0.0 for name in callables}
    for fn in callables.values():  # warm-up
        await fn()
    for _ in range(n):
        for name, fn in callables.items():
            c0, t0 = time.process_time(), time.perf_counter()
            await fn()
            out[name].append(time.perf_counter() - t0)
            cpu[name] += time.process_time() - c0
    out["cpu"] = {name: total / n for name, total in cpu.items()}
    return out


def sync(fn):
    async def call():
        fn()
    return call


# -- the floor: the ledger's two durable commits ----------------------------

def ledger_floor(ledger):
    counter = iter(range(10**9))

    def one():
        i = next(counter)
        call = tl.ToolCall(f"floor_{i}", "noop", "{}")
        begin = ledger.begin("bench-floor", 0, tl.CallSpec(call=call, tool_version=1))
        ledger.commit(begin.ticket, '"ok"', None)

    return sync(one)


def plain_executor(runtime):
    """The same no-op as a plain ``@tl.tool`` run by ``tl.Executor``: what
    any Python tool pays for the library's round trip (the two commits and
    the calls from the library's threads into Python and back)."""
    @tl.tool(name="noop_plain", idempotency_key=True)
    async def noop_plain(request):
        return "ok"

    executor = tl.Executor(runtime.ledger, tools=[noop_plain])
    counter = iter(range(10**9))

    async def one():
        await executor.execute("bench-plain", 0, tl.ToolCall(f"plain_{next(counter)}", "noop_plain", "{}"))

    return one


# -- LangGraph ----------------------------------------------------------------

async def bench_langgraph(runtime, floor, plain, n: int) -> dict:
    from langchain_core.tools import tool

    from toolledger.adapters.langgraph import ledger_tool

    @tool
    def noop_lg(x: int) -> str:
        """Does nothing."""
        return "ok"

    wrapped = ledger_tool(noop_lg, runtime, downstream=Downstream.KEY)
    steps = iter(range(10**9))

    def call(t):
        def one():
            step = next(steps)
            config = {"configurable": {"thread_id": "bench"}, "metadata": {"langgraph_step": step}}
            t.invoke({"type": "tool_call", "name": "noop_lg", "args": {"x": 1}, "id": f"call_{step}"}, config)
        return sync(one)

    return await interleaved({"floor": floor, "executor": plain, "without": call(noop_lg), "with": call(wrapped)}, n)


# -- OpenAI Agents SDK ----------------------------------------------------------

async def bench_openai_agents(runtime, floor, plain, n: int) -> dict:
    from agents import function_tool
    from agents.tool_context import ToolContext

    from toolledger.adapters import openai_agents as oa

    @function_tool(failure_error_function=None)
    def noop_oa(x: int) -> str:
        """Does nothing."""
        return "ok"

    agents = oa.AgentsLedger(runtime)
    wrapped = agents.tool(noop_oa, downstream=Downstream.KEY)
    ids = iter(range(10**9))

    def call(t):
        async def one():
            i = next(ids)
            ctx = ToolContext(context=None, tool_name="noop_oa", tool_call_id=f"call_{i}", tool_arguments='{"x":1}')
            await t.on_invoke_tool(ctx, '{"x":1}')
        return one

    # The run scope AgentsLedger.run sets: one run, one turn, new call ids.
    token = oa._SCOPE.set(oa._RunScope(run_id=f"bench-{uuid.uuid4().hex}", turn=1))
    try:
        return await interleaved({"floor": floor, "executor": plain, "without": call(noop_oa), "with": call(wrapped)}, n)
    finally:
        oa._SCOPE.reset(token)


# -- MCP -------------------------------------------------------------------------

async def bench_mcp(runtime, floor, reference, n: int) -> dict:
    from mcp.client._memory import InMemoryTransport
    from mcp.server.mcpserver import MCPServer

    from toolledger.adapters.mcp import MCPLedger

    server = MCPServer("bench")

    @server.tool()
    def noop_mcp(x: int) -> str:
        """Does nothing."""
        return "ok"

    ledger_mcp = MCPLedger(runtime, server="bench")
    ledger_mcp.tool("noop_mcp", downstream=Downstream.KEY)
    ids = iter(range(10**9))

    async with InMemoryTransport(server)._connect() as (read, write):
        async with ledger_mcp.session(read, write) as session:
            await session.initialize()

            async def plain():
                await session.call_tool("noop_mcp", {"x": 1})

            async def wrapped():
                i = next(ids)
                await ledger_mcp.call_tool(session, "noop_mcp", {"x": 1},
                                           operation_id="bench-mcp", round=0, call_id=f"call_{i}")

            return await interleaved({"floor": floor, "executor": reference, "without": plain, "with": wrapped}, n)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    workdir = args.dir or tempfile.mkdtemp(prefix="toolledger-bench-", dir=os.getcwd())
    runtime = LedgerRuntime(os.path.join(workdir, "ledger.db"))
    floor = ledger_floor(runtime.ledger)
    plain = plain_executor(runtime)
    print(f"dir={workdir} calls={args.calls}")
    verdicts = []
    for name, bench in (("langgraph", bench_langgraph), ("openai_agents", bench_openai_agents), ("mcp", bench_mcp)):
        times = asyncio.run(bench(runtime, floor, plain, args.calls))
        floor_us = median_us(times["floor"])
        without_us, with_us = median_us(times["without"]), median_us(times["with"])
        added = with_us - without_us
        budget = floor_us + BUDGET_EXTRA_US
        ok = added <= budget
        verdicts.append(ok)
        print(f"{name}_ledger_two_commits_p50_us={floor_us:.0f}")
        print(f"{name}_without_p50_us={without_us:.0f}")
        print(f"{name}_with_p50_us={with_us:.0f}")
        print(f"{name}_with_p90_us={p90_us(times['with']):.0f}")
        print(f"{name}_added_p50_us={added:.0f}")
        print(f"{name}_added_beyond_two_commits_us={added - floor_us:.0f}")
        executor_us = median_us(times["executor"])
        print(f"{name}_plain_python_tool_via_executor_p50_us={executor_us:.0f}")
        print(f"{name}_added_beyond_plain_python_tool_us={added - executor_us:.0f}")
        print(f"{name}_budget_us={budget:.0f} {'met' if ok else 'NOT met'}")
        cpu = {k: v * 1e6 for k, v in times["cpu"].items()}
        print(f"{name}_cpu_mean_us floor={cpu['floor']:.0f} plain_python_tool={cpu['executor']:.0f} "
              f"without={cpu['without']:.0f} with={cpu['with']:.0f} "
              f"added={cpu['with'] - cpu['without']:.0f}")
    runtime.close()
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
