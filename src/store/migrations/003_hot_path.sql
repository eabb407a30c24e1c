-- toolledger schema, version 3: fewer pages written per tool call.
--
-- Version 2 wrote about 14 pages per side-effecting call (the benchmark's
-- WAL maps them): the execution row, its primary-key index, an index by
-- operation, the attention index (touched by every status change), a rounds
-- row, a transition log row per step, and a third transaction for the
-- delivery mark. The bare-SQLite floor of two durable commits writes about 3.
-- Version 3 keeps every fact and drops the pages:
--
-- * The transition log moves into the execution row (`history`, one line per
--   step, appended in the same UPDATE that changes the status), still
--   append-only: a trigger refuses any update that does not keep the old text
--   as a prefix. Line format, fields separated by `|`:
--     at_ms|transition|from|to|attempt|session[|reason]
--   `from` is empty for the creation of the record; `reason` is present only
--   when there is one, with `%`, `|`, CR and LF written as %25 %7C %0D %0A.
-- * `recover()` finds what needs attention without `begin` writing an index
--   entry. `needs_attention` is 1 for an execution that is not final and has
--   been swept, NULL otherwise; a partial index holds the flagged rows.
--   `attention_sweep.swept_rowid` (W) says how far the sweep got: every
--   non-final execution with rowid <= W is flagged. New rows are appended
--   above W unflagged, so `begin` writes the row and its key and nothing
--   else; `recover()` reads the flagged rows plus the rows above W. A sweep
--   (flag the non-final rows in (W, max], set W = max) runs in `recover()`
--   and, piggybacked on a `begin`, every few hundred calls, so the rows above
--   W stay few; by then most of them are final and need no flag. A move into
--   a final status clears the flag. Prune lowers W to the largest rowid left
--   so a reused rowid can never hide below it. CHECKs tie the flag to the
--   status (a final execution is never flagged).
-- * The index by operation goes: an execution id starts with its escaped
--   operation id and `:`, so `list(op)` is a primary-key range scan.
-- * The rounds table goes (nothing read it); so do the foreign keys from
--   executions to rounds and operations (begin always writes the operation
--   first, in the same transaction; prune removes an operation only when no
--   execution id carries its prefix). Without them, deleting an operation
--   would scan every execution for children.
--
-- CHECK constraints compare with `=` chains, not `IN (...)` lists: SQLite
-- evaluates a constant list of three or more values by building a temporary
-- B-tree each time the statement runs, which was a visible share of the CPU
-- of every insert and status change.
--
-- Runs with foreign_keys OFF (the runner turns them off around migrations and
-- runs foreign_key_check before it commits).

CREATE TABLE executions_v3 (
    execution_id       TEXT PRIMARY KEY NOT NULL,
    operation_id       TEXT NOT NULL,
    round              INTEGER NOT NULL,
    position           INTEGER NOT NULL,
    provider           TEXT NOT NULL,
    provider_call_id   TEXT NOT NULL,
    tool_name          TEXT NOT NULL,
    tool_version       INTEGER NOT NULL,
    args_digest        TEXT NOT NULL CHECK (length(args_digest) = 64),
    args_json          TEXT NOT NULL,
    downstream_key     TEXT NOT NULL,
    requires_approval  INTEGER NOT NULL CHECK (requires_approval IN (0,1)),
    status             TEXT NOT NULL CHECK (status = 'prepared' OR status = 'approved'
                           OR status = 'executing' OR status = 'committed'
                           OR status = 'result_delivered' OR status = 'rejected'
                           OR status = 'cancelled_before_commit' OR status = 'outcome_unknown'
                           OR status = 'failed_before_commit'),
    attempt_count      INTEGER NOT NULL DEFAULT 0,
    owner_session      TEXT,
    lease_deadline_ms  INTEGER,
    external_id        TEXT,
    result_json        TEXT,
    last_reason        TEXT,
    retryable          INTEGER,
    compensates        TEXT REFERENCES executions(execution_id),
    created_ms         INTEGER NOT NULL,
    updated_ms         INTEGER NOT NULL,
    needs_attention    INTEGER CHECK (needs_attention IS NULL OR needs_attention = 1)
                       CHECK (needs_attention IS NULL OR NOT (status = 'result_delivered'
                           OR status = 'rejected' OR status = 'cancelled_before_commit')),
    history            TEXT NOT NULL DEFAULT ''
);

-- Row ids are kept: prune and export page through executions by row id.
INSERT INTO executions_v3 (rowid, execution_id, operation_id, round, position, provider,
    provider_call_id, tool_name, tool_version, args_digest, args_json, downstream_key,
    requires_approval, status, attempt_count, owner_session, lease_deadline_ms, external_id,
    result_json, last_reason, retryable, compensates, created_ms, updated_ms,
    needs_attention, history)
SELECT e.rowid, e.execution_id, e.operation_id, e.round, e.position, e.provider,
    e.provider_call_id, e.tool_name, e.tool_version, e.args_digest, e.args_json,
    e.downstream_key, e.requires_approval, e.status, e.attempt_count, e.owner_session,
    e.lease_deadline_ms, e.external_id, e.result_json, e.last_reason, e.retryable,
    e.compensates, e.created_ms, e.updated_ms,
    CASE WHEN e.status IN ('result_delivered','rejected','cancelled_before_commit')
         THEN NULL ELSE 1 END,
    -- Filled by the Rust step of this migration (store/history.rs), the one
    -- writer of log lines, from the `transitions` rows before they go.
    ''
FROM executions e;

-- Operations, rebuilt for the same CHECK reason (nothing references them now).
CREATE TABLE operations_v3 (
    operation_id  TEXT PRIMARY KEY NOT NULL,
    status        TEXT NOT NULL DEFAULT 'open'
                  CHECK (status = 'open' OR status = 'completed' OR status = 'cancelled'
                         OR status = 'cancelled_after_side_effect'),
    created_ms    INTEGER NOT NULL,
    updated_ms    INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO operations_v3 SELECT operation_id, status, created_ms, updated_ms FROM operations;
