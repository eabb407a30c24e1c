"""Runs an agent process of tests/adapters/agents/ against a loopback
downstream: once killed by SIGKILL right after its email took effect, then
resumed as its framework documents; counts the effects."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

from .downstream import LoopbackDownstream

HERE = os.path.dirname(os.path.abspath(__file__))
AGENTS = os.path.join(HERE, "agents")
SCRIPTS = {
    "langgraph": "langgraph_agent.py",
    "openai_agents": "openai_agents_agent.py",
    "mcp": "mcp_agent.py",
}
OPERATIONS = {
    "langgraph": "langgraph:thread-1",
    "openai_agents": "openai-agents:conversation-1:user-1",
    "mcp": "conversation-1:user-1",
}
# Each process must be done well within this (a run takes about a second).
PROCESS_TIMEOUT_S = 120


@dataclass
class CrashResume:
    effects: int  # effects at the downstream after the crash and the resume
    effects_after_crash: int
    report: dict  # what the resumed process reported
    ledger_dir: str


def run_agent(framework: str, phase: str, adapter: str, downstream: str, url: str, workdir: str, crash: bool):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([AGENTS, HERE] + sys.path)
    env["TL_CRASH_AFTER_EFFECT"] = "1" if crash else "0"
    env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    cmd = [sys.executable, os.path.join(AGENTS, SCRIPTS[framework]),
           "--phase", phase, "--adapter", adapter, "--downstream", downstream, "--url", url, "--dir", workdir]
    return subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)


def last_report(proc) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"no report (rc {proc.returncode})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return json.loads(lines[-1])


def crash_and_resume(framework: str, adapter: str, downstream: str, workdir: str) -> CrashResume:
    with LoopbackDownstream() as service:
        first = run_agent(framework, "first", adapter, downstream, service.url, workdir, crash=True)
        assert first.returncode == -signal.SIGKILL, (
            f"the first run was to be killed after the effect (rc {first.returncode})\n{first.stdout}\n{first.stderr}"
        )
        after_crash = service.count()
        resumed = run_agent(framework, "resume", adapter, downstream, service.url, workdir, crash=False)
        assert resumed.returncode == 0, f"resume failed (rc {resumed.returncode})\n{resumed.stdout}\n{resumed.stderr}"
        return CrashResume(service.count(), after_crash, last_report(resumed), workdir)
