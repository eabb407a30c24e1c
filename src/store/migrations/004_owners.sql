-- toolledger schema, version 4: exactly one owner per attempt, honest
-- partial batches, exact argument digests.
--
-- Every statement here changes the schema only (no table rebuild), so the
-- migration costs the same on a ledger of ten rows and of a million.
--
-- * Fencing. `owner_session` + `attempt_count` name the one attempt that may
--   move an execution; every step of an attempt names both and the UPDATE
--   checks them (a stale attempt changes nothing and its evidence goes to
--   `evidence`). `owner_session` now stays on the row after it leaves
--   `executing`: it is the owner of the current attempt, so a result that
--   arrives late for an attempt whose outcome became unknown can still be
--   checked against it.
-- * No wall-clock lease on the row. Liveness is the owner session's: its lock
--   file held means alive; a suspended session is alive until the lease of
--   its suspension mark (`sessions`) lapses on the boot clock. The column
--   `lease_deadline_ms` (a wall-clock deadline) becomes `unknown_since_ms`:
--   the boot-clock time (with `unknown_boot`, the boot it was read in) at
--   which the current attempt's outcome became unknown; a lookup's "not
--   found" only counts once the tool's landing window has passed since then.
--   Old deadlines are cleared: they meant something else.
-- * `partial`: 1 on a committed independent batch that committed some items
--   and not others (its result says which).
-- * `digest_scheme`: NULL for digests written by version 3 and before
--   (numbers read as doubles), 2 for exact digests. Tombstones too.

ALTER TABLE executions RENAME COLUMN lease_deadline_ms TO unknown_since_ms;
UPDATE executions SET unknown_since_ms = NULL WHERE unknown_since_ms IS NOT NULL;
ALTER TABLE executions ADD COLUMN unknown_boot TEXT;
ALTER TABLE executions ADD COLUMN partial INTEGER CHECK (partial IS NULL OR partial = 1);
ALTER TABLE executions ADD COLUMN digest_scheme INTEGER
    CHECK (digest_scheme IS NULL OR digest_scheme = 2);
ALTER TABLE tombstones ADD COLUMN digest_scheme INTEGER
    CHECK (digest_scheme IS NULL OR digest_scheme = 2);

-- One row per open ledger (session). A session takes its lock file before it
-- writes its row and deletes the row before it lets go of the lock on a clean
-- close, so a row whose lock is free belongs to a dead session, unless a
-- suspension mark covers it: `suspended_ms` (boot clock, in boot `boot_id`)
-- plus `suspend_lease_ms` is how long it stays owner of what it was running.
CREATE TABLE sessions (
    session_id        TEXT PRIMARY KEY NOT NULL,
    lock_path         TEXT NOT NULL,
    boot_id           TEXT NOT NULL,
    suspended_ms      INTEGER,
    suspend_lease_ms  INTEGER,
    opened_ms         INTEGER NOT NULL,
    pid               INTEGER NOT NULL,
    CHECK ((suspended_ms IS NULL) = (suspend_lease_ms IS NULL))
) WITHOUT ROWID;

-- What a stale attempt learnt and could not record as the execution's own: a
-- result, an external id, a failure. Kept, never dropped: it may be the only
-- trace of a real effect.
CREATE TABLE evidence (
    execution_id  TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    session_id    TEXT NOT NULL,
    kind          TEXT NOT NULL CHECK (kind = 'commit' OR kind = 'fail'
                      OR kind = 'unknown' OR kind = 'external_id' OR kind = 'batch_item'
                      OR kind = 'job'),
    result_json   TEXT,
    external_id   TEXT,
    reason        TEXT,
    item_index    INTEGER,
    at_ms         INTEGER NOT NULL
);
CREATE INDEX evidence_by_execution ON evidence(execution_id);

-- The ledger's identity: a reopened connection (resume) checks that it found
-- the same database, not a file put in its place.
CREATE TABLE meta (
    key    TEXT PRIMARY KEY NOT NULL,
    value  TEXT NOT NULL
) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('ledger_id', lower(hex(randomblob(16))));
