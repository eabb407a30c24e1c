//! Batches, background jobs and webhooks: more than one durable step inside
//! one execution.
//!
//! An independent batch records each item's completion under its own key
//! (`<execution id>#item_<n>`), so a crash after item 3 resumes at item 4. A
//! tool that starts a background job stores the job id at once; later job
//! updates (from polling or a webhook) reconcile into the same execution, and
//! every webhook `(source, event id)` is processed at most once.

use super::answers::StoredResult;
use super::{Error, Ledger, Result};
use crate::model::canonical::canonicalize;
use crate::model::{DownstreamKey, ExecutionId, ExecutionStatus, Transition};
use crate::store::{Durability, StatusFields};

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
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Json`] for a result that is not JSON,
    /// [`Error::InvalidTransition`] unless the execution is `executing` or
    /// `outcome_unknown`.
    pub fn record_batch_item(
        &self,
        id: &ExecutionId,
        index: u32,
        result_json: &str,
        external_id: Option<&str>,
    ) -> Result<bool> {
        canonicalize(result_json, &self.config.json_limits)?;
        let now = self.now();
        self.write(Durability::Full, |dao| {
            let rec = dao
                .execution(id)?
                .ok_or_else(|| Error::NotFound(id.clone()))?;
            if !matches!(
                rec.status,
                ExecutionStatus::Executing | ExecutionStatus::OutcomeUnknown
            ) {
                return Err(Error::InvalidTransition {
                    execution_id: id.clone(),
                    from: rec.status,
                    transition: Transition::Commit,
                });
            }
            let key = id.batch_item(index).downstream_key();
            Ok(dao.insert_batch_item(id, index, &key, result_json, external_id, now)?)
        })
    }

    /// The completed items of a batch: `(index, result JSON, external id)`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn batch_items(&self, id: &ExecutionId) -> Result<Vec<(u32, String, Option<String>)>> {
        self.store.read(|dao| Ok(dao.batch_items(id)?))
    }

    /// The downstream key of item `index` of a batch execution.
    pub fn batch_item_key(id: &ExecutionId, index: u32) -> DownstreamKey {
        id.batch_item(index).downstream_key()
    }

    /// Durably records the background job a tool started for `id` (its job
    /// id is also stored as the execution's external id).
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::AlreadyCommitted`] if another external id
    /// is stored, storage errors.
    pub fn record_job(&self, id: &ExecutionId, job_id: &str) -> Result<()> {
        let now = self.now();
        self.write(Durability::Full, |dao| {
            dao.execution(id)?
                .ok_or_else(|| Error::NotFound(id.clone()))?;
            if !dao.set_external_id(id, job_id, now)? {
                return Err(Error::AlreadyCommitted(id.clone()));
            }
            dao.upsert_job(id, job_id, "started", now)?;
            Ok(())
        })
    }

    /// The background job of `id`: `(job id, last state)`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn job(&self, id: &ExecutionId) -> Result<Option<(String, String)>> {
        self.store.read(|dao| Ok(dao.job(id)?))
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
    /// storage errors (nothing recorded, not even the event id).
    pub fn ingest_webhook(
        &self,
        source: &str,
        event_id: &str,
        id: &ExecutionId,
        update: &JobUpdate,
    ) -> Result<JobApplied> {
        self.apply_job(Some((source, event_id)), id, update)
    }

    fn apply_job(
        &self,
        event: Option<(&str, &str)>,
        id: &ExecutionId,
        update: &JobUpdate,
    ) -> Result<JobApplied> {
        if let JobUpdate::Succeeded { result_json } = update {
            canonicalize(result_json, &self.config.json_limits)?;
        }
        let now = self.now();
        self.write(Durability::Full, |dao| {
            let rec = dao
                .execution(id)?
                .ok_or_else(|| Error::NotFound(id.clone()))?;
            if let Some((source, event_id)) = event {
                if !dao.insert_webhook_event(source, event_id, id, now)? {
                    return Ok(JobApplied::DuplicateEvent);
                }
            }
            let open = matches!(
                rec.status,
                ExecutionStatus::Executing | ExecutionStatus::OutcomeUnknown
            );
            let job_id = rec.external_id.clone().unwrap_or_default();
            match update {
                JobUpdate::Progress { state } => {
                    dao.upsert_job(id, &job_id, state, now)?;
                    Ok(JobApplied::Progress)
                }
                _ if !open => Ok(JobApplied::AlreadyFinal(rec.status)),
                JobUpdate::Succeeded { result_json } => {
                    dao.upsert_job(id, &job_id, "succeeded", now)?;
                    Ok(JobApplied::Committed(self.commit_in(
                        dao,
                        &rec,
                        result_json,
                        None,
                        now,
                    )?))
                }
                JobUpdate::Failed { reason } => {
                    dao.upsert_job(id, &job_id, "failed", now)?;
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
                    Ok(JobApplied::Failed)
                }
            }
        })
    }
}
