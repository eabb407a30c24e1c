//! Delivery marks: `committed → result_delivered`, written lazily, and the
//! one read path that accounts for them.
//!
//! `mark_delivered` checks its ids at once but writes nothing: the marks are
//! queued and the next write transaction of this ledger applies them first
//! (no sync of their own). A mark lost with the process only replays the
//! stored result, which docs/design.md allows.
//!
//! Reads never write. Every read of the ledger goes through
//! [`Ledger::read`], which requires the value read to implement [`Settle`]:
//! the queued marks are laid over what the database says (a `committed`
//! record with a queued mark reads as `result_delivered`), so no read can
//! report a stale status, and none needs the write lock, a free disk or a
//! writable file.

use std::collections::VecDeque;
use std::sync::{Arc, MutexGuard};

use super::{Error, Ledger, Result};
use crate::model::{
    ExecutionId, ExecutionRecord, ExecutionStatus, Move, OperationStatus, Transition,
    TransitionEntry,
};
use crate::store::{Dao, Durability, Store, StoreStats};

/// The ledger's store. Its transactions are reachable only from this module,
/// through [`Ledger::read`] (which settles the queued marks into what it
/// reads) and [`Ledger::write`] (which writes them first): no other part of
/// the ledger can read around the queue.
#[derive(Debug)]
pub(super) struct GuardedStore(Arc<Store>);

impl GuardedStore {
    pub(super) fn new(store: Store) -> GuardedStore {
        GuardedStore(Arc::new(store))
    }

    /// Keeps the store from ever being dropped (a forked child's copy of
    /// the parent's connection: see `Ledger::drop`).
    pub(super) fn leak(&self) {
        std::mem::forget(Arc::clone(&self.0));
    }

    /// See `Store::sync`.
    pub(super) fn sync(&self) -> crate::store::Result<()> {
        self.0.sync()
    }

    /// See `Store::sync_deferred`.
    pub(super) fn sync_deferred(&self) -> crate::store::Result<bool> {
        self.0.sync_deferred()
    }

    /// See `Store::has_unsynced`.
    pub(super) fn has_unsynced(&self) -> bool {
        self.0.has_unsynced()
    }

    /// The database file's resolved path (`None` in memory).
    pub(super) fn path(&self) -> Option<&std::path::Path> {
        self.0.path()
    }

    /// See `Store::is_suspended`.
    pub(super) fn is_suspended(&self) -> bool {
        self.0.is_suspended()
    }

    /// See `Store::suspend`.
    pub(super) fn suspend(&self) -> crate::store::Result<()> {
        self.0.suspend()
    }

    /// See `Store::resume`.
    pub(super) fn resume(&self) -> crate::store::Result<()> {
        self.0.resume()
    }

    /// See `Store::kill`.
    pub(super) fn kill(&self) {
        self.0.kill();
    }

    /// See `Store::checkpoint`.
    pub(super) fn checkpoint(&self) -> crate::store::Result<()> {
        self.0.checkpoint()
    }

    /// See `Store::is_encrypted`.
    pub(super) fn is_encrypted(&self) -> bool {
        self.0.is_encrypted()
    }

    /// See `Store::reseal`.
    pub(super) fn reseal(&self, key: &crate::store::LedgerKey) -> crate::store::Result<()> {
        self.0.reseal(key)
    }

    /// See `Store::set_sink`.
    pub(super) fn set_sink(
        &self,
        sink: Option<std::sync::Arc<dyn crate::store::EventSink>>,
    ) -> crate::store::Result<()> {
        self.0.set_sink(sink)
    }

    /// See `Store::stored_digest`.
    pub(super) fn stored_digest(
        &self,
        plain: crate::model::ArgsDigest,
    ) -> crate::store::Result<crate::model::ArgsDigest> {
        self.0.stored_digest(plain)
    }
}

/// The delivery bookkeeping of one ledger.
#[derive(Debug, Default)]
pub(super) struct Deliveries {
    /// Checked marks waiting for the next write.
    queued: Vec<DeliveryMark>,
    /// The last executions committed through this ledger (committed is
    /// final but for delivery), so `mark_delivered` right after a commit
    /// needs no read to check them. Bounded by [`RECENT_COMMITS`].
    recent_commits: VecDeque<DeliveryMark>,
}

/// One checked, not yet written `committed -> result_delivered` mark.
#[derive(Debug, Clone)]
pub(super) struct DeliveryMark {
    pub(super) execution_id: ExecutionId,
    /// The execution's attempt count (final once committed), for the log.
    pub(super) attempt: u32,
    /// When `mark_delivered` was called: the row's update time and the log
    /// entry's time, however late the mark is written.
    pub(super) at_ms: i64,
}

/// Queued marks past this many are written at once (one lazy write) rather
/// than waiting for the next write.
const MAX_QUEUED_DELIVERIES: usize = 256;

/// How many recent commits `mark_delivered` can check without a read.
const RECENT_COMMITS: usize = 64;

/// The marks queued when a read began.
pub(crate) struct Pending<'a> {
    marks: &'a [DeliveryMark],
}

impl Pending<'_> {
    fn mark(&self, id: &ExecutionId) -> Option<&DeliveryMark> {
        self.marks.iter().rev().find(|m| &m.execution_id == id)
    }
}

/// A value read from the ledger, brought up to date with the delivery marks
/// queued but not yet written.
pub(crate) trait Settle: Sized {
    /// Lays the queued marks over `self` (`dao` is the read's transaction).
    ///
    /// # Errors
    /// Storage errors.
    fn settle(self, pending: &Pending<'_>, dao: &Dao<'_>) -> Result<Self>;
}

impl Settle for ExecutionRecord {
    fn settle(mut self, pending: &Pending<'_>, _dao: &Dao<'_>) -> Result<Self> {
        if self.status == ExecutionStatus::Committed {
            if let Some(mark) = pending.mark(&self.execution_id) {
                self.status = ExecutionStatus::ResultDelivered;
                self.updated_ms = mark.at_ms;
            }
        }
        Ok(self)
    }
}

impl<T: Settle> Settle for Option<T> {
    fn settle(self, pending: &Pending<'_>, dao: &Dao<'_>) -> Result<Self> {
        self.map(|v| v.settle(pending, dao)).transpose()
    }
}

impl<T: Settle> Settle for Vec<T> {
    fn settle(self, pending: &Pending<'_>, dao: &Dao<'_>) -> Result<Self> {
        self.into_iter().map(|v| v.settle(pending, dao)).collect()
    }
}

/// One execution's transition log, as read.
pub(crate) struct History {
    pub(crate) id: ExecutionId,
    pub(crate) entries: Vec<TransitionEntry>,
}

impl Settle for History {
    fn settle(mut self, pending: &Pending<'_>, _dao: &Dao<'_>) -> Result<Self> {
        let last = self.entries.last().map(|e| e.to);
        if let (Some(ExecutionStatus::Committed), Some(mark)) = (last, pending.mark(&self.id)) {
            self.entries.push(TransitionEntry {
                from: Some(ExecutionStatus::Committed),
                to: ExecutionStatus::ResultDelivered,
                transition: Transition::Deliver.as_str().to_owned(),
                attempt: mark.attempt,
                reason: None,
                at_ms: mark.at_ms,
            });
        }
        Ok(self)
    }
}

impl Settle for StoreStats {
    fn settle(mut self, pending: &Pending<'_>, dao: &Dao<'_>) -> Result<Self> {
        let mut moved = 0u64;
        let mut seen: Vec<&ExecutionId> = Vec::new();
        for mark in pending.marks {
            if seen.contains(&&mark.execution_id) {
                continue;
            }
            seen.push(&mark.execution_id);
            if let Some((ExecutionStatus::Committed, _)) =
                dao.status_and_attempt(&mark.execution_id)?
            {
                moved += 1;
            }
        }
        if moved > 0 {
            let mut bump = |name: &str, delta: i64| match self
                .executions_by_status
                .iter_mut()
                .find(|(n, _)| n == name)
            {
                Some((_, count)) => *count = count.saturating_add_signed(delta),
                None => self
                    .executions_by_status
                    .push((name.to_owned(), u64::try_from(delta).unwrap_or(0))),
            };
            let moved = i64::try_from(moved).unwrap_or(i64::MAX);
            bump(ExecutionStatus::Committed.as_str(), -moved);
            bump(ExecutionStatus::ResultDelivered.as_str(), moved);
            self.executions_by_status.retain(|(_, n)| *n > 0);
            self.executions_by_status.sort();
            self.transitions = self.transitions.saturating_add(moved.unsigned_abs());
        }
        Ok(self)
    }
}

impl Settle for DeliveryMark {
    fn settle(self, _: &Pending<'_>, _: &Dao<'_>) -> Result<Self> {
        Ok(self)
    }
}

/// Marks about to be queued: those already queued are left out.
pub(super) struct NewMarks(pub(super) Vec<DeliveryMark>);

impl Settle for NewMarks {
    fn settle(mut self, pending: &Pending<'_>, _: &Dao<'_>) -> Result<Self> {
        self.0.retain(|m| pending.mark(&m.execution_id).is_none());
        Ok(self)
    }
}

/// Values that report no execution status: read as they are.
macro_rules! settled_as_is {
    ($($t:ty),* $(,)?) => {
        $(impl Settle for $t {
            fn settle(self, _: &Pending<'_>, _: &Dao<'_>) -> Result<Self> {
                Ok(self)
            }
        })*
    };
}

settled_as_is!(
    bool,
    u64,
    String,
    OperationStatus,
    crate::store::Tombstone,
    crate::store::DbSize,
    crate::model::EvidenceEntry,
    (ExecutionStatus, u32),
    (u32, String, Option<String>),
    (crate::model::OperationId, OperationStatus),
    // A replay answer carries the stored result, which delivery never
    // changes.
    super::answers::Begin,
);

impl<A: Settle, B: Settle> Settle for (A, B) {
    fn settle(self, pending: &Pending<'_>, dao: &Dao<'_>) -> Result<Self> {
        Ok((self.0.settle(pending, dao)?, self.1.settle(pending, dao)?))
    }
}

impl Ledger {
    /// Every read of the ledger: a deferred transaction (no write lock) whose
    /// answer is brought up to date with the queued delivery marks.
    pub(super) fn read<T: Settle>(&self, f: impl FnOnce(&Dao<'_>) -> Result<T>) -> Result<T> {
        let marks = self.deliveries_lock().queued.clone();
        let pending = Pending { marks: &marks };
        self.store
            .0
            .read(|dao| f(dao)?.settle(&pending, dao))
            .map_err(|e| self.explain_sealed(e))
    }

    /// A plain session reading or writing a file that another session
    /// encrypted since it opened meets sealed values (`Undecryptable`) or the
    /// encrypted file's refusal of a clear value (`Guard`): the truth is that
    /// a key is needed now ([`crate::store::Error::KeyRequired`]), not that
    /// the values were tampered with.
    fn explain_sealed(&self, e: super::Error) -> super::Error {
        use crate::store::Error as S;
        let sealed = match &e {
            super::Error::Store(S::Undecryptable) => true,
            super::Error::Store(S::Guard(message)) => message.contains("came in the clear"),
            _ => false,
        };
        if sealed && !self.store.0.is_encrypted() && self.store.0.encrypted_on_disk() {
            super::Error::Store(S::KeyRequired)
        } else {
            e
        }
    }

    /// [`Ledger::read`] only if it can run at once (`Store::read_now`):
    /// `Ok(None)` when the store's connection is held by another call (a
    /// commit's fsync, the deferred-commit flush, a write waiting for
    /// another connection) or SQLite would make the read wait. The delivery
    /// queue's lock is taken as `read` takes it (it is only ever held to
    /// move marks in memory, never across I/O).
    /// `f` returns its storage errors apart (the outer `Result`: a busy
    /// one is the `None`) from the ledger's own.
    pub(super) fn read_now<T: Settle>(
        &self,
        f: impl FnOnce(&Dao<'_>) -> crate::store::Result<Result<T>>,
    ) -> Result<Option<T>> {
        let marks = self.deliveries_lock().queued.clone();
        let pending = Pending { marks: &marks };
        self.store
            .0
            .read_now(|dao| Ok(f(dao)?.and_then(|t| t.settle(&pending, dao))))
            .map_err(|e| self.explain_sealed(e))
    }

    /// Every write of the ledger goes through here: it first applies the
    /// queued delivery marks inside the same transaction (so they cost no
    /// sync of their own and become durable with it), then runs `f`. If the
    /// transaction fails the marks are queued again.
    pub(super) fn write<T>(
        &self,
        durability: Durability,
        f: impl FnOnce(&Dao<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut taken: Vec<DeliveryMark> = Vec::new();
        let mut registering = false;
        self.flusher.note_write(&self.store.0);
        let out = self.store.0.write(durability, |dao| {
            registering = self.register_in(dao)?;
            // Taken under the store's lock: no other write applies them too.
            taken = std::mem::take(&mut self.deliveries_lock().queued);
            self.apply_marks(dao, &taken)?;
            f(dao)
        });
        if out.is_err() && !taken.is_empty() {
            self.deliveries_lock().queued.append(&mut taken);
        }
        if out.is_ok() && registering {
            self.note_registered();
        }
        if out.is_ok() && durability == Durability::Deferred {
            self.flusher.arm(&self.store.0);
        }
        out.map_err(|e| self.explain_sealed(e))
    }

    /// A write that happens only if the write lock is free at once
    /// (`Ok(None)` otherwise: the caller takes a path that needs none), and
    /// that writes the queued delivery marks only if `f` wrote something:
    /// when `f` only answered from what is stored, nothing is written and
    /// nothing synced.
    pub(super) fn write_now<T>(
        &self,
        durability: Durability,
        f: impl FnOnce(&Dao<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        let mut taken: Vec<DeliveryMark> = Vec::new();
        let mut wrote = false;
        let mut registering = false;
        self.flusher.note_write(&self.store.0);
        let out = self.store.0.write_now(durability, |dao| {
            let before = dao.total_changes();
            let out = f(dao)?;
            wrote = dao.total_changes() != before;
            if wrote {
                // Only a transaction that writes registers (a replay on a
                // full disk still answers).
                registering = self.register_in(dao)?;
                taken = std::mem::take(&mut self.deliveries_lock().queued);
                self.apply_marks(dao, &taken)?;
            }
            Ok((out, wrote))
        });
        if out.is_err() && !taken.is_empty() {
            self.deliveries_lock().queued.append(&mut taken);
        }
        if wrote && matches!(out, Ok(Some(_))) && durability == Durability::Deferred {
            self.flusher.arm(&self.store.0);
        }
        if registering && matches!(out, Ok(Some(_))) {
            self.note_registered();
        }
        out.map_err(|e| self.explain_sealed(e))
    }

    /// Writes checked delivery marks inside the caller's transaction.
    fn apply_marks(&self, dao: &Dao<'_>, marks: &[DeliveryMark]) -> Result<()> {
        let deliver = Move::check(ExecutionStatus::Committed, Transition::Deliver)
            .map_err(|_| Error::Internal("deliver is not in the transition table"))?;
        for mark in marks {
            // A row no longer `committed` (delivered meanwhile by another
            // process) is left alone: the guarded move reports false.
            dao.deliver(
                &mark.execution_id,
                deliver,
                mark.attempt,
                self.session_id(),
                mark.at_ms,
            )?;
        }
        Ok(())
    }

    pub(super) fn deliveries_lock(&self) -> MutexGuard<'_, Deliveries> {
        // The queue holds plain data: a panic elsewhere cannot leave it torn.
        self.deliveries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn queue_deliveries(&self, marks: Vec<DeliveryMark>) -> Result<()> {
        let queued = {
            let mut d = self.deliveries_lock();
            d.queued.extend(marks);
            d.queued.len()
        };
        if queued > MAX_QUEUED_DELIVERIES {
            self.settle_deliveries()?;
        }
        Ok(())
    }

    /// Remembers a commit made through this ledger (see [`Deliveries`]).
    pub(super) fn remember_commit(&self, execution_id: &ExecutionId, attempt: u32) {
        let mut d = self.deliveries_lock();
        if d.recent_commits.len() == RECENT_COMMITS {
            d.recent_commits.pop_front();
        }
        d.recent_commits.push_back(DeliveryMark {
            execution_id: execution_id.clone(),
            attempt,
            at_ms: 0,
        });
    }

    /// The marks for `ids` that recent commits already vouch for, or `None`
    /// when some id must be checked by a read.
    fn marks_from_recent_commits(
        &self,
        ids: &[ExecutionId],
        now: i64,
    ) -> Option<Vec<DeliveryMark>> {
        let d = self.deliveries_lock();
        ids.iter()
            .map(|id| {
                d.recent_commits
                    .iter()
                    .rev()
                    .find(|m| m.execution_id == *id)
                    .map(|m| DeliveryMark {
                        at_ms: now,
                        ..m.clone()
                    })
            })
            .collect()
    }

    /// Writes the queued delivery marks now (one lazy write), if any.
    pub(super) fn settle_deliveries(&self) -> Result<()> {
        if self.deliveries_lock().queued.is_empty() {
            return Ok(());
        }
        self.write(Durability::Lazy, |_| Ok(()))
    }

    /// Marks results as handed to the model. Lazy: the marks are checked
    /// now (one read) and written with the next write of this ledger — the
    /// next `begin` or `commit` carries them in its own transaction, at no
    /// extra sync —, or by [`Ledger::suspend`], [`Ledger::checkpoint`] or
    /// when the ledger is dropped. Reads already report them. Losing them
    /// (the process dies first) only replays the stored result.
    /// Already-delivered ids are skipped.
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] for an id that has not committed (nothing
    /// of the batch is marked then), [`Error::NotFound`].
    pub fn mark_delivered(&self, ids: &[ExecutionId]) -> Result<()> {
        // Results committed through this ledger a moment ago (the usual
        // case) are known to be committed or delivered: no read needed.
        let now = self.now();
        if let Some(marks) = self.marks_from_recent_commits(ids, now) {
            return self.queue_deliveries(marks);
        }
        let marks = self.read(|dao| {
            let mut marks = Vec::with_capacity(ids.len());
            for id in ids {
                let (status, attempt) = dao
                    .status_and_attempt(id)?
                    .ok_or_else(|| Error::NotFound(id.clone()))?;
                if status != ExecutionStatus::ResultDelivered {
                    crate::model::check_transition(status, Transition::Deliver)
                        .map_err(|e| Error::transition(id, e))?;
                    marks.push(DeliveryMark {
                        execution_id: id.clone(),
                        attempt,
                        at_ms: now,
                    });
                }
            }
            Ok(NewMarks(marks))
        })?;
        self.queue_deliveries(marks.0)
    }
}
