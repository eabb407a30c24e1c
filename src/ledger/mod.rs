//! The durable state machine: begin, approve, execute, commit, deliver.
//!
//! [`Ledger`] is the core API. Every method is one transaction, and the
//! durable syncs sit exactly on the commit boundaries of DESIGN.md:
//!
//! | call | sync | why |
//! |---|---|---|
//! | [`Ledger::begin_round`] / [`Ledger::begin`] | 1 fsync for the whole round | the intent (`executing` + downstream key) is durable before any tool runs |
//! | [`Ledger::commit`] | 1 fsync | the result is durable before the model sees it |
//! | [`Ledger::record_external_id`], approvals, failures, unknown outcomes | 1 fsync each | off the happy path |
//! | [`Ledger::mark_delivered`] | none (deferred into the next write) | losing it only replays the stored result |
//! | [`Ledger::recover`] | none (lazy) | a lost `outcome_unknown` mark of a dead session's row is made again by the next `recover` |
//! | replay (`begin` of a committed call) | none | nothing is written |
//!
//! So a side-effecting happy path costs two durable syncs.
//!
//! ```
//! use toolledger::ledger::{Begin, CallSpec, Ledger, LedgerConfig};
//! use toolledger::model::{OperationId, ToolCall};
//!
//! # fn main() -> Result<(), toolledger::ledger::Error> {
//! let dir = tempfile::tempdir().map_err(|e| toolledger::ledger::Error::Session(e.to_string()))?;
//! let ledger = Ledger::open(&dir.path().join("ledger.db"), LedgerConfig::default())?;
//! let op = OperationId::new("op_77")?;
//! let call = ToolCall::custom("call_1", "send_email", r#"{"to":"a@example.com"}"#);
//! match ledger.begin(&op, 0, &CallSpec::new(call.clone(), 1))? {
//!     Begin::Execute(ticket) => {
//!         // ... send the email with ticket.downstream_key as idempotency key ...
//!         ledger.commit(&ticket.execution_id, r#"{"sent":true}"#, Some("msg_1"))?;
//!     }
//!     other => panic!("unexpected {other:?}"),
//! }
//! // Asked again (a retry, a restart): the stored result, nothing runs.
//! let again = ledger.begin(&op, 0, &CallSpec::new(call, 1))?;
//! assert!(matches!(again, Begin::Replay(r) if r.result_json == r#"{"sent":true}"#));
//! # Ok(()) }
//! ```

mod answers;
mod begin;
mod clock;
mod error;
mod jobs;
mod retention;
mod session;
mod steps;

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use answers::{
    ApprovalRequest, Begin, CallSpec, CancelOutcome, Resolution, Resolved, StoredResult, Ticket,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Error, Result};
pub use jobs::{JobApplied, JobUpdate};
pub use retention::{
    PruneCutoff, PruneOptions, PruneProgress, PruneReport, PRUNED_EXECUTED_REASON,
    PRUNED_FAILED_REASON,
};

use crate::model::{
    ExecutionId, ExecutionRecord, ExecutionStatus, JsonLimits, OperationId, SessionId, Transition,
};
use crate::store::{Durability, StatusFields, Store, StoreOptions};
use session::Sessions;

/// How a ledger behaves.
#[derive(Debug, Clone)]
pub struct LedgerConfig {
    /// How long an `executing` row stays owned without renewal. After that a
    /// `begin` or `recover` treats the outcome as unknown.
    pub lease: Duration,
    /// Bounds on argument JSON (and on stored results).
    pub json_limits: JsonLimits,
    /// How long a write waits for another process's lock.
    pub busy_timeout: Duration,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            lease: Duration::from_secs(60),
            json_limits: JsonLimits::default(),
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// The durable execution ledger. `Send + Sync`: share it with an `Arc`.
#[derive(Debug)]
pub struct Ledger {
    store: Store,
    clock: Arc<dyn Clock>,
    sessions: Sessions,
    config: LedgerConfig,
    /// Delivery marks checked by `mark_delivered` and not yet written, and
    /// the executions this ledger committed last (see [`Ledger::write`]).
    deliveries: Mutex<Deliveries>,
    /// Calls begun since this ledger last swept the attention flags.
    begun_since_sweep: AtomicU32,
}

/// A `begin` sweeps the attention flags (see `Dao::sweep_attention`) once
/// this many calls were begun through the ledger since its last sweep, so
/// `recover()` never reads more than a few hundred unflagged rows per
/// process.
const SWEEP_EVERY: u32 = 256;

/// The delivery bookkeeping of one ledger.
#[derive(Debug, Default)]
struct Deliveries {
    /// Checked marks waiting for the next write.
    queued: Vec<DeliveryMark>,
    /// The last executions committed through this ledger (committed is
    /// final but for delivery), so `mark_delivered` right after a commit
    /// needs no read to check them. Bounded by [`RECENT_COMMITS`].
    recent_commits: std::collections::VecDeque<DeliveryMark>,
}

/// One checked, not yet written `committed -> result_delivered` mark.
#[derive(Debug, Clone)]
struct DeliveryMark {
    execution_id: ExecutionId,
    /// The execution's attempt count (final once committed), for the log.
    attempt: u32,
    /// When `mark_delivered` was called: the row's update time and the log
    /// entry's time, however late the mark is written.
    at_ms: i64,
}

/// Queued marks past this many are written at once (one lazy write) rather
/// than waiting for the next write.
const MAX_QUEUED_DELIVERIES: usize = 256;

/// How many recent commits `mark_delivered` can check without a read.
const RECENT_COMMITS: usize = 64;

impl Ledger {
    /// Opens (creating if needed) the ledger database at `path` with the
    /// system clock.
    ///
    /// # Errors
    /// Storage errors: a file that is not a database or is corrupt, a newer
    /// schema, a read-only or unopenable path, a lock held past the timeout.
    pub fn open(path: &Path, config: LedgerConfig) -> Result<Ledger> {
        Ledger::open_with_clock(path, config, Arc::new(SystemClock))
    }

    /// Opens the ledger at `path` with an injected clock.
    ///
    /// # Errors
    /// As [`Ledger::open`].
    pub fn open_with_clock(
        path: &Path,
        config: LedgerConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Ledger> {
        let store = Store::open(
            path,
            StoreOptions {
                busy_timeout: config.busy_timeout,
            },
        )?;
        Ledger::with_store(store, config, clock)
    }

    /// A private in-memory ledger (tests and ephemeral harnesses).
    ///
    /// # Errors
    /// Storage errors.
    pub fn open_in_memory(config: LedgerConfig, clock: Arc<dyn Clock>) -> Result<Ledger> {
        Ledger::with_store(Store::open_in_memory()?, config, clock)
    }

    fn with_store(store: Store, config: LedgerConfig, clock: Arc<dyn Clock>) -> Result<Ledger> {
        let sessions = Sessions::start(store.path(), SessionId::generate())
            .map_err(|e| Error::Session(e.kind().to_string()))?;
        Ok(Ledger {
            store,
            clock,
            sessions,
            config,
            deliveries: Mutex::new(Deliveries::default()),
            begun_since_sweep: AtomicU32::new(0),
        })
    }

    /// This ledger's session id (the owner written on `executing` rows).
    pub fn session_id(&self) -> &SessionId {
        self.sessions.own()
    }

    /// The configuration in force.
    pub fn config(&self) -> &LedgerConfig {
        &self.config
    }

    /// The clock in use.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    fn lease_deadline(&self, now: i64) -> i64 {
        now.saturating_add(i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX))
    }

    /// Reads one execution.
    ///
    /// # Errors
    /// Storage errors.
    pub fn get(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>> {
        self.settle_deliveries()?;
        self.store.read(|dao| Ok(dao.execution(id)?))
    }

    /// Every execution of an operation, in round and position order.
    ///
    /// # Errors
    /// Storage errors.
    pub fn list(&self, op: &OperationId) -> Result<Vec<ExecutionRecord>> {
        self.settle_deliveries()?;
        self.store.read(|dao| Ok(dao.executions_of(op)?))
    }

    /// The status of an operation, if it exists.
    ///
    /// # Errors
    /// Storage errors.
    pub fn operation_status(
        &self,
        op: &OperationId,
    ) -> Result<Option<crate::model::OperationStatus>> {
        self.store.read(|dao| Ok(dao.operation_status(op)?))
    }

    /// The compensations recorded for `original`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn compensations(&self, original: &ExecutionId) -> Result<Vec<ExecutionRecord>> {
        self.settle_deliveries()?;
        self.store.read(|dao| Ok(dao.compensations_of(original)?))
    }

    /// Call at app start and after resume. Turns `executing` rows whose owner
    /// session is dead (or whose lease expired) into `outcome_unknown`, and
    /// returns every execution that needs attention: unknown outcomes,
    /// approvals pending, approved or retryable work, live in-flight rows and
    /// committed results not yet delivered to the model. One write, lazy (no
    /// sync): an `outcome_unknown` mark lost to a power cut only means the
    /// next `recover` marks the same rows again, and any later durable write
    /// (every step that follows a `Reconcile` is one) makes it durable first.
    /// The scan reads the flagged rows (a partial index) and the few rows
    /// begun since the last sweep (a row-id range), which it sweeps first, so
    /// its cost does not grow with history.
    ///
    /// # Errors
    /// Storage errors.
    pub fn recover(&self) -> Result<Vec<ExecutionRecord>> {
        Ok(self.recover_marking()?.0)
    }

    /// [`Ledger::recover`], also saying which executions it turned into
    /// `outcome_unknown` (the executor counts them in its metrics).
    pub(crate) fn recover_marking(&self) -> Result<(Vec<ExecutionRecord>, Vec<ExecutionId>)> {
        let now = self.now();
        self.write(Durability::Lazy, |dao| {
            dao.sweep_attention(0)?;
            let mut pending = dao.executions_needing_attention()?;
            let mut marked = Vec::new();
            for rec in pending.iter_mut() {
                if rec.status == ExecutionStatus::Executing && !self.owner_is_live(rec, now) {
                    let reason = self.abandon_reason(rec, now);
                    let moved = dao.move_status(
                        &rec.execution_id,
                        ExecutionStatus::Executing,
                        Transition::MarkUnknown,
                        ExecutionStatus::OutcomeUnknown,
                        &StatusFields {
                            reason: Some(reason),
                            ..StatusFields::default()
                        },
                        self.session_id(),
                        now,
                    )?;
                    if moved {
                        rec.status = ExecutionStatus::OutcomeUnknown;
                        rec.owner_session = None;
                        rec.lease_deadline_ms = None;
                        rec.last_reason = Some(reason.to_owned());
                        marked.push(rec.execution_id.clone());
                    }
                }
            }
            Ok((pending, marked))
        })
    }

    /// True when the owner of an `executing` row is alive and its lease holds.
    fn owner_is_live(&self, rec: &ExecutionRecord, now: i64) -> bool {
        let lease_ok = rec.lease_deadline_ms.is_some_and(|d| d > now);
        let alive = rec
            .owner_session
            .as_ref()
            .is_some_and(|s| self.sessions.is_alive(s));
        lease_ok && alive
    }

    fn abandon_reason(&self, rec: &ExecutionRecord, now: i64) -> &'static str {
        if rec.lease_deadline_ms.is_some_and(|d| d <= now) {
            "lease expired while executing"
        } else {
            "owner session died while executing"
        }
    }

    /// Checkpoints the WAL and closes the database so no file lock is held
    /// while the app is suspended (iOS 0xdead10cc). Calls fail with
    /// `Suspended` until [`Ledger::resume`].
    ///
    /// # Errors
    /// Storage errors from the checkpoint.
    pub fn suspend(&self) -> Result<()> {
        self.settle_deliveries()?;
        self.store.suspend()?;
        self.sessions.release();
        Ok(())
    }

    /// Reopens after [`Ledger::suspend`] and runs [`Ledger::recover`].
    ///
    /// # Errors
    /// The errors of opening and of `recover`.
    pub fn resume(&self) -> Result<Vec<ExecutionRecord>> {
        self.sessions
            .acquire()
            .map_err(|e| Error::Session(e.kind().to_string()))?;
        self.store.resume()?;
        self.recover()
    }

    /// Operations with their status, newest first, at most `limit`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn operations(
        &self,
        limit: u32,
    ) -> Result<Vec<(OperationId, crate::model::OperationStatus)>> {
        self.store.read(|dao| Ok(dao.operations(limit)?))
    }

    /// The transition log of one execution, oldest first.
    ///
    /// # Errors
    /// Storage errors.
    pub fn transitions(&self, id: &ExecutionId) -> Result<Vec<crate::model::TransitionEntry>> {
        self.settle_deliveries()?;
        self.store.read(|dao| Ok(dao.transitions_of(id)?))
    }

    /// Counts for the inspector.
    ///
    /// # Errors
    /// Storage errors.
    pub fn stats(&self) -> Result<crate::store::StoreStats> {
        self.settle_deliveries()?;
        self.store.read(|dao| Ok(dao.stats()?))
    }
}

impl Ledger {
    /// Every write of the ledger goes through here: it first applies the
    /// queued delivery marks inside the same transaction (so they cost no
    /// sync of their own and become durable with it), then runs `f`. If the
    /// transaction fails the marks are queued again.
    fn write<T>(
        &self,
        durability: Durability,
        f: impl FnOnce(&crate::store::Dao<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut taken: Vec<DeliveryMark> = Vec::new();
        let out = self.store.write(durability, |dao| {
            // Taken under the store's lock: no other write applies them too.
            taken = std::mem::take(&mut self.deliveries_lock().queued);
            for mark in &taken {
                // A row no longer `committed` (delivered meanwhile by another
                // process) is left alone: the guarded move reports false.
                dao.move_status(
                    &mark.execution_id,
                    ExecutionStatus::Committed,
                    Transition::Deliver,
                    ExecutionStatus::ResultDelivered,
                    &StatusFields {
                        attempt: Some(mark.attempt),
                        ..StatusFields::default()
                    },
                    self.session_id(),
                    mark.at_ms,
                )?;
            }
            f(dao)
        });
        if out.is_err() && !taken.is_empty() {
            self.deliveries_lock().queued.append(&mut taken);
        }
        out
    }

    fn deliveries_lock(&self) -> MutexGuard<'_, Deliveries> {
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
    fn remember_commit(&self, execution_id: &ExecutionId, attempt: u32) {
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

    /// Counts `calls` begun; true when the caller's transaction should sweep
    /// the attention flags (and the count starts again).
    fn sweep_due(&self, calls: usize) -> bool {
        let calls = u32::try_from(calls).unwrap_or(u32::MAX);
        let before = self.begun_since_sweep.fetch_add(calls, Ordering::Relaxed);
        if before.saturating_add(calls) >= SWEEP_EVERY {
            self.begun_since_sweep.store(0, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Writes the queued delivery marks now (one lazy write), if any.
    fn settle_deliveries(&self) -> Result<()> {
        if self.deliveries_lock().queued.is_empty() {
            return Ok(());
        }
        self.write(Durability::Lazy, |_| Ok(()))
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        // Best effort: a mark lost here only replays a stored result.
        let _ = self.settle_deliveries();
    }
}
