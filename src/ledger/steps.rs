//! The steps after `begin`: approval, execution, commit, failure, unknown
//! outcomes and their resolution, cancellation.
//!
//! Each step is one transaction that re-reads the record, checks the move
//! against the transition table and writes it with the transition log entry.
//! The steps of an attempt name it ([`AttemptId`]): the store applies them
//! only while the execution is still at that attempt, owned by this session
//! (`resolve_unknown`, which any session or the app may call, checks the
//! attempt only). A stale attempt changes nothing; what it carried is kept as
//! evidence and it gets [`Error::StaleAttempt`].

use super::answers::{AttemptId, CancelOutcome, Resolution, Resolved, StoredResult, Ticket};
use super::{CommitSync, Downstream, Error, Ledger, Result};
use crate::model::canonical::validate;
use crate::model::text::check_foreign_id;
use crate::model::{
    ArgsDigest, ExecutionId, ExecutionRecord, ExecutionStatus, Monotonic, Move, OperationId,
    OperationStatus, Transition,
};
use crate::store::{Dao, Durability, Evidence, EvidenceKind, StatusFields};

pub(super) fn load(dao: &Dao<'_>, id: &ExecutionId) -> Result<ExecutionRecord> {
    dao.execution(id)?
        .ok_or_else(|| Error::NotFound(id.clone()))
}

/// What a fenced step wants written, for the evidence if it is stale.
#[derive(Default)]
pub(super) struct Carried<'a> {
    pub(super) result_json: Option<&'a str>,
    pub(super) external_id: Option<&'a str>,
    pub(super) reason: Option<&'a str>,
    pub(super) item_index: Option<u32>,
}

/// The result of a step whose transaction must commit even when it refuses
/// (the evidence of a stale attempt is written, the refusal returned).
pub(super) enum Fenced<T> {
    Done(T),
    Refused(Error),
}

impl Ledger {
    /// Runs a write whose closure may refuse after writing evidence.
    pub(super) fn write_fenced<T>(
        &self,
        f: impl FnOnce(&Dao<'_>) -> Result<Fenced<T>>,
    ) -> Result<T> {
        match self.write(Durability::Full, f)? {
            Fenced::Done(v) => Ok(v),
            Fenced::Refused(e) => Err(e),
        }
    }

    /// `None` when `attempt` is the current attempt of `rec` (and, with
    /// `own`, this session's); otherwise writes what the stale attempt
    /// carried as evidence and returns the refusal.
    pub(super) fn check_fence(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        attempt: &AttemptId,
        own: bool,
        kind: EvidenceKind,
        carried: &Carried<'_>,
        now: i64,
    ) -> Result<Option<Error>> {
        if attempt.attempt == 0 || attempt.attempt > rec.attempt_count {
            // Not an attempt this execution ever had: bad input, not a
            // stale attempt (nothing is kept as evidence).
            return Err(Error::NoSuchAttempt {
                execution_id: rec.execution_id.clone(),
                attempt: attempt.attempt,
                current_attempt: rec.attempt_count,
            });
        }
        let current = rec.attempt_count == attempt.attempt
            && (!own || rec.owner_session.as_ref() == Some(self.session_id()));
        if current {
            return Ok(None);
        }
        dao.insert_evidence(
            &rec.execution_id,
            &Evidence {
                attempt: attempt.attempt,
                session: self.session_id(),
                kind,
                result_json: carried.result_json,
                external_id: carried.external_id,
                reason: carried.reason,
                item_index: carried.item_index,
                at_ms: now,
            },
        )?;
        let note = format!(
            "stale attempt {} ({}): kept as evidence",
            attempt.attempt,
            kind.as_str()
        );
        dao.append_note(
            &rec.execution_id,
            "stale_attempt",
            rec.status,
            attempt.attempt,
            self.session_id(),
            &note,
            now,
        )?;
        if kind.is_effect() {
            effect_in_operation(dao, &rec.operation_id, now)?;
        }
        Ok(Some(Error::StaleAttempt {
            execution_id: rec.execution_id.clone(),
            attempt: attempt.attempt,
            current_attempt: rec.attempt_count,
            status: rec.status,
        }))
    }

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
            validate(preview, &self.config.json_limits)?;
        }
        let now = self.now();
        self.write(Durability::Full, |dao| {
            let rec = load(dao, id)?;
            check_digest(&rec, digest)?;
            self.step(
                dao,
                &rec,
                Transition::Approve,
                None,
                StatusFields::default(),
                now,
            )?;
            dao.record_approval(id, digest, true, preview_json, now)?;
            Ok(())
        })
    }

    /// True when execution `id` was approved for exactly `digest` (its
    /// approval is recorded), whatever its status now.
    ///
    /// # Errors
    /// Storage errors.
    pub(crate) fn was_approved(&self, id: &ExecutionId, digest: &ArgsDigest) -> Result<bool> {
        self.read(|dao| Ok(dao.approval(id, digest)?.is_some()))
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
                None,
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
    /// match the stored digest. Nothing starts in a cancelled operation: the
    /// execution is cancelled instead (or, for a batch whose items
    /// committed, recorded as the partial commit it is).
    ///
    /// # Errors
    /// [`Error::OperationCancelled`]; [`Error::InvalidTransition`] from any
    /// other status (including a non-retryable failure), [`Error::NotFound`],
    /// storage errors.
    pub fn mark_executing(&self, id: &ExecutionId) -> Result<Ticket> {
        let now = self.now();
        self.write_fenced(|dao| {
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
            if op_cancelled(dao, &rec.operation_id)? {
                self.cancel_in(dao, &rec, now)?;
                return Ok(Fenced::Refused(Error::OperationCancelled(id.clone())));
            }
            Ok(Fenced::Done(
                self.start_attempt(dao, &rec, transition, now)?,
            ))
        })
    }

    /// Makes the downstream's id for the effect durable as soon as it is
    /// known (before the result), so reconciliation can find the effect.
    ///
    /// # Errors
    /// [`Error::StaleAttempt`] (the id is kept as evidence);
    /// [`Error::AlreadyCommitted`] when a different external id is stored;
    /// [`Error::NotFound`]; storage errors.
    pub fn record_external_id(&self, attempt: &AttemptId, external_id: &str) -> Result<()> {
        check_foreign_id("external id", external_id).map_err(Error::Id)?;
        let now = self.now();
        self.write_fenced(|dao| {
            let rec = load(dao, &attempt.execution_id)?;
            let carried = Carried {
                external_id: Some(external_id),
                ..Carried::default()
            };
            if let Some(stale) = self.check_fence(
                dao,
                &rec,
                attempt,
                true,
                EvidenceKind::ExternalId,
                &carried,
                now,
            )? {
                return Ok(Fenced::Refused(stale));
            }
            if dao.set_external_id(&attempt.execution_id, external_id, now)? {
                Ok(Fenced::Done(()))
            } else {
                Err(Error::AlreadyCommitted(attempt.execution_id.clone()))
            }
        })
    }

    /// Commits the side effect's result: durable before it goes to the model.
    /// Accepted from `executing` and, for the same attempt, from
    /// `outcome_unknown` (the truth arrived late). Committing the identical
    /// result again is a no-op; a different one is refused, the stored one
    /// stands and the refused one is kept as evidence. If the operation was cancelled meanwhile, it becomes
    /// `cancelled_after_side_effect`.
    ///
    /// # Errors
    /// [`Error::StaleAttempt`] when `attempt` is no longer the execution's
    /// (its result is kept as evidence); [`Error::Json`] for a result that is
    /// not JSON, [`Error::AlreadyCommitted`], [`Error::InvalidTransition`],
    /// [`Error::NotFound`], storage errors.
    pub fn commit(
        &self,
        attempt: &AttemptId,
        result_json: &str,
        external_id: Option<&str>,
    ) -> Result<StoredResult> {
        if let Some(external_id) = external_id {
            check_foreign_id("external id", external_id).map_err(Error::Id)?;
        }
        validate(result_json, &self.config.json_limits)?;
        self.commit_valid(attempt, result_json, external_id, None)
    }

    /// [`Ledger::commit`] for a result already checked against the JSON
    /// limits (the executor's `storable_result` always yields one), so the
    /// hot path does not parse it twice. `downstream` is what the tool
    /// declares (the executor knows it from the tool's descriptor); `None`:
    /// what the call's [`super::CallSpec::downstream`] declared when it was
    /// begun through this ledger, and durable when it was not. The policy
    /// ([`super::DeferredCommits::commit_sync`]) counts a key's life from
    /// the `begin` of the execution's first attempt when this ledger handed
    /// it out, and takes it as unknown otherwise. A stale attempt's evidence
    /// is always made durable.
    pub(crate) fn commit_valid(
        &self,
        attempt: &AttemptId,
        result_json: &str,
        external_id: Option<&str>,
        downstream: Option<&Downstream>,
    ) -> Result<StoredResult> {
        let begun = self.take_begun(attempt);
        let declared = downstream.copied().or(begun.map(|b| b.downstream));
        let sync = match declared {
            Some(d) => self
                .config
                .deferred_commits
                .commit_sync(&d, begun.and_then(|b| b.key_age)),
            None => CommitSync::Now,
        };
        let durability = match sync {
            CommitSync::Now => Durability::Full,
            CommitSync::Deferred => Durability::Deferred,
        };
        let now = self.now();
        let stored = self.write(durability, |dao| {
            // The usual case in one statement: this session's running
            // attempt commits (the general path below explains every other).
            let mv = Move::check(ExecutionStatus::Executing, Transition::Commit)
                .map_err(|e| Error::transition(&attempt.execution_id, e))?;
            if dao.commit_running(
                &attempt.execution_id,
                mv,
                attempt.attempt,
                self.session_id(),
                result_json,
                external_id,
                now,
            )? {
                return Ok(Fenced::Done(StoredResult {
                    execution_id: attempt.execution_id.clone(),
                    result_json: result_json.to_owned(),
                    external_id: external_id.map(str::to_owned),
                    partial: false,
                }));
            }
            let rec = load(dao, &attempt.execution_id)?;
            if self.own_open_failure(dao, &rec, attempt)? {
                // This session's attempt, recorded as failed before commit
                // (retryable) and now reported done: the effect happened. No
                // attempt of it is running, and the next one would send it
                // again.
                return Ok(Fenced::Done(self.commit_over_failure(
                    dao,
                    &rec,
                    attempt.attempt,
                    result_json,
                    external_id,
                    now,
                )?));
            }
            let carried = Carried {
                result_json: Some(result_json),
                external_id,
                ..Carried::default()
            };
            if let Some(stale) = self.check_fence(
                dao,
                &rec,
                attempt,
                true,
                EvidenceKind::Commit,
                &carried,
                now,
            )? {
                return Ok(Fenced::Refused(stale));
            }
            if rec.status.is_committed() && !same_effect(&rec, &carried) {
                // Committed meanwhile by another hand (a job's webhook, a
                // resolver) with another result: the stored one stands, and
                // what this attempt reported is kept, never dropped.
                self.keep_found_after_settled(dao, &rec, attempt.attempt, &carried, now)?;
                return Ok(Fenced::Refused(Error::AlreadyCommitted(
                    rec.execution_id.clone(),
                )));
            }
            if settled_without_effect(rec.status) {
                // Settled as absent while this attempt's request was out (a
                // "not found" in a cancelled operation, an abandon): its
                // effect happened after all. The settled status stands and
                // the effect is kept as evidence, never dropped (a cancelled
                // operation becomes `cancelled_after_side_effect`), as for a
                // lookup that finds it.
                self.keep_found_after_settled(dao, &rec, attempt.attempt, &carried, now)?;
                return Ok(Fenced::Refused(Error::InvalidTransition {
                    execution_id: rec.execution_id.clone(),
                    from: rec.status,
                    transition: Transition::Commit,
                }));
            }
            let fence = (attempt, true);
            Ok(Fenced::Done(self.commit_in(
                dao,
                &rec,
                Some(fence),
                result_json,
                external_id,
                false,
                now,
            )?))
        })?;
        let stored = match stored {
            Fenced::Done(stored) => stored,
            Fenced::Refused(e) => {
                if durability == Durability::Deferred {
                    // The evidence may be the only trace of the effect.
                    self.sync()?;
                }
                return Err(e);
            }
        };
        self.remember_commit(&attempt.execution_id, attempt.attempt);
        Ok(stored)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn commit_in(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        fence: Option<(&AttemptId, bool)>,
        result_json: &str,
        external_id: Option<&str>,
        partial: bool,
        now: i64,
    ) -> Result<StoredResult> {
        if rec.status.is_committed() {
            let same_result = rec.result_json.as_deref() == Some(result_json);
            let same_ext = external_id.is_none() || rec.external_id.as_deref() == external_id;
            return if same_result && same_ext {
                Ok(StoredResult::of(rec))
            } else {
                Err(Error::AlreadyCommitted(rec.execution_id.clone()))
            };
        }
        if let (Some(old), Some(new)) = (rec.external_id.as_deref(), external_id) {
            if old != new {
                return Err(Error::AlreadyCommitted(rec.execution_id.clone()));
            }
        }
        let transition = if rec.status == ExecutionStatus::FailedBeforeCommit {
            Transition::SettlePartial
        } else {
            Transition::Commit
        };
        self.step(
            dao,
            rec,
            transition,
            fence,
            StatusFields {
                result_json: Some(result_json),
                external_id,
                partial,
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
            partial,
        })
    }

    /// Records that the attempt provably did not commit (the downstream
    /// refused it, or it never left). `retryable` decides whether the next
    /// `begin` runs it again under the same key.
    ///
    /// # Errors
    /// [`Error::StaleAttempt`]; [`Error::InvalidTransition`] unless
    /// `executing`; [`Error::NotFound`].
    pub fn fail_before_commit(
        &self,
        attempt: &AttemptId,
        reason: &str,
        retryable: bool,
    ) -> Result<()> {
        let now = self.now();
        self.write_fenced(|dao| {
            let rec = load(dao, &attempt.execution_id)?;
            let carried = Carried {
                reason: Some(reason),
                ..Carried::default()
            };
            if let Some(stale) =
                self.check_fence(dao, &rec, attempt, true, EvidenceKind::Fail, &carried, now)?
            {
                return Ok(Fenced::Refused(stale));
            }
            self.fail_step(dao, &rec, attempt, reason, retryable, now)?;
            Ok(Fenced::Done(()))
        })
    }

    /// Inside a write transaction: moves `attempt` (the current attempt of
    /// `rec`, this session's) to failed before commit.
    pub(super) fn fail_step(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        attempt: &AttemptId,
        reason: &str,
        retryable: bool,
        now: i64,
    ) -> Result<()> {
        self.step(
            dao,
            rec,
            Transition::FailBeforeCommit,
            Some((attempt, true)),
            StatusFields {
                reason: Some(reason),
                retryable: Some(retryable),
                ..StatusFields::default()
            },
            now,
        )?;
        Ok(())
    }

    /// Records that the request may have reached the downstream (timeout,
    /// dropped connection). Leaves only through reconciliation. Returns when
    /// (boot clock) the outcome became unknown: a lookup's "not found" only
    /// counts once the tool's landing window has passed since then.
    ///
    /// # Errors
    /// [`Error::StaleAttempt`]; [`Error::InvalidTransition`] unless
    /// `executing`; [`Error::NotFound`].
    pub fn mark_outcome_unknown(&self, attempt: &AttemptId, reason: &str) -> Result<Monotonic> {
        self.mark_unknown_as(attempt, reason, EvidenceKind::Unknown)
    }

    /// [`Ledger::mark_outcome_unknown`] for a job the attempt started under
    /// an id the ledger refuses (empty, too long): nothing can follow it, so
    /// its outcome is unknown; a stale attempt's report is kept as evidence
    /// of a job, an effect (as [`Ledger::record_job`] keeps it).
    pub(crate) fn mark_job_unfollowable(
        &self,
        attempt: &AttemptId,
        reason: &str,
    ) -> Result<Monotonic> {
        self.mark_unknown_as(attempt, reason, EvidenceKind::Job)
    }

    fn mark_unknown_as(
        &self,
        attempt: &AttemptId,
        reason: &str,
        stale_kind: EvidenceKind,
    ) -> Result<Monotonic> {
        let now = self.now();
        let mono = self.clock.monotonic();
        self.write_fenced(|dao| {
            let rec = load(dao, &attempt.execution_id)?;
            let carried = Carried {
                reason: Some(reason),
                ..Carried::default()
            };
            if let Some(stale) =
                self.check_fence(dao, &rec, attempt, true, stale_kind, &carried, now)?
            {
                return Ok(Fenced::Refused(stale));
            }
            self.step(
                dao,
                &rec,
                Transition::MarkUnknown,
                Some((attempt, true)),
                StatusFields {
                    reason: Some(reason),
                    unknown_since: Some(&mono),
                    ..StatusFields::default()
                },
                now,
            )?;
            Ok(Fenced::Done(mono.clone()))
        })
    }

    /// Resolves attempt `attempt`'s unknown outcome: commit what was found,
    /// retry under the same key, or record it as failed. Any session (or the
    /// app, after asking the user) may resolve; the attempt must still be the
    /// execution's current one. A retry never starts in a cancelled
    /// operation (it is recorded as cancelled), and a batch whose items
    /// committed is never recorded as failed (it is the partial commit it is).
    ///
    /// # Errors
    /// [`Error::StaleAttempt`]; [`Error::InvalidTransition`] unless
    /// `outcome_unknown` (a committed one is never changed), [`Error::Json`]
    /// for a found result that is not JSON.
    pub fn resolve_unknown(&self, attempt: &AttemptId, resolution: Resolution) -> Result<Resolved> {
        if let Resolution::Found {
            external_id: Some(external_id),
            ..
        } = &resolution
        {
            check_foreign_id("external id", external_id).map_err(Error::Id)?;
        }
        self.resolve(attempt, resolution, true)
    }

    /// A same-key resend of attempt `attempt`'s unknown outcome, which
    /// nothing proved absent (the downstream dedupes by the key, so the
    /// resend is safe while the earlier request may have landed): the next
    /// attempt, as [`Resolution::NotFoundRetry`] starts it, except in a
    /// cancelled operation. There nothing may be sent, and nothing says the
    /// earlier request did not take effect, so it is refused with
    /// [`Error::OperationCancelled`] and nothing is written: the outcome
    /// stays unknown (the operation `cancelled_after_side_effect`) for a
    /// lookup or the app to settle. (Taken as `NotFoundRetry`, a
    /// cancellation between the executor's check and the resend recorded
    /// the call `cancelled_before_commit`, "not found downstream", and the
    /// operation plain `cancelled`, with the effect made.)
    pub(crate) fn resend_unknown(&self, attempt: &AttemptId) -> Result<Resolved> {
        self.resolve(attempt, Resolution::NotFoundRetry, false)
    }

    /// [`Ledger::resolve_unknown`]; `proven`: a `NotFoundRetry` stands on
    /// proof of absence (else it is a resend in doubt, `resend_unknown`).
    fn resolve(
        &self,
        attempt: &AttemptId,
        resolution: Resolution,
        proven: bool,
    ) -> Result<Resolved> {
        if let Resolution::Found { result_json, .. } = &resolution {
            validate(result_json, &self.config.json_limits)?;
        }
        let now = self.now();
        let id = &attempt.execution_id;
        self.write_fenced(|dao| {
            let rec = load(dao, id)?;
            let carried = match &resolution {
                Resolution::Found {
                    result_json,
                    external_id,
                } => Carried {
                    result_json: Some(result_json),
                    external_id: external_id.as_deref(),
                    ..Carried::default()
                },
                _ => Carried::default(),
            };
            let kind = match resolution {
                Resolution::Found { .. } => EvidenceKind::Commit,
                _ => EvidenceKind::Fail,
            };
            if let Some(stale) = self.check_fence(dao, &rec, attempt, false, kind, &carried, now)? {
                return Ok(Fenced::Refused(stale));
            }
            if rec.status != ExecutionStatus::OutcomeUnknown {
                let refusal = Error::InvalidTransition {
                    execution_id: id.clone(),
                    from: rec.status,
                    transition: match resolution {
                        Resolution::Found { .. } => Transition::Commit,
                        Resolution::NotFoundRetry => Transition::Retry,
                        Resolution::NotFoundAbandon { .. } => Transition::FailBeforeCommit,
                    },
                };
                if let (
                    Resolution::Found {
                        result_json,
                        external_id,
                    },
                    true,
                ) = (&resolution, self.own_open_failure(dao, &rec, attempt)?)
                {
                    // Found for a call recorded as failed (retryable): the
                    // effect happened; sent again it would happen twice.
                    return Ok(Fenced::Done(Resolved::Committed(
                        self.commit_over_failure(
                            dao,
                            &rec,
                            attempt.attempt,
                            result_json,
                            external_id.as_deref(),
                            now,
                        )?,
                    )));
                }
                if kind == EvidenceKind::Commit && settled_without_effect(rec.status) {
                    // An effect found after the call was settled as absent
                    // (another resolver's "not found"): refused, and kept.
                    self.keep_found_after_settled(dao, &rec, attempt.attempt, &carried, now)?;
                    return Ok(Fenced::Refused(refusal));
                }
                if kind == EvidenceKind::Commit
                    && rec.status.is_committed()
                    && !same_effect(&rec, &carried)
                {
                    // Committed meanwhile by another resolver with another
                    // result (another external id): refused, and kept.
                    self.keep_found_after_settled(dao, &rec, attempt.attempt, &carried, now)?;
                    return Ok(Fenced::Refused(refusal));
                }
                return Err(refusal);
            }
            let fence = Some((attempt, false));
            let resolved = match &resolution {
                Resolution::Found {
                    result_json,
                    external_id,
                } => Resolved::Committed(self.commit_in(
                    dao,
                    &rec,
                    fence,
                    result_json,
                    external_id.as_deref(),
                    false,
                    now,
                )?),
                Resolution::NotFoundRetry if op_cancelled(dao, &rec.operation_id)? => {
                    if !proven {
                        // Nothing written: the outcome stays unknown.
                        return Err(Error::OperationCancelled(id.clone()));
                    }
                    self.end_not_found(dao, &rec, "not found downstream after cancellation", now)?
                }
                Resolution::NotFoundRetry => {
                    Resolved::Retry(self.start_attempt(dao, &rec, Transition::Retry, now)?)
                }
                Resolution::NotFoundAbandon { reason } => {
                    self.end_not_found(dao, &rec, reason, now)?
                }
            };
            Ok(Fenced::Done(resolved))
        })
    }

    /// Is `rec` an [`open_failure`] at `attempt`, its last attempt, which this
    /// session ran, or whose owner is dead (the app reopened the ledger)?
    /// Then a report of that attempt's effect (the caller's answer changed:
    /// a 503, then the backend's own "done") is the truth about the only
    /// attempt there is, and nobody can be running it: it is committed. A
    /// report of a live other session's attempt is checked by the fence as
    /// before (kept as evidence).
    fn own_open_failure(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        attempt: &AttemptId,
    ) -> Result<bool> {
        if attempt.attempt != rec.attempt_count || !open_failure(dao, rec)? {
            return Ok(false);
        }
        if rec.owner_session.as_ref() == Some(self.session_id()) {
            return Ok(true);
        }
        let mono = self.clock().monotonic();
        Ok(matches!(
            self.liveness_of(dao, rec.owner_session.as_ref(), &mono)?,
            super::owners::Liveness::Dead(_)
        ))
    }

    /// Inside a write transaction: commits `result_json` (and `external_id`)
    /// for `rec`, a retryable failure before commit ([`open_failure`]), when
    /// attempt `attempt` reported or showed its effect after all (this
    /// session's late report of the same attempt, its lookup, the job's own
    /// report). Sending it again would make a second effect; the log says
    /// which attempt it was.
    pub(super) fn commit_over_failure(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        attempt: u32,
        result_json: &str,
        external_id: Option<&str>,
        now: i64,
    ) -> Result<StoredResult> {
        self.step(
            dao,
            rec,
            Transition::Commit,
            None,
            StatusFields {
                result_json: Some(result_json),
                external_id,
                ..StatusFields::default()
            },
            now,
        )?;
        let note = format!(
            "attempt {attempt} made its effect after the call was recorded as failed before \
             commit (retryable): committed, not sent again"
        );
        dao.append_note(
            &rec.execution_id,
            "effect_after_failure",
            ExecutionStatus::Committed,
            attempt,
            self.session_id(),
            &note,
            now,
        )?;
        effect_in_operation(dao, &rec.operation_id, now)?;
        Ok(StoredResult {
            execution_id: rec.execution_id.clone(),
            result_json: result_json.to_owned(),
            external_id: external_id
                .map(str::to_owned)
                .or_else(|| rec.external_id.clone()),
            partial: false,
        })
    }

    /// Inside a write transaction: keeps what `carried` says was found
    /// downstream (a result, an external id; a batch item's, with its index)
    /// as evidence of attempt `attempt` of `rec`, which was already settled
    /// without it (committed with another result, failed,
    /// cancelled or rejected), with a note in its log. An execution with
    /// evidence is never pruned.
    pub(super) fn keep_found_after_settled(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        attempt: u32,
        carried: &Carried<'_>,
        now: i64,
    ) -> Result<()> {
        dao.insert_evidence(
            &rec.execution_id,
            &Evidence {
                attempt,
                session: self.session_id(),
                kind: if carried.item_index.is_some() {
                    EvidenceKind::BatchItem
                } else {
                    EvidenceKind::Commit
                },
                result_json: carried.result_json,
                external_id: carried.external_id,
                reason: carried.reason,
                item_index: carried.item_index,
                at_ms: now,
            },
        )?;
        let note = format!(
            "effect found after it was settled as {}: kept as evidence",
            rec.status
        );
        dao.append_note(
            &rec.execution_id,
            "found_after_settled",
            rec.status,
            attempt,
            self.session_id(),
            &note,
            now,
        )?;
        effect_in_operation(dao, &rec.operation_id, now)
    }

    /// An unknown outcome found absent, not to be retried: a batch whose
    /// items committed is settled as partial; otherwise failed before commit
    /// and, in a cancelled operation, cancelled.
    fn end_not_found(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        reason: &str,
        now: i64,
    ) -> Result<Resolved> {
        if dao.has_batch_items(&rec.execution_id)? {
            return Ok(Resolved::Partial(self.settle_partial(
                dao,
                rec,
                None,
                Some(reason),
                now,
            )?));
        }
        self.step(
            dao,
            rec,
            Transition::FailBeforeCommit,
            None,
            StatusFields {
                reason: Some(reason),
                retryable: Some(false),
                ..StatusFields::default()
            },
            now,
        )?;
        if op_cancelled(dao, &rec.operation_id)? {
            let failed = load(dao, &rec.execution_id)?;
            self.step(
                dao,
                &failed,
                Transition::Cancel,
                None,
                StatusFields {
                    reason: Some("operation cancelled"),
                    ..StatusFields::default()
                },
                now,
            )?;
            return Ok(Resolved::Cancelled);
        }
        Ok(Resolved::Failed)
    }

    /// Cancels one execution if nothing can have reached the downstream. A
    /// batch whose items committed is recorded as the partial commit it is
    /// (`AlreadyCommitted`).
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

    pub(super) fn cancel_in(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        now: i64,
    ) -> Result<CancelOutcome> {
        use ExecutionStatus as S;
        Ok(match rec.status {
            S::FailedBeforeCommit if dao.has_batch_items(&rec.execution_id)? => {
                let reason = rec.last_reason.clone();
                self.settle_partial(dao, rec, None, reason.as_deref(), now)?;
                CancelOutcome::AlreadyCommitted
            }
            S::Prepared | S::Approved | S::FailedBeforeCommit => {
                self.step(
                    dao,
                    rec,
                    Transition::Cancel,
                    None,
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
    /// cancelled; no new call is begun in it and no attempt starts in it
    /// again. It becomes `cancelled_after_side_effect` as soon as any effect
    /// may exist — an execution committed (or a batch committed some items),
    /// or one is running or has an unknown outcome, or an effect was found
    /// for one settled as absent (kept as evidence); those keep their status
    /// and finish honestly. Undo a committed effect with
    /// [`Ledger::compensate`] in another operation (the compensation's own
    /// turn): nothing begins in a cancelled one, a compensation included.
    ///
    /// # Errors
    /// Storage errors.
    pub fn cancel_operation(&self, op: &OperationId) -> Result<OperationStatus> {
        let now = self.now();
        self.write(Durability::Full, |dao| {
            dao.ensure_operation(op, now)?;
            let mut effect_possible = false;
            for rec in dao.executions_of(op)? {
                let outcome = self.cancel_in(dao, &rec, now)?;
                effect_possible |= matches!(
                    outcome,
                    CancelOutcome::AlreadyCommitted | CancelOutcome::NotCancellable
                ) || dao.has_effect_evidence(&rec.execution_id)?;
            }
            let status = if effect_possible {
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

/// True for the statuses that say a call was settled without an effect
/// (failed before commit, cancelled before commit, rejected): an effect
/// found for it afterwards is kept as evidence.
/// Inside a write transaction: is `rec` a retryable failure before commit
/// of a single call (no batch items)? No attempt of it is running, and the
/// next `begin` or `retry` would send it again, so an effect of it that
/// this session reports, or that its job reports, is committed
/// ([`Ledger::commit_over_failure`]), not only kept as evidence.
pub(super) fn open_failure(dao: &Dao<'_>, rec: &ExecutionRecord) -> Result<bool> {
    Ok(rec.status == ExecutionStatus::FailedBeforeCommit
        && rec.retryable == Some(true)
        && !dao.has_batch_items(&rec.execution_id)?)
}

pub(super) fn settled_without_effect(status: ExecutionStatus) -> bool {
    matches!(
        status,
        ExecutionStatus::FailedBeforeCommit
            | ExecutionStatus::CancelledBeforeCommit
            | ExecutionStatus::Rejected
    )
}

/// Evidence of an effect was kept for an execution of `op`: a cancelled
/// operation is `cancelled_after_side_effect` (it was plain `cancelled` when
/// the execution had been settled as absent before the effect was found).
fn effect_in_operation(dao: &Dao<'_>, op: &OperationId, now: i64) -> Result<()> {
    if dao.operation_status(op)? == Some(OperationStatus::Cancelled) {
        dao.set_operation_status(op, OperationStatus::CancelledAfterSideEffect, now)?;
    }
    Ok(())
}

/// True when what `carried` found is what committed `rec` holds (the same
/// result; the same external id, or none), as `commit_in` judges a repeat.
fn same_effect(rec: &ExecutionRecord, carried: &Carried<'_>) -> bool {
    rec.result_json.as_deref() == carried.result_json
        && (carried.external_id.is_none() || rec.external_id.as_deref() == carried.external_id)
}

/// True when the operation was cancelled.
pub(super) fn op_cancelled(dao: &Dao<'_>, op: &OperationId) -> Result<bool> {
    Ok(matches!(
        dao.operation_status(op)?,
        Some(OperationStatus::Cancelled | OperationStatus::CancelledAfterSideEffect)
    ))
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
