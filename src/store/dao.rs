//! Data access: every query the ledger runs, against one open transaction.
//!
//! A [`Dao`] only exists inside `Store::read` / `Store::write`, so every
//! method here runs in the caller's transaction. Status updates are guarded by
//! the expected current status (`WHERE status = ?`) and report whether a row
//! changed, so a lost race is visible instead of silently overwriting.

use rusqlite::types::Type;
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::error::{Error, Result};
use crate::model::{
    ArgsDigest, DigestScheme, DownstreamKey, ExecutionId, ExecutionRecord, ExecutionStatus,
    Monotonic, Move, OperationId, OperationStatus, Provider, SessionId, TransitionEntry,
};

/// Queries over one open transaction.
pub struct Dao<'a> {
    pub(super) tx: &'a Connection,
}

/// A new execution row, written by `begin`.
#[derive(Debug, Clone)]
pub struct NewExecution<'a> {
    /// Its id.
    pub execution_id: &'a ExecutionId,
    /// Its operation.
    pub operation_id: &'a OperationId,
    /// Round within the operation.
    pub round: u32,
    /// Position within the round.
    pub position: u32,
    /// Provider of the call.
    pub provider: Provider,
    /// Provider call id.
    pub provider_call_id: &'a str,
    /// Tool name.
    pub tool_name: &'a str,
    /// Tool version.
    pub tool_version: u32,
    /// Digest of the canonical arguments.
    pub args_digest: &'a ArgsDigest,
    /// Canonical arguments.
    pub args_json: &'a str,
    /// Downstream idempotency key.
    pub downstream_key: &'a DownstreamKey,
    /// Whether approval is required.
    pub requires_approval: bool,
    /// Initial status (`prepared` or `executing`).
    pub status: ExecutionStatus,
    /// Attempts started (1 when created `executing`).
    pub attempt_count: u32,
    /// Owner session when `executing`.
    pub owner_session: Option<&'a SessionId>,
    /// The execution this one compensates.
    pub compensates: Option<&'a ExecutionId>,
    /// Now, ms since the epoch.
    pub now_ms: i64,
}

/// Row counts for the inspector and benchmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Number of operations.
    pub operations: u64,
    /// Number of executions per status name.
    pub executions_by_status: Vec<(String, u64)>,
    /// Rows in the transition log.
    pub transitions: u64,
}

/// The columns `row_to_record` reads, as a literal so hot queries can be
/// built with `concat!` (no formatting per call).
macro_rules! execution_columns {
    () => {
        "execution_id, operation_id, round, position, provider, \
    provider_call_id, tool_name, tool_version, args_digest, args_json, downstream_key, \
    requires_approval, status, attempt_count, owner_session, unknown_since_ms, external_id, \
    result_json, last_reason, retryable, compensates, created_ms, updated_ms, unknown_boot, \
    partial, digest_scheme"
    };
}

const EXECUTION_COLUMNS: &str = execution_columns!();

fn bad(col: usize, what: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, Type::Text, what.to_owned().into())
}

fn row_to_record(row: &Row<'_>) -> rusqlite::Result<ExecutionRecord> {
    let provider: String = row.get(4)?;
    let status: String = row.get(12)?;
    let owner: Option<String> = row.get(14)?;
    let compensates: Option<String> = row.get(20)?;
    let unknown_ms: Option<i64> = row.get(15)?;
    let unknown_boot: Option<String> = row.get(23)?;
    let partial: Option<i64> = row.get(24)?;
    Ok(ExecutionRecord {
        execution_id: ExecutionId::from_stored(row.get(0)?),
        operation_id: OperationId::from_stored(row.get(1)?),
        round: row.get(2)?,
        position: row.get(3)?,
        provider: Provider::parse(&provider).ok_or_else(|| bad(4, "unknown provider"))?,
        provider_call_id: row.get(5)?,
        tool_name: row.get(6)?,
        tool_version: row.get(7)?,
        args_digest: ArgsDigest::from_stored(row.get(8)?),
        digest_scheme: DigestScheme::from_stored(row.get(25)?),
        args_json: row.get(9)?,
        downstream_key: DownstreamKey::from_stored(row.get(10)?),
        requires_approval: row.get(11)?,
        status: ExecutionStatus::parse(&status).ok_or_else(|| bad(12, "unknown status"))?,
        attempt_count: row.get(13)?,
        owner_session: owner.map(SessionId::from_stored),
        unknown_since: unknown_ms.map(|ms| Monotonic::new(unknown_boot.unwrap_or_default(), ms)),
        partial: partial == Some(1),
        external_id: row.get(16)?,
        result_json: row.get(17)?,
        last_reason: row.get(18)?,
        retryable: row.get(19)?,
        compensates: compensates.map(ExecutionId::from_stored),
        created_ms: row.get(21)?,
        updated_ms: row.get(22)?,
    })
}

impl<'a> Dao<'a> {
    pub(super) fn new(tx: &'a Connection) -> Dao<'a> {
        Dao { tx }
    }

    /// Creates the operation if it does not exist; returns its status.
    ///
    /// # Errors
    /// Storage errors.
    pub fn ensure_operation(&self, op: &OperationId, now_ms: i64) -> Result<OperationStatus> {
        // Read first: an existing operation (every call after the first of a
        // turn) costs no write at all.
        if let Some(status) = self.operation_status(op)? {
            return Ok(status);
        }
        self.tx
            .prepare_cached(
                "INSERT INTO operations (operation_id, status, created_ms, updated_ms)
                 VALUES (?1, 'open', ?2, ?2)",
            )?
            .execute(params![op.as_str(), now_ms])?;
        Ok(OperationStatus::Open)
    }

    /// The operation's status, if it exists.
    ///
    /// # Errors
    /// Storage errors.
    pub fn operation_status(&self, op: &OperationId) -> Result<Option<OperationStatus>> {
        let name: Option<String> = self
            .tx
            .prepare_cached("SELECT status FROM operations WHERE operation_id = ?1")?
            .query_row([op.as_str()], |r| r.get(0))
            .optional()?;
        name.map(|n| {
            OperationStatus::parse(&n).ok_or_else(|| Error::InvalidData("operation status".into()))
        })
        .transpose()
    }

    /// Sets the operation's status.
    ///
    /// # Errors
    /// Storage errors.
    pub fn set_operation_status(
        &self,
        op: &OperationId,
        status: OperationStatus,
        now_ms: i64,
    ) -> Result<()> {
        self.tx
            .prepare_cached(
                "UPDATE operations SET status = ?2, updated_ms = ?3 WHERE operation_id = ?1",
            )?
            .execute(params![op.as_str(), status.as_str(), now_ms])?;
        Ok(())
    }

    /// Reads one execution.
    ///
    /// # Errors
    /// Storage errors.
    pub fn execution(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>> {
        const SQL: &str = concat!(
            "SELECT ",
            execution_columns!(),
            " FROM executions WHERE execution_id = ?1"
        );
        Ok(self
            .tx
            .prepare_cached(SQL)?
            .query_row([id.as_str()], row_to_record)
            .optional()?)
    }

    /// The status and attempt count of one execution (a light read).
    ///
    /// # Errors
    /// Storage errors.
    pub fn status_and_attempt(&self, id: &ExecutionId) -> Result<Option<(ExecutionStatus, u32)>> {
        let found: Option<(String, u32)> = self
            .tx
            .prepare_cached("SELECT status, attempt_count FROM executions WHERE execution_id = ?1")?
            .query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        found
            .map(|(name, attempt)| {
                ExecutionStatus::parse(&name)
                    .map(|s| (s, attempt))
                    .ok_or_else(|| Error::InvalidData("unknown status".into()))
            })
            .transpose()
    }

    /// Inserts a new execution and logs its creation.
    ///
    /// # Errors
    /// Storage errors (a duplicate id is a constraint error).
    pub fn insert_execution(&self, new: &NewExecution<'_>, session: &SessionId) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO executions (execution_id, operation_id, round, position, provider,
                    provider_call_id, tool_name, tool_version, args_digest, args_json,
                    downstream_key, requires_approval, status, attempt_count, owner_session,
                    compensates, created_ms, updated_ms, history, digest_scheme)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                    ?17, ?17, ?18, 2)",
            )?
            // Positional parameters: binding by name costs a lookup per value.
            .execute(params![
                new.execution_id.as_str(),
                new.operation_id.as_str(),
                new.round,
                new.position,
                new.provider.as_str(),
                new.provider_call_id,
                new.tool_name,
                new.tool_version,
                new.args_digest.as_str(),
                new.args_json,
                new.downstream_key.as_str(),
                new.requires_approval,
                new.status.as_str(),
                new.attempt_count,
                new.owner_session.map(SessionId::as_str),
                new.compensates.map(ExecutionId::as_str),
                new.now_ms,
                // Unflagged: the row sits above the sweep's watermark, where
                // `recover()` reads every row (see `sweep_attention`).
                history_line(&LogLine {
                    at_ms: new.now_ms,
                    transition: if new.status == ExecutionStatus::Executing {
                        "start"
                    } else {
                        "prepare"
                    },
                    from: None,
                    to: new.status,
                    attempt: new.attempt_count,
                    session,
                    reason: None,
                }),
            ])?;
        Ok(())
    }

    /// Applies one checked [`Move`] and appends it to the log. Entering
    /// `executing` makes `actor` the owner of the new attempt; entering
    /// `outcome_unknown` records `change.unknown_since`. With a `fence`, the
    /// row must also be at that attempt (and owned by that session): the
    /// fencing token of the attempt that asks. Returns false when the row was
    /// not in `mv.from()` or the fence did not hold (nothing changed then).
    ///
    /// # Errors
    /// Storage errors, or [`Error::Guard`] if the schema refuses the move.
    pub fn move_status(
        &self,
        id: &ExecutionId,
        mv: Move,
        fence: Option<Fence<'_>>,
        change: &StatusFields<'_>,
        actor: &SessionId,
        now_ms: i64,
    ) -> Result<bool> {
        let to = mv.to();
        let attempt: u32 = match change.attempt {
            Some(a) => a,
            None => self
                .tx
                .prepare_cached("SELECT attempt_count FROM executions WHERE execution_id = ?1")?
                .query_row([id.as_str()], |r| r.get(0))
                .optional()?
                .unwrap_or_default(),
        };
        let line = history_line(&LogLine {
            at_ms: now_ms,
            transition: mv.transition().as_str(),
            from: Some(mv.from()),
            to,
            attempt,
            session: actor,
            reason: change.reason,
        });
        // Two statements: only a move into a final status touches the
        // attention flag (and its index, if the row was flagged), so
        // `executing -> committed` writes the row's page and nothing else.
        macro_rules! move_sql {
            ($extra:literal) => {
                concat!(
                    "UPDATE executions SET status = ?3, updated_ms = ?4,
                    attempt_count = COALESCE(?5, attempt_count),
                    owner_session = COALESCE(?6, owner_session),
                    unknown_since_ms = ?7, unknown_boot = ?8,
                    result_json = COALESCE(?9, result_json),
                    external_id = COALESCE(?10, external_id),
                    last_reason = COALESCE(?11, last_reason),
                    retryable = COALESCE(?12, retryable),
                    partial = COALESCE(?13, partial),
                    history = history || ?14",
                    $extra,
                    " WHERE execution_id = ?1 AND status = ?2
                      AND (?15 IS NULL OR (attempt_count = ?15
                                           AND (?16 IS NULL OR owner_session = ?16)))"
                )
            };
        }
        const STAYS: &str = move_sql!("");
        const LEAVES: &str = move_sql!(", needs_attention = NULL");
        let sql = if to.needs_attention() { STAYS } else { LEAVES };
        // Entering `executing` starts an attempt owned by the actor.
        let owner = (to == ExecutionStatus::Executing).then_some(actor.as_str());
        let unknown = change
            .unknown_since
            .filter(|_| to == ExecutionStatus::OutcomeUnknown);
        let changed = self.tx.prepare_cached(sql)?.execute(params![
            id.as_str(),
            mv.from().as_str(),
            to.as_str(),
            now_ms,
            change.attempt,
            owner,
            unknown.map(|u| u.ms),
            unknown.map(|u| &*u.boot_id),
            change.result_json,
            change.external_id,
            change.reason,
            change.retryable,
            change.partial.then_some(1),
            line,
            fence.map(|f| f.attempt),
            fence.and_then(|f| f.session).map(SessionId::as_str),
        ])?;
        Ok(changed != 0)
    }

    /// Appends a log line that is not a status move (evidence of a stale
    /// attempt) to an execution's log.
    ///
    /// # Errors
    /// Storage errors.
    pub fn append_note(
        &self,
        id: &ExecutionId,
        note: &str,
        status: ExecutionStatus,
        attempt: u32,
        actor: &SessionId,
        reason: &str,
        now_ms: i64,
    ) -> Result<()> {
        let line = history_line(&LogLine {
            at_ms: now_ms,
            transition: note,
            from: Some(status),
            to: status,
            attempt,
            session: actor,
            reason: Some(reason),
        });
        self.tx
            .prepare_cached(
                "UPDATE executions SET history = history || ?2 WHERE execution_id = ?1",
            )?
            .execute(params![id.as_str(), line])?;
        Ok(())
    }

    /// Records when (boot clock) an `outcome_unknown` row's outcome became
    /// unknown, if no time is recorded yet (rows of schema version 3).
    ///
    /// # Errors
    /// Storage errors.
    pub fn stamp_unknown(&self, id: &ExecutionId, at: &Monotonic) -> Result<()> {
        self.tx
            .prepare_cached(
                "UPDATE executions SET unknown_since_ms = ?2, unknown_boot = ?3
                 WHERE execution_id = ?1 AND status = 'outcome_unknown'
                   AND unknown_since_ms IS NULL",
            )?
            .execute(params![id.as_str(), at.ms, &*at.boot_id])?;
        Ok(())
    }

    /// Stores the downstream's id for the effect as soon as it is known.
    /// Returns false when the row is missing or holds a different id.
    ///
    /// # Errors
    /// Storage errors.
    pub fn set_external_id(&self, id: &ExecutionId, external: &str, now_ms: i64) -> Result<bool> {
        let changed = self
            .tx
            .prepare_cached(
                "UPDATE executions SET external_id = ?2, updated_ms = ?3
                 WHERE execution_id = ?1 AND (external_id IS NULL OR external_id = ?2)",
            )?
            .execute(params![id.as_str(), external, now_ms])?;
        Ok(changed == 1)
    }

    /// Records an approval decision bound to a digest.
    ///
    /// # Errors
    /// Storage errors.
    pub fn record_approval(
        &self,
        id: &ExecutionId,
        digest: &ArgsDigest,
        approved: bool,
        preview_json: Option<&str>,
        now_ms: i64,
    ) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO approvals (execution_id, args_digest, decision, preview_json, decided_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(execution_id, args_digest) DO UPDATE SET
                    decision = excluded.decision, preview_json = excluded.preview_json,
                    decided_ms = excluded.decided_ms",
            )?
            .execute(params![
                id.as_str(),
                digest.as_str(),
                if approved { "approved" } else { "rejected" },
                preview_json,
                now_ms
            ])?;
        Ok(())
    }

    /// The approval preview recorded for `(id, digest)`, if approved.
    ///
    /// # Errors
    /// Storage errors.
    pub fn approval(
        &self,
        id: &ExecutionId,
        digest: &ArgsDigest,
    ) -> Result<Option<Option<String>>> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT preview_json FROM approvals
                 WHERE execution_id = ?1 AND args_digest = ?2 AND decision = 'approved'",
            )?
            .query_row(params![id.as_str(), digest.as_str()], |r| r.get(0))
            .optional()?)
    }

    /// Every execution of an operation, in round and position order.
    ///
    /// # Errors
    /// Storage errors.
    pub fn executions_of(&self, op: &OperationId) -> Result<Vec<ExecutionRecord>> {
        // A primary-key range: every id of the operation carries its prefix.
        let (start, end) = op.execution_id_range();
        let sql = format!(
            "SELECT {EXECUTION_COLUMNS} FROM executions
             WHERE execution_id >= ?1 AND execution_id < ?2 AND operation_id = ?3
             ORDER BY round, position, execution_id"
        );
        let mut stmt = self.tx.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![start, end, op.as_str()], row_to_record)?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Executions whose status means the app still has something to do:
    /// awaiting approval or execution, executing, unknown, retryable
    /// failures, and committed results not yet delivered. They are the
    /// flagged rows (an index) plus the non-final rows above the sweep's
    /// watermark (a row-id range, kept short by [`Dao::sweep_attention`]).
    ///
    /// # Errors
    /// Storage errors.
    pub fn executions_needing_attention(&self) -> Result<Vec<ExecutionRecord>> {
        let mut stmt = self.tx.prepare_cached(NEEDING_ATTENTION)?;
        let rows = stmt.query_map([], row_to_record)?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Flags every non-final execution above the watermark and moves the
    /// watermark to the last row, if at least `min_rows` rows were added
    /// since the last sweep (0: always). Returns how many rows it flagged.
    ///
    /// # Errors
    /// Storage errors.
    pub fn sweep_attention(&self, min_rows: i64) -> Result<u64> {
        let (swept, last): (i64, i64) = self
            .tx
            .prepare_cached(
                "SELECT swept_rowid, (SELECT coalesce(max(rowid), 0) FROM executions)
                 FROM attention_sweep WHERE id = 1",
            )?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        if last <= swept || last - swept < min_rows {
            return Ok(0);
        }
        let flagged = self
            .tx
            .prepare_cached(
                "UPDATE executions SET needs_attention = 1
                 WHERE rowid > ?1 AND rowid <= ?2 AND needs_attention IS NULL
                   AND NOT (status = 'result_delivered' OR status = 'rejected'
                            OR status = 'cancelled_before_commit')",
            )?
            .execute(params![swept, last])?;
        self.tx
            .prepare_cached("UPDATE attention_sweep SET swept_rowid = ?1 WHERE id = 1")?
            .execute([last])?;
        Ok(flagged as u64)
    }

    /// After rows were deleted: lowers the watermark to the largest row id
    /// left, so that a row id SQLite hands out again is never below it.
    ///
    /// # Errors
    /// Storage errors.
    pub fn clamp_attention_watermark(&self) -> Result<()> {
        self.tx
            .prepare_cached(
                "UPDATE attention_sweep
                 SET swept_rowid = (SELECT coalesce(max(rowid), 0) FROM executions)
                 WHERE id = 1 AND swept_rowid > (SELECT coalesce(max(rowid), 0) FROM executions)",
            )?
            .execute([])?;
        Ok(())
    }

    /// Compensations recorded for `original`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn compensations_of(&self, original: &ExecutionId) -> Result<Vec<ExecutionRecord>> {
        let sql = format!(
            "SELECT {EXECUTION_COLUMNS} FROM executions WHERE compensates = ?1 ORDER BY created_ms"
        );
        let mut stmt = self.tx.prepare_cached(&sql)?;
        let rows = stmt.query_map([original.as_str()], row_to_record)?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// The transition log of one execution, oldest first.
    ///
    /// # Errors
    /// Storage errors.
    pub fn transitions_of(&self, id: &ExecutionId) -> Result<Vec<TransitionEntry>> {
        let history: Option<String> = self
            .tx
            .prepare_cached("SELECT history FROM executions WHERE execution_id = ?1")?
            .query_row([id.as_str()], |r| r.get(0))
            .optional()?;
        parse_history(history.as_deref().unwrap_or_default())
            .map_err(|what| Error::InvalidData(what.to_owned()))
    }

    /// Counts for the inspector.
    ///
    /// # Errors
    /// Storage errors.
    pub fn stats(&self) -> Result<StoreStats> {
        let operations: u64 = self
            .tx
            .query_row("SELECT count(*) FROM operations", [], |r| r.get(0))?;
        let transitions: u64 = self.tx.query_row(
            "SELECT coalesce(sum(length(history) - length(replace(history, char(10), ''))), 0)
                 FROM executions",
            [],
            |r| r.get(0),
        )?;
        let mut stmt = self.tx.prepare_cached(
            "SELECT status, count(*) FROM executions GROUP BY status ORDER BY status",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(StoreStats {
            operations,
            executions_by_status: rows.collect::<rusqlite::Result<Vec<_>>>()?,
            transitions,
        })
    }

    /// Operations with their status, newest first (inspector).
    ///
    /// # Errors
    /// Storage errors.
    pub fn operations(&self, limit: u32) -> Result<Vec<(OperationId, OperationStatus)>> {
        let mut stmt = self.tx.prepare_cached(
            "SELECT operation_id, status FROM operations ORDER BY created_ms DESC, operation_id LIMIT ?1",
        )?;
        let rows = stmt.query_map([limit], |r| {
            let status: String = r.get(1)?;
            Ok((
                OperationId::from_stored(r.get(0)?),
                OperationStatus::parse(&status).ok_or_else(|| bad(1, "operation status"))?,
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Records the completion of one item of an independent batch.
    /// Returns false if the item was already recorded (nothing changes).
    ///
    /// # Errors
    /// Storage errors.
    pub fn insert_batch_item(
        &self,
        id: &ExecutionId,
        index: u32,
        item_key: &DownstreamKey,
        result_json: &str,
        external_id: Option<&str>,
        now_ms: i64,
    ) -> Result<bool> {
        let changed = self
            .tx
            .prepare_cached(
                "INSERT INTO batch_items (execution_id, item_index, item_key, result_json,
                    external_id, committed_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(execution_id, item_index) DO NOTHING",
            )?
            .execute(params![
                id.as_str(),
                index,
                item_key.as_str(),
                result_json,
                external_id,
                now_ms
            ])?;
        Ok(changed == 1)
    }

    /// True when some item of the batch `id` committed.
    ///
    /// # Errors
    /// Storage errors.
    pub fn has_batch_items(&self, id: &ExecutionId) -> Result<bool> {
        Ok(self
            .tx
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM batch_items WHERE execution_id = ?1)")?
            .query_row([id.as_str()], |r| r.get(0))?)
    }

    /// The completed items of a batch: `(index, result JSON, external id)`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn batch_items(&self, id: &ExecutionId) -> Result<Vec<(u32, String, Option<String>)>> {
        let mut stmt = self.tx.prepare_cached(
            "SELECT item_index, result_json, external_id FROM batch_items
             WHERE execution_id = ?1 ORDER BY item_index",
        )?;
        let rows = stmt.query_map([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Creates or updates the background job of an execution.
    ///
    /// # Errors
    /// Storage errors.
    pub fn upsert_job(
        &self,
        id: &ExecutionId,
        job_id: &str,
        state: &str,
        now_ms: i64,
    ) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO jobs (execution_id, job_id, state, updated_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(execution_id) DO UPDATE SET state = excluded.state,
                    updated_ms = excluded.updated_ms",
            )?
            .execute(params![id.as_str(), job_id, state, now_ms])?;
        Ok(())
    }

    /// The background job of an execution: `(job id, state)`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn job(&self, id: &ExecutionId) -> Result<Option<(String, String)>> {
        Ok(self
            .tx
            .prepare_cached("SELECT job_id, state FROM jobs WHERE execution_id = ?1")?
            .query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    /// Records a webhook event; returns false when `(source, event_id)` was
    /// already processed.
    ///
    /// # Errors
    /// Storage errors.
    pub fn insert_webhook_event(
        &self,
        source: &str,
        event_id: &str,
        id: &ExecutionId,
        now_ms: i64,
    ) -> Result<bool> {
        let changed = self
            .tx
            .prepare_cached(
                "INSERT INTO webhook_events (source, event_id, execution_id, received_ms)
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT(source, event_id) DO NOTHING",
            )?
            .execute(params![source, event_id, id.as_str(), now_ms])?;
        Ok(changed == 1)
    }
}

/// One entry of an execution's transition log, as written.
struct LogLine<'a> {
    at_ms: i64,
    transition: &'a str,
    from: Option<ExecutionStatus>,
    to: ExecutionStatus,
    attempt: u32,
    session: &'a SessionId,
    reason: Option<&'a str>,
}

/// Formats one line of the `history` column (the transition log, schema
/// version 3): `at_ms|transition|from|to|attempt|session[|reason]` and a
/// newline. `from` is empty for the creation of the record; the reason is
/// present only when there is one, with `%`, `|`, CR and LF escaped as
/// `%25 %7C %0D %0A`. Every other field is an integer, a fixed word or an
/// alphanumeric session id, so it needs no escaping.
fn history_line(line: &LogLine<'_>) -> String {
    let mut out = String::with_capacity(96);
    out.push_str(&line.at_ms.to_string());
    out.push('|');
    out.push_str(line.transition);
    out.push('|');
    out.push_str(line.from.map_or("", ExecutionStatus::as_str));
    out.push('|');
    out.push_str(line.to.as_str());
    out.push('|');
    out.push_str(&line.attempt.to_string());
    out.push('|');
    out.push_str(line.session.as_str());
    if let Some(reason) = line.reason {
        out.push('|');
        for ch in reason.chars() {
            match ch {
                '%' => out.push_str("%25"),
                '|' => out.push_str("%7C"),
                '\r' => out.push_str("%0D"),
                '\n' => out.push_str("%0A"),
                c => out.push(c),
            }
        }
    }
    out.push('\n');
    out
}

/// Parses a `history` column back into log entries, oldest first.
fn parse_history(history: &str) -> std::result::Result<Vec<TransitionEntry>, &'static str> {
    history
        .split_terminator('\n')
        .map(|line| {
            let mut f = line.splitn(7, '|');
            let mut next = || f.next().ok_or("truncated transition log line");
            let at_ms = next()?.parse().map_err(|_| "bad time in transition log")?;
            let transition = next()?.to_owned();
            let from = match next()? {
                "" => None,
                s => Some(ExecutionStatus::parse(s).ok_or("unknown status in transition log")?),
            };
            let to = ExecutionStatus::parse(next()?).ok_or("unknown status in transition log")?;
            let attempt = next()?
                .parse()
                .map_err(|_| "bad attempt in transition log")?;
            let _session = next()?;
            let reason = f.next().map(unescape_reason);
            Ok(TransitionEntry {
                from,
                to,
                transition,
                attempt,
                reason,
                at_ms,
            })
        })
        .collect()
}

fn unescape_reason(text: &str) -> String {
    text.replace("%0A", "\n")
        .replace("%0D", "\r")
        .replace("%7C", "|")
        .replace("%25", "%")
}

/// The fencing token a step of an attempt carries: the move happens only if
/// the row is still at this attempt (owned by this session, when given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence<'a> {
    /// The attempt number.
    pub attempt: u32,
    /// The session that must own it (`None`: any session, e.g. an app
    /// resolving an unknown outcome).
    pub session: Option<&'a SessionId>,
}

/// The columns a status move may set besides the status.
#[derive(Debug, Clone, Default)]
pub struct StatusFields<'a> {
    /// New attempt number (entering `executing`).
    pub attempt: Option<u32>,
    /// When the outcome became unknown (entering `outcome_unknown`).
    pub unknown_since: Option<&'a Monotonic>,
    /// Marks a committed independent batch as partial.
    pub partial: bool,
    /// Result JSON (entering `committed`).
    pub result_json: Option<&'a str>,
    /// External id (commit, or found by reconciliation).
    pub external_id: Option<&'a str>,
    /// Reason (failures, unknown outcomes, rejections).
    pub reason: Option<&'a str>,
    /// Whether a failure may be retried.
    pub retryable: Option<bool>,
}

// ---------------------------------------------------------------------------
// Retention, size and maintenance queries (`Ledger::prune`, the inspector and
// the benchmark).
// ---------------------------------------------------------------------------

/// What is left of a pruned execution: enough for `begin` to refuse a very
/// late retry, nothing of its arguments or result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    /// The pruned execution.
    pub execution_id: ExecutionId,
    /// The digest of its arguments.
    pub args_digest: ArgsDigest,
    /// The terminal status it had when pruned.
    pub final_status: ExecutionStatus,
    /// How its digest was computed.
    pub digest_scheme: DigestScheme,
    /// When it was pruned, ms since the Unix epoch.
    pub pruned_ms: i64,
}

/// One execution that `prune` may delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneCandidate {
    /// Position in the scan (the row id); the next page starts after it.
    pub cursor: i64,
    /// The execution.
    pub execution_id: ExecutionId,
    /// Its operation.
    pub operation_id: OperationId,
    /// Its round.
    pub round: u32,
    /// The digest of its arguments.
    pub args_digest: ArgsDigest,
    /// Its terminal status.
    pub status: ExecutionStatus,
}

/// Rows deleted with one pruned execution.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrunedRows {
    /// Transition log entries.
    pub transitions: u64,
    /// Approval decisions.
    pub approvals: u64,
    /// Independent-batch item records.
    pub batch_items: u64,
    /// Background job records.
    pub jobs: u64,
    /// Processed webhook events.
    pub webhook_events: u64,
}

/// The size of the database file as SQLite sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DbSize {
    /// Bytes per page.
    pub page_size: u64,
    /// Pages in the file (including free ones).
    pub page_count: u64,
    /// Free pages (reclaimable by an incremental vacuum).
    pub freelist_count: u64,
}

impl DbSize {
    /// Total bytes (`page_size * page_count`).
    pub fn bytes(&self) -> u64 {
        self.page_size.saturating_mul(self.page_count)
    }
}

/// `recover()`'s scan: the flagged rows (partial index) and the rows above
/// the sweep's watermark (row-id range) that are not final.
const NEEDING_ATTENTION: &str = concat!(
    "SELECT ",
    execution_columns!(),
    " FROM executions WHERE needs_attention = 1
     UNION ALL
     SELECT ",
    execution_columns!(),
    " FROM executions
     WHERE rowid > (SELECT swept_rowid FROM attention_sweep WHERE id = 1)
       AND needs_attention IS NULL
       AND NOT (status = 'result_delivered' OR status = 'rejected'
                OR status = 'cancelled_before_commit')
     ORDER BY created_ms, execution_id"
);

/// The terminal statuses `prune` may remove (a `failed_before_commit` row only
/// when it is not retryable). Everything else needs attention or may still
/// run, and is never pruned.
///
/// Never prunable, whatever the status: an execution with evidence of a
/// stale attempt (it may be the only trace of an effect), and one that is not
/// delivered but has committed batch items (a partial commit of a version 3
/// ledger recorded as failed or cancelled: its items happened).
const PRUNABLE: &str = "(status IN ('result_delivered','rejected','cancelled_before_commit')
        OR (status = 'failed_before_commit' AND retryable IS NOT 1))
    AND NOT EXISTS (SELECT 1 FROM evidence v WHERE v.execution_id = executions.execution_id)
    AND (status = 'result_delivered'
         OR NOT EXISTS (SELECT 1 FROM batch_items b WHERE b.execution_id = executions.execution_id))";

impl Dao<'_> {
    /// The tombstone of a pruned execution, if any.
    ///
    /// # Errors
    /// Storage errors.
    pub fn tombstone(&self, id: &ExecutionId) -> Result<Option<Tombstone>> {
        self.tx
            .prepare_cached(
                "SELECT args_digest, final_status, pruned_ms, digest_scheme FROM tombstones
                 WHERE execution_id = ?1",
            )?
            .query_row([id.as_str()], |r| {
                let status: String = r.get(1)?;
                Ok(Tombstone {
                    execution_id: id.clone(),
                    args_digest: ArgsDigest::from_stored(r.get(0)?),
                    final_status: ExecutionStatus::parse(&status)
                        .ok_or_else(|| bad(1, "unknown status"))?,
                    pruned_ms: r.get(2)?,
                    digest_scheme: DigestScheme::from_stored(r.get(3)?),
                })
            })
            .optional()
            .map_err(Error::from)
    }

    /// How many executions last updated before `cutoff_ms` are prunable.
    ///
    /// # Errors
    /// Storage errors.
    pub fn count_prunable(&self, cutoff_ms: i64) -> Result<u64> {
        let sql = format!("SELECT count(*) FROM executions WHERE updated_ms < ?1 AND ({PRUNABLE})");
        Ok(self
            .tx
            .prepare_cached(&sql)?
            .query_row([cutoff_ms], |r| r.get(0))?)
    }

    /// The next `limit` prunable executions after `cursor`, in row order.
    ///
    /// # Errors
    /// Storage errors.
    pub fn prune_candidates(
        &self,
        cutoff_ms: i64,
        cursor: i64,
        limit: u32,
    ) -> Result<Vec<PruneCandidate>> {
        let sql = format!(
            "SELECT rowid, execution_id, operation_id, round, args_digest, status
             FROM executions WHERE rowid > ?1 AND updated_ms < ?2 AND ({PRUNABLE})
             ORDER BY rowid LIMIT ?3"
        );
        let mut stmt = self.tx.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![cursor, cutoff_ms, limit], |r| {
            let status: String = r.get(5)?;
            Ok(PruneCandidate {
                cursor: r.get(0)?,
                execution_id: ExecutionId::from_stored(r.get(1)?),
                operation_id: OperationId::from_stored(r.get(2)?),
                round: r.get(3)?,
                args_digest: ArgsDigest::from_stored(r.get(4)?),
                status: ExecutionStatus::parse(&status).ok_or_else(|| bad(5, "unknown status"))?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// True when some execution compensates `id` (it must outlive them).
    ///
    /// # Errors
    /// Storage errors.
    pub fn has_compensations(&self, id: &ExecutionId) -> Result<bool> {
        Ok(self
            .tx
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM executions WHERE compensates = ?1)")?
            .query_row([id.as_str()], |r| r.get(0))?)
    }

    /// Deletes one execution with its approvals, batch items, job, webhook
    /// events and transition log, leaving `tombstone` (when given) in its
    /// place. Only a prunable (terminal) row is deleted; returns `None` when
    /// the row is missing or no longer prunable.
    ///
    /// # Errors
    /// Storage errors.
    pub fn prune_execution(
        &self,
        id: &ExecutionId,
        tombstone_pruned_ms: Option<i64>,
    ) -> Result<Option<PrunedRows>> {
        let sql = format!(
            "SELECT args_digest, status,
                    length(history) - length(replace(history, char(10), '')), digest_scheme
             FROM executions WHERE execution_id = ?1 AND ({PRUNABLE})"
        );
        let found: Option<(String, String, u64, Option<i64>)> = self
            .tx
            .prepare_cached(&sql)?
            .query_row([id.as_str()], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()?;
        let Some((digest, status, log_entries, scheme)) = found else {
            return Ok(None);
        };
        let delete = |sql: &str| -> Result<u64> {
            Ok(self.tx.prepare_cached(sql)?.execute([id.as_str()])? as u64)
        };
        let rows = PrunedRows {
            approvals: delete("DELETE FROM approvals WHERE execution_id = ?1")?,
            batch_items: delete("DELETE FROM batch_items WHERE execution_id = ?1")?,
            jobs: delete("DELETE FROM jobs WHERE execution_id = ?1")?,
            webhook_events: delete("DELETE FROM webhook_events WHERE execution_id = ?1")?,
            transitions: log_entries,
        };
        if let Some(pruned_ms) = tombstone_pruned_ms {
            self.tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO tombstones
                        (execution_id, args_digest, final_status, pruned_ms, digest_scheme)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![id.as_str(), digest, status, pruned_ms, scheme])?;
        }
        delete("DELETE FROM executions WHERE execution_id = ?1")?;
        Ok(Some(rows))
    }

    /// Deletes the operation if no execution is left in it and it is `open`
    /// or `completed` (a cancelled operation keeps refusing new calls, so it
    /// stays). Returns how many operations were deleted (0 or 1).
    ///
    /// # Errors
    /// Storage errors.
    pub fn prune_empty_operation(&self, op: &OperationId) -> Result<u64> {
        let (start, end) = op.execution_id_range();
        let deleted = self
            .tx
            .prepare_cached(
                "DELETE FROM operations WHERE operation_id = ?1
                 AND status IN ('open','completed')
                 AND NOT EXISTS (SELECT 1 FROM executions
                                 WHERE execution_id >= ?2 AND execution_id < ?3)",
            )?
            .execute(params![op.as_str(), start, end])?;
        Ok(deleted as u64)
    }

    /// Deletes tombstones written before `cutoff_ms`; returns how many.
    ///
    /// # Errors
    /// Storage errors.
    pub fn delete_tombstones_before(&self, cutoff_ms: i64) -> Result<u64> {
        Ok(self
            .tx
            .prepare_cached("DELETE FROM tombstones WHERE pruned_ms < ?1")?
            .execute([cutoff_ms])? as u64)
    }

    /// Number of tombstones.
    ///
    /// # Errors
    /// Storage errors.
    pub fn tombstone_count(&self) -> Result<u64> {
        Ok(self
            .tx
            .query_row("SELECT count(*) FROM tombstones", [], |r| r.get(0))?)
    }

    /// Returns free pages to the file system (the database was created with
    /// `auto_vacuum=INCREMENTAL`) and says how many. In WAL mode the file
    /// shrinks at the next checkpoint.
    ///
    /// # Errors
    /// Storage errors.
    pub fn incremental_vacuum(&self) -> Result<u64> {
        // The pragma frees one page per step (one result row each): it must
        // be stepped to the end, which `execute_batch` does not do.
        let mut stmt = self.tx.prepare("PRAGMA incremental_vacuum")?;
        let mut rows = stmt.query([])?;
        let mut freed = 0;
        while rows.next()?.is_some() {
            freed += 1;
        }
        Ok(freed)
    }

    /// Page size, page count and free pages.
    ///
    /// # Errors
    /// Storage errors.
    pub fn size(&self) -> Result<DbSize> {
        let get = |pragma: &str| -> Result<u64> {
            Ok(self
                .tx
                .query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0))?)
        };
        Ok(DbSize {
            page_size: get("page_size")?,
            page_count: get("page_count")?,
            freelist_count: get("freelist_count")?,
        })
    }

    /// Every execution, in row order, `limit` at a time after `cursor`
    /// (export). Returns `(cursor, record)` pairs.
    ///
    /// # Errors
    /// Storage errors.
    pub fn executions_page(&self, cursor: i64, limit: u32) -> Result<Vec<(i64, ExecutionRecord)>> {
        let sql = format!(
            "SELECT {EXECUTION_COLUMNS}, rowid FROM executions WHERE rowid > ?1
             ORDER BY rowid LIMIT ?2"
        );
        let mut stmt = self.tx.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![cursor, limit], |r| {
            Ok((r.get(26)?, row_to_record(r)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Number of executions.
    ///
    /// # Errors
    /// Storage errors.
    pub fn execution_count(&self) -> Result<u64> {
        Ok(self
            .tx
            .query_row("SELECT count(*) FROM executions", [], |r| r.get(0))?)
    }

    /// Executions per tool name, most used first (inspector).
    ///
    /// # Errors
    /// Storage errors.
    pub fn executions_by_tool(&self) -> Result<Vec<(String, u64)>> {
        let mut stmt = self.tx.prepare_cached(
            "SELECT tool_name, count(*) AS n FROM executions GROUP BY tool_name
             ORDER BY n DESC, tool_name",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// The oldest creation and newest update time of any execution.
    ///
    /// # Errors
    /// Storage errors.
    pub fn execution_time_range(&self) -> Result<Option<(i64, i64)>> {
        let range: (Option<i64>, Option<i64>) = self.tx.query_row(
            "SELECT min(created_ms), max(updated_ms) FROM executions",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(range.0.zip(range.1))
    }

    /// The schema version of the open database.
    ///
    /// # Errors
    /// Storage errors.
    pub fn schema_version(&self) -> Result<i64> {
        Ok(self.tx.query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }

    /// Bytes used per table and index (SQLite's `dbstat`), largest first
    /// (the benchmark's size breakdown).
    ///
    /// # Errors
    /// Storage errors.
    pub fn bytes_per_object(&self) -> Result<Vec<(String, u64)>> {
        let mut stmt = self.tx.prepare(
            "SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY sum(pgsize) DESC",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// `EXPLAIN QUERY PLAN` of the scan behind `recover()`, one line per step
    /// (the benchmark and a test check that it uses the partial index).
    ///
    /// # Errors
    /// Storage errors.
    pub fn attention_query_plan(&self) -> Result<Vec<String>> {
        let sql = format!("EXPLAIN QUERY PLAN {NEEDING_ATTENTION}");
        let mut stmt = self.tx.prepare(&sql)?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(3))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Benchmark support: appends `count` delivered executions (8 per
    /// operation, 4 per round, each with its 3 transition log entries) to the
    /// real tables in one statement per table, for building a large history
    /// quickly. Ids are `hist_<batch>_op_<n>:round_<r>:call_<c>:send_email:v1`.
    /// Not for applications: nothing is validated.
    ///
    /// # Errors
    /// Storage errors.
    #[doc(hidden)]
    pub fn fill_history_for_bench(
        &self,
        batch: &str,
        count: u64,
        start_ms: i64,
        result_json: &str,
        session: &SessionId,
    ) -> Result<()> {
        let ops = count.div_ceil(8);
        // Ids are zero-padded so rows arrive in key order (fast B-tree appends).
        self.tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2)
             INSERT INTO operations (operation_id, status, created_ms, updated_ms)
             SELECT printf('hist_%s_op_%08d', ?1, i), 'completed', ?3 + i * 8, ?3 + i * 8 FROM n",
            params![batch, ops, start_ms],
        )?;
        self.tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2),
             ids(i, op, rnd, pos, id) AS (
                SELECT i, printf('hist_%s_op_%08d', ?1, i / 8), (i % 8) / 4, i % 4,
                       printf('hist_%s_op_%08d:round_%d:call_%d:send_email:v1',
                              ?1, i / 8, (i % 8) / 4, i % 4)
                FROM n)
             INSERT INTO executions (execution_id, operation_id, round, position, provider,
                provider_call_id, tool_name, tool_version, args_digest, args_json,
                downstream_key, requires_approval, status, attempt_count, external_id,
                result_json, created_ms, updated_ms, history, digest_scheme)
             SELECT id, op, rnd, pos, 'custom', printf('call_%d', pos), 'send_email', 1,
                lower(hex(randomblob(32))),
                printf('{\"subject\":\"Report %d\",\"to\":\"user%d@example.com\"}', i, i),
                'tl_' || substr(lower(hex(randomblob(24))), 1, 48), 0, 'result_delivered', 1,
                printf('msg_%d', i), ?4, ?3 + i, ?3 + i + 1,
                printf('%d|start||executing|1|%s' || char(10)
                       || '%d|commit|executing|committed|1|%s' || char(10)
                       || '%d|deliver|committed|result_delivered|1|%s' || char(10),
                       ?3 + i, ?5, ?3 + i, ?5, ?3 + i + 1, ?5), 2
             FROM ids",
            params![batch, count, start_ms, result_json, session.as_str()],
        )?;
        // An app sweeps every few hundred calls: the history is swept.
        self.sweep_attention(0)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_round_trip_every_reason() {
        let session = SessionId::generate();
        let reasons = [
            None,
            Some(""),
            Some("plain"),
            Some("a|b|c"),
            Some("100% sure, %7C is not a pipe, %25 not a percent"),
            Some("line one\nline two\r\n"),
            Some("ünïcødé ✓ |%\n"),
        ];
        let mut history = String::new();
        for (i, reason) in reasons.iter().enumerate() {
            history.push_str(&history_line(&LogLine {
                at_ms: 1_700_000_000_000 + i as i64,
                transition: "fail_before_commit",
                from: (i > 0).then_some(ExecutionStatus::Executing),
                to: ExecutionStatus::FailedBeforeCommit,
                attempt: i as u32,
                session: &session,
                reason: *reason,
            }));
        }
        assert_eq!(
            history.matches('\n').count(),
            reasons.len(),
            "one line each"
        );
        let parsed = parse_history(&history).unwrap();
        assert_eq!(parsed.len(), reasons.len());
        for (i, (entry, reason)) in parsed.iter().zip(reasons).enumerate() {
            assert_eq!(entry.reason.as_deref(), reason, "entry {i}");
            assert_eq!(entry.attempt, i as u32);
            assert_eq!(entry.at_ms, 1_700_000_000_000 + i as i64);
            assert_eq!(entry.from, (i > 0).then_some(ExecutionStatus::Executing));
            assert_eq!(entry.transition, "fail_before_commit");
        }
    }

    #[test]
    fn a_damaged_log_is_a_typed_error_not_a_panic() {
        for bad in [
            "x|start||executing|1|s\n",
            "1|start\n",
            "1|start||nope|1|s\n",
            "1|start||executing|-1|s\n",
        ] {
            assert!(parse_history(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_history("").unwrap(), Vec::new());
    }
}
