//! The exported [`Ledger`]: the durable state machine, one method per step.
//!
//! Every method is one short SQLite transaction and blocks the calling thread
//! until it is durable (an fsync on commit boundaries): apps call them off the
//! main/UI thread (a background queue, `Dispatchers.IO`, a worker thread).

use std::path::Path;
use std::sync::Arc;

use toolledger_core::ledger as core;
use toolledger_core::model::{ArgsDigest, ExecutionId, OperationId};

use super::error::LedgerError;
use super::execution::{
    CancelOutcome, Execution, LedgerStats, OperationStatus, OperationSummary, TransitionEntry,
};
use super::records::{Begin, CallSpec, LedgerConfig, Resolution, Resolved, StoredResult, Ticket};

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// The durable execution ledger: one SQLite file on the device.
///
/// Most apps use an [`super::executor::Executor`] over it and call only
/// `recover`, `suspend`/`resume` and the read methods here; the step methods
/// are for apps that run tools themselves. Share one instance per database
/// file in a process. Methods block on disk I/O: call them off the main thread.
#[derive(Debug, uniffi::Object)]
pub struct Ledger {
    pub(crate) inner: Arc<core::Ledger>,
    /// The observers of its status moves (`set_observer`, `add_observer`).
    observers: Arc<super::privacy::Observers>,
}

#[uniffi::export]
impl Ledger {
    /// Opens (creating if needed) the ledger database at `path`, created
    /// readable by its owner only.
    ///
    /// With `key` (32 bytes the app keeps in the Keychain / Android
    /// Keystore), the ledger is encrypted at rest: a new ledger is created
    /// encrypted, an encrypted one opens only with its key. A plain ledger
    /// that holds records is encrypted once with `encrypt_ledger`.
    ///
    /// # Errors
    /// `Storage` for a file that is not a database (`NotADatabase`) or is
    /// corrupt, a newer schema (`IncompatibleVersion`), a read-only or
    /// unopenable path, a lock held past the busy timeout; `WrongKey`,
    /// `KeyRequired`, `NotEncrypted`, `InvalidKey` (nothing written).
    #[uniffi::constructor(default(key = None))]
    pub fn open(path: String, config: LedgerConfig, key: Option<Vec<u8>>) -> Result<Arc<Ledger>> {
        let key = key.as_deref().map(super::privacy::key_of).transpose()?;
        let inner = core::Ledger::open_with(
            Path::new(&path),
            config.into(),
            Arc::new(core::SystemClock),
            key.as_ref(),
        )?;
        Ok(Arc::new(Ledger {
            inner: Arc::new(inner),
            observers: Arc::default(),
        }))
    }

    /// True when the ledger is encrypted at rest.
    pub fn is_encrypted(&self) -> bool {
        self.inner.is_encrypted()
    }

    /// Registers (or, with `None`, removes) the observer that hears of every
    /// committed status move: ids, tool, statuses, attempt, elapsed time and
    /// the reason's kind, never a value. It replaces the observer an earlier
    /// `set_observer` named; those `add_observer` added keep hearing.
    ///
    /// # Errors
    /// `Internal` for a poisoned lock.
    pub fn set_observer(
        &self,
        observer: Option<Arc<dyn super::privacy::LedgerObserver>>,
    ) -> Result<()> {
        super::privacy::put_observer(
            &self.inner,
            &self.observers,
            Some(super::privacy::PRIMARY_SLOT),
            observer,
        )?;
        Ok(())
    }

    /// Adds an observer beside the others (an event stream of a language
    /// layer, a second log) and returns its token for `remove_observer`.
    /// Every observer hears every committed move, in the order added.
    ///
    /// # Errors
    /// `Internal` for a poisoned lock.
    pub fn add_observer(&self, observer: Arc<dyn super::privacy::LedgerObserver>) -> Result<u64> {
        super::privacy::put_observer(&self.inner, &self.observers, None, Some(observer))
    }

    /// Removes the observer `add_observer` returned `token` for (a token
    /// already removed, or never returned, changes nothing).
    ///
    /// # Errors
    /// `Internal` for a poisoned lock.
    pub fn remove_observer(&self, token: u64) -> Result<()> {
        if token == super::privacy::PRIMARY_SLOT {
            // Slot 0 is `set_observer`'s: not a token `add_observer` gives.
            return Ok(());
        }
        super::privacy::put_observer(&self.inner, &self.observers, Some(token), None)?;
        Ok(())
    }

    /// This ledger's session id (the owner written on `executing` rows).
    pub fn session_id(&self) -> String {
        self.inner.session_id().as_str().to_owned()
    }

    /// Begins every call of one model response in one durable transaction
    /// and answers, per call and in order: run it, ask for approval, replay
    /// the stored result, or refuse. If any call is invalid, nothing of the
    /// round is recorded.
    ///
    /// # Errors
    /// `InvalidInput` for bad JSON or ids; `Storage`.
    pub fn begin_round(
        &self,
        operation_id: OperationId,
        round: u32,
        calls: Vec<CallSpec>,
    ) -> Result<Vec<Begin>> {
        let specs: Vec<core::CallSpec> = calls.into_iter().map(Into::into).collect();
        let answers = self.inner.begin_round(&operation_id, round, &specs)?;
        Ok(answers.into_iter().map(Into::into).collect())
    }

    /// Begins one call (see `begin_round`).
    ///
    /// # Errors
    /// As `begin_round`.
    pub fn begin(&self, operation_id: OperationId, round: u32, spec: CallSpec) -> Result<Begin> {
        Ok(self.inner.begin(&operation_id, round, &spec.into())?.into())
    }

    /// Approves the execution for exactly the arguments with `args_digest`,
    /// recording the preview the human saw (JSON, optional).
    ///
    /// # Errors
    /// `DigestMismatch`, `NotFound`, `InvalidTransition` unless it is
    /// prepared, `InvalidInput` for a preview that is not JSON.
    pub fn approve(
        &self,
        execution_id: ExecutionId,
        args_digest: ArgsDigest,
        preview_json: Option<String>,
    ) -> Result<()> {
        Ok(self
            .inner
            .approve(&execution_id, &args_digest, preview_json.as_deref())?)
    }

    /// Rejects the execution (a human said no). It never runs.
    ///
    /// # Errors
    /// As `approve`.
    pub fn reject(
        &self,
        execution_id: ExecutionId,
        args_digest: ArgsDigest,
        reason: String,
    ) -> Result<()> {
        Ok(self.inner.reject(&execution_id, &args_digest, &reason)?)
    }

    /// Starts the next attempt of an approved (or retryable failed)
    /// execution: durably `executing` before the tool runs.
    ///
    /// # Errors
    /// `InvalidTransition` from any other status, `NotFound`, `Storage`.
    pub fn mark_executing(&self, execution_id: ExecutionId) -> Result<Ticket> {
        Ok(self.inner.mark_executing(&execution_id)?.into())
    }

    /// Makes the downstream's id for the effect durable as soon as it is
    /// known. `ticket` names the attempt (the fencing token).
    ///
    /// # Errors
    /// `StaleAttempt` when another attempt superseded this one (the id is
    /// kept as evidence); `AlreadyCommitted` when a different external id is
    /// stored; `NotFound`.
    pub fn record_external_id(&self, ticket: Ticket, external_id: String) -> Result<()> {
        Ok(self
            .inner
            .record_external_id(&ticket.attempt_id(), &external_id)?)
    }

    /// For an execution whose outcome is unknown: how long ago it became
    /// unknown, in ms (boot clock). Before a lookup's "not found" counts as
    /// proof, this must exceed the tool's landing window (a request sent
    /// before may land until then). `None` when the outcome is not unknown.
    ///
    /// # Errors
    /// `Storage`.
    pub fn unknown_for_ms(&self, execution_id: ExecutionId) -> Result<Option<u64>> {
        Ok(self
            .inner
            .unknown_for(&execution_id)?
            .map(super::records::millis))
    }

    /// True while `ticket`'s attempt is still the execution's current one,
    /// running and owned by this session: a long tool may check before each
    /// expensive step and stop when it is not.
    ///
    /// # Errors
    /// `Storage`.
    pub fn owns(&self, ticket: Ticket) -> Result<bool> {
        Ok(self.inner.owns(&ticket.attempt_id())?)
    }

    /// Commits the side effect's result of `ticket`'s attempt: durable before
    /// it goes to the model. Committing the identical result again is a no-op.
    ///
    /// # Errors
    /// `StaleAttempt` when another attempt superseded this one (the result is
    /// kept as evidence); `InvalidInput` for a result that is not JSON,
    /// `AlreadyCommitted`, `InvalidTransition`, `NotFound`, `Storage`.
    pub fn commit(
        &self,
        ticket: Ticket,
        result_json: String,
        external_id: Option<String>,
    ) -> Result<StoredResult> {
        Ok(self
            .inner
            .commit(&ticket.attempt_id(), &result_json, external_id.as_deref())?
            .into())
    }

    /// Records that `ticket`'s attempt provably did not commit; `retryable`
    /// decides whether the next `begin` runs it again under the same key.
    ///
    /// # Errors
    /// `StaleAttempt`; `InvalidTransition` unless executing; `NotFound`.
    pub fn fail_before_commit(
        &self,
        ticket: Ticket,
        reason: String,
        retryable: bool,
    ) -> Result<()> {
        Ok(self
            .inner
            .fail_before_commit(&ticket.attempt_id(), &reason, retryable)?)
    }

    /// Records that `ticket`'s request may have reached the downstream
    /// (timeout, dropped connection). Leaves only through reconciliation.
    ///
    /// # Errors
    /// `StaleAttempt`; `InvalidTransition` unless executing; `NotFound`.
    pub fn mark_outcome_unknown(&self, ticket: Ticket, reason: String) -> Result<()> {
        self.inner
            .mark_outcome_unknown(&ticket.attempt_id(), &reason)?;
        Ok(())
    }

    /// Resolves the unknown outcome of attempt `attempt` of the execution:
    /// commit what was found, retry under the same key (run the returned
    /// ticket), or record the failure. Any session may resolve.
    ///
    /// # Errors
    /// `StaleAttempt` when another attempt has started since;
    /// `InvalidTransition` unless the outcome is unknown; `InvalidInput` for a
    /// found result that is not JSON.
    pub fn resolve_unknown(
        &self,
        execution_id: ExecutionId,
        attempt: u32,
        resolution: Resolution,
    ) -> Result<Resolved> {
        let attempt = core::AttemptId::new(execution_id, attempt);
        Ok(self
            .inner
            .resolve_unknown(&attempt, resolution.into())?
            .into())
    }

    /// Marks results as handed to the model. Checked now, written with the
    /// ledger's next write (no sync of its own) or before any read that
    /// reports statuses, `suspend` and `checkpoint`; losing it (the process
    /// dies first) only replays the stored result.
    ///
    /// # Errors
    /// `InvalidTransition` for an id that has not committed (nothing of the
    /// batch is marked then), `NotFound`.
    pub fn mark_delivered(&self, execution_ids: Vec<ExecutionId>) -> Result<()> {
        Ok(self.inner.mark_delivered(&execution_ids)?)
    }

    /// Cancels one execution if nothing can have reached the downstream.
    ///
    /// # Errors
    /// `NotFound`, `Storage`.
    pub fn cancel(&self, execution_id: ExecutionId) -> Result<CancelOutcome> {
        Ok(self.inner.cancel(&execution_id)?.into())
    }

    /// Cancels an operation: what cannot have run is cancelled and nothing
    /// starts in it again. Returns `CancelledAfterSideEffect` as soon as an
    /// effect may exist (a call committed, is running or has an unknown
    /// outcome; undo a committed one with `compensate`), else `Cancelled`.
    ///
    /// # Errors
    /// `Storage`.
    pub fn cancel_operation(&self, operation_id: OperationId) -> Result<OperationStatus> {
        Ok(self.inner.cancel_operation(&operation_id)?.into())
    }

    /// Marks an operation completed.
    ///
    /// # Errors
    /// `Storage`.
    pub fn complete_operation(&self, operation_id: OperationId) -> Result<()> {
        Ok(self.inner.complete_operation(&operation_id)?)
    }

    /// Begins a compensation of the committed execution `original`: a new
    /// execution with its own id, approval and downstream key, linked to it.
    ///
    /// # Errors
    /// `NotFound`; `InvalidInput` when `original` never committed; the
    /// errors of `begin_round`.
    pub fn compensate(
        &self,
        original: ExecutionId,
        operation_id: OperationId,
        round: u32,
        spec: CallSpec,
    ) -> Result<Begin> {
        Ok(self
            .inner
            .compensate(&original, &operation_id, round, &spec.into())?
            .into())
    }

    /// Reads one execution.
    ///
    /// # Errors
    /// `Storage`.
    pub fn get(&self, execution_id: ExecutionId) -> Result<Option<Execution>> {
        Ok(self.inner.get(&execution_id)?.map(Into::into))
    }

    /// Every execution of an operation, in round and position order.
    ///
    /// # Errors
    /// `Storage`.
    pub fn list(&self, operation_id: OperationId) -> Result<Vec<Execution>> {
        Ok(into_executions(self.inner.list(&operation_id)?))
    }

    /// The compensations recorded for `original`.
    ///
    /// # Errors
    /// `Storage`.
    pub fn compensations(&self, original: ExecutionId) -> Result<Vec<Execution>> {
        Ok(into_executions(self.inner.compensations(&original)?))
    }

    /// The status of an operation, if it exists.
    ///
    /// # Errors
    /// `Storage`.
    pub fn operation_status(&self, operation_id: OperationId) -> Result<Option<OperationStatus>> {
        Ok(self.inner.operation_status(&operation_id)?.map(Into::into))
    }

    /// Operations with their status, newest first, at most `limit`.
    ///
    /// # Errors
    /// `Storage`.
    pub fn operations(&self, limit: u32) -> Result<Vec<OperationSummary>> {
        Ok(self
            .inner
            .operations(limit)?
            .into_iter()
            .map(|(operation_id, status)| OperationSummary {
                operation_id,
                status: status.into(),
            })
            .collect())
    }

    /// The transition log of one execution, oldest first.
    ///
    /// # Errors
    /// `Storage`.
    pub fn transitions(&self, execution_id: ExecutionId) -> Result<Vec<TransitionEntry>> {
        Ok(self
            .inner
            .transitions(&execution_id)?
            .into_iter()
            .map(Into::into)
            .collect())
    }

    /// Row counts (for diagnostics).
    ///
    /// # Errors
    /// `Storage`.
    pub fn stats(&self) -> Result<LedgerStats> {
        Ok(self.inner.stats()?.into())
    }

    /// Call at app start and after resume: executions left `executing` by a
    /// dead session become `OutcomeUnknown` (a live one's, and a suspended
    /// one's within its lease or while its process lives, stay); returns every execution that needs
    /// attention (unknown outcomes, pending approvals, retryable work, calls
    /// still running in a live session, committed results not yet
    /// delivered).
    ///
    /// # Errors
    /// `Storage`.
    pub fn recover(&self) -> Result<Vec<Execution>> {
        Ok(into_executions(self.inner.recover()?))
    }

    /// Checkpoints and closes the database so no file lock is held while the
    /// app is suspended (iOS kills suspended apps holding locks in shared
    /// containers). Calls fail with `Suspended` until `resume`.
    ///
    /// # Errors
    /// `Storage` from the checkpoint.
    pub fn suspend(&self) -> Result<()> {
        Ok(self.inner.suspend()?)
    }

    /// Makes every deferred commit durable now (one WAL sync; nothing to do
    /// when none is waiting). A tool whose downstream dedupes by key or can
    /// be looked up gets its commit written at once and synced with the next
    /// durable write, at `suspend`, or within the deferral deadline
    /// (docs/design.md, "The durability policy"); call this where the app
    /// wants that point now, e.g. before it reports a result to a server.
    ///
    /// # Errors
    /// `Storage` from the sync; `Suspended`.
    pub fn sync(&self) -> Result<()> {
        Ok(self.inner.sync()?)
    }

    /// True while a deferred commit of this ledger is not durable yet (it
    /// already survives the app being killed; only a power cut or an OS
    /// crash could lose it, and reconciliation would recover it).
    pub fn has_unsynced_commits(&self) -> bool {
        self.inner.has_unsynced_commits()
    }

    /// Reopens after `suspend` and runs `recover`.
    ///
    /// # Errors
    /// The errors of opening and of `recover`.
    pub fn resume(&self) -> Result<Vec<Execution>> {
        Ok(into_executions(self.inner.resume()?))
    }
}

fn into_executions(records: Vec<toolledger_core::model::ExecutionRecord>) -> Vec<Execution> {
    records.into_iter().map(Into::into).collect()
}
