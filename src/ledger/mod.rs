//! The durable state machine: begin, approve, execute, commit, deliver.
//!
//! [`Ledger`] is the core API. Every method is one transaction, and the
//! durable syncs sit exactly on the commit boundaries of docs/design.md:
//!
//! | call | sync | why |
//! |---|---|---|
//! | [`Ledger::begin_round`] / [`Ledger::begin`] | 1 fsync for the whole round | the intent (`executing` + downstream key) is durable before any tool runs |
//! | [`Ledger::commit`] of a call whose downstream dedupes by a long-lived key or can be looked up | none now; durable by the next durable write, `suspend()`, [`Ledger::sync`] or within [`DeferredCommits::deadline`] | a commit lost to a power cut is reconciled without a second effect |
//! | [`Ledger::commit`] of any other call | 1 fsync | the result is durable before the model sees it |
//! | [`Ledger::record_external_id`], approvals, failures, unknown outcomes | 1 fsync each | off the happy path |
//! | [`Ledger::mark_delivered`] | none (deferred into the next write) | losing it only replays the stored result |
//! | [`Ledger::recover`] | none (lazy) | a lost `outcome_unknown` mark of a dead session's row is made again by the next `recover` |
//! | replay (`begin` of a committed call) | none | nothing is written |
//!
//! So a side-effecting happy path costs one durable sync when its downstream
//! dedupes or can be looked up ([`CallSpec::downstream`]), two otherwise (the
//! policy is in [`durability`] and docs/design.md).
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
//!         ledger.commit(&ticket.attempt_id(), r#"{"sent":true}"#, Some("msg_1"))?;
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
mod decide;
mod deliveries;
pub mod durability;
mod error;
mod flusher;
mod inspect;
mod jobs;
mod owners;
mod privacy;
mod process;
mod retention;
mod session;
mod steps;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use answers::{
    ApprovalRequest, AttemptId, Begin, CallSpec, CancelOutcome, Resolution, Resolved, StoredResult,
    Ticket,
};
pub use clock::{Clock, ManualClock, Monotonic, SystemClock};
pub use decide::NextStep;
pub use durability::{
    CommitSync, DeferredCommits, Downstream, IdleCheckpoint, DEFAULT_DEFERRED_DEADLINE,
};
pub use error::{Error, Result};
pub use inspect::{Inspector, OperationView, PageCursor, Summary};
pub use jobs::{JobApplied, JobUpdate};
pub use privacy::{LedgerEvent, LedgerKey, LedgerObserver, ReasonKind};
pub use retention::{
    PruneCutoff, PruneOptions, PruneProgress, PruneReport, PRUNED_EXECUTED_REASON,
    PRUNED_FAILED_REASON,
};

/// Why the storage layer refused (carried by [`Error::Store`]).
pub use crate::store::Error as StorageError;
/// Files beside a ledger (exports, copies) are created for the owner only:
/// 0600 files, 0700 directories, whatever the umask.
pub use crate::store::{private_dir, private_file};
pub use crate::store::{DbSize, StoreStats};

/// The schema version this library writes (`PRAGMA user_version`). A file
/// with a higher one is refused (`StorageError::IncompatibleVersion`), a
/// lower one is migrated by [`Ledger::open`].
pub const SCHEMA_VERSION: i64 = crate::store::schema::CURRENT_VERSION;

use crate::model::{
    EvidenceEntry, ExecutionId, ExecutionRecord, ExecutionStatus, JsonLimits, OperationId,
    SessionId,
};
use crate::store::{Durability, Fence, StatusFields, Store};
use deliveries::{Deliveries, GuardedStore, History};
use flusher::Flusher;
use owners::Liveness;
use session::Sessions;

/// How a ledger behaves.
#[derive(Debug, Clone)]
pub struct LedgerConfig {
    /// How long a suspended session stays the owner of the calls it was
    /// running whatever becomes of its process, measured on the boot clock
    /// from `suspend()`. While it lasts, other sessions answer `InFlight`
    /// for them; after it, they stay `InFlight` while the session's process
    /// may still run it (a frozen app can be thawed and send), and count as
    /// abandoned and are reconciled once that process is gone. A running
    /// (not suspended) session is owner for as long as it lives, however
    /// long a call takes.
    pub lease: Duration,
    /// Bounds on argument JSON (and on stored results).
    pub json_limits: JsonLimits,
    /// How long a write waits for another process's lock.
    pub busy_timeout: Duration,
    /// Which commits may become durable after they return, and how soon
    /// (the durability policy, [`durability`]).
    pub deferred_commits: DeferredCommits,
    /// The SQLite VFS to open the file through, by its registered name
    /// (`None`: SQLite's default for the platform). For storage simulations
    /// (tests/power_loss) and platforms that bring their own.
    pub sqlite_vfs: Option<String>,
    /// When the write-ahead log is checkpointed by a background thread
    /// instead of inside a call's commit ([`IdleCheckpoint`]).
    pub idle_checkpoint: IdleCheckpoint,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            lease: Duration::from_secs(60),
            json_limits: JsonLimits::default(),
            busy_timeout: Duration::from_secs(5),
            deferred_commits: DeferredCommits::default(),
            sqlite_vfs: None,
            idle_checkpoint: IdleCheckpoint::default(),
        }
    }
}

/// The durable execution ledger. `Send + Sync`: share it with an `Arc`.
#[derive(Debug)]
pub struct Ledger {
    store: GuardedStore,
    clock: Arc<dyn Clock>,
    sessions: Sessions,
    config: LedgerConfig,
    /// Delivery marks checked by `mark_delivered` and not yet written, and
    /// the executions this ledger committed last (see `deliveries`).
    deliveries: Mutex<Deliveries>,
    /// Calls begun since this ledger last swept the attention flags.
    begun_since_sweep: AtomicU32,
    /// True once this session's row is in the `sessions` table.
    registered: AtomicBool,
    /// Held for the whole of a `suspend()` and of `resume()`'s reopening:
    /// one at a time, so that a resume cannot take the lock while a
    /// suspend still holds it (and then lose it to that suspend's release),
    /// nor clear a suspension mark that the suspend then closes under.
    lifecycle: Mutex<()>,
    /// The thread inside `suspend()` or `resume()` (holding `lifecycle`):
    /// an observer it calls (the events of their writes) that calls
    /// `suspend()` or `resume()` again must not wait for itself.
    lifecycle_thread: Mutex<Option<std::thread::ThreadId>>,
    /// A `suspend()` asked by an observer during `resume()`: run when the
    /// resume lets go of the lifecycle lock.
    suspend_asked: AtomicBool,
    /// Set by [`Ledger::abandon`]: drop like a killed process.
    abandoned: AtomicBool,
    /// Attempts `begin` handed out through this ledger, most recent last:
    /// what their commit's durability is decided by (the call's
    /// [`CallSpec::downstream`], and for a first attempt how long ago its
    /// request could first have gone out). Bounded by [`BEGUN_ATTEMPTS`]:
    /// an attempt that fell off is decided with its key's age unknown.
    begun: Mutex<VecDeque<Begun>>,
    /// Attempts a failed `begin` may have written and never handed out
    /// (see `Ledger::settle_unsent`); `has_unsent` says whether there are
    /// any without taking the lock.
    unsent: Mutex<Vec<AttemptId>>,
    has_unsent: AtomicBool,
    /// What this process's executors run and leave behind (see
    /// [`InProcess`]).
    in_process: Mutex<InProcess>,
    /// Syncs deferred commits by their deadline.
    flusher: Flusher,
}

/// What the executors of one ledger (every `Executor` made over it, in this
/// process) share: the attempts one of them runs in its own `perform`
/// right now, so that a report from another one (or from a caller that was
/// not handed that attempt) cannot take it over; and the orphans of an
/// executor dropped when their settlement could not be written (suspended,
/// a full disk), settled by the next `recover()` (which `resume()` runs).
#[derive(Debug, Default)]
pub(crate) struct InProcess {
    running: std::collections::HashMap<ExecutionId, u32>,
    stranded: Vec<Stranded>,
}

/// An orphan left by a dropped executor: its attempt, and the result its
/// tool reported that the ledger could not write, if any. `Debug` shows the
/// attempt and how much was kept, never a result (a `Ledger`'s `Debug`
/// reaches it).
pub(crate) struct Stranded {
    /// The attempt.
    pub attempt: AttemptId,
    /// The kept result and external id.
    pub kept: Option<(String, Option<String>)>,
    /// For an independent batch: the kept items' index, result and
    /// external id (the attempt stopped right after the last of them).
    pub items: Vec<(u32, String, Option<String>)>,
}

/// The lifecycle lock held by one `suspend()` or `resume()`.
struct LifecycleGuard<'a> {
    ledger: &'a Ledger,
    _held: std::sync::MutexGuard<'a, ()>,
}

impl Drop for LifecycleGuard<'_> {
    fn drop(&mut self) {
        *self
            .ledger
            .lifecycle_thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}

impl std::fmt::Debug for Stranded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stranded")
            .field("attempt", &self.attempt)
            .field("kept_result", &self.kept.is_some())
            .field("kept_items", &self.items.len())
            .finish()
    }
}

/// How many begun attempts `commit` remembers.
const BEGUN_ATTEMPTS: usize = 256;

/// One attempt `begin` handed out (see `Ledger::begun`).
#[derive(Debug)]
struct Begun {
    attempt: AttemptId,
    /// This process's monotonic time at the `begin`.
    at: Instant,
    /// The ledger's boot clock at the `begin` (it counts the time the
    /// device slept, which `at` does not on Linux, Android and Apple).
    at_boot: Monotonic,
    /// The first attempt of its execution: the first request under the key
    /// goes out after this `begin`.
    first: bool,
    /// What the call's spec declared.
    downstream: Downstream,
}

/// What `commit` knows of an attempt `begin` handed out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BegunAttempt {
    /// How long ago the key's first request could have gone out (the first
    /// attempt's `begin`); `None` for a later attempt.
    pub key_age: Option<Duration>,
    /// What the call's spec declared.
    pub downstream: Downstream,
}

/// A `begin` sweeps the attention flags (see `Dao::sweep_attention`) once
/// this many calls were begun through the ledger since its last sweep, so
/// `recover()` never reads more than a few hundred unflagged rows per
/// process.
const SWEEP_EVERY: u32 = 256;

impl Ledger {
    /// Opens (creating if needed) the ledger database at `path` with the
    /// system clock. The path is resolved once, here (absolute, symlinks
    /// resolved); everything after uses the resolved path.
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
        Ledger::open_with(path, config, clock, None)
    }

    /// A private in-memory ledger (tests and ephemeral harnesses).
    ///
    /// # Errors
    /// Storage errors.
    pub fn open_in_memory(config: LedgerConfig, clock: Arc<dyn Clock>) -> Result<Ledger> {
        Ledger::with_store(Store::open_in_memory()?, config, clock)
    }

    fn with_store(store: Store, config: LedgerConfig, clock: Arc<dyn Clock>) -> Result<Ledger> {
        let sessions =
            Sessions::start(store.path(), SessionId::generate()).map_err(session_error)?;
        let flusher = Flusher::new(config.deferred_commits.deadline, config.idle_checkpoint);
        let ledger = Ledger {
            store: GuardedStore::new(store),
            clock,
            sessions,
            config,
            deliveries: Mutex::new(Deliveries::default()),
            begun_since_sweep: AtomicU32::new(0),
            registered: AtomicBool::new(false),
            lifecycle: Mutex::new(()),
            lifecycle_thread: Mutex::new(None),
            suspend_asked: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            begun: Mutex::new(VecDeque::new()),
            unsent: Mutex::new(Vec::new()),
            has_unsent: AtomicBool::new(false),
            in_process: Mutex::new(InProcess::default()),
            flusher,
        };
        // Best effort: on a full disk the ledger still opens (replays need no
        // write); an unregistered session is found at its default lock path,
        // and `suspend()` registers it before it marks it.
        let _ = ledger.register();
        Ok(ledger)
    }

    /// Inside a write of this ledger: writes this session's row first if it
    /// was never written (its registration at open was refused, a busy or
    /// full file), so that no session runs a call, takes one over or
    /// suspends without a row to judge it by (with its lock file deleted, a
    /// session without a row could not be told alive). True when it wrote
    /// it ([`Ledger::note_registered`] once the write commits). An atomic
    /// load on every write otherwise.
    pub(super) fn register_in(&self, dao: &crate::store::Dao<'_>) -> Result<bool> {
        if self.registered.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let Some(lock_path) = self.sessions.own_lock_path() else {
            return Ok(false);
        };
        let mono = self.clock.monotonic();
        // Only if missing: a concurrent `suspend()` may have just written
        // the row with its mark (its write registered it, and `registered`
        // is set only once that write returns).
        dao.register_session_if_missing(
            self.session_id(),
            &lock_path.to_string_lossy(),
            &mono.boot_id,
            self.now(),
            std::process::id(),
        )?;
        Ok(true)
    }

    /// Notes that this session's row is written (by a committed write).
    pub(super) fn note_registered(&self) {
        self.registered.store(true, Ordering::Relaxed);
    }

    /// Writes this session's row (active) and clears out dead sessions.
    fn register(&self) -> Result<()> {
        let Some(lock_path) = self.sessions.own_lock_path() else {
            return Ok(());
        };
        let lock_path = lock_path.to_string_lossy().into_owned();
        let mono = self.clock.monotonic();
        let dead = self.write(Durability::Lazy, |dao| {
            // Never registered: the write has just done it (`register_in`).
            // Registered (a resume): again, which clears the mark.
            if self.registered.load(Ordering::Relaxed) {
                dao.register_session(
                    self.session_id(),
                    &lock_path,
                    &mono.boot_id,
                    self.now(),
                    std::process::id(),
                )?;
            }
            Ok(self.clean_dead_sessions(dao, &mono)?)
        })?;
        Ledger::clean_lock_files(dead);
        self.registered.store(true, Ordering::Relaxed);
        Ok(())
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

    /// The database file's resolved path (`None` in memory).
    pub fn path(&self) -> Option<&Path> {
        self.store.path()
    }

    fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Reads one execution.
    ///
    /// # Errors
    /// Storage errors.
    pub fn get(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>> {
        self.read(|dao| Ok(dao.execution(id)?))
    }

    /// Every execution of an operation, in round and position order.
    ///
    /// # Errors
    /// Storage errors.
    pub fn list(&self, op: &OperationId) -> Result<Vec<ExecutionRecord>> {
        self.read(|dao| Ok(dao.executions_of(op)?))
    }

    /// The status of an operation, if it exists.
    ///
    /// # Errors
    /// Storage errors.
    pub fn operation_status(
        &self,
        op: &OperationId,
    ) -> Result<Option<crate::model::OperationStatus>> {
        self.read(|dao| Ok(dao.operation_status(op)?))
    }

    /// The compensations recorded for `original`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn compensations(&self, original: &ExecutionId) -> Result<Vec<ExecutionRecord>> {
        self.read(|dao| Ok(dao.compensations_of(original)?))
    }

    /// What stale attempts of `id` learnt and could not record (results,
    /// external ids, failures of attempts that had been superseded).
    ///
    /// # Errors
    /// Storage errors.
    pub fn evidence(&self, id: &ExecutionId) -> Result<Vec<EvidenceEntry>> {
        self.read(|dao| Ok(dao.evidence_of(id)?))
    }

    /// True while `attempt` is the current attempt of its execution, owned
    /// by this session and running: a long-running tool may ask before each
    /// expensive step and stop when it is no longer the owner.
    ///
    /// # Errors
    /// Storage errors.
    pub fn owns(&self, attempt: &AttemptId) -> Result<bool> {
        let rec = self.read(|dao| Ok(dao.execution(&attempt.execution_id)?))?;
        Ok(rec.is_some_and(|r| {
            r.status == ExecutionStatus::Executing
                && r.attempt_count == attempt.attempt
                && r.owner_session.as_ref() == Some(self.session_id())
        }))
    }

    /// What the app does next with `rec` (by the same table as `begin`):
    /// for listings of what needs attention.
    ///
    /// # Errors
    /// Storage errors.
    pub fn next_step(&self, rec: &ExecutionRecord) -> Result<NextStep> {
        let (has_items, op) = self.read(|dao| {
            Ok((
                dao.has_batch_items(&rec.execution_id)?,
                dao.operation_status(&rec.operation_id)?,
            ))
        })?;
        Ok(NextStep::of(&decide::Facts {
            status: rec.status,
            retryable: rec.retryable,
            requires_approval: rec.requires_approval,
            same_digest: true,
            op_cancelled: matches!(
                op,
                Some(
                    crate::model::OperationStatus::Cancelled
                        | crate::model::OperationStatus::CancelledAfterSideEffect
                )
            ),
            has_items: has_items && rec.status == ExecutionStatus::FailedBeforeCommit,
            pruned: false,
        }))
    }

    /// For an execution whose outcome is unknown: how long ago (boot clock)
    /// it became unknown. An app that runs tools itself compares it with the
    /// tool's landing window before it takes a lookup's "not found" as
    /// proof (the executor does this itself). `None` when not unknown.
    ///
    /// # Errors
    /// Storage errors.
    pub fn unknown_for(&self, id: &ExecutionId) -> Result<Option<Duration>> {
        let rec = self.read(|dao| Ok(dao.execution(id)?))?;
        let now = self.clock.monotonic();
        Ok(rec
            .filter(|r| r.status == ExecutionStatus::OutcomeUnknown)
            .and_then(|r| r.unknown_since)
            .map(|since| Duration::from_millis(u64::try_from(now.since(&since)).unwrap_or(0))))
    }

    /// Call at app start and after resume. Turns `executing` rows whose owner
    /// session is dead into `outcome_unknown` (a held lock means alive; a
    /// suspended owner is alive while its lease runs on the boot clock, and
    /// after it while its process may still run it),
    /// deletes the rows and lock files of dead sessions, and returns every
    /// execution that needs attention: unknown outcomes, approvals pending,
    /// approved or retryable work, live in-flight rows and committed results
    /// not yet delivered to the model. One write, lazy (no sync): an
    /// `outcome_unknown` mark lost to a power cut only means the next
    /// `recover` marks the same rows again, and any later durable write
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

    fn in_process(&self) -> std::sync::MutexGuard<'_, InProcess> {
        self.in_process
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An executor of this ledger runs attempt `attempt` of `id` in its own
    /// `perform` (until [`Ledger::end_running`]).
    pub(crate) fn note_running(&self, id: &ExecutionId, attempt: u32) {
        self.in_process().running.insert(id.clone(), attempt);
    }

    /// The attempt noted by [`Ledger::note_running`] is no longer run.
    pub(crate) fn end_running(&self, id: &ExecutionId, attempt: u32) {
        let mut in_process = self.in_process();
        if in_process.running.get(id) == Some(&attempt) {
            in_process.running.remove(id);
        }
    }

    /// Does an executor of this ledger run that attempt in its own `perform`?
    pub(crate) fn runs_here(&self, id: &ExecutionId, attempt: u32) -> bool {
        self.in_process().running.get(id) == Some(&attempt)
    }

    /// Leaves an orphan of a dropped executor to the next `recover()`.
    pub(crate) fn strand(&self, stranded: Stranded) {
        self.in_process().stranded.push(stranded);
    }

    /// Settles the orphans dropped executors left (see [`InProcess`]); one
    /// that still cannot be written stays for the next time.
    fn settle_stranded(&self) {
        let stranded = std::mem::take(&mut self.in_process().stranded);
        for orphan in stranded {
            if let Err(Error::Store(_)) = self.settle_orphan(&orphan) {
                self.strand(orphan);
            }
        }
    }

    /// Settles the orphan of a dropped executor, fenced by its attempt (a
    /// refusal, the attempt no longer current or no longer executing, is
    /// harmless): a kept result is committed; a batch's kept items are
    /// recorded and, no item being in flight after them, the rest is a
    /// retryable failure before commit (the next ask runs the items not run
    /// yet, under their own keys); any other orphan's outcome is unknown.
    ///
    /// # Errors
    /// Storage errors (nothing settled then).
    pub(crate) fn settle_orphan(&self, orphan: &Stranded) -> Result<()> {
        let written = if let Some((result_json, external_id)) = &orphan.kept {
            self.commit_valid(&orphan.attempt, result_json, external_id.as_deref(), None)
                .map(drop)
        } else if !orphan.items.is_empty() {
            let mut recorded = Ok(());
            for (index, result_json, external_id) in &orphan.items {
                if let Err(e) = self.record_batch_item(
                    &orphan.attempt,
                    *index,
                    result_json,
                    external_id.as_deref(),
                ) {
                    recorded = Err(e);
                    break;
                }
            }
            recorded.and_then(|()| {
                self.fail_before_commit(
                    &orphan.attempt,
                    "its executor was dropped between items: the items not run yet run at \
                     the next ask",
                    true,
                )
            })
        } else {
            self.mark_outcome_unknown(
                &orphan.attempt,
                "its caller stopped waiting while it ran, and its executor was dropped; \
                 the outcome is unknown",
            )
            .map(drop)
        };
        match written {
            Err(Error::Store(e)) => Err(Error::Store(e)),
            _ => Ok(()),
        }
    }

    pub(crate) fn recover_marking(&self) -> Result<(Vec<ExecutionRecord>, Vec<ExecutionId>)> {
        self.settle_stranded();
        let now = self.now();
        let mono = self.clock.monotonic();
        self.write(Durability::Lazy, |dao| {
            dao.sweep_attention(0)?;
            let mut pending = dao.executions_needing_attention()?;
            let mut marked = Vec::new();
            for rec in pending.iter_mut() {
                if rec.status != ExecutionStatus::Executing {
                    continue;
                }
                if let Liveness::Dead(reason) =
                    self.liveness_of(dao, rec.owner_session.as_ref(), &mono)?
                {
                    if self.abandon_attempt(dao, rec, reason, &mono, now)? {
                        marked.push(rec.execution_id.clone());
                    }
                }
            }
            let dead = self.clean_dead_sessions(dao, &mono)?;
            Ok((pending, marked, dead))
        })
        .map(|(pending, marked, dead)| {
            Ledger::clean_lock_files(dead);
            (pending, marked)
        })
    }

    /// Moves an `executing` row whose owner is dead to `outcome_unknown`
    /// (fenced by its attempt) and updates `rec` to match. False when the
    /// row had moved on.
    pub(super) fn abandon_attempt(
        &self,
        dao: &crate::store::Dao<'_>,
        rec: &mut ExecutionRecord,
        reason: &'static str,
        mono: &crate::model::Monotonic,
        now: i64,
    ) -> Result<bool> {
        let mv = crate::model::Move::check(rec.status, crate::model::Transition::MarkUnknown)
            .map_err(|e| Error::transition(&rec.execution_id, e))?;
        let moved = dao.move_status(
            &rec.execution_id,
            mv,
            Some(Fence {
                attempt: rec.attempt_count,
                session: rec.owner_session.as_ref(),
            }),
            &StatusFields {
                attempt: Some(rec.attempt_count),
                reason: Some(reason),
                unknown_since: Some(mono),
                ..StatusFields::default()
            },
            self.session_id(),
            now,
        )?;
        if moved {
            rec.status = ExecutionStatus::OutcomeUnknown;
            rec.last_reason = Some(reason.to_owned());
            rec.unknown_since = Some(mono.clone());
            rec.updated_ms = now;
        }
        Ok(moved)
    }

    /// Gets ready for the app to be suspended: leaves a durable suspension
    /// mark (this session stays the owner of what it is running for
    /// [`LedgerConfig::lease`] on the boot clock), writes the queued delivery
    /// marks, checkpoints the WAL and closes the database, and releases the
    /// session lock, so no file lock is held while suspended (iOS
    /// 0xdead10cc). Every lock is released even when a step fails (a full
    /// disk): the ledger is suspended whatever this returns. Calls fail with
    /// `Suspended` until [`Ledger::resume`]. Suspending twice is a no-op.
    ///
    /// # Errors
    /// Storage errors of the mark or the checkpoint (the ledger is
    /// suspended all the same).
    pub fn suspend(&self) -> Result<()> {
        if self.in_lifecycle() {
            // Called back (an observer) from inside this thread's own
            // `suspend()` (it is suspending already) or `resume()` (asked
            // for once the resume is done).
            self.suspend_asked.store(true, Ordering::SeqCst);
            return Ok(());
        }
        let _one_at_a_time = self.lifecycle();
        if self.store.is_suspended() {
            // Suspended already; a lock taken since (a resume that failed
            // after taking it) is let go all the same.
            self.sessions.release_suspended();
            return Ok(());
        }
        let marked = self.mark_suspended();
        let closed = self.store.suspend().map_err(Error::from);
        self.sessions.release_suspended();
        marked.and(closed)
    }

    /// Takes the lifecycle lock for `suspend()` / `resume()`, noting the
    /// thread that holds it (see [`Ledger::in_lifecycle`]).
    fn lifecycle(&self) -> LifecycleGuard<'_> {
        let held = self
            .lifecycle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *self
            .lifecycle_thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(std::thread::current().id());
        LifecycleGuard {
            ledger: self,
            _held: held,
        }
    }

    /// Is this thread inside `suspend()` or `resume()` already?
    fn in_lifecycle(&self) -> bool {
        *self
            .lifecycle_thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            == Some(std::thread::current().id())
    }

    fn mark_suspended(&self) -> Result<()> {
        let mono = self.clock.monotonic();
        let lease = i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX);
        let lock_path = self.sessions.own_lock_path();
        let now = self.now();
        self.write(Durability::Lazy, |dao| {
            let Some(lock_path) = &lock_path else {
                return Ok(());
            };
            // Registered by the write if it never was; a row deleted since
            // (this session judged dead and cleaned away while it lived) is
            // written again, so that the mark is there.
            if !dao.mark_suspended(self.session_id(), &mono.boot_id, mono.ms, lease)? {
                dao.register_session_if_missing(
                    self.session_id(),
                    &lock_path.to_string_lossy(),
                    &mono.boot_id,
                    now,
                    std::process::id(),
                )?;
                dao.mark_suspended(self.session_id(), &mono.boot_id, mono.ms, lease)?;
            }
            Ok(())
        })?;
        self.registered.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Reopens after [`Ledger::suspend`] (the same file, found by the path
    /// resolved at open, never a file created in its place), takes the
    /// session lock again, clears the suspension mark and runs
    /// [`Ledger::recover`]. Without a prior `suspend` it only recovers.
    ///
    /// # Errors
    /// The errors of opening and of `recover`; `DatabaseReplaced` when
    /// another database is at the path now.
    pub fn resume(&self) -> Result<Vec<ExecutionRecord>> {
        if self.abandoned.load(Ordering::Relaxed) {
            return Err(crate::store::Error::Suspended.into());
        }
        if self.sessions.forked() {
            // Before the lock: a forked child taking the parent's session
            // lock while it is free (the parent suspended) would keep the
            // parent's own resume waiting for as long as the child lives.
            return Err(crate::store::Error::Forked.into());
        }
        if self.in_lifecycle() {
            // Called back (an observer) from inside this thread's own
            // `suspend()` or `resume()`: it would wait for itself.
            return Err(crate::store::Error::Suspended.into());
        }
        {
            let _one_at_a_time = self.lifecycle();
            self.suspend_asked.store(false, Ordering::SeqCst);
            self.sessions.acquire().map_err(session_error)?;
            if let Err(e) = self.store.resume() {
                // Still suspended: no lock held while the app may be frozen
                // (iOS kills an app that holds one in a shared container).
                self.sessions.release_suspended();
                return Err(e.into());
            }
            // Active again: the lock says so; the row must not say "suspended".
            match self.register() {
                Ok(()) => {}
                Err(e @ Error::Store(crate::store::Error::Busy)) => {
                    // Not resumed after all (another process holds the
                    // file: ask again): suspended again, with no lock held
                    // while the app may be frozen; the row keeps its mark.
                    let _ = self.store.suspend();
                    self.sessions.release_suspended();
                    return Err(e);
                }
                // Any other failure (a full disk): resumed all the same, so
                // that replays and reads still answer. The row keeps its
                // old mark, which the lock now held overrules (and, once
                // this process is gone, a lapsed lease and the process
                // check judge it as before).
                Err(_) => {}
            }
        }
        if self.suspend_asked.swap(false, Ordering::SeqCst) {
            // An observer asked for a suspension while this resumed.
            self.suspend()?;
            return Ok(Vec::new());
        }
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
        self.read(|dao| Ok(dao.operations(limit)?))
    }

    /// The transition log of one execution, oldest first.
    ///
    /// # Errors
    /// Storage errors.
    pub fn transitions(&self, id: &ExecutionId) -> Result<Vec<crate::model::TransitionEntry>> {
        let history = self.read(|dao| {
            Ok(History {
                id: id.clone(),
                entries: dao.transitions_of(id)?,
            })
        })?;
        Ok(history.entries)
    }

    /// Counts for the inspector.
    ///
    /// # Errors
    /// Storage errors.
    pub fn stats(&self) -> Result<StoreStats> {
        self.read(|dao| Ok(dao.stats()?))
    }

    /// Ends this ledger the way a killed process would: the database is
    /// closed without a checkpoint or any further write, the session lock is
    /// released but its file and row stay, and queued delivery marks are
    /// lost; every later call fails with `Suspended`. For crash simulations
    /// and tests (several "processes" in one); an app never needs it.
    #[doc(hidden)]
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::Relaxed);
        self.flusher.stop();
        self.store.kill();
        self.sessions.abandon();
    }

    /// Makes every commit of this ledger durable now (one sync of the WAL).
    /// Deferred commits become durable on their own by the next durable
    /// write, `suspend()` or [`DeferredCommits::deadline`]; call this when
    /// the app knows it is about to lose power or be frozen without
    /// `suspend()`.
    ///
    /// # Errors
    /// Storage errors of the sync; `Suspended`.
    pub fn sync(&self) -> Result<()> {
        Ok(self.store.sync()?)
    }

    /// True while a deferred commit of this ledger is not durable yet.
    pub fn has_unsynced_commits(&self) -> bool {
        self.store.has_unsynced()
    }

    /// Makes the deferred commits durable if one is not yet (what the
    /// deadline thread does when the deadline comes). True when it synced.
    ///
    /// # Errors
    /// Storage errors of the sync; `Suspended`.
    #[doc(hidden)]
    pub fn sync_deferred(&self) -> Result<bool> {
        Ok(self.store.sync_deferred()?)
    }

    /// Remembers an attempt `begin` handed out, for its commit.
    fn remember_begun(&self, attempt: AttemptId, first: bool, downstream: Downstream) {
        let mut d = self
            .begun
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if d.len() == BEGUN_ATTEMPTS {
            d.pop_front();
        }
        d.push_back(Begun {
            attempt,
            at: Instant::now(),
            at_boot: self.clock.monotonic(),
            first,
            downstream,
        });
    }

    /// Notes attempts a failed `begin` may have written.
    fn note_unsent(&self, attempts: Vec<AttemptId>) {
        if attempts.is_empty() {
            return;
        }
        let mut u = self
            .unsent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        u.extend(attempts);
        self.has_unsent.store(true, Ordering::Release);
    }

    /// The attempts noted by [`Ledger::note_unsent`], if any (a copy: they
    /// stay noted until a write that settled them succeeded).
    fn unsent_attempts(&self) -> Option<Vec<AttemptId>> {
        if !self.has_unsent.load(Ordering::Acquire) {
            return None;
        }
        let u = self
            .unsent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (!u.is_empty()).then(|| u.clone())
    }

    /// Forgets the noted attempts a successful write settled.
    fn forget_unsent(&self, settled: &[AttemptId]) {
        let mut u = self
            .unsent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        u.retain(|a| !settled.contains(a));
        self.has_unsent.store(!u.is_empty(), Ordering::Release);
    }

    /// What `begin` handed out for `attempt` (once), if remembered.
    fn take_begun(&self, attempt: &AttemptId) -> Option<BegunAttempt> {
        let mut d = self
            .begun
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let i = d.iter().rposition(|b| &b.attempt == attempt)?;
        let b = d.remove(i)?;
        drop(d);
        // The longer of the two clocks: the boot clock counts a sleep of
        // the device (a request that went out before it and was answered
        // after it), and the process's clock stands in for a boot clock
        // that cannot be read.
        let slept = u64::try_from(self.clock.monotonic().since(&b.at_boot)).unwrap_or(0);
        Some(BegunAttempt {
            key_age: b
                .first
                .then(|| b.at.elapsed().max(Duration::from_millis(slept))),
            downstream: b.downstream,
        })
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
}

/// The error of a session lock file: `Busy` when its lock stayed held by
/// another process past the wait (a frozen prober: ask again), else
/// `Session`.
fn session_error(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::WouldBlock {
        Error::Store(crate::store::Error::Busy)
    } else {
        Error::Session(e.kind().to_string())
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        if self.sessions.forked() {
            // A child made by `fork()` dropping its copy of the parent's
            // ledger: the session, its lock, its row and its connection are
            // the parent's (SQLite forbids using a connection across a
            // fork, and closing one may checkpoint and delete the WAL). The
            // child writes nothing, joins no thread of the parent's and
            // leaves the connection open until it exits.
            self.store.leak();
            return;
        }
        self.flusher.stop();
        if self.abandoned.load(Ordering::Relaxed) || self.store.is_suspended() {
            return;
        }
        // Best effort: a mark lost here only replays a stored result; a
        // session row left here is cleaned by the next session that opens.
        if self
            .write(Durability::Lazy, |dao| {
                dao.delete_session(self.session_id())?;
                Ok(())
            })
            .is_ok()
        {
            self.sessions.row_deleted();
        }
        // Deferred commits are durable before the ledger goes (closing the
        // last connection checkpoints, but another process may hold one).
        let _ = self.store.sync_deferred();
    }
}

#[cfg(test)]
mod stranded_tests {
    use super::*;

    #[test]
    fn a_stranded_orphans_debug_shows_no_result() {
        let id = ExecutionId::parse("op:round_0:c:t:v1").unwrap();
        let stranded = Stranded {
            attempt: AttemptId::new(id, 2),
            kept: Some((
                r#"{"card":"4111-secret"}"#.into(),
                Some("ext-secret".into()),
            )),
            items: vec![(0, r#"{"item":"item-secret"}"#.into(), None)],
        };
        let shown = format!("{stranded:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("kept_items: 1"), "{shown}");
    }
}
