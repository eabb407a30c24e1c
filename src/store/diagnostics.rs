//! Counts, sizes and pages for the inspector (`Inspector`, the CLI) and
//! `Ledger::stats`: reads only.

use rusqlite::params;

use super::codec::{row_to_record, EXECUTION_COLUMNS};
use super::dao::Dao;
use super::error::Result;
use crate::model::ExecutionRecord;

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

impl Dao<'_> {
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
            Ok((r.get(26)?, row_to_record(self.keys, r)?))
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
}
