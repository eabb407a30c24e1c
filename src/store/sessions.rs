//! The sessions registry, the evidence of stale attempts and the ledger's
//! identity (schema version 4).

use rusqlite::{params, OptionalExtension};

use super::codec::unseal;
use super::crypt::{Col, Row};
use super::dao::Dao;
use super::error::Result;
use crate::model::text::bounded_reason;
use crate::model::{EvidenceEntry, ExecutionId, SessionId};

/// One open ledger as registered in the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// The session.
    pub session_id: SessionId,
    /// Where its lock file is (absolute; each session registers its own).
    pub lock_path: String,
    /// The boot it was opened (or suspended) in.
    pub boot_id: String,
    /// When it was suspended (boot clock, ms), `None` while active.
    pub suspended_ms: Option<i64>,
    /// How long after `suspended_ms` it stays owner of what it was running.
    pub suspend_lease_ms: Option<i64>,
    /// When it was opened (wall clock, ms; for people).
    pub opened_ms: i64,
    /// Its process id (for people).
    pub pid: i64,
}

/// What a stale attempt tried to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvidenceKind {
    /// A result (the effect happened, as that attempt saw it).
    Commit,
    /// A failure before commit.
    Fail,
    /// An unknown outcome.
    Unknown,
    /// The downstream's id for the effect.
    ExternalId,
    /// One committed item of an independent batch.
    BatchItem,
    /// A background job it started.
    Job,
}

impl EvidenceKind {
    /// True for evidence that an effect may exist downstream (the kinds
    /// [`Dao::has_effect_evidence`] counts).
    pub fn is_effect(self) -> bool {
        matches!(
            self,
            EvidenceKind::Commit
                | EvidenceKind::ExternalId
                | EvidenceKind::BatchItem
                | EvidenceKind::Job
        )
    }

    /// The name stored in the `evidence` table.
    pub fn as_str(self) -> &'static str {
        match self {
            EvidenceKind::Commit => "commit",
            EvidenceKind::Fail => "fail",
            EvidenceKind::Unknown => "unknown",
            EvidenceKind::ExternalId => "external_id",
            EvidenceKind::BatchItem => "batch_item",
            EvidenceKind::Job => "job",
        }
    }
}

/// One row of evidence, as written.
#[derive(Debug, Clone, Copy)]
pub struct Evidence<'a> {
    /// The stale attempt's number.
    pub attempt: u32,
    /// The session that ran it.
    pub session: &'a SessionId,
    /// What it tried to record.
    pub kind: EvidenceKind,
    /// Its result, if any.
    pub result_json: Option<&'a str>,
    /// Its external id, if any.
    pub external_id: Option<&'a str>,
    /// Its reason, if any.
    pub reason: Option<&'a str>,
    /// The batch item, if any.
    pub item_index: Option<u32>,
    /// When (wall clock, ms).
    pub at_ms: i64,
}

fn session_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        session_id: r.get(0)?,
        lock_path: r.get(1)?,
        boot_id: r.get(2)?,
        suspended_ms: r.get(3)?,
        suspend_lease_ms: r.get(4)?,
        opened_ms: r.get(5)?,
        pid: r.get(6)?,
    })
}

const SESSION_COLUMNS: &str =
    "session_id, lock_path, boot_id, suspended_ms, suspend_lease_ms, opened_ms, pid";

impl Dao<'_> {
    /// The ledger's identity (`meta.ledger_id`), `None` before version 4.
    ///
    /// # Errors
    /// Storage errors.
    pub fn ledger_id(&self) -> Result<Option<String>> {
        let exists: bool = self.tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'meta')",
            [],
            |r| r.get(0),
        )?;
        if !exists {
            return Ok(None);
        }
        Ok(self
            .tx
            .query_row("SELECT value FROM meta WHERE key = 'ledger_id'", [], |r| {
                r.get(0)
            })
            .optional()?)
    }

    /// Registers (or re-registers) a session as active.
    ///
    /// # Errors
    /// Storage errors.
    pub fn register_session(
        &self,
        session: &SessionId,
        lock_path: &str,
        boot_id: &str,
        opened_ms: i64,
        pid: u32,
    ) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO sessions (session_id, lock_path, boot_id, opened_ms, pid)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(session_id) DO UPDATE SET lock_path = excluded.lock_path,
                    boot_id = excluded.boot_id, suspended_ms = NULL, suspend_lease_ms = NULL",
            )?
            .execute(params![session, lock_path, boot_id, opened_ms, pid])?;
        Ok(())
    }

    /// Registers a session that has no row yet; a row already there (and
    /// its suspension mark) is left as it is.
    ///
    /// # Errors
    /// Storage errors.
    pub fn register_session_if_missing(
        &self,
        session: &SessionId,
        lock_path: &str,
        boot_id: &str,
        opened_ms: i64,
        pid: u32,
    ) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO sessions (session_id, lock_path, boot_id, opened_ms, pid)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(session_id) DO NOTHING",
            )?
            .execute(params![session, lock_path, boot_id, opened_ms, pid])?;
        Ok(())
    }

    /// Marks a session suspended at `at_ms` (boot clock of `boot_id`) for
    /// `lease_ms`. Returns false when the session has no row.
    ///
    /// # Errors
    /// Storage errors.
    pub fn mark_suspended(
        &self,
        session: &SessionId,
        boot_id: &str,
        at_ms: i64,
        lease_ms: i64,
    ) -> Result<bool> {
        let changed = self
            .tx
            .prepare_cached(
                "UPDATE sessions SET boot_id = ?2, suspended_ms = ?3, suspend_lease_ms = ?4
                 WHERE session_id = ?1",
            )?
            .execute(params![session, boot_id, at_ms, lease_ms])?;
        Ok(changed == 1)
    }

    /// One session's row.
    ///
    /// # Errors
    /// Storage errors.
    pub fn session(&self, session: &SessionId) -> Result<Option<SessionRow>> {
        let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE session_id = ?1");
        Ok(self
            .tx
            .prepare_cached(&sql)?
            .query_row([session], session_from_row)
            .optional()?)
    }

    /// Every registered session.
    ///
    /// # Errors
    /// Storage errors.
    pub fn sessions(&self) -> Result<Vec<SessionRow>> {
        let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions ORDER BY opened_ms");
        let mut stmt = self.tx.prepare_cached(&sql)?;
        let rows = stmt.query_map([], session_from_row)?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Deletes a session's row.
    ///
    /// # Errors
    /// Storage errors.
    pub fn delete_session(&self, session: &SessionId) -> Result<()> {
        self.tx
            .prepare_cached("DELETE FROM sessions WHERE session_id = ?1")?
            .execute([session])?;
        Ok(())
    }

    /// Keeps what a stale attempt learnt.
    ///
    /// # Errors
    /// Storage errors.
    pub fn insert_evidence(&self, id: &ExecutionId, e: &Evidence<'_>) -> Result<()> {
        // Bound to the execution and the attempt (an execution's evidence
        // rows have no other identity).
        let row = Row::with(id.as_str(), i64::from(e.attempt));
        let result = self.seal(Col::EvidenceResult, row, e.result_json)?;
        let external = self.seal(Col::EvidenceExternalId, row, e.external_id)?;
        let reason = e.reason.map(bounded_reason);
        let reason = self.seal(Col::EvidenceReason, row, reason.as_deref())?;
        self.tx
            .prepare_cached(
                "INSERT INTO evidence (execution_id, attempt, session_id, kind, result_json,
                    external_id, reason, item_index, at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                id,
                e.attempt,
                e.session,
                e.kind.as_str(),
                result,
                external,
                reason,
                e.item_index,
                e.at_ms
            ])?;
        Ok(())
    }

    /// True when evidence says an effect of execution `id` may exist
    /// downstream (a result, an external id, a committed batch item, a job
    /// started), whatever its status says.
    ///
    /// # Errors
    /// Storage errors.
    pub fn has_effect_evidence(&self, id: &ExecutionId) -> Result<bool> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM evidence WHERE execution_id = ?1
                    AND kind IN ('commit', 'external_id', 'batch_item', 'job'))",
            )?
            .query_row([id], |r| r.get(0))?)
    }

    /// The evidence kept for one execution, oldest first.
    ///
    /// # Errors
    /// Storage errors.
    pub fn evidence_of(&self, id: &ExecutionId) -> Result<Vec<EvidenceEntry>> {
        let mut stmt = self.tx.prepare_cached(
            "SELECT attempt, kind, result_json, external_id, reason, item_index FROM evidence
             WHERE execution_id = ?1 ORDER BY rowid",
        )?;
        let rows = stmt.query_map([id], |r| {
            let attempt: u32 = r.get(0)?;
            let row = Row::with(id.as_str(), i64::from(attempt));
            Ok(EvidenceEntry {
                attempt,
                kind: r.get(1)?,
                result_json: unseal(self.keys, Col::EvidenceResult, row, r.get_ref(2)?)?,
                external_id: unseal(self.keys, Col::EvidenceExternalId, row, r.get_ref(3)?)?,
                reason: unseal(self.keys, Col::EvidenceReason, row, r.get_ref(4)?)?,
                item_index: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }
}
