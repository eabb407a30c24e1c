//! What `recover()` must look at, without `begin` writing an index entry:
//! the `needs_attention` flag (a partial index) and the swept watermark
//! (`attention_sweep.swept_rowid`). See migration 003 for the rules.

use rusqlite::params;

use super::codec::{execution_columns, row_to_record};
use super::dao::Dao;
use super::error::Result;
use crate::model::ExecutionRecord;

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

impl Dao<'_> {
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
        let rows = stmt.query_map([], |r| row_to_record(self.keys, r))?;
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
}

#[cfg(test)]
mod tests {
    use crate::store::{Store, StoreOptions};

    #[test]
    fn recover_reads_only_the_rows_that_need_attention() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("l.db"), StoreOptions::default(), None).unwrap();
        let plan: Vec<String> = store
            .read(|dao| {
                let sql = format!("EXPLAIN QUERY PLAN {}", super::NEEDING_ATTENTION);
                let mut stmt = dao.tx.prepare(&sql)?;
                let rows = stmt.query_map([], |r| r.get::<_, String>(3))?;
                Ok::<_, crate::store::Error>(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            })
            .unwrap();
        assert!(
            plan.iter()
                .any(|step| step.contains("USING INDEX executions_needing_attention")),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|step| step.starts_with("SCAN executions")));
    }
}
