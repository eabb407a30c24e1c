"""Proof against the real frameworks: an agent killed after its email took
effect at the downstream and before its framework recorded it, then resumed
as the framework documents. Without the adapter the framework sends it again
(its baseline: 2 effects); with it, exactly 1 effect for a downstream with
keys or lookup, and for one with neither an explicit unknown outcome handed
to the app instead of a resend."""

import pytest

import toolledger as tl
from .harness import OPERATIONS, crash_and_resume

FRAMEWORKS = ["langgraph", "openai_agents", "mcp"]
RESULTS: list[tuple[str, str, str, int]] = []  # (framework, mode, downstream, effects)


def stored_calls(workdir, framework):
    """The side-effecting executions the ledger holds for the run (the
    Agents adapter's recorded model responses left out)."""
    with tl.Ledger.open(f"{workdir}/ledger.db") as ledger:
        executions = ledger.list(OPERATIONS[framework])
    return [e for e in executions if e.tool_name != "toolledger.model_response"]


@pytest.mark.parametrize("downstream", ["key", "lookup", "neither"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_without_the_adapter_the_framework_sends_again(framework, downstream, tmp_path):
    run = crash_and_resume(framework, "off", downstream, str(tmp_path))
    RESULTS.append((framework, "baseline", downstream, run.effects))
    assert run.effects_after_crash == 1
    assert run.report["status"] == "ok", run.report
    assert run.effects == 2, "the framework's own resume is expected to send the email again"


@pytest.mark.parametrize("downstream", ["key", "lookup"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_with_the_adapter_the_effect_happens_once(framework, downstream, tmp_path):
    run = crash_and_resume(framework, "on", downstream, str(tmp_path))
    RESULTS.append((framework, "adapter", downstream, run.effects))
    assert run.effects_after_crash == 1
    assert run.report["status"] == "ok", run.report
    assert run.effects == 1
    calls = stored_calls(tmp_path, framework)
    assert len(calls) == 1
    assert calls[0].status in (tl.ExecutionStatus.COMMITTED, tl.ExecutionStatus.RESULT_DELIVERED)
    # The stored result is the effect the first (killed) process made.
    assert "eff_1" in calls[0].result_json


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_with_the_adapter_and_neither_the_app_gets_unknown(framework, tmp_path):
    run = crash_and_resume(framework, "on", "neither", str(tmp_path))
    RESULTS.append((framework, "adapter", "neither", run.effects))
    assert run.effects == 1, "nothing may be resent to a downstream with neither key nor lookup"
    assert run.report["status"] == "unknown", run.report
    calls = stored_calls(tmp_path, framework)
    assert len(calls) == 1
    assert calls[0].status == tl.ExecutionStatus.OUTCOME_UNKNOWN
    assert run.report["execution_id"] == calls[0].execution_id


@pytest.mark.parametrize("downstream", ["key", "lookup"])
def test_openai_agents_tools_alone_cannot_name_a_regenerated_call(downstream, tmp_path):
    """Without the recorded model responses, the SDK's resume asks the model
    again and gets a new call_id: a new execution for the ledger, so the
    email goes out twice. This is why the adapter wraps the model too."""
    run = crash_and_resume("openai_agents", "tools-only", downstream, str(tmp_path))
    RESULTS.append(("openai_agents", "tools only", downstream, run.effects))
    assert run.effects == 2
    assert len(stored_calls(tmp_path, "openai_agents")) == 2
