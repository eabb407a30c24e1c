"""toolledger_logging — the ledger's status moves into Python's `logging`.

    import logging, toolledger, toolledger_logging
    ledger = toolledger.Ledger.open(path, toolledger.LedgerConfig())
    ledger.set_observer(toolledger_logging.LoggingObserver())

Each committed move is one record on the `toolledger` logger: the execution
id, tool, statuses, attempt, elapsed time and, for failures and unknown
outcomes, the reason's kind (`timeout`, `tool_error`, `owner_died`, …) —
never an argument, a result or a reason's text, so the records can go to any
handler. Unknown outcomes and failures log at WARNING, the rest at DEBUG.
"""

import logging

import toolledger as tl

_WARN = {tl.ExecutionStatus.OUTCOME_UNKNOWN, tl.ExecutionStatus.FAILED_BEFORE_COMMIT}


class LoggingObserver(tl.LedgerObserver):
    """A `LedgerObserver` that writes to a `logging.Logger`."""

    def __init__(self, logger=None):
        self.logger = logger or logging.getLogger("toolledger")

    def on_event(self, event):
        level = logging.WARNING if event.to_status in _WARN else logging.DEBUG
        # `event.line` holds ids, tool, statuses, attempt, times and the
        # reason's kind only; the extra fields are for structured handlers.
        self.logger.log(
            level,
            "%s",
            event.line,
            extra={
                "execution_id": event.execution_id,
                "tool": event.tool_name,
                "to_status": event.to_status.name.lower(),
                "attempt": event.attempt,
                "elapsed_ms": event.elapsed_ms,
                "reason_kind": event.reason_kind.name.lower() if event.reason_kind else None,
            },
        )
