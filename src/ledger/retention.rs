//! Retention: pruning old finished executions without forgetting that they ran.
//!
//! A ledger on a phone grows with every side-effecting call. [`Ledger::prune`]
//! deletes executions that are finished for good (`result_delivered`,
//! `rejected`, `cancelled_before_commit`, and `failed_before_commit` when not
//! retryable) and were last updated before a cutoff, together with their
//! approvals, batch items, jobs, webhook events and transition log, plus the
//! open/completed operations left empty. Nothing that needs
//! attention or may still run (`prepared`, `approved`, `executing`,
//! `outcome_unknown`, `committed` but not delivered, retryable failures) is
//! ever pruned, and an execution that a compensation still points to stays
//! until the compensation goes.
//!
//! Each pruned execution leaves a tombstone (id, args digest, final status,
//! pruned time). A very late retry of a pruned call is answered from it by
//! `begin`, never run again:
//!
//! | tombstone | same digest | `begin` answers |
//! |---|---|---|
//! | `result_delivered` | yes | `Failed { reason: "pruned: already executed (result no longer stored)" }` |
//! | `failed_before_commit` | yes | `Failed { reason: "pruned: failed before commit …" }` |
//! | `rejected` / `cancelled_before_commit` | yes | `Rejected` / `Cancelled` |
//! | any | no | `Conflict` |
//!
//! Pruning works in small transactions (no long write lock on a phone), then
//! runs `PRAGMA incremental_vacuum` and a WAL checkpoint so the file shrinks.
//!
//! ```
//! use std::time::Duration;
//! use toolledger::ledger::{Ledger, LedgerConfig};
//! # fn main() -> Result<(), toolledger::ledger::Error> {
//! # let dir = tempfile::tempdir().map_err(|e| toolledger::ledger::Error::Session(e.to_string()))?;
//! let ledger = Ledger::open(&dir.path().join("ledger.db"), LedgerConfig::default())?;
//! // Forget the details of everything finished more than 30 days ago.
//! let report = ledger.prune(Duration::from_secs(30 * 86_400), true)?;
//! assert_eq!(report.executions, 0);
//! # Ok(()) }
//! ```

use std::collections::BTreeSet;
use std::time::Duration;

use super::answers::Begin;
use super::decide::{decide, Decision, Facts};
use super::owners::Liveness;
use super::{Ledger, Result};
use crate::model::{ArgsDigest, ExecutionId, OperationId};
use crate::store::{Dao, DbSize, Durability, PruneCandidate, PrunedRows, Tombstone};

/// The reason `begin` gives for a late retry of a pruned call that ran.
pub const PRUNED_EXECUTED_REASON: &str = "pruned: already executed (result no longer stored)";

/// The reason `begin` gives for a late retry of a pruned call that failed.
pub const PRUNED_FAILED_REASON: &str = "pruned: failed before commit (reason no longer stored)";

/// Which executions are old enough to prune.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneCutoff {
    /// Last updated longer ago than this (by the ledger's clock).
    OlderThan(Duration),
    /// Last updated before this instant, ms since the Unix epoch.
    BeforeMs(i64),
}

impl From<Duration> for PruneCutoff {
    fn from(age: Duration) -> PruneCutoff {
        PruneCutoff::OlderThan(age)
    }
}

/// How to prune.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneOptions {
    /// Which executions are old enough.
    pub cutoff: PruneCutoff,
    /// Leave a tombstone per pruned execution (strongly recommended: without
    /// it a very late retry of a pruned call would run again). With `false`,
    /// no tombstone is written and tombstones written before the cutoff are
    /// deleted too: everything older than the cutoff is forgotten.
    pub keep_tombstones: bool,
    /// Executions examined per transaction.
    pub batch_size: u32,
}

impl PruneOptions {
    /// Prune with tombstones, 500 executions per transaction.
    pub fn new(cutoff: impl Into<PruneCutoff>) -> PruneOptions {
        PruneOptions {
            cutoff: cutoff.into(),
            keep_tombstones: true,
            batch_size: 500,
        }
    }
}

/// How far a prune has come: `done` of `total` candidates examined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneProgress {
    /// Candidates examined so far.
    pub done: u64,
    /// Candidates found when the prune started.
    pub total: u64,
}

/// What a prune removed and what the file looks like afterwards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// The cutoff applied, ms since the Unix epoch.
    pub cutoff_ms: i64,
    /// Executions deleted.
    pub executions: u64,
    /// Transition log entries deleted.
    pub transitions: u64,
    /// Approval decisions deleted.
    pub approvals: u64,
    /// Batch item records deleted.
    pub batch_items: u64,
    /// Background job records deleted.
    pub jobs: u64,
    /// Processed webhook events deleted.
    pub webhook_events: u64,
    /// Empty operations deleted.
    pub operations: u64,
    /// Tombstones written.
    pub tombstones_written: u64,
    /// Old tombstones deleted (`keep_tombstones: false`).
    pub tombstones_removed: u64,
    /// Prunable executions kept because a compensation still points to them.
    pub kept_for_compensations: u64,
    /// Database bytes (pages × page size) before.
    pub bytes_before: u64,
    /// Database bytes after the vacuum and checkpoint.
    pub bytes_after: u64,
}

impl PruneReport {
    fn add(&mut self, rows: PrunedRows, tombstone: bool) {
        self.executions += 1;
        self.transitions += rows.transitions;
        self.approvals += rows.approvals;
        self.batch_items += rows.batch_items;
        self.jobs += rows.jobs;
        self.webhook_events += rows.webhook_events;
        self.tombstones_written += u64::from(tombstone);
    }

    fn merge(&mut self, other: &PruneReport) {
        self.executions += other.executions;
        self.transitions += other.transitions;
        self.approvals += other.approvals;
        self.batch_items += other.batch_items;
        self.jobs += other.jobs;
        self.webhook_events += other.webhook_events;
        self.operations += other.operations;
        self.tombstones_written += other.tombstones_written;
        self.tombstones_removed += other.tombstones_removed;
    }
}

/// What `begin` answers for a call whose execution was pruned: the answer
/// table's, for a record of which only the tombstone is left.
pub(super) fn answer_for_tombstone(tomb: Tombstone, new_digest: &ArgsDigest) -> Begin {
    let facts = Facts {
        status: tomb.final_status,
        retryable: None,
        requires_approval: false,
        same_digest: &tomb.args_digest == new_digest,
        op_cancelled: false,
        has_items: false,
        pruned: true,
    };
    let execution_id = tomb.execution_id;
    match decide(&facts, || Liveness::Alive) {
        Decision::Conflict => Begin::Conflict {
            execution_id,
            stored_digest: tomb.args_digest,
            new_digest: new_digest.clone(),
        },
        Decision::Rejected => Begin::Rejected { execution_id },
        Decision::Cancelled => Begin::Cancelled { execution_id },
        Decision::Failed => Begin::Failed {
            execution_id,
            reason: PRUNED_FAILED_REASON.to_owned(),
        },
        // PrunedAfterRun, and nothing else for a tombstone.
        _ => Begin::Failed {
            execution_id,
            reason: PRUNED_EXECUTED_REASON.to_owned(),
        },
    }
}

impl Ledger {
    /// Prunes finished executions last updated longer ago than `older_than`
    /// (a [`Duration`] or a [`PruneCutoff`]), see the module docs. With
    /// `keep_tombstones` (recommended) each leaves a tombstone so a late retry
    /// is refused, never re-executed.
    ///
    /// # Errors
    /// Storage errors. Work already committed by earlier batches stays done
    /// (each batch is atomic: an execution goes together with its tombstone).
    pub fn prune(
        &self,
        older_than: impl Into<PruneCutoff>,
        keep_tombstones: bool,
    ) -> Result<PruneReport> {
        let options = PruneOptions {
            keep_tombstones,
            ..PruneOptions::new(older_than)
        };
        self.prune_with(&options, &mut |_| {})
    }

    /// [`Ledger::prune`] with every option and a progress callback, called
    /// after each batch.
    ///
    /// # Errors
    /// As [`Ledger::prune`].
    pub fn prune_with(
        &self,
        options: &PruneOptions,
        progress: &mut dyn FnMut(PruneProgress),
    ) -> Result<PruneReport> {
        let now = self.now();
        let cutoff_ms = match options.cutoff {
            PruneCutoff::BeforeMs(ms) => ms,
            PruneCutoff::OlderThan(age) => {
                now.saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
            }
        };
        let tombstone_at = options.keep_tombstones.then_some(now);
        let batch = options.batch_size.max(1);
        let (total, size_before) =
            self.read(|dao| Ok((dao.count_prunable(cutoff_ms)?, dao.size()?)))?;
        let mut report = PruneReport {
            cutoff_ms,
            bytes_before: size_before.bytes(),
            ..PruneReport::default()
        };
        let mut cursor = 0;
        let mut done = 0;
        let mut deferred: Vec<PruneCandidate> = Vec::new();
        loop {
            let (part, examined, next, held) = self.write(Durability::Lazy, |dao| {
                let candidates = dao.prune_candidates(cutoff_ms, cursor, batch)?;
                let next = candidates.last().map(|c| c.cursor);
                let mut held = Vec::new();
                let mut ready = Vec::new();
                for c in &candidates {
                    if dao.has_compensations(&c.execution_id)? {
                        held.push(c.clone());
                    } else {
                        ready.push(c);
                    }
                }
                let part = prune_batch(dao, ready, tombstone_at)?;
                Ok::<_, super::Error>((part, candidates.len() as u64, next, held))
            })?;
            report.merge(&part);
            deferred.extend(held);
            done += examined;
            progress(PruneProgress {
                done,
                total: total.max(done),
            });
            match next {
                Some(n) if examined >= u64::from(batch) => cursor = n,
                _ => break,
            }
        }
        // Originals whose compensations were pruned above can go now; newest
        // first, so a compensation of a compensation frees its original.
        if !deferred.is_empty() {
            deferred.reverse();
            let (part, kept) = self.write(Durability::Lazy, |dao| {
                let mut part = PruneReport::default();
                let mut kept = 0;
                for c in &deferred {
                    if dao.has_compensations(&c.execution_id)? {
                        kept += 1;
                    } else {
                        // One at a time, so the next original's check sees it gone.
                        part.merge(&prune_batch(dao, vec![c], tombstone_at)?);
                    }
                }
                Ok::<_, super::Error>((part, kept))
            })?;
            report.merge(&part);
            report.kept_for_compensations = kept;
        }
        let removed = self.write(Durability::Full, |dao| {
            let removed = if options.keep_tombstones {
                0
            } else {
                dao.delete_tombstones_before(cutoff_ms)?
            };
            dao.incremental_vacuum()?;
            Ok::<_, super::Error>(removed)
        })?;
        report.tombstones_removed = removed;
        // The file shrinks when the vacuumed pages are checkpointed. A busy
        // reader elsewhere only postpones that; the prune itself is done.
        match self.store.checkpoint() {
            Ok(()) | Err(crate::store::Error::Busy) => {}
            Err(e) => return Err(e.into()),
        }
        report.bytes_after = self.database_size()?.bytes();
        Ok(report)
    }

    /// The tombstone left by pruning `id`, if it was pruned.
    ///
    /// # Errors
    /// Storage errors.
    pub fn tombstone(&self, id: &ExecutionId) -> Result<Option<Tombstone>> {
        self.read(|dao| Ok(dao.tombstone(id)?))
    }

    /// Number of tombstones.
    ///
    /// # Errors
    /// Storage errors.
    pub fn tombstone_count(&self) -> Result<u64> {
        self.read(|dao| Ok(dao.tombstone_count()?))
    }

    /// Page size, page count and free pages of the database.
    ///
    /// # Errors
    /// Storage errors.
    pub fn database_size(&self) -> Result<DbSize> {
        self.read(|dao| Ok(dao.size()?))
    }

    /// Writes the queued delivery marks, then copies the WAL into the main
    /// database file and truncates it (the inspector and benchmarks measure
    /// the file after this).
    ///
    /// # Errors
    /// Storage errors, `Busy` when another connection holds a snapshot.
    pub fn checkpoint(&self) -> Result<()> {
        self.settle_deliveries()?;
        Ok(self.store.checkpoint()?)
    }
}

/// Prunes `ready` inside the open transaction, then the operations they
/// leave empty.
fn prune_batch(
    dao: &Dao<'_>,
    ready: Vec<&PruneCandidate>,
    tombstone_at: Option<i64>,
) -> Result<PruneReport> {
    let mut part = PruneReport::default();
    let mut touched: BTreeSet<&OperationId> = BTreeSet::new();
    for c in ready {
        if let Some(rows) = dao.prune_execution(&c.execution_id, tombstone_at)? {
            part.add(rows, tombstone_at.is_some());
            touched.insert(&c.operation_id);
        }
    }
    if part.executions > 0 {
        dao.clamp_attention_watermark()?;
    }
    for op in touched {
        part.operations += dao.prune_empty_operation(op)?;
    }
    Ok(part)
}
