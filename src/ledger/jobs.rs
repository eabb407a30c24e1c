//! Batches, background jobs and webhooks: more than one durable step inside
//! one execution.
//!
//! An independent batch records each item's completion under its own key
//! (`<execution id>#item_<n>`), so a crash after item 3 resumes at item 4. A
//! tool that starts a background job stores the job id at once; later job
//! updates (from polling or a webhook) reconcile into the same execution, and
//! every webhook `(source, event id)` is processed at most once.

use super::answers::{AttemptId, StoredResult};
use super::steps::{load, open_failure, settled_without_effect, Carried, Fenced};
use super::{Error, Ledger, Result};
use crate::model::canonical::{object_array_member, validate, write_json_string};
use crate::model::text::{bounded_reason, check_foreign_id};
use crate::model::{DownstreamKey, ExecutionId, ExecutionRecord, ExecutionStatus, Transition};
use crate::store::{Dao, Durability, EvidenceKind, StatusFields};

/// A state change of a background job, from polling or a webhook.
#[derive(Clone, PartialEq, Eq)]
pub enum JobUpdate {
    /// Still running; `state` is the downstream's label (e.g. "queued").
    Progress {
        /// The downstream's state label.
        state: String,
    },
    /// The job finished and its effect is committed downstream.
    Succeeded {
        /// The result to store and hand to the model.
        result_json: String,
    },
    /// The job failed without committing its effect.
    Failed {
        /// Why (no argument values).
        reason: String,
    },
}

impl std::fmt::Debug for JobUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobUpdate::Progress { state } => write!(f, "Progress({state})"),
            JobUpdate::Succeeded { .. } => f.write_str("Succeeded"),
            JobUpdate::Failed { reason } => write!(f, "Failed({reason})"),
        }
    }
}

/// What applying a job update or webhook did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobApplied {
    /// Recorded progress; the execution is still waiting.
    Progress,
    /// The execution committed with the job's result.
    Committed(StoredResult),
    /// The execution is recorded as failed before commit.
    Failed,
    /// The execution had already reached a final status; nothing changed.
    AlreadyFinal(ExecutionStatus),
    /// This webhook event was processed before; ignored.
    DuplicateEvent,
}

impl Ledger {
    /// Durably records that item `index` of an independent batch committed
    /// downstream. Recording the same item twice keeps the first record.
    /// While the execution is `executing` only its owner may record (the
    /// attempt and the session must match); while its outcome is unknown,
    /// any session reconciling it may (the attempt must match).
    ///
    /// # Errors
    /// [`Error::StaleAttempt`] (the item is kept as evidence);
    /// [`Error::NotFound`], [`Error::Json`] for a result that is not JSON,
    /// [`Error::InvalidTransition`] unless the execution is `executing` or
    /// `outcome_unknown`.
    pub fn record_batch_item(
        &self,
        attempt: &AttemptId,
        index: u32,
        result_json: &str,
        external_id: Option<&str>,
    ) -> Result<bool> {
        if let Some(external_id) = external_id {
            check_foreign_id("external id", external_id).map_err(Error::Id)?;
        }
        validate(result_json, &self.config.json_limits)?;
        let now = self.now();
        let id = &attempt.execution_id;
        self.write_fenced(|dao| {
            let rec = load(dao, id)?;
            let carried = Carried {
                result_json: Some(result_json),
                external_id,
                item_index: Some(index),
                ..Carried::default()
            };
            // A running attempt records its items itself (its owner only);
            // an item found downstream while its outcome is unknown is a
            // fact any reconciler may record (the attempt must match).
            let own = rec.status == ExecutionStatus::Executing;
            if let Some(stale) = self.check_fence(
                dao,
                &rec,
                attempt,
                own,
                EvidenceKind::BatchItem,
                &carried,
                now,
            )? {
                return Ok(Fenced::Refused(stale));
            }
            if !matches!(
                rec.status,
                ExecutionStatus::Executing | ExecutionStatus::OutcomeUnknown
            ) {
                let refusal = Error::InvalidTransition {
                    execution_id: id.clone(),
                    from: rec.status,
                    transition: Transition::Commit,
                };
                if settled_without_effect(rec.status) {
                    // An item found after the batch was settled as absent
                    // (another resolver's "not found"): refused, and kept.
                    self.keep_found_after_settled(dao, &rec, attempt.attempt, &carried, now)?;
                    return Ok(Fenced::Refused(refusal));
                }
                return Err(refusal);
            }
            let key = id.batch_item(index).downstream_key();
            Ok(Fenced::Done(dao.insert_batch_item(
                id,
                index,
                &key,
                result_json,
                external_id,
                now,
            )?))
        })
    }

    /// Commits attempt `attempt` of an independent batch with the results of
    /// its committed items. With `failure` (an item failed for good, or the
    /// operation was cancelled before the next item), the commit is partial:
    /// the result says which items happened and which did not, and why.
    /// While the execution is `executing` only its owner may commit; while
    /// its outcome is unknown (its owner died after recording the items),
    /// any session reconciling it may, for the same attempt: the items are
    /// recorded facts, and so is their combination.
    ///
    /// # Errors
    /// [`Error::StaleAttempt`], [`Error::NotFound`], storage errors.
    pub fn commit_batch(&self, attempt: &AttemptId, failure: Option<&str>) -> Result<StoredResult> {
        let now = self.now();
        let id = &attempt.execution_id;
        self.write_fenced(|dao| {
            let rec = load(dao, id)?;
            let own = rec.status == ExecutionStatus::Executing;
            if let Some(stale) = self.check_fence(
                dao,
                &rec,
                attempt,
                own,
                EvidenceKind::Commit,
                &Carried {
                    reason: failure,
                    ..Carried::default()
                },
                now,
            )? {
                return Ok(Fenced::Refused(stale));
            }
            Ok(Fenced::Done(self.settle_partial(
                dao,
                &rec,
                Some((attempt, own)),
                failure,
                now,
            )?))
        })
    }

    /// Commits a batch execution from its recorded items: `{"items": [...]}`
    /// when every item committed; otherwise a partial commit whose result
    /// also holds `"partial": {"committed": [...], "not_committed": [...],
    /// "reason": ...}` (uncommitted items are `null` in `items`). A result
    /// over the JSON limits keeps the partial summary and drops the item
    /// results (they stay in the batch item records), so it never fails to
    /// commit.
    pub(super) fn settle_partial(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        fence: Option<(&AttemptId, bool)>,
        reason: Option<&str>,
        now: i64,
    ) -> Result<StoredResult> {
        let items = dao.batch_items(&rec.execution_id)?;
        let declared = object_array_member(&rec.args_json, "items", &self.config.json_limits)
            .ok()
            .flatten()
            .map_or(0, |v| v.len());
        let total = declared.max(
            items
                .iter()
                .map(|(i, _, _)| *i as usize + 1)
                .max()
                .unwrap_or(0),
        );
        let partial = items.len() < total;
        let mut result = compose_items(&items, total, partial, reason, true);
        if result.len() > self.config.json_limits.max_bytes {
            result = compose_items(&items, total, partial, reason, false);
        }
        self.commit_in(dao, rec, fence, &result, None, partial, now)
    }

    /// The completed items of a batch: `(index, result JSON, external id)`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn batch_items(&self, id: &ExecutionId) -> Result<Vec<(u32, String, Option<String>)>> {
        self.read(|dao| Ok(dao.batch_items(id)?))
    }

    /// The downstream key of item `index` of a batch execution.
    pub fn batch_item_key(id: &ExecutionId, index: u32) -> DownstreamKey {
        id.batch_item(index).downstream_key()
    }

    /// Durably records the background job attempt `attempt` started (its
    /// job id is also stored as the execution's external id).
    ///
    /// # Errors
    /// [`Error::StaleAttempt`] (the job id is kept as evidence);
    /// [`Error::NotFound`], [`Error::AlreadyCommitted`] if another external
    /// id is stored, storage errors.
    pub fn record_job(&self, attempt: &AttemptId, job_id: &str) -> Result<()> {
        check_foreign_id("job id", job_id).map_err(Error::Id)?;
        let now = self.now();
        let id = &attempt.execution_id;
        self.write_fenced(|dao| {
            let rec = load(dao, id)?;
            let carried = Carried {
                external_id: Some(job_id),
                ..Carried::default()
            };
            if let Some(stale) =
                self.check_fence(dao, &rec, attempt, true, EvidenceKind::Job, &carried, now)?
            {
                return Ok(Fenced::Refused(stale));
            }
            // Running, or marked unknown meanwhile (a lapsed lease, a
            // reconciler): the job id is the best clue to its outcome and is
            // kept. Finished by the job's own update meanwhile (a webhook
            // first): nothing to record, the caller answers what is stored.
            if rec.status != ExecutionStatus::Executing
                && rec.status != ExecutionStatus::OutcomeUnknown
            {
                return Err(Error::InvalidTransition {
                    execution_id: id.clone(),
                    from: rec.status,
                    transition: Transition::Commit,
                });
            }
            if !dao.set_external_id(id, job_id, now)? {
                return Err(Error::AlreadyCommitted(id.clone()));
            }
            dao.set_job(id, job_id, "started", now)?;
            Ok(Fenced::Done(()))
        })
    }

    /// The background job of `id`: `(job id, last state)`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn job(&self, id: &ExecutionId) -> Result<Option<(String, String)>> {
        self.read(|dao| Ok(dao.job(id)?))
    }

    /// Applies a job update obtained by polling.
    ///
    /// # Errors
    /// As [`Ledger::ingest_webhook`].
    pub fn record_job_update(&self, id: &ExecutionId, update: &JobUpdate) -> Result<JobApplied> {
        self.apply_job(None, id, update)
    }

    /// Applies a webhook event exactly once: the event id is stored in the
    /// same transaction as its effect, and a repeat is ignored.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Json`] for a result that is not JSON,
    /// [`Error::WebhookEventOfAnotherExecution`] for an event processed for
    /// another execution, [`Error::InvalidTransition`] for a call that never
    /// started (`prepared`, `approved`), storage errors (nothing recorded, not even the
    /// event id).
    pub fn ingest_webhook(
        &self,
        source: &str,
        event_id: &str,
        id: &ExecutionId,
        update: &JobUpdate,
    ) -> Result<JobApplied> {
        check_foreign_id("webhook source", source).map_err(Error::Id)?;
        check_foreign_id("webhook event id", event_id).map_err(Error::Id)?;
        self.apply_job(Some((source, event_id)), id, update)
    }

    fn apply_job(
        &self,
        event: Option<(&str, &str)>,
        id: &ExecutionId,
        update: &JobUpdate,
    ) -> Result<JobApplied> {
        if let JobUpdate::Succeeded { result_json } = update {
            validate(result_json, &self.config.json_limits)?;
        }
        let now = self.now();
        self.write(Durability::Full, |dao| {
            let rec = dao
                .execution(id)?
                .ok_or_else(|| Error::NotFound(id.clone()))?;
            if let Some((source, event_id)) = event {
                if !dao.insert_webhook_event(source, event_id, id, now)? {
                    // A repeat for this execution is ignored; the same event
                    // named for another execution is refused.
                    let first = dao.webhook_event_execution(source, event_id)?;
                    return match first {
                        Some(first) if first != id.as_str() => {
                            Err(Error::WebhookEventOfAnotherExecution {
                                execution_id: id.clone(),
                                event_execution_id: ExecutionId::parse(first).map_err(Error::Id)?,
                            })
                        }
                        _ => Ok(JobApplied::DuplicateEvent),
                    };
                }
            }
            let open = matches!(
                rec.status,
                ExecutionStatus::Executing | ExecutionStatus::OutcomeUnknown
            );
            let job_id = rec.external_id.clone().unwrap_or_default();
            let failed_open = open_failure(dao, &rec)?;
            match update {
                JobUpdate::Succeeded { result_json } if failed_open => {
                    // The job succeeded for a call recorded as failed
                    // (retryable): sent again it would run twice.
                    dao.upsert_job(id, &job_id, "succeeded", now)?;
                    let stored = self.commit_over_failure(
                        dao,
                        &rec,
                        rec.attempt_count,
                        result_json,
                        None,
                        now,
                    )?;
                    Ok(JobApplied::Committed(stored))
                }
                JobUpdate::Succeeded { result_json } if settled_without_effect(rec.status) => {
                    // The job's effect happened, but the call was settled
                    // without it (another resolver's "not found"): the
                    // stored status stands and the result is kept.
                    let carried = Carried {
                        result_json: Some(result_json),
                        ..Carried::default()
                    };
                    self.keep_found_after_settled(dao, &rec, rec.attempt_count, &carried, now)?;
                    Ok(JobApplied::AlreadyFinal(rec.status))
                }
                JobUpdate::Succeeded { result_json }
                    if rec.status.is_committed()
                        && rec.result_json.as_deref() != Some(result_json.as_str()) =>
                {
                    // Committed meanwhile with another result (an earlier
                    // event, polling, a resolver): the stored result stands
                    // and what this update reported is kept.
                    let carried = Carried {
                        result_json: Some(result_json),
                        ..Carried::default()
                    };
                    self.keep_found_after_settled(dao, &rec, rec.attempt_count, &carried, now)?;
                    Ok(JobApplied::AlreadyFinal(rec.status))
                }
                _ if matches!(
                    rec.status,
                    ExecutionStatus::Prepared | ExecutionStatus::Approved
                ) =>
                {
                    // The call never started: no job of it can run. A
                    // misrouted update, refused; nothing is recorded (not
                    // even the event id).
                    Err(Error::InvalidTransition {
                        execution_id: id.clone(),
                        from: rec.status,
                        transition: match update {
                            JobUpdate::Succeeded { .. } => Transition::Commit,
                            JobUpdate::Failed { .. } => Transition::FailBeforeCommit,
                            JobUpdate::Progress { .. } => Transition::Start,
                        },
                    })
                }
                _ if !open => Ok(JobApplied::AlreadyFinal(rec.status)),
                JobUpdate::Progress { state } => {
                    dao.upsert_job(id, &job_id, state, now)?;
                    Ok(JobApplied::Progress)
                }
                JobUpdate::Succeeded { result_json } => {
                    dao.upsert_job(id, &job_id, "succeeded", now)?;
                    Ok(JobApplied::Committed(self.commit_in(
                        dao,
                        &rec,
                        None,
                        result_json,
                        None,
                        false,
                        now,
                    )?))
                }
                JobUpdate::Failed { reason } => {
                    dao.upsert_job(id, &job_id, "failed", now)?;
                    self.step(
                        dao,
                        &rec,
                        Transition::FailBeforeCommit,
                        None,
                        StatusFields {
                            reason: Some(reason),
                            retryable: Some(false),
                            ..StatusFields::default()
                        },
                        now,
                    )?;
                    Ok(JobApplied::Failed)
                }
            }
        })
    }
}

/// The combined result of a batch: the items' results in order (`null` for
/// an item that did not commit), and for a partial commit which items
/// committed, which did not, and why. Without `with_results` every item is
/// `null` and the result says the item results are stored separately.
fn compose_items(
    items: &[(u32, String, Option<String>)],
    total: usize,
    partial: bool,
    reason: Option<&str>,
    with_results: bool,
) -> String {
    let mut out = String::from("{\"items\":[");
    for index in 0..total {
        if index > 0 {
            out.push(',');
        }
        match items.iter().find(|(i, _, _)| *i as usize == index) {
            Some((_, result, _)) if with_results => out.push_str(result),
            _ => out.push_str("null"),
        }
    }
    out.push(']');
    if !with_results {
        out.push_str(",\"toolledger_note\":\"item results too large to store together; see the batch item records\"");
    }
    if partial {
        let committed: Vec<String> = items.iter().map(|(i, _, _)| i.to_string()).collect();
        let missing: Vec<String> = (0..total)
            .filter(|index| !items.iter().any(|(i, _, _)| *i as usize == *index))
            .map(|i| i.to_string())
            .collect();
        out.push_str(",\"partial\":{\"committed\":[");
        out.push_str(&committed.join(","));
        out.push_str("],\"not_committed\":[");
        out.push_str(&missing.join(","));
        out.push_str("],\"reason\":");
        // Free text: stored bounded (model/text.rs).
        write_json_string(
            &mut out,
            &bounded_reason(reason.unwrap_or("stopped before the remaining items")),
        );
        out.push('}');
    }
    out.push('}');
    out
}
