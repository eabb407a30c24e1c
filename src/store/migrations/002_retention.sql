-- toolledger schema, version 2: retention, and a leaner transition log.
--
-- `Ledger::prune` deletes old terminal executions with everything hanging off
-- them. What it keeps is one compact tombstone per pruned execution, so that a
-- very late retry of a pruned call is refused or reported by `begin`, never
-- run again (the stored result is gone, the fact that it ran is not).

CREATE TABLE tombstones (
    execution_id  TEXT PRIMARY KEY NOT NULL,
    args_digest   TEXT NOT NULL CHECK (length(args_digest) = 64),
    final_status  TEXT NOT NULL CHECK (final_status IN ('result_delivered','rejected',
                      'cancelled_before_commit','failed_before_commit')),
    pruned_ms     INTEGER NOT NULL
) WITHOUT ROWID;

-- Pruning deletes an execution's webhook events by execution id; without this
-- index every such delete scans the whole table.
CREATE INDEX webhook_events_by_execution ON webhook_events(execution_id);

-- The transition log, rebuilt for size and write cost. Version 1 kept it in a
-- rowid table with AUTOINCREMENT plus an index on (execution_id, seq): every
-- log entry wrote three pages (the table, the index and sqlite_sequence) and
-- stored the execution id twice. It is only ever read per execution, so it is
-- now clustered by (execution_id, seq). `seq` orders the entries of one
-- execution; entries copied from version 1 keep their numbers (already
-- increasing per execution), new ones take the execution's last seq + 1.
ALTER TABLE transitions RENAME TO transitions_v1;

CREATE TABLE transitions (
    execution_id  TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    from_status   TEXT,
    to_status     TEXT NOT NULL,
    transition    TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    session_id    TEXT NOT NULL,
    reason        TEXT,
    at_ms         INTEGER NOT NULL,
    PRIMARY KEY (execution_id, seq)
) WITHOUT ROWID;

INSERT INTO transitions (execution_id, seq, from_status, to_status, transition, attempt,
                         session_id, reason, at_ms)
SELECT execution_id, seq, from_status, to_status, transition, attempt, session_id, reason, at_ms
FROM transitions_v1;

-- Drops the old index and trigger with it.
DROP TABLE transitions_v1;

CREATE TRIGGER transitions_append_only
BEFORE UPDATE ON transitions
BEGIN
    SELECT RAISE(ABORT, 'toolledger: the transition log is append-only');
END;
