-- toolledger schema, version 5: the same guard on every update of an
-- execution, at a fraction of its cost per tool call.
--
-- Every statement here changes the schema only (no table rebuild).
--
-- Version 3's guard cost about 6,000 instructions per update (two per
-- side-effecting call: the commit and the delivery mark) and, because it
-- could ABORT the statement, made SQLite open a statement journal for every
-- update it fired on (a copy of each page the update touched, about 4,000
-- more). This one keeps what it guarantees and drops both costs:
--
-- * A committed side effect is final: its status may only move on to
--   delivered (and, newly refused here, never back from delivered to
--   committed), and its result never changes.
-- * The transition log only grows: the new log starts with the old one, as
--   bytes. Version 3 cut a copy of the new log to the old one's length with
--   substr(); a function call in a statement also makes SQLite open a
--   statement journal (it may raise an error). Here two comparisons do it:
--   a byte string S starts with P exactly when P <= S < P || x'FFFF',
--   because a log never holds the bytes FF FF (UTF-8 never holds 0xFF; in a
--   UTF-16 file they would be U+FFFF, a noncharacter no log line writes).
--   Two bytes, not one: a database file in UTF-16 drops a lone byte when it
--   becomes text, which would refuse every update. Where S does
--   not start with P, the first byte in which they differ decides both
--   comparisons the same way, or S is shorter than P, so S < P: refused.
--   Both logs are compared as TEXT (BINARY collation: memcmp, then length).
-- * A refusal rolls back the whole transaction (`RAISE(ROLLBACK)`), not just
--   the statement: no ABORT, so no statement journal. The ledger never keeps
--   a transaction whose statement failed (a store write rolls back on every
--   error), so the caller sees the same outcome: the error, and nothing of
--   the transaction written.
--
-- The hot path's two updates (the commit of a running attempt, the delivery
-- mark) say `UPDATE OR FAIL`: their CHECK constraints then halt without an
-- ABORT too. Each changes one row (by primary key) and SQLite checks every
-- constraint before it writes that row, so FAIL there leaves exactly what
-- ABORT would: nothing of the statement.

DROP TRIGGER executions_guard;

CREATE TRIGGER executions_guard
AFTER UPDATE ON executions
WHEN (CAST(NEW.history AS TEXT) >= CAST(OLD.history AS TEXT)
      AND CAST(NEW.history AS TEXT) < CAST(OLD.history AS TEXT) || x'FFFF') IS NOT 1
  OR ((OLD.status = 'committed' OR OLD.status = 'result_delivered')
      AND (NOT (NEW.status = 'result_delivered' OR NEW.status = OLD.status)
           OR NEW.result_json IS NOT OLD.result_json))
BEGIN
    SELECT RAISE(ROLLBACK, 'toolledger: a committed execution cannot be downgraded')
    WHERE (OLD.status = 'committed' OR OLD.status = 'result_delivered')
      AND NOT (NEW.status = 'result_delivered' OR NEW.status = OLD.status);
    SELECT RAISE(ROLLBACK, 'toolledger: a committed result cannot be rewritten')
    WHERE (OLD.status = 'committed' OR OLD.status = 'result_delivered')
      AND NEW.result_json IS NOT OLD.result_json;
    SELECT RAISE(ROLLBACK, 'toolledger: the transition log is append-only');
END;
