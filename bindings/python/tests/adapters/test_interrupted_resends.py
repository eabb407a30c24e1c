"""An idempotency-key tool whose caller is interrupted (KeyboardInterrupt)
after the tool made its effect. Its attempt's outcome is unknown; the
same-key resend the UNKNOWN report hands out at once is never run. Reported
"not sent" (an earlier version did), a landing window of 0 let the library
settle the execution as FAILED_BEFORE_COMMIT, and recover() said Failed, for
an effect that happened: the resends are reported unknown too."""

import pytest

import toolledger as tl
from toolledger.adapters import Downstream, LedgerRuntime
from toolledger.adapters._core import ToolSpec


@pytest.mark.parametrize("window", [0, None])
def test_interrupted_key_tool_is_not_recorded_failed_before_commit(tmp_path, window):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2)
    effects = []

    def send(args):
        effects.append(args)
        raise KeyboardInterrupt  # the caller is interrupted after the effect

    rt.register(ToolSpec(name="send_email", run=send, downstream=Downstream.KEY,
                         landing_window_ms=window))
    try:
        with pytest.raises(KeyboardInterrupt):
            rt.call("conv:1", 0, "call_1", "send_email", '{"to":"a@example.com"}',
                    lambda: send({"to": "a@example.com"}))
        assert len(effects) == 1
        (rec,) = rt.ledger.list("conv:1")
        print("status", rec.status, "attempts", rec.attempt_count, "reason", rec.last_reason)
        # Unknown (the effect may have happened): attempt 1, reported
        # interrupted; nothing handed out after it.
        assert (rec.status, rec.attempt_count) == (tl.ExecutionStatus.OUTCOME_UNKNOWN, 1), (
            f"{rec.status} at attempt {rec.attempt_count}: {rec.last_reason!r}")
    finally:
        rt.close()


def test_recover_never_reports_the_interrupted_effect_as_failed(tmp_path):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2)
    effects = []

    def send(args):
        effects.append(args)
        raise KeyboardInterrupt

    rt.register(ToolSpec(name="send_email", run=send, downstream=Downstream.KEY, landing_window_ms=0))
    try:
        with pytest.raises(KeyboardInterrupt):
            rt.call("conv:1", 0, "call_1", "send_email", '{"to":"a@example.com"}',
                    lambda: send({"to": "a@example.com"}))
        import asyncio
        rec = asyncio.run(rt.executor.recover())
        # recover() resends under the same key (attempts 2 and 3, the last);
        # the tool is interrupted again each time, which is its error there:
        # unknown, never Failed.
        (out,) = rec.outcomes
        assert isinstance(out, tl.Unknown), f"recover() says {out!r}"
        assert len(effects) == 3
    finally:
        rt.close()
