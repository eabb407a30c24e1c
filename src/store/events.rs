//! Status moves as events for an observer: collected by the `Dao` inside a
//! write (only when someone observes) and handed out after the commit, so an
//! observer never hears of a move that was rolled back. An event carries
//! ids, the tool, the statuses, the attempt, times and a reason *kind*,
//! never a value or a reason's text.

use rusqlite::OptionalExtension;

use super::dao::Dao;
use super::error::Result;
use crate::model::{ExecutionId, ExecutionStatus};

/// One committed status move (or the creation of an execution).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveEvent {
    /// The execution.
    pub execution_id: ExecutionId,
    /// Its tool.
    pub tool_name: String,
    /// The status before (`None` when the execution was created).
    pub from: Option<ExecutionStatus>,
    /// The status after.
    pub to: ExecutionStatus,
    /// The attempt number at that moment.
    pub attempt: u32,
    /// Wall-clock ms from the execution's creation to this move.
    pub elapsed_ms: i64,
    /// The move's reason, as text: kept inside the store and the ledger to
    /// be classified into a kind; never handed to an observer.
    pub(crate) reason: Option<String>,
}

impl Dao<'_> {
    /// Records a move for the observer, when someone observes.
    pub(super) fn observe(
        &self,
        id: &ExecutionId,
        from: Option<ExecutionStatus>,
        to: ExecutionStatus,
        attempt: u32,
        reason: Option<&str>,
        now_ms: i64,
    ) -> Result<()> {
        let Some(events) = &self.events else {
            return Ok(());
        };
        let found: Option<(String, i64)> = self
            .tx
            .prepare_cached("SELECT tool_name, created_ms FROM executions WHERE execution_id = ?1")?
            .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let (tool_name, created_ms) = found.unwrap_or_default();
        events.borrow_mut().push(MoveEvent {
            execution_id: id.clone(),
            tool_name,
            from,
            to,
            attempt,
            elapsed_ms: now_ms.saturating_sub(created_ms).max(0),
            reason: reason.map(str::to_owned),
        });
        Ok(())
    }
}
