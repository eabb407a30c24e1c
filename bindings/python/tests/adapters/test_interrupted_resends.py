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
        assert rec.status is not tl.ExecutionStatus.EXECUTING
        assert rec.status is not tl.ExecutionStatus.FAILED_BEFORE_COMMIT, (
            f"an effect that happened is recorded failed before commit: {rec.last_reason!r}")
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
        print("recover:", rec)
        outs = [o for o in (rec.outcomes if rec is not None else [])]
        assert not any(isinstance(o, tl.Failed) for o in outs), f"recover() says Failed: {outs!r}"
    finally:
        rt.close()
