//! The side-effect protocol as one loop: perform → commit, with failures,
//! unknown outcomes and reconciliation as explicit steps.

use std::time::Instant;

use super::tool::{
    BatchMode, LookupOutcome, PerformOutcome, ToolDescriptor, ToolHandler, ToolRequest,
};
use super::{backoff, batch, CallOutcome, Executor, Result};
use crate::crashpoint::{self, CrashPoint};
use crate::ledger::{Begin, Resolution, Resolved, StoredResult, Ticket};
use crate::model::canonical::write_json_string;
use crate::model::{ExecutionRecord, ExecutionStatus, JsonLimits, OperationStatus};

/// The next thing to do for one execution.
pub(super) enum Step {
    /// Run an attempt with this ticket (the record is durably `executing`).
    Perform(Ticket),
    /// The outcome is unknown: reconcile before anything else.
    Reconcile(Ticket),
    /// Finished.
    Done(CallOutcome),
}

/// The `Begin` a stored record stands for, without writing anything
/// (used by `recover` and `run_existing`).
pub(super) fn begin_for_record(exec: &Executor, rec: &ExecutionRecord) -> Result<Begin> {
    use ExecutionStatus as S;
    let id = rec.execution_id.clone();
    Ok(match rec.status {
        S::Committed | S::ResultDelivered => Begin::Replay(StoredResult {
            execution_id: id,
            result_json: rec.result_json.clone().unwrap_or_default(),
            external_id: rec.external_id.clone(),
        }),
        S::OutcomeUnknown => Begin::Reconcile(Ticket::from_record(rec)),
        S::Prepared if rec.requires_approval => {
            Begin::NeedsApproval(crate::ledger::ApprovalRequest {
                execution_id: id,
                tool_name: rec.tool_name.clone(),
                args_json: rec.args_json.clone(),
                args_digest: rec.args_digest.clone(),
            })
        }
        S::Prepared | S::Approved => Begin::Execute(exec.ledger().mark_executing(&id)?),
        S::Executing => Begin::InFlight { execution_id: id },
        S::FailedBeforeCommit => Begin::Failed {
            execution_id: id,
            reason: rec.last_reason.clone().unwrap_or_default(),
        },
        S::Rejected => Begin::Rejected { execution_id: id },
        S::CancelledBeforeCommit => Begin::Cancelled { execution_id: id },
    })
}

impl Executor {
    /// Carries one `begin` answer through to an outcome for the model.
    pub(super) async fn drive(
        &self,
        tool: &dyn ToolHandler,
        desc: &ToolDescriptor,
        begin: Begin,
    ) -> Result<CallOutcome> {
        let metrics = self.metrics_sink();
        let mut step = match begin {
            Begin::Execute(t) => Step::Perform(t),
            Begin::Reconcile(t) => Step::Reconcile(t),
            Begin::Replay(r) => {
                metrics.replay();
                Step::Done(CallOutcome::Completed {
                    execution_id: r.execution_id,
                    result_json: r.result_json,
                    external_id: r.external_id,
                    replayed: true,
                })
            }
            Begin::NeedsApproval(req) => Step::Done({
                crashpoint::hit(CrashPoint::AfterPrepared);
                CallOutcome::NeedsApproval {
                    preview_json: tool.approval_preview(&req.args_json),
                    execution_id: req.execution_id,
                    tool_name: req.tool_name,
                    args_digest: req.args_digest,
                }
            }),
            Begin::Conflict {
                execution_id,
                stored_digest,
                new_digest,
            } => {
                metrics.conflict();
                Step::Done(CallOutcome::Conflict {
                    execution_id,
                    stored_digest,
                    new_digest,
                })
            }
            Begin::InFlight { execution_id } => {
                metrics.in_flight();
                Step::Done(CallOutcome::InFlight { execution_id })
            }
            Begin::Failed {
                execution_id,
                reason,
            } => Step::Done(CallOutcome::Failed {
                execution_id,
                reason,
                retryable: false,
            }),
            Begin::Rejected { execution_id } => Step::Done(CallOutcome::Rejected { execution_id }),
            Begin::Cancelled { execution_id } => {
                Step::Done(CallOutcome::Cancelled { execution_id })
            }
        };
        // Bounded: every Perform/Reconcile round trip consumes an attempt,
        // and attempts are capped by `max_attempts`.
        loop {
            step = match step {
                Step::Done(outcome) => return Ok(outcome),
                Step::Perform(ticket) => match desc.batch {
                    BatchMode::Independent => {
                        batch::perform_items(self, tool, desc, ticket, false).await?
                    }
                    BatchMode::Atomic => self.perform_once(tool, desc, ticket).await?,
                },
                Step::Reconcile(ticket) => match desc.batch {
                    BatchMode::Independent => {
                        batch::perform_items(self, tool, desc, ticket, true).await?
                    }
                    BatchMode::Atomic => self.reconcile(tool, desc, ticket).await?,
                },
            };
        }
    }

    async fn perform_once(
        &self,
        tool: &dyn ToolHandler,
        desc: &ToolDescriptor,
        ticket: Ticket,
    ) -> Result<Step> {
        let request = request_for(&ticket);
        crashpoint::hit(CrashPoint::BeforeRequest);
        let outcome = self.perform_guarded(tool, &desc.name, request).await;
        self.after_perform(desc, ticket, outcome).await
    }

    /// Records what one attempt did and decides the next step.
    pub(super) async fn after_perform(
        &self,
        desc: &ToolDescriptor,
        ticket: Ticket,
        outcome: PerformOutcome,
    ) -> Result<Step> {
        let ledger = self.ledger();
        let id = &ticket.execution_id;
        Ok(match outcome {
            PerformOutcome::Committed {
                result_json,
                external_id,
            } => {
                crashpoint::hit(CrashPoint::AfterRemoteCommit);
                let result_json = storable_result(result_json, &ledger.config().json_limits);
                let stored = ledger.commit_valid(id, &result_json, external_id.as_deref())?;
                crashpoint::hit(CrashPoint::AfterLocalCommit);
                Step::Done(CallOutcome::Completed {
                    execution_id: stored.execution_id,
                    result_json: stored.result_json,
                    external_id: stored.external_id,
                    replayed: false,
                })
            }
            PerformOutcome::JobStarted { job_id } => {
                ledger.record_job(id, &job_id)?;
                Step::Done(CallOutcome::Pending {
                    execution_id: id.clone(),
                    job_id,
                })
            }
            PerformOutcome::FailedBeforeCommit { reason, retryable } => {
                ledger.fail_before_commit(id, &reason, retryable)?;
                if retryable && ticket.attempt < self.config().max_attempts {
                    tokio::time::sleep(backoff(self.config(), ticket.attempt, id.as_str())).await;
                    match self.stop_if_cancelled(id)? {
                        Some(cancelled) => Step::Done(cancelled),
                        None => Step::Perform(ledger.mark_executing(id)?),
                    }
                } else {
                    Step::Done(CallOutcome::Failed {
                        execution_id: id.clone(),
                        reason,
                        retryable,
                    })
                }
            }
            PerformOutcome::Unknown { reason } => {
                self.metrics_sink().outcome_unknown(&desc.name);
                ledger.mark_outcome_unknown(id, &reason)?;
                Step::Reconcile(ticket)
            }
        })
    }

    /// True when the execution's operation was cancelled.
    fn operation_cancelled(&self, id: &crate::model::ExecutionId) -> Result<bool> {
        let ledger = self.ledger();
        let Some(rec) = ledger.get(id)? else {
            return Ok(false);
        };
        Ok(matches!(
            ledger.operation_status(&rec.operation_id)?,
            Some(OperationStatus::Cancelled | OperationStatus::CancelledAfterSideEffect)
        ))
    }

    /// A provably failed attempt is where a call of a cancelled operation
    /// stops: if the operation was cancelled while the attempt ran (or
    /// during the backoff), the execution is cancelled instead of retried.
    fn stop_if_cancelled(&self, id: &crate::model::ExecutionId) -> Result<Option<CallOutcome>> {
        let ledger = self.ledger();
        let Some(rec) = ledger.get(id)? else {
            return Ok(None);
        };
        let op_cancelled = matches!(
            ledger.operation_status(&rec.operation_id)?,
            Some(OperationStatus::Cancelled | OperationStatus::CancelledAfterSideEffect)
        );
        if !op_cancelled && rec.status != ExecutionStatus::CancelledBeforeCommit {
            return Ok(None);
        }
        // failed_before_commit → cancelled_before_commit, unless
        // `cancel_operation` already moved it there.
        ledger.cancel(id)?;
        Ok(Some(CallOutcome::Cancelled {
            execution_id: id.clone(),
        }))
    }

    /// Reconcile before replay: lookup, then same-key retry, then surface.
    async fn reconcile(
        &self,
        tool: &dyn ToolHandler,
        desc: &ToolDescriptor,
        ticket: Ticket,
    ) -> Result<Step> {
        let ledger = self.ledger();
        let id = ticket.execution_id.clone();
        // A background job the downstream accepted is pending, not unknown:
        // its completion arrives by polling or webhook.
        if let Some((job_id, state)) = ledger.job(&id)? {
            if state != "succeeded" && state != "failed" {
                return Ok(Step::Done(CallOutcome::Pending {
                    execution_id: id,
                    job_id,
                }));
            }
        }
        // After a cancellation nothing is sent again: only a lookup may
        // settle the outcome (found → committed; not found → cancelled).
        let cancelled = self.operation_cancelled(&id)?;
        let attempts_left = !cancelled && ticket.attempt < self.config().max_attempts;
        if desc.lookup {
            match tool.lookup(request_for(&ticket)).await {
                Ok(LookupOutcome::Found {
                    result_json,
                    external_id,
                }) => {
                    self.metrics_sink().reconciled(true);
                    let result_json = storable_result(result_json, &ledger.config().json_limits);
                    return Ok(
                        match ledger.resolve_unknown(
                            &id,
                            Resolution::Found {
                                result_json,
                                external_id,
                            },
                        )? {
                            Resolved::Committed(r) => Step::Done(CallOutcome::Completed {
                                execution_id: r.execution_id,
                                result_json: r.result_json,
                                external_id: r.external_id,
                                replayed: false,
                            }),
                            Resolved::Retry(t) => Step::Perform(t),
                            Resolved::Failed => Step::Done(unknown(&id, "reconciliation failed")),
                        },
                    );
                }
                Ok(LookupOutcome::NotFound) if attempts_left => {
                    self.metrics_sink().reconciled(false);
                    return Ok(retry(
                        ledger.resolve_unknown(&id, Resolution::NotFoundRetry)?,
                        &id,
                    ));
                }
                Ok(LookupOutcome::NotFound) if cancelled => {
                    self.metrics_sink().reconciled(false);
                    let _failed = ledger.resolve_unknown(
                        &id,
                        Resolution::NotFoundAbandon {
                            reason: "not found downstream after cancellation".into(),
                        },
                    )?;
                    ledger.cancel(&id)?;
                    return Ok(Step::Done(CallOutcome::Cancelled { execution_id: id }));
                }
                Ok(LookupOutcome::NotFound) => {
                    self.metrics_sink().reconciled(false);
                    return Ok(Step::Done(unknown(
                        &id,
                        "not found downstream and no attempts left; resolve it",
                    )));
                }
                Ok(LookupOutcome::Unsupported) => {}
                Err(e) => {
                    self.metrics_sink().reconcile_failed();
                    return Ok(Step::Done(unknown(
                        &id,
                        &format!("lookup failed: {}", e.message),
                    )));
                }
            }
        }
        if desc.idempotency_key && attempts_left {
            // The downstream dedupes by our key: sending it again either
            // returns the original effect or performs it the one time.
            return Ok(retry(
                ledger.resolve_unknown(&id, Resolution::NotFoundRetry)?,
                &id,
            ));
        }
        let reason = ledger
            .get(&id)?
            .and_then(|r| r.last_reason)
            .unwrap_or_else(|| "outcome unknown".into());
        Ok(Step::Done(unknown(&id, &reason)))
    }

    /// Runs `perform` with the timeout and keeps the lease alive meanwhile.
    /// Transport errors and timeouts come back as `Unknown`.
    pub(super) async fn perform_guarded(
        &self,
        tool: &dyn ToolHandler,
        tool_name: &str,
        request: ToolRequest,
    ) -> PerformOutcome {
        let ledger = self.ledger().clone();
        let id = request.execution_id.clone();
        let started = Instant::now();
        self.metrics_sink().attempt();
        let perform = tool.perform(request);
        tokio::pin!(perform);
        let renew_every = (ledger.config().lease / 3).max(std::time::Duration::from_millis(10));
        let mut renew =
            tokio::time::interval_at(tokio::time::Instant::now() + renew_every, renew_every);
        let timeout = self.config().perform_timeout;
        let deadline =
            tokio::time::sleep(timeout.unwrap_or(std::time::Duration::from_secs(u32::MAX.into())));
        tokio::pin!(deadline);
        let outcome = loop {
            tokio::select! {
                out = &mut perform => break match out {
                    Ok(o) => o,
                    Err(e) => PerformOutcome::Unknown { reason: format!("tool error: {}", e.message) },
                },
                _ = renew.tick() => { let _ = ledger.renew_lease(&id); }
                _ = &mut deadline, if timeout.is_some() => break PerformOutcome::Unknown {
                    reason: "timed out waiting for the downstream".into(),
                },
            }
        };
        self.metrics_sink().latency(tool_name, started.elapsed());
        outcome
    }
}

/// The request for one attempt (or lookup) of a whole-call execution.
fn request_for(ticket: &Ticket) -> ToolRequest {
    ToolRequest {
        execution_id: ticket.execution_id.clone(),
        downstream_key: ticket.downstream_key.clone(),
        tool_name: ticket.tool_name.clone(),
        arguments_json: ticket.args_json.clone(),
        attempt: ticket.attempt,
        item_index: None,
        external_id: ticket.external_id.clone(),
    }
}

fn retry(resolved: Resolved, id: &crate::model::ExecutionId) -> Step {
    match resolved {
        Resolved::Retry(t) => Step::Perform(t),
        Resolved::Committed(r) => Step::Done(CallOutcome::Completed {
            execution_id: r.execution_id,
            result_json: r.result_json,
            external_id: r.external_id,
            replayed: false,
        }),
        Resolved::Failed => Step::Done(unknown(id, "reconciliation failed")),
    }
}

pub(super) fn unknown(id: &crate::model::ExecutionId, reason: &str) -> CallOutcome {
    CallOutcome::Unknown {
        execution_id: id.clone(),
        reason: reason.to_owned(),
    }
}

/// A committed effect must be recorded even if the tool's result is not
/// valid JSON: such a result is stored as a JSON string of its text.
/// One that is too large for the limits is stored as a marker with its size,
/// so the commit (and the external id) is never lost.
pub(super) fn storable_result(result_json: String, limits: &JsonLimits) -> String {
    if result_json.len() + 2 > limits.max_bytes {
        return format!(
            "{{\"toolledger_error\":\"result too large to store\",\"bytes\":{}}}",
            result_json.len()
        );
    }
    if crate::model::canonical::canonicalize(&result_json, limits).is_ok() {
        result_json
    } else {
        let mut s = String::with_capacity(result_json.len() + 2);
        write_json_string(&mut s, &result_json);
        s
    }
}
