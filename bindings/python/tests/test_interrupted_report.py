"""A caller interrupted while its tool runs (``KeyboardInterrupt``, a
cancelled task) reports the attempt before the interruption goes on. When
that report cannot be recorded (the ledger was suspended meanwhile, a
storage error) the report's error replaced the interruption: the caller got
``toolledger`` error instead of its ``KeyboardInterrupt`` (an app's
``except ToolLedgerError`` swallowed the Ctrl-C) or ``CancelledError`` (an
``asyncio.wait_for`` raised the ledger's error instead of ``TimeoutError``,
a ``TaskGroup`` saw a failure instead of a cancellation). The library keeps
an attempt whose report failed as its orphan (the next ask reconciles it),
so the interruption goes on, and the call is not left in flight."""

import asyncio

import pytest

import toolledger as tl


def test_a_ctrl_c_whose_report_cannot_be_recorded_is_still_a_ctrl_c(ledger_path):
    with tl.Ledger.open(ledger_path) as ledger:
        runs = []

        @tl.tool(name="send")
        def send(request):
            runs.append(request.attempt)
            ledger.suspend()  # e.g. the app's signal handler suspends first
            raise KeyboardInterrupt

        executor = tl.Executor(ledger, tools=[send])
        with pytest.raises(KeyboardInterrupt):
            executor.execute_sync("op", 0, tl.ToolCall("c1", "send", {}))
        ledger.resume()
        # Never in flight for the life of the process: the attempt's
        # outcome is unknown (it may have been sent), and nothing runs again.
        again = executor.execute_sync("op", 0, tl.ToolCall("c1", "send", {}))
        assert isinstance(again, tl.Unknown), again
        assert runs == [1]


def test_a_cancelled_call_whose_report_cannot_be_recorded_is_still_cancelled(ledger_path):
    async def main():
        with tl.Ledger.open(ledger_path) as ledger:
            started = asyncio.Event()

            @tl.tool(name="send")
            async def send(request):
                started.set()
                await asyncio.sleep(60)

            executor = tl.Executor(ledger, tools=[send])
            task = asyncio.ensure_future(executor.execute("op", 0, tl.ToolCall("c1", "send", {})))
            await asyncio.wait_for(started.wait(), 30)
            ledger.suspend()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
            ledger.resume()
            again = await asyncio.wait_for(executor.execute("op", 0, tl.ToolCall("c1", "send", {})), 30)
            assert isinstance(again, tl.Unknown), again

    asyncio.run(main())


class _SecondCtrlC:
    """The executor's steps, with a second Ctrl-C arriving while the
    interrupted attempt's report is written (CPython runs the signal's
    handler as the native call returns: the report is recorded, its answer
    never reaches the caller)."""

    def __init__(self, steps):
        self._steps = steps
        self.fired = False

    def __getattr__(self, name):
        return getattr(self._steps, name)

    def report_attempt(self, *args):
        step = self._steps.report_attempt(*args)
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt
        return step

    def report_interrupted(self, *args):
        step = self._steps.report_interrupted(*args)
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt
        return step


def test_a_second_ctrl_c_during_the_interrupted_report_does_not_leave_the_call_in_flight(ledger_path):
    with tl.Ledger.open(ledger_path) as ledger:
        sent = []

        @tl.tool(name="send", idempotency_key=True)
        def send(request):
            sent.append(request.attempt)
            if len(sent) == 1:
                raise KeyboardInterrupt  # the first Ctrl-C, while the tool runs
            return {"ok": True}

        executor = tl.Executor(ledger, tools=[send])
        executor._steps = _SecondCtrlC(executor._steps)
        with pytest.raises(KeyboardInterrupt):
            executor.execute_sync("op", 0, tl.ToolCall("c1", "send", {}))
        again = executor.execute_sync("op", 0, tl.ToolCall("c1", "send", {}))
        assert not isinstance(again, tl.InFlight), again
