//! The steps after `begin`: approval, execution, commit, failure, unknown
//! outcomes and their resolution, delivery, cancellation.
//!
//! Each step is one transaction that re-reads the record, checks the move
//! against the transition table and writes it with the transition log entry.

use super::answers::{CancelOutcome, Resolution, Resolved, StoredResult, Ticket};
use super::{DeliveryMark, Error, Ledger, Result};
use crate::model::canonical::canonicalize;
use crate::model::{
    check_transition, ArgsDigest, ExecutionId, ExecutionRecord, ExecutionStatus, OperationId,
    OperationStatus, Transition,
};
use crate::store::{Dao, Durability, StatusFields};

fn load(dao: &Dao<'_>, id: &ExecutionId) -> Result<ExecutionRecord> {
    dao.execution(id)?
        .ok_or_else(|| Error::NotFound(id.clone()))
}

impl Ledger {
    /// Approves the execution for exactly the arguments with `digest`,
    /// recording the preview the human saw. An approval for another digest
    /// does not unlock it.
    ///
    /// # Errors
    /// [`Error::DigestMismatch`], [`Error::NotFound`],
    /// [`Error::InvalidTransition`] unless it is `prepared`, [`Error::Json`]
    /// for a preview that is not JSON.
    pub fn approve(
        &self,
        id: &ExecutionId,
        digest: &ArgsDigest,
        preview_json: Option<&str>,
    ) -> Result<()> {
        if let Some(preview) = preview_json {
            canonicalize(preview, &self.config.json_limits)?;
        }
        let now = self.now();
        self.write(Durability::Full, |dao| {
            let rec = load(dao, id)?;
            check_digest(&rec, digest)?;
            self.step(dao, &rec, Transition::Approve, StatusFields::default(), now)?;
            dao.record_approval(id, digest, true, preview_json, now)?;
            Ok(())
        })
    }

    /// Rejects the execution (a human said no). It never runs.
    ///
    /// # Errors
    /// As [`Ledger::approve`].
    pub fn reject(&self, id: &ExecutionId, digest: &ArgsDigest, reason: &str) -> Result<()> {
        let now = self.now();
        self.write(Durability::Full, |dao| {
            let rec = load(dao, id)?;
            check_digest(&rec, digest)?;
            self.step(
                dao,
                &rec,
                Transition::Reject,
                StatusFields {
                    reason: Some(reason),
                    ..StatusFields::default()
                },
                now,
            )?;
            dao.record_approval(id, digest, false, None, now)?;
            Ok(())
        })
    }

    /// Starts the next attempt of an approved (or retryable failed, or
    /// approval-free prepared) execution: durable `executing` before the
    /// tool runs. For approval-required calls the recorded approval must
    /// match the stored digest.
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] from any other status (including a
    /// non-retryable failure), [`Error::NotFound`], storage errors.
    pub fn mark_executing(&self, id: &ExecutionId) -> Result<Ticket> {
        let now = self.now();
        self.write(Durability::Full, |dao| {
            let rec = load(dao, id)?;
            let transition = match rec.status {
                ExecutionStatus::Prepared if rec.requires_approval => {
                    return Err(Error::InvalidTransition {
                        execution_id: id.clone(),
                        from: rec.status,
                        transition: Transition::Start,
                    })
                }
                ExecutionStatus::FailedBeforeCommit if rec.retryable != Some(true) => {
                    return Err(Error::InvalidTransition {
                        execution_id: id.clone(),
                        from: rec.status,
                        transition: Transition::Retry,
                    })
                }
                ExecutionStatus::FailedBeforeCommit => Transition::Retry,
                _ => Transition::Start,
            };
            if rec.requires_approval && dao.approval(id, &rec.args_digest)?.is_none() {
                return Err(Error::InvalidTransition {
                    execution_id: id.clone(),
                    from: rec.status,
                    transition,
                });
            }
            self.start_attempt(dao, &rec, transition, now)
        })
    }

    /// Makes the downstream's id for the effect durable as soon as it is
    /// known (before the result), so reconciliation can find the effect.
    ///
    /// # Errors
    /// [`Error::AlreadyCommitted`] when a different external id is stored;
    /// [`Error::NotFound`]; storage errors.
    pub fn record_external_id(&self, id: &ExecutionId, external_id: &str) -> Result<()> {
        let now = self.now();
        self.write(Durability::Full, |dao| {
            load(dao, id)?;
            if dao.set_external_id(id, external_id, now)? {
                Ok(())
            } else {
                Err(Error::AlreadyCommitted(id.clone()))
            }
        })
    }

    /// Extends this session's lease on an `executing` row (call during long
    /// tool runs). Returns false if the row is no longer ours.
    ///
    /// # Errors
    /// Storage errors.
    pub fn renew_lease(&self, id: &ExecutionId) -> Result<bool> {
        let now = self.now();
        let deadline = self.lease_deadline(now);
        self.write(Durability::Lazy, |dao| {
            Ok(dao.renew_lease(id, self.session_id(), deadline)?)
        })
    }

    /// Commits the side effect's result: durable before it goes to the model.
    /// Accepted from `executing` and `outcome_unknown` (the truth arrived
    /// late). Committing the identical result again is a no-op; a different
    /// one is refused and the stored one stands. If the operation was
    /// cancelled meanwhile, it becomes `cancelled_after_side_effect`.
    ///
    /// # Errors
    /// [`Error::Json`] for a result that is not JSON, [`Error::AlreadyCommitted`],
    /// [`Error::InvalidTransition`], [`Error::NotFound`], storage errors.
    pub fn commit(
        &self,
        id: &ExecutionId,
        result_json: &str,
        external_id: Option<&str>,
    ) -> Result<StoredResult> {
        canonicalize(result_json, &self.config.json_limits)?;
        self.commit_valid(id, result_json, external_id)
    }

    /// [`Ledger::commit`] for a result already checked against the JSON
    /// limits (the executor's `storable_result` always yields one), so the
    /// hot path does not parse it twice.
    pub(crate) fn commit_valid(
        &self,
        id: &ExecutionId,
        result_json: &str,
        external_id: Option<&str>,
    ) -> Result<StoredResult> {
        let now = self.now();
        let (stored, attempt) = self.write(Durability::Full, |dao| {
            let rec = load(dao, id)?;
            let stored = self.commit_in(dao, &rec, result_json, external_id, now)?;
            Ok((stored, rec.attempt_count))
        })?;
        self.remember_commit(id, attempt);
        Ok(stored)
    }

    pub(super) fn commit_in(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        result_json: &str,
        external_id: Option<&str>,
        now: i64,
    ) -> Result<StoredResult> {
        if rec.status.is_committed() {
            let same_result = rec.result_json.as_deref() == Some(result_json);
            let same_ext = external_id.is_none() || rec.external_id.as_deref() == external_id;
            return if same_result && same_ext {
                Ok(stored(rec))
            } else {
                Err(Error::AlreadyCommitted(rec.execution_id.clone()))
            };
        }
        if let (Some(old), Some(new)) = (rec.external_id.as_deref(), external_id) {
            if old != new {
                return Err(Error::AlreadyCommitted(rec.execution_id.clone()));
            }
        }
        self.step(
            dao,
            rec,
            Transition::Commit,
            StatusFields {
                result_json: Some(result_json),
                external_id,
                ..StatusFields::default()
            },
            now,
        )?;
        if dao.operation_status(&rec.operation_id)? == Some(OperationStatus::Cancelled) {
            dao.set_operation_status(
                &rec.operation_id,
                OperationStatus::CancelledAfterSideEffect,
                now,
            )?;
        }
        Ok(StoredResult {
            execution_id: rec.execution_id.clone(),
            result_json: result_json.to_owned(),
            external_id: external_id
                .map(str::to_owned)
                .or_else(|| rec.external_id.clone()),
        })
    }

    /// Records that the attempt provably did not commit (the downstream
    /// refused it, or it never left). `retryable` decides whether the next
    /// `begin` runs it again under the same key.
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] unless `executing`; [`Error::NotFound`].
    pub fn fail_before_commit(
        &self,
        id: &ExecutionId,
        reason: &str,
        retryable: bool,
    ) -> Result<()> {
        let now = self.now();
        self.write(Durability::Full, |dao| {
            let rec = load(dao, id)?;
            self.step(
                dao,
                &rec,
                Transition::FailBeforeCommit,
                StatusFields {
                    reason: Some(reason),
                    retryable: Some(retryable),
                    ..StatusFields::default()
                },
                now,
            )?;
            Ok(())
        })
    }

    /// Records that the request may have reached the downstream (timeout,
    /// dropped connection). Leaves only through reconciliation.
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] unless `executing`; [`Error::NotFound`].
    pub fn mark_outcome_unknown(&self, id: &ExecutionId, reason: &str) -> Result<()> {
        let now = self.now();
        self.write(Durability::Full, |dao| {
            let rec = load(dao, id)?;
            self.step(
                dao,
                &rec,
                Transition::MarkUnknown,
                StatusFields {
                    reason: Some(reason),
                    ..StatusFields::default()
                },
                now,
            )?;
            Ok(())
        })
    }

    /// Resolves an `outcome_unknown` execution: commit what was found, retry
    /// under the same key, or record it as failed.
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] unless `outcome_unknown` (a committed one
    /// is never changed), [`Error::Json`] for a found result that is not JSON.
    pub fn resolve_unknown(&self, id: &ExecutionId, resolution: Resolution) -> Result<Resolved> {
        if let Resolution::Found { result_json, .. } = &resolution {
            canonicalize(result_json, &self.config.json_limits)?;
        }
        let now = self.now();
        self.write(Durability::Full, |dao| {
            let rec = load(dao, id)?;
            if rec.status != ExecutionStatus::OutcomeUnknown {
                return Err(Error::InvalidTransition {
                    execution_id: id.clone(),
                    from: rec.status,
                    transition: match resolution {
                        Resolution::Found { .. } => Transition::Commit,
                        Resolution::NotFoundRetry => Transition::Retry,
                        Resolution::NotFoundAbandon { .. } => Transition::FailBeforeCommit,
                    },
                });
            }
            match &resolution {
                Resolution::Found {
                    result_json,
                    external_id,
                } => Ok(Resolved::Committed(self.commit_in(
                    dao,
                    &rec,
                    result_json,
                    external_id.as_deref(),
                    now,
                )?)),
                Resolution::NotFoundRetry => Ok(Resolved::Retry(self.start_attempt(
                    dao,
                    &rec,
                    Transition::Retry,
                    now,
                )?)),
                Resolution::NotFoundAbandon { reason } => {
                    self.step(
                        dao,
                        &rec,
                        Transition::FailBeforeCommit,
                        StatusFields {
                            reason: Some(reason),
                            retryable: Some(false),
                            ..StatusFields::default()
                        },
                        now,
                    )?;
                    Ok(Resolved::Failed)
                }
            }
        })
    }

    /// Marks results as handed to the model. Lazy: the marks are checked
    /// now (one read) and written with the next write of this ledger — the
    /// next `begin` or `commit` carries them in its own transaction, at no
    /// extra sync —, or by a lazy write before any read that reports statuses
    /// ([`Ledger::get`], [`Ledger::list`], [`Ledger::recover`], …), by
    /// [`Ledger::suspend`], or when the ledger is dropped. Losing them (the
    /// process dies first) only replays the stored result. Already-delivered
    /// ids are skipped.
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
        let marks = self.store.read(|dao| {
            let mut marks = Vec::with_capacity(ids.len());
            for id in ids {
                let (status, attempt) = dao
                    .status_and_attempt(id)?
                    .ok_or_else(|| Error::NotFound(id.clone()))?;
                if status != ExecutionStatus::ResultDelivered {
                    check_transition(status, Transition::Deliver)
                        .map_err(|e| Error::transition(id, e))?;
                    marks.push(DeliveryMark {
                        execution_id: id.clone(),
                        attempt,
                        at_ms: now,
                    });
                }
            }
            Ok::<_, Error>(marks)
        })?;
        self.queue_deliveries(marks)
    }

    /// Cancels one execution if nothing can have reached the downstream.
    ///
    /// # Errors
    /// [`Error::NotFound`], storage errors.
    pub fn cancel(&self, id: &ExecutionId) -> Result<CancelOutcome> {
        let now = self.now();
        self.write(Durability::Full, |dao| {
            let rec = load(dao, id)?;
            self.cancel_in(dao, &rec, now)
        })
    }

    fn cancel_in(&self, dao: &Dao<'_>, rec: &ExecutionRecord, now: i64) -> Result<CancelOutcome> {
        use ExecutionStatus as S;
        Ok(match rec.status {
            S::Prepared | S::Approved | S::FailedBeforeCommit => {
                self.step(
                    dao,
                    rec,
                    Transition::Cancel,
                    StatusFields {
                        reason: Some("cancelled"),
                        ..StatusFields::default()
                    },
                    now,
                )?;
                CancelOutcome::Cancelled
            }
            S::Committed | S::ResultDelivered => CancelOutcome::AlreadyCommitted,
            S::Executing | S::OutcomeUnknown => CancelOutcome::NotCancellable,
            S::Rejected | S::CancelledBeforeCommit => CancelOutcome::AlreadyFinal,
        })
    }

    /// Cancels an operation: every execution that cannot have run is
    /// cancelled; no new call is begun in it. If any execution committed the
    /// operation becomes `cancelled_after_side_effect` (the effect stays; undo
    /// it with [`Ledger::compensate`]); executions still running keep their
    /// status and move the operation there if they commit later.
    ///
    /// # Errors
    /// Storage errors.
    pub fn cancel_operation(&self, op: &OperationId) -> Result<OperationStatus> {
        let now = self.now();
        self.write(Durability::Full, |dao| {
            dao.ensure_operation(op, now)?;
            let mut committed = false;
            for rec in dao.executions_of(op)? {
                committed |= self.cancel_in(dao, &rec, now)? == CancelOutcome::AlreadyCommitted;
            }
            let status = if committed {
                OperationStatus::CancelledAfterSideEffect
            } else {
                OperationStatus::Cancelled
            };
            dao.set_operation_status(op, status, now)?;
            Ok(status)
        })
    }

    /// Marks an operation completed (no more calls will be begun in it).
    ///
    /// # Errors
    /// Storage errors.
    pub fn complete_operation(&self, op: &OperationId) -> Result<()> {
        let now = self.now();
        self.write(Durability::Lazy, |dao| {
            if dao.ensure_operation(op, now)? == OperationStatus::Open {
                dao.set_operation_status(op, OperationStatus::Completed, now)?;
            }
            Ok(())
        })
    }
}

fn check_digest(rec: &ExecutionRecord, digest: &ArgsDigest) -> Result<()> {
    if &rec.args_digest == digest {
        Ok(())
    } else {
        Err(Error::DigestMismatch {
            execution_id: rec.execution_id.clone(),
            stored: rec.args_digest.clone(),
            given: digest.clone(),
        })
    }
}

fn stored(rec: &ExecutionRecord) -> StoredResult {
    StoredResult {
        execution_id: rec.execution_id.clone(),
        result_json: rec.result_json.clone().unwrap_or_default(),
        external_id: rec.external_id.clone(),
    }
}
