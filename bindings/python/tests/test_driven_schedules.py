"""Seeded schedules for the caller-driven `Executor.execute` (an `async def`
tool run in the awaiting task, the path the framework adapters take too)
and `Executor.execute_round` (a round's calls walked in tasks of their own).

In each schedule one to three tasks ask for the same call at random moments,
some are cancelled at random moments, and the tool follows a seeded script
per attempt: it answers, refuses retryably (`NotCommitted`), or raises or
hangs past the perform timeout, before or after its effect. For each kind
of downstream the invariants are checked after every schedule:

- at most one effect per call (a key downstream dedupes by key, so every
  attempt must carry the same key; a lookup or a neither downstream does not
  dedupe, so a second effect would be a resend the ledger made);
- every `Completed` answer is the effect's own result, with the effect there;
  a final `Failed` (not retryable, or the answer once every caller is gone)
  means no effect;
- once every caller is gone the call settles: asking again answers
  something other than `InFlight` within a bounded wait.

TOOLLEDGER_PY_SCHEDULES sets the number of schedules per kind (default 100).
"""

import asyncio
import os
import random

import pytest

import toolledger as tl

SCHEDULES = int(os.environ.get("TOOLLEDGER_PY_SCHEDULES", "100"))
MOVES = ("answer", "refuse", "raise_before", "hang_before", "raise_after", "hang_after", "slow_answer")


class Service:
    """Effects per downstream key, in memory; it dedupes only when told to."""

    def __init__(self):
        self.effects = {}

    def perform(self, key):
        self.effects[key] = self.effects.get(key, 0) + 1
        return f"msg_{key}"

    def find(self, key):
        return f"msg_{key}" if self.effects.get(key) else None

    def count(self, key):
        return self.effects.get(key, 0)


def scripted(name, offers, service, moves):
    """A tool following `moves` attempt by attempt (the last move repeats)."""

    class Scripted(tl.Tool):
        idempotency_key = offers == "key"
        landing_window = 0.001

        def __init__(self):
            self.name = name
            self.attempts = 0
            self.keys = set()

        async def perform(self, request):
            self.attempts += 1
            key = request.downstream_key
            self.keys.add(key)
            if offers == "key" and service.find(key):
                # A downstream that dedupes answers a repeated key with the first effect.
                return {"id": service.find(key)}
            move = moves[min(self.attempts, len(moves)) - 1]
            if move == "refuse":
                raise tl.NotCommitted("503", retryable=True)
            if move == "raise_before":
                raise ConnectionRefusedError("refused")
            if move == "hang_before":
                await asyncio.sleep(10)
            effect = service.perform(key)
            if move == "raise_after":
                raise ConnectionResetError("reset")
            if move == "hang_after":
                await asyncio.sleep(10)
            if move == "slow_answer":
                await asyncio.sleep(0.003)
            return {"id": effect}

    if offers == "lookup":
        class Scripted(Scripted):  # noqa: F811 - the same tool, with a lookup
            async def lookup(self, request):
                found = service.find(request.downstream_key)
                return {"id": found} if found else None

    return Scripted()


def check_call(what, service, tool, offers, answers, final):
    """The invariants of one call after its schedule: at most one effect
    (and one key, for a key downstream); every `Completed` answer the
    effect's own result; a final `Failed` (not retryable, or the last
    answer) only with no effect."""
    effects = sum(service.count(k) for k in tool.keys)
    if offers == "key":
        assert len(tool.keys) <= 1, f"{what}: a resend under another key {tool.keys}"
    assert effects <= 1, f"{what}: {effects} effects"
    for a in answers:
        if isinstance(a, tl.Completed):
            assert effects == 1, f"{what}: Completed with no effect"
            (key,) = tool.keys
            assert a.result == {"id": f"msg_{key}"}, f"{what}: a result that is not the effect's"
        elif isinstance(a, tl.Failed) and (not a.retryable or a is final):
            assert effects == 0, f"{what}: Failed although the effect happened"


@pytest.mark.parametrize("offers", ["key", "lookup", "neither"])
def test_seeded_schedules_never_give_two_effects_a_false_answer_or_a_call_left_in_flight(ledger_path, offers):
    service = Service()
    finals = {}

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executor = tl.Executor(ledger, max_attempts=3, perform_timeout_ms=40, backoff_base_ms=1,
                                   backoff_max_ms=2)
            for s in range(SCHEDULES):
                rng = random.Random(20261202 * 31 + s * 7 + len(offers))
                moves = [rng.choice(MOVES) for _ in range(3)]
                tool = scripted(f"tool_{s}", offers, service, moves)
                executor.register(tool)
                call = tl.ToolCall(f"call_{s}", tool.name, {})
                answers = []

                async def caller(start, cancel_after):
                    await asyncio.sleep(start)
                    task = asyncio.ensure_future(executor.execute(f"sched_{offers}", 0, call))
                    if cancel_after is not None:
                        await asyncio.sleep(cancel_after)
                        task.cancel()
                    try:
                        answers.append(await task)
                    except asyncio.CancelledError:
                        pass

                callers = []
                for _ in range(1 + rng.randrange(3)):
                    start = rng.uniform(0, 0.01)
                    cancel_after = rng.uniform(0, 0.06) if rng.randrange(10) < 3 else None
                    callers.append(caller(start, cancel_after))
                await asyncio.gather(*callers)

                final = None
                for _ in range(300):  # every caller gone: the call settles
                    final = await executor.execute(f"sched_{offers}", 0, call)
                    if not isinstance(final, tl.InFlight):
                        break
                    await asyncio.sleep(0.01)
                assert not isinstance(final, tl.InFlight), f"schedule {s} ({offers}, {moves}): still in flight"
                answers.append(final)

                check_call(f"schedule {s} ({offers}, {moves}): answers {answers}",
                           service, tool, offers, answers, final)
                kind = type(final).__name__
                finals[kind] = finals.get(kind, 0) + 1

    asyncio.run(asyncio.wait_for(main(), 600))
    print(f"{offers}: {SCHEDULES} schedules, final answers {finals}")
    assert sum(finals.values()) == SCHEDULES


@pytest.mark.parametrize("offers", ["key", "lookup", "neither"])
def test_seeded_round_schedules_never_give_two_effects_a_false_answer_or_a_call_left_in_flight(ledger_path, offers):
    """The same invariants for `Executor.execute_round`: each schedule is a
    round of two or three calls (a scripted tool each), asked for by one to
    three tasks at random moments, as a round or (some tasks) one call at a
    time, some tasks cancelled at random moments, under a random
    `max_parallel` (1 to 3): a call waiting for its turn when its task is
    cancelled is given back, a running one reported interrupted."""
    service = Service()
    finals = {}

    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            executors = {
                width: tl.Executor(ledger, max_attempts=3, perform_timeout_ms=40, backoff_base_ms=1,
                                   backoff_max_ms=2, max_parallel=width)
                for width in (1, 2, 3)
            }
            op = f"rounds_{offers}"
            for s in range(SCHEDULES):
                rng = random.Random(20261203 * 31 + s * 7 + len(offers))
                executor = executors[1 + rng.randrange(3)]
                tools, calls, scripts = [], [], []
                for i in range(2 + rng.randrange(2)):
                    moves = [rng.choice(MOVES) for _ in range(3)]
                    tool = scripted(f"rtool_{s}_{i}", offers, service, moves)
                    executor.register(tool)
                    tools.append(tool)
                    scripts.append(moves)
                    calls.append(tl.ToolCall(f"rcall_{s}_{i}", tool.name, {}))
                answers = [[] for _ in calls]

                async def caller(start, cancel_after, which):
                    await asyncio.sleep(start)
                    if which is None:
                        task = asyncio.ensure_future(executor.execute_round(op, 0, calls))
                    else:
                        task = asyncio.ensure_future(executor.execute(op, 0, calls[which]))
                    if cancel_after is not None:
                        await asyncio.sleep(cancel_after)
                        task.cancel()
                    try:
                        got = await task
                    except asyncio.CancelledError:
                        return
                    if which is None:
                        for i, a in enumerate(got):
                            answers[i].append(a)
                    else:
                        answers[which].append(got)

                callers = []
                for _ in range(1 + rng.randrange(3)):
                    start = rng.uniform(0, 0.01)
                    cancel_after = rng.uniform(0, 0.06) if rng.randrange(10) < 3 else None
                    which = None if rng.randrange(3) else rng.randrange(len(calls))
                    callers.append(caller(start, cancel_after, which))
                await asyncio.gather(*callers)

                final = None
                for _ in range(300):  # every caller gone: every call settles
                    final = await executor.execute_round(op, 0, calls)
                    if not any(isinstance(a, tl.InFlight) for a in final):
                        break
                    await asyncio.sleep(0.01)
                for i, (tool, moves) in enumerate(zip(tools, scripts)):
                    what = f"round schedule {s} ({offers}), call {i} {moves}: answers {answers[i]}, final {final[i]}"
                    assert not isinstance(final[i], tl.InFlight), f"{what}: still in flight"
                    check_call(what, service, tool, offers, answers[i] + [final[i]], final[i])
                    kind = type(final[i]).__name__
                    finals[kind] = finals.get(kind, 0) + 1

    asyncio.run(asyncio.wait_for(main(), 600))
    print(f"{offers}: {SCHEDULES} round schedules, final answers {finals}")
    assert sum(finals.values()) >= 2 * SCHEDULES
