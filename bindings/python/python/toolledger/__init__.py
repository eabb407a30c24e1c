"""toolledger: a durable SQLite ledger that makes AI tool calls effectively once.

A chat app that is retried, suspended or killed in the middle of a tool
call never runs a side-effecting tool twice: the intent is durable before
the tool runs, the result is durable before the model sees it, and a
repeated call gets the stored result back.

    import asyncio
    import toolledger as tl

    @tl.tool(idempotency_key=True)
    async def send_email(request):
        ...  # send request.downstream_key as the Idempotency-Key
        return {"sent": True}

    async def main():
        with tl.Ledger.open("ledger.db") as ledger:
            executor = tl.Executor(ledger, tools=[send_email])
            await executor.recover()
            out = await executor.execute(
                "op_1", 0, tl.ToolCall("call_1", "send_email", {"to": "a@example.com"}))
            if isinstance(out, tl.Completed):
                print(out.result, out.replayed)

    asyncio.run(main())

The names here are the Pythonic layer (`Ledger`, `Executor`, `Tool`,
`tool`, the outcome dataclasses, `Error` and its subclasses) plus the
library's records and enums it passes through. `toolledger.ffi` is the
generated module as it is.
"""

from . import _loop
from ._native.toolledger import (
    ApprovalRequest,
    BatchMode,
    Begin,
    CallSpec,
    CancelOutcome,
    EffectClass,
    Execution,
    ExecutionStatus,
    ExecutorConfig,
    JobApplied,
    JobUpdate,
    LatencySummary,
    LedgerConfig,
    LedgerStats,
    MetricsSnapshot,
    OperationStatus,
    OperationSummary,
    Provider,
    RecoveryFailure,
    RecoveryFailureKind,
    Resolution,
    Resolved,
    StatusCount,
    StorageKind,
    StoredResult,
    Ticket,
    ToolResult,
    TransitionEntry,
)
from .errors import (
    AlreadyCommitted,
    DigestMismatch,
    Error,
    InternalError,
    InvalidInput,
    InvalidTransition,
    LedgerClosed,
    NoEventLoop,
    NotFound,
    OperationCancelled,
    StaleAttempt,
    StorageError,
    Suspended,
    UnknownTool,
)
from .ledger import Executor, Ledger, ToolCall
from .outcomes import (
    CallOutcome,
    Cancelled,
    Completed,
    Conflict,
    Failed,
    InFlight,
    NeedsApproval,
    Pending,
    Recovery,
    Rejected,
    Unknown,
)
from .providers import (
    ToolCallStream,
    mcp_request_protocol_version,
    parse_tool_calls,
    render_anthropic_user_message,
    render_gemini_user_turn,
    render_mcp_batch_response,
    render_mcp_result,
    render_tool_result,
)
from .tools import Committed, FunctionTool, JobStarted, NotCommitted, Tool, ToolRequest, tool

_loop.install()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("toolledger")
    except Exception:  # noqa: BLE001 — not installed as a distribution
        return "0+unknown"


__version__ = _version()

__all__ = [name for name in dir() if not name.startswith("_")]
