"""Exactly-once tools for agent frameworks: LangGraph
(:mod:`toolledger.adapters.langgraph`), the OpenAI Agents SDK
(:mod:`toolledger.adapters.openai_agents`) and MCP clients
(:mod:`toolledger.adapters.mcp`).

Each adapter runs a framework's tool calls through the ledger's executor
under an identity taken from the framework (see each module), so a resumed
run replays a committed call and reconciles one a killed process left
running, instead of running it again. The framework modules import their
framework; this package itself needs only ``toolledger``.
"""

from ._core import (
    CallNotExecuted,
    Downstream,
    LedgerRuntime,
    OutcomeUnknown,
    ToolSpec,
    current_call,
    execution_id_of,
    result_of,
)

__all__ = [
    "CallNotExecuted",
    "Downstream",
    "LedgerRuntime",
    "OutcomeUnknown",
    "ToolSpec",
    "current_call",
    "execution_id_of",
    "result_of",
]
