//! The `approvals` table: a human's decision, bound to the argument digest
//! it was made for.

use rusqlite::{params, OptionalExtension};

use super::codec::unseal;
use super::crypt::{Col, Row};
use super::dao::Dao;
use super::error::Result;
use crate::model::{ArgsDigest, ExecutionId};

impl Dao<'_> {
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
        let preview = self.seal(Col::Preview, Row::of(id.as_str()), preview_json)?;
        self.tx
            .prepare_cached(
                "INSERT INTO approvals (execution_id, args_digest, decision, preview_json, decided_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(execution_id, args_digest) DO UPDATE SET
                    decision = excluded.decision, preview_json = excluded.preview_json,
                    decided_ms = excluded.decided_ms",
            )?
            .execute(params![
                id,
                digest,
                if approved { "approved" } else { "rejected" },
                preview,
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
            .query_row(params![id, digest], |r| {
                unseal(self.keys, Col::Preview, Row::of(id.as_str()), r.get_ref(0)?)
            })
            .optional()?)
    }
}
