-- toolledger schema, version 1.
-- Statuses are stored as snake_case text with CHECK constraints mirroring
-- model::status; the transition table itself lives in Rust.

CREATE TABLE operations (
    operation_id  TEXT PRIMARY KEY NOT NULL,
    status        TEXT NOT NULL DEFAULT 'open'
                  CHECK (status IN ('open','completed','cancelled','cancelled_after_side_effect')),
    created_ms    INTEGER NOT NULL,
    updated_ms    INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE rounds (
    operation_id  TEXT NOT NULL REFERENCES operations(operation_id),
    round         INTEGER NOT NULL CHECK (round >= 0),
    created_ms    INTEGER NOT NULL,
    PRIMARY KEY (operation_id, round)
) WITHOUT ROWID;

CREATE TABLE executions (
    execution_id       TEXT PRIMARY KEY NOT NULL,
    operation_id       TEXT NOT NULL REFERENCES operations(operation_id),
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
    status             TEXT NOT NULL CHECK (status IN ('prepared','approved','executing',
                           'committed','result_delivered','rejected','cancelled_before_commit',
                           'outcome_unknown','failed_before_commit')),
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
    FOREIGN KEY (operation_id, round) REFERENCES rounds(operation_id, round)
);

CREATE INDEX executions_by_operation ON executions(operation_id, round, position);
-- recover() reads only the executions that need attention.
CREATE INDEX executions_needing_attention ON executions(status)
    WHERE status IN ('prepared','approved','executing','outcome_unknown','failed_before_commit','committed');
CREATE INDEX executions_by_compensated ON executions(compensates) WHERE compensates IS NOT NULL;

-- A committed side effect is final: no write may downgrade it.
CREATE TRIGGER executions_committed_is_final
BEFORE UPDATE OF status ON executions
WHEN OLD.status IN ('committed','result_delivered')
     AND NEW.status NOT IN ('committed','result_delivered')
BEGIN
    SELECT RAISE(ABORT, 'toolledger: a committed execution cannot be downgraded');
END;

CREATE TRIGGER executions_committed_result_is_final
BEFORE UPDATE OF result_json ON executions
WHEN OLD.status IN ('committed','result_delivered') AND NEW.result_json IS NOT OLD.result_json
BEGIN
    SELECT RAISE(ABORT, 'toolledger: a committed result cannot be rewritten');
END;

CREATE TABLE approvals (
    execution_id  TEXT NOT NULL REFERENCES executions(execution_id),
    args_digest   TEXT NOT NULL,
    decision      TEXT NOT NULL CHECK (decision IN ('approved','rejected')),
    preview_json  TEXT,
    decided_ms    INTEGER NOT NULL,
    PRIMARY KEY (execution_id, args_digest)
) WITHOUT ROWID;

-- Append-only log of every status change and attempt.
CREATE TABLE transitions (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    execution_id  TEXT NOT NULL,
    from_status   TEXT,
    to_status     TEXT NOT NULL,
    transition    TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    session_id    TEXT NOT NULL,
    reason        TEXT,
    at_ms         INTEGER NOT NULL
);
CREATE INDEX transitions_by_execution ON transitions(execution_id, seq);

CREATE TRIGGER transitions_append_only
BEFORE UPDATE ON transitions
BEGIN
    SELECT RAISE(ABORT, 'toolledger: the transition log is append-only');
END;

-- Per-item completion of independent batches.
CREATE TABLE batch_items (
    execution_id  TEXT NOT NULL REFERENCES executions(execution_id),
    item_index    INTEGER NOT NULL CHECK (item_index >= 0),
    item_key      TEXT NOT NULL,
    result_json   TEXT NOT NULL,
    external_id   TEXT,
    committed_ms  INTEGER NOT NULL,
    PRIMARY KEY (execution_id, item_index)
) WITHOUT ROWID;

-- Background jobs and webhooks: every processed (source, event id) once.
CREATE TABLE webhook_events (
    source        TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    execution_id  TEXT NOT NULL REFERENCES executions(execution_id),
    received_ms   INTEGER NOT NULL,
    PRIMARY KEY (source, event_id)
) WITHOUT ROWID;

CREATE TABLE jobs (
    execution_id  TEXT PRIMARY KEY NOT NULL REFERENCES executions(execution_id),
    job_id        TEXT NOT NULL,
    state         TEXT NOT NULL,
    updated_ms    INTEGER NOT NULL
) WITHOUT ROWID;
