-- toolledger schema, version 3, second part: runs after the Rust step that
-- writes each execution's `history` from its `transitions` rows (see
-- 003_hot_path.sql for what version 3 changes and why).

-- Log rows that name no execution are never written by toolledger (a log
-- entry and its execution are written and pruned together); a hand-edited
-- file may have some. They are kept here rather than dropped.
CREATE TABLE transitions_orphaned AS
SELECT execution_id, seq, from_status, to_status, transition, attempt, session_id, reason, at_ms
FROM transitions t
WHERE NOT EXISTS (SELECT 1 FROM executions e WHERE e.execution_id = t.execution_id);

DROP TABLE transitions;
-- Drops the old indexes and triggers with it.
DROP TABLE executions;
ALTER TABLE executions_v3 RENAME TO executions;
DROP TABLE rounds;
DROP TABLE operations;
ALTER TABLE operations_v3 RENAME TO operations;

-- The sweep's watermark (one row). Everything migrated above is swept.
CREATE TABLE attention_sweep (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    swept_rowid  INTEGER NOT NULL
);
INSERT INTO attention_sweep (id, swept_rowid)
SELECT 1, coalesce(max(rowid), 0) FROM executions;

-- recover() reads only the executions that need attention.
CREATE INDEX executions_needing_attention ON executions(needs_attention)
    WHERE needs_attention IS NOT NULL;
CREATE INDEX executions_by_compensated ON executions(compensates) WHERE compensates IS NOT NULL;

-- One guard on every update of an execution (one trigger program costs less
-- than three): a committed side effect is final (its status may only move on
-- to delivered, its result never changes) and the transition log only grows.
-- The prefix check compares bytes (a BLOB's length and substr need no scan of
-- the text).
CREATE TRIGGER executions_guard
AFTER UPDATE ON executions
WHEN ((OLD.status = 'committed' OR OLD.status = 'result_delivered')
      AND (NOT (NEW.status = 'committed' OR NEW.status = 'result_delivered')
           OR NEW.result_json IS NOT OLD.result_json))
  OR substr(CAST(NEW.history AS BLOB), 1, length(CAST(OLD.history AS BLOB)))
     IS NOT CAST(OLD.history AS BLOB)
BEGIN
    SELECT RAISE(ABORT, 'toolledger: a committed execution cannot be downgraded')
    WHERE (OLD.status = 'committed' OR OLD.status = 'result_delivered')
      AND NOT (NEW.status = 'committed' OR NEW.status = 'result_delivered');
    SELECT RAISE(ABORT, 'toolledger: a committed result cannot be rewritten')
    WHERE (OLD.status = 'committed' OR OLD.status = 'result_delivered')
      AND NEW.result_json IS NOT OLD.result_json;
    SELECT RAISE(ABORT, 'toolledger: the transition log is append-only');
END;
