//! The `executions` table: one row per logical tool call, its status, its
//! attempt and owner, its result and its transition log (`history`, see
//! [`super::history`]). Every status change goes through
//! [`Dao::move_status`], which takes a checked [`Move`] and the fence of the
//! attempt that asks.

use rusqlite::{params, OptionalExtension};

use super::codec::{execution_columns, row_to_record, unseal, EXECUTION_COLUMNS};
use super::crypt::{hex, unhex, Col, Row};
use super::dao::Dao;
use super::error::{Error, Result};
use super::history::{history_line, parse_history, LogLine};
use super::hot::HotSql;
use crate::model::text::bounded_reason;
use crate::model::{
    ArgsDigest, DigestScheme, DownstreamKey, ExecutionId, ExecutionRecord, ExecutionStatus,
    Monotonic, Move, OperationId, Provider, SessionId, TransitionEntry,
};

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

/// What answers a repeated `begin` of a stored execution when it committed
/// (see [`Dao::stored_answer`]); for any other status only `status` and the
/// digest say anything. No `Debug` of the values: printed, it shows the
/// status and flags, never the result or the downstream's id.
#[derive(Clone)]
pub struct StoredAnswer {
    /// Its status.
    pub status: ExecutionStatus,
    /// The digest of its arguments, as stored.
    pub args_digest: ArgsDigest,
    /// How that digest was computed.
    pub digest_scheme: DigestScheme,
    /// The committed result (unsealed).
    pub result_json: Option<String>,
    /// The downstream's id for the effect (unsealed).
    pub external_id: Option<String>,
    /// An independent batch that committed in part.
    pub partial: bool,
}

impl std::fmt::Debug for StoredAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredAnswer")
            .field("status", &self.status)
            .field("digest_scheme", &self.digest_scheme)
            .field("partial", &self.partial)
            .finish_non_exhaustive()
    }
}

impl Dao<'_> {
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
            .query_row([id], |r| row_to_record(self.keys, r))
            .optional()?)
    }

    /// What answers a repeated `begin` of a committed execution, read without
    /// the rest of its record: its status, digest (and digest scheme) and,
    /// when it committed, the result, the downstream's id and whether the
    /// commit was partial. `None` when no execution has the id. The replay's
    /// read: a whole record costs about three times as much to decode.
    ///
    /// # Errors
    /// Storage errors; a sealed value that does not open (as
    /// [`Dao::execution`]).
    pub fn stored_answer(&self, id: &ExecutionId) -> Result<Option<StoredAnswer>> {
        let keys = self.keys;
        self.hot(HotSql::StoredAnswer, |stmt| {
            stmt.query_row([id], |r| {
                let bound = Row::of(id.as_str());
                let partial: Option<i64> = r.get(5)?;
                Ok(StoredAnswer {
                    status: r.get(0)?,
                    args_digest: r.get(1)?,
                    digest_scheme: r.get(2)?,
                    result_json: unseal(keys, Col::Result, bound, r.get_ref(3)?)?,
                    external_id: unseal(keys, Col::ExternalId, bound, r.get_ref(4)?)?,
                    partial: partial == Some(1),
                })
            })
            .optional()
        })
    }

    /// The status and attempt count of one execution (a light read).
    ///
    /// # Errors
    /// Storage errors.
    pub fn status_and_attempt(&self, id: &ExecutionId) -> Result<Option<(ExecutionStatus, u32)>> {
        Ok(self
            .tx
            .prepare_cached("SELECT status, attempt_count FROM executions WHERE execution_id = ?1")?
            .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    /// Inserts a new execution, logging its creation, unless a stored
    /// execution has its id. Returns false then (nothing written: the caller
    /// reads what is stored and decides by it), so the usual `begin` of a
    /// new call does not read the execution first. Tombstones are the
    /// caller's to check (see `Dao::tombstone`).
    ///
    /// # Errors
    /// Storage errors.
    pub fn insert_execution(&self, new: &NewExecution<'_>, session: &SessionId) -> Result<bool> {
        let row = Row::of(new.execution_id.as_str());
        let args = self.seal(Col::Args, row, Some(new.args_json))?;
        // `HotSql::InsertExecution`: a taken id inserts nothing. Positional
        // parameters: binding by name costs a lookup per value.
        let inserted = self.hot(HotSql::InsertExecution, |stmt| {
            stmt.execute(params![
                new.execution_id,
                new.operation_id,
                new.round,
                new.position,
                new.provider,
                new.provider_call_id,
                new.tool_name,
                new.tool_version,
                new.args_digest,
                args,
                new.downstream_key,
                new.requires_approval,
                new.status,
                new.attempt_count,
                new.owner_session,
                new.compensates,
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
            ])
        })?;
        if inserted == 0 {
            return Ok(false);
        }
        self.observe(
            new.execution_id,
            None,
            new.status,
            new.attempt_count,
            None,
            new.now_ms,
        )?;
        Ok(true)
    }

    /// A reason as written into a log line: itself in a plain ledger, the
    /// hex of its sealed bytes in an encrypted one.
    fn log_reason<'r>(
        &self,
        id: &ExecutionId,
        reason: Option<&'r str>,
    ) -> Result<Option<std::borrow::Cow<'r, str>>> {
        Ok(match (reason, self.keys) {
            (None, _) => None,
            (Some(r), None) => Some(std::borrow::Cow::Borrowed(r)),
            (Some(r), Some(keys)) => Some(std::borrow::Cow::Owned(hex(&keys.seal(
                Col::History,
                Row::of(id.as_str()),
                r.as_bytes(),
            )?))),
        })
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
                .query_row([id], |r| r.get(0))
                .optional()?
                .unwrap_or_default(),
        };
        // Free text is stored bounded (model/text.rs), in the log too.
        let change_reason = change.reason.map(bounded_reason);
        let log_reason = self.log_reason(id, change_reason.as_deref())?;
        let line = history_line(&LogLine {
            at_ms: now_ms,
            transition: mv.transition().as_str(),
            from: Some(mv.from()),
            to,
            attempt,
            session: actor,
            reason: log_reason.as_deref(),
        });
        let row = Row::of(id.as_str());
        let result = self.seal(Col::Result, row, change.result_json)?;
        let external = self.seal(Col::ExternalId, row, change.external_id)?;
        let reason = self.seal(Col::Reason, row, change_reason.as_deref())?;
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
        let owner = (to == ExecutionStatus::Executing).then_some(actor);
        let unknown = change
            .unknown_since
            .filter(|_| to == ExecutionStatus::OutcomeUnknown);
        let changed = self.tx.prepare_cached(sql)?.execute(params![
            id,
            mv.from(),
            to,
            now_ms,
            change.attempt,
            owner,
            unknown.map(|u| u.ms),
            unknown.map(|u| &*u.boot_id),
            result,
            external,
            reason,
            change.retryable,
            change.partial.then_some(1),
            line,
            fence.map(|f| f.attempt),
            fence.and_then(|f| f.session),
        ])?;
        if changed != 0 {
            self.observe(
                id,
                Some(mv.from()),
                to,
                attempt,
                change_reason.as_deref(),
                now_ms,
            )?;
        }
        Ok(changed != 0)
    }

    /// The happy commit of a running attempt, in one statement:
    /// `executing -> committed` for attempt `attempt` owned by `owner`,
    /// storing the result and logging the move, when nothing else needs
    /// deciding: the external id stored is none or `external_id` itself (so
    /// the one now stored is `external_id`), and the operation is not
    /// cancelled. Returns false when the row is not so (nothing changed:
    /// the caller takes the general path, which explains why).
    ///
    /// # Errors
    /// Storage errors, or [`Error::Guard`] if the schema refuses the move.
    #[allow(clippy::too_many_arguments)]
    pub fn commit_running(
        &self,
        id: &ExecutionId,
        mv: Move,
        attempt: u32,
        owner: &SessionId,
        result_json: &str,
        external_id: Option<&str>,
        now_ms: i64,
    ) -> Result<bool> {
        // An encrypted ledger takes the general path: its values are sealed
        // there, and a sealed external id never equals another sealing of
        // the same text, so the SQL comparison below cannot be made.
        if mv.from() != ExecutionStatus::Executing
            || mv.to() != ExecutionStatus::Committed
            || self.keys.is_some()
        {
            return Ok(false);
        }
        let line = history_line(&LogLine {
            at_ms: now_ms,
            transition: mv.transition().as_str(),
            from: Some(mv.from()),
            to: mv.to(),
            attempt,
            session: owner,
            reason: None,
        });
        // The statement (`HotSql::CommitRunning`) checks the fence, that the
        // external id stored is none or the same, and that the operation is
        // not cancelled.
        let changed = self.hot(HotSql::CommitRunning, |stmt| {
            stmt.execute(params![
                id,
                attempt,
                now_ms,
                result_json,
                external_id,
                line,
                owner
            ])
        })?;
        if changed != 0 {
            self.observe(id, Some(mv.from()), mv.to(), attempt, None, now_ms)?;
        }
        Ok(changed != 0)
    }

    /// `committed -> result_delivered` (move `mv`, checked by the caller),
    /// logged as made by `actor` for attempt `attempt` at `at_ms`: the
    /// delivery mark, in a statement of its own (it changes nothing but the
    /// status, the time, the log and the attention flag). False when the
    /// row is no longer `committed` (delivered meanwhile by another
    /// process): nothing changed.
    ///
    /// # Errors
    /// Storage errors, or [`Error::Guard`] if the schema refuses the move.
    pub fn deliver(
        &self,
        id: &ExecutionId,
        mv: Move,
        attempt: u32,
        actor: &SessionId,
        at_ms: i64,
    ) -> Result<bool> {
        if mv.from() != ExecutionStatus::Committed || mv.to() != ExecutionStatus::ResultDelivered {
            return Err(Error::Guard(format!(
                "deliver is committed -> result_delivered, not {} -> {}",
                mv.from(),
                mv.to()
            )));
        }
        let line = history_line(&LogLine {
            at_ms,
            transition: mv.transition().as_str(),
            from: Some(mv.from()),
            to: mv.to(),
            attempt,
            session: actor,
            reason: None,
        });
        let changed = self.hot(HotSql::Deliver, |stmt| {
            stmt.execute(params![id, at_ms, line])
        })?;
        if changed != 0 {
            self.observe(id, Some(mv.from()), mv.to(), attempt, None, at_ms)?;
        }
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
        let reason = bounded_reason(reason);
        let log_reason = self.log_reason(id, Some(&reason))?;
        let line = history_line(&LogLine {
            at_ms: now_ms,
            transition: note,
            from: Some(status),
            to: status,
            attempt,
            session: actor,
            reason: log_reason.as_deref(),
        });
        self.tx
            .prepare_cached(
                "UPDATE executions SET history = history || ?2 WHERE execution_id = ?1",
            )?
            .execute(params![id, line])?;
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
            .execute(params![id, at.ms, &*at.boot_id])?;
        Ok(())
    }

    /// Stores the downstream's id for the effect as soon as it is known.
    /// Returns false when the row is missing or holds a different id.
    ///
    /// # Errors
    /// Storage errors.
    pub fn set_external_id(&self, id: &ExecutionId, external: &str, now_ms: i64) -> Result<bool> {
        // Compared here, not in SQL: a sealed value never equals another
        // sealing of the same text (each has its own nonce).
        let row = Row::of(id.as_str());
        let stored: Option<Option<String>> = self
            .tx
            .prepare_cached("SELECT external_id FROM executions WHERE execution_id = ?1")?
            .query_row([id], |r| {
                unseal(self.keys, Col::ExternalId, row, r.get_ref(0)?)
            })
            .optional()?;
        match stored {
            None => Ok(false),
            Some(Some(known)) => Ok(known == external),
            Some(None) => {
                let sealed = self.seal(Col::ExternalId, row, Some(external))?;
                let changed = self
                    .tx
                    .prepare_cached(
                        "UPDATE executions SET external_id = ?2, updated_ms = ?3
                         WHERE execution_id = ?1 AND external_id IS NULL",
                    )?
                    .execute(params![id, sealed, now_ms])?;
                Ok(changed == 1)
            }
        }
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
        let rows = stmt.query_map(params![start, end, op], |r| row_to_record(self.keys, r))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
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
        let rows = stmt.query_map([original], |r| row_to_record(self.keys, r))?;
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
            .query_row([id], |r| r.get(0))
            .optional()?;
        let mut entries = parse_history(history.as_deref().unwrap_or_default())
            .map_err(|what| Error::InvalidData(what.to_owned()))?;
        if let Some(keys) = self.keys {
            for entry in &mut entries {
                if let Some(sealed) = entry.reason.take() {
                    let bytes = unhex(&sealed).ok_or(Error::Undecryptable)?;
                    entry.reason = Some(keys.open(Col::History, Row::of(id.as_str()), &bytes)?);
                }
            }
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_stored_answer_shows_no_result_or_downstream_id() {
        let answer = StoredAnswer {
            status: ExecutionStatus::Committed,
            args_digest: ArgsDigest::parse("ab".repeat(32)).unwrap(),
            digest_scheme: DigestScheme::Exact,
            result_json: Some(r#"{"iban":"CANARY-RESULT"}"#.to_owned()),
            external_id: Some("CANARY-EXTERNAL".to_owned()),
            partial: true,
        };
        let printed = format!("{answer:?} {answer:#?}");
        assert!(!printed.contains("CANARY"), "{printed}");
        assert!(printed.contains("Committed") && printed.contains("partial: true"));
    }
}
