"""An interrupted key-tool call reports each same-key resend it is handed
unknown, and each such report hands out the next (one attempt each) until
`max_attempts`. A loop bounded by a fixed step count (64) stopped first
with `max_attempts` above it and left the last resend running in this
process (`InFlight` for ever): the executor's attempts end the chain."""

import pytest

import toolledger as tl
from toolledger.adapters import Downstream, LedgerRuntime
from toolledger.adapters._core import ToolSpec


@pytest.mark.parametrize("max_attempts", [3, 100])
def test_interrupted_key_tool_not_left_executing(tmp_path, max_attempts):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2,
                       max_attempts=max_attempts)
    effects = []

    def send(args):
        effects.append(args)
        raise KeyboardInterrupt

    rt.register(ToolSpec(name="send_email", run=send, downstream=Downstream.KEY))
    try:
        with pytest.raises(KeyboardInterrupt):
            rt.call("conv:1", 0, "call_1", "send_email", '{"to":"a@example.com"}',
                    lambda: send({"to": "a@example.com"}))
        (rec,) = rt.ledger.list("conv:1")
        print("status", rec.status, "attempts", rec.attempt_count)
        # Unknown at attempt 1: neither left running nor using attempts up,
        # whatever max_attempts is.
        assert (rec.status, rec.attempt_count) == (tl.ExecutionStatus.OUTCOME_UNKNOWN, 1), (
            f"{rec.status} at attempt {rec.attempt_count} of {max_attempts}")
    finally:
        rt.close()


def test_repeat_after_interrupt_is_not_in_flight(tmp_path):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2,
                       max_attempts=100)
    calls = []

    def send(args):
        calls.append(args)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return "sent"

    rt.register(ToolSpec(name="send_email", run=send, downstream=Downstream.KEY))
    try:
        with pytest.raises(KeyboardInterrupt):
            rt.call("conv:1", 0, "call_1", "send_email", '{"to":"a@example.com"}',
                    lambda: send({"to": "a@example.com"}))
        again = rt.call("conv:1", 0, "call_1", "send_email", '{"to":"a@example.com"}',
                        lambda: send({"to": "a@example.com"}))
        # The repeat sends the same key again (attempt 2) and commits.
        assert isinstance(again, tl.Completed) and again.result == "sent", again
        assert len(calls) == 2
    finally:
        rt.close()
