//! The side-effect protocol as one loop: perform → commit, with failures,
//! unknown outcomes and reconciliation as explicit steps.
//!
//! Every step of an attempt names it (its [`crate::ledger::AttemptId`]); when
//! the ledger says the attempt is stale (another attempt superseded it), what
//! the tool returned is kept as evidence by the ledger and the caller gets
//! the execution's current truth, never a second story.

use std::time::{Duration, Instant};

use super::tool::{
    BatchMode, LookupOutcome, PerformOutcome, ToolDescriptor, ToolError, ToolHandler, ToolRequest,
};
use super::{backoff, batch, CallOutcome, Executor, Result, Takeover};
use crate::crashpoint::{self, CrashPoint};
use crate::ledger::{self, AttemptId, Begin, Resolution, Resolved, StoredResult, Ticket};
use crate::model::canonical::write_json_string;
use crate::model::text::check_foreign_id;
use crate::model::{ExecutionId, ExecutionStatus, JsonLimits, Monotonic, OperationStatus};

/// The next thing to do for one execution.
pub(super) enum Step {
    /// Run an attempt with this ticket (the record is durably `executing`).
    Perform(Ticket),
    /// The outcome is unknown: reconcile before anything else.
    Reconcile(Ticket),
    /// A retryable failure with attempts left: after `after` (the backoff),
    /// start the next attempt (unless the operation was cancelled meanwhile).
    Retry {
        /// The execution.
        id: ExecutionId,
        /// How long to wait first.
        after: Duration,
    },
    /// Finished.
    Done(CallOutcome),
}

/// Where reconciling an unknown outcome stands before any lookup.
pub(super) enum Reconciling {
    /// The tool looks effects up: run its `lookup`, then
    /// [`Executor::reconcile_after_lookup`].
    Lookup,
    /// Settled without a lookup.
    Settled(Box<Step>),
}

pub(super) fn completed(r: StoredResult, replayed: bool) -> CallOutcome {
    CallOutcome::Completed {
        execution_id: r.execution_id,
        result_json: r.result_json,
        external_id: r.external_id,
        replayed,
        partial: r.partial,
    }
}

impl Executor {
    /// Carries one `begin` answer through to an outcome for the model.
    pub(super) async fn drive(
        &self,
        tool: &dyn ToolHandler,
        desc: &ToolDescriptor,
        begin: Begin,
    ) -> Result<CallOutcome> {
        let mut step = self.first_step(tool, begin)?;
        // Bounded: every Perform/Reconcile round trip consumes an attempt,
        // and attempts are capped by `max_attempts`.
        loop {
            step = match step {
                Step::Done(outcome) => return Ok(outcome),
                Step::Perform(ticket) => {
                    // Dropped unfinished (the caller went away, a step
                    // failed): the attempt is an orphan of this executor.
                    let running = self.running(&ticket);
                    let next = match desc.batch {
                        BatchMode::Independent => {
                            batch::perform_items(self, tool, desc, ticket, false).await?
                        }
                        BatchMode::Atomic => self.perform_once(tool, desc, ticket).await?,
                    };
                    running.finish();
                    next
                }
                Step::Retry { id, after } => {
                    tokio::time::sleep(after).await;
                    self.next_attempt(tool, &id)?
                }
                Step::Reconcile(ticket) => match desc.batch {
                    BatchMode::Independent => {
                        batch::perform_items(self, tool, desc, ticket, true).await?
                    }
                    BatchMode::Atomic => self.reconcile(tool, desc, ticket).await?,
                },
            };
        }
    }

    /// The first step for a `begin` (or `continue_execution`) answer: the
    /// one translation of the ledger's answer into the executor's steps,
    /// for [`Executor::drive`] and for caller-driven calls alike.
    pub(super) fn first_step(&self, tool: &dyn ToolHandler, begin: Begin) -> Result<Step> {
        let metrics = self.metrics_sink();
        let step = match begin {
            Begin::Execute(t) => Step::Perform(t),
            Begin::Reconcile(t) => Step::Reconcile(t),
            Begin::Replay(r) => {
                metrics.replay();
                Step::Done(completed(r, true))
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
            Begin::InFlight {
                execution_id,
                retry_after,
            } => match self.take_over_orphan(&execution_id)? {
                Some(Takeover::Reconcile(ticket)) => Step::Reconcile(ticket),
                Some(Takeover::Continue(ticket)) => Step::Perform(ticket),
                Some(Takeover::Committed(stored)) => {
                    metrics.replay();
                    Step::Done(completed(stored, true))
                }
                None => {
                    metrics.in_flight();
                    Step::Done(CallOutcome::InFlight {
                        execution_id,
                        retry_after,
                    })
                }
            },
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
        Ok(step)
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
        let id = ticket.execution_id.clone();
        match self.after_perform(desc, ticket, outcome) {
            // The tool's result, refused because the call was committed
            // while it ran by another hand (its job's webhook): the stored
            // result is the answer (the tool's was kept as evidence).
            Err(super::Error::Ledger(ledger::Error::AlreadyCommitted(_)))
                if self
                    .ledger()
                    .get(&id)?
                    .is_some_and(|r| r.status.is_committed()) =>
            {
                Ok(Step::Done(self.current_outcome(&id)?))
            }
            other => other,
        }
    }

    /// Records what one attempt did and decides the next step. A stale
    /// attempt (superseded while it ran) ends with the current truth.
    pub(super) fn after_perform(
        &self,
        desc: &ToolDescriptor,
        mut ticket: Ticket,
        outcome: PerformOutcome,
    ) -> Result<Step> {
        let ledger = self.ledger();
        let attempt = ticket.attempt_id();
        let id = &ticket.execution_id.clone();
        let recorded = match outcome {
            PerformOutcome::Committed {
                result_json,
                external_id,
            } => {
                crashpoint::hit(CrashPoint::AfterRemoteCommit);
                let result_json = storable_result(result_json, &ledger.config().json_limits);
                let external_id = storable_id(external_id);
                // The durability policy, by what the tool declares.
                let downstream = desc.downstream();
                let committed = ledger.commit_valid(
                    &attempt,
                    &result_json,
                    external_id.as_deref(),
                    Some(&downstream),
                );
                if let Err(ledger::Error::Store(_)) = &committed {
                    // Not written (suspended meanwhile, a full disk): the
                    // effect and its result are known here. Kept with the
                    // attempt, which becomes this executor's orphan, for the
                    // next ask to commit instead of calling it unknown.
                    self.keep_unrecorded(&attempt, &result_json, external_id.as_deref());
                }
                committed.map(|stored| {
                    crashpoint::hit(CrashPoint::AfterLocalCommit);
                    Step::Done(completed(stored, false))
                })
            }
            PerformOutcome::JobStarted { job_id } => match check_foreign_id("job id", &job_id) {
                // A job started under an id the ledger refuses (empty, too
                // long) cannot be followed: its outcome is unknown, and the
                // reason says why.
                Err(refused) => {
                    let reason =
                        format!("the tool started a job the ledger cannot follow: {refused}");
                    match ledger.mark_job_unfollowable(&attempt, &reason) {
                        Ok(_) => Ok(Step::Done(CallOutcome::Unknown {
                            execution_id: id.clone(),
                            attempt: attempt.attempt,
                            reason,
                            retry_after: None,
                        })),
                        // Settled meanwhile (the job's own update, a failure
                        // reported first, a takeover): what is stored is the
                        // answer, as for a job id that could be recorded.
                        Err(ledger::Error::InvalidTransition { .. }) => {
                            Ok(Step::Done(self.current_outcome(id)?))
                        }
                        Err(e) => Err(e),
                    }
                }
                Ok(()) => match ledger.record_job(&attempt, &job_id) {
                    Ok(()) => Ok(Step::Done(self.current_or_pending(id, job_id)?)),
                    // The job's own update finished it first (a webhook):
                    // what is stored is the answer.
                    Err(ledger::Error::InvalidTransition { .. }) => {
                        Ok(Step::Done(self.current_outcome(id)?))
                    }
                    Err(e) => Err(e),
                },
            },
            PerformOutcome::FailedBeforeCommit { reason, .. }
                if self.earlier_may_land(desc, &ticket).is_some() =>
            {
                // This resend was refused, but the earlier request may still
                // land: nothing is proven, the outcome stays unknown.
                let wait = self.earlier_may_land(desc, &ticket);
                let reason =
                    format!("resend refused ({reason}); the earlier request may still land");
                ledger.mark_outcome_unknown(&attempt, &reason).map(|_| {
                    Step::Done(CallOutcome::Unknown {
                        execution_id: id.clone(),
                        attempt: attempt.attempt,
                        reason,
                        retry_after: wait,
                    })
                })
            }
            PerformOutcome::FailedBeforeCommit { reason, retryable } => {
                match ledger.fail_before_commit(&attempt, &reason, retryable) {
                    Ok(()) if retryable && ticket.attempt < self.config().max_attempts => {
                        Ok(Step::Retry {
                            id: id.clone(),
                            after: backoff(self.config(), ticket.attempt, id.as_str()),
                        })
                    }
                    Ok(()) => Ok(Step::Done(CallOutcome::Failed {
                        execution_id: id.clone(),
                        reason,
                        retryable,
                    })),
                    Err(e) => Err(e),
                }
            }
            PerformOutcome::Unknown { reason } => {
                self.metrics_sink().outcome_unknown(&desc.name);
                ledger.mark_outcome_unknown(&attempt, &reason).map(|since| {
                    ticket.unknown_since = Some(since);
                    Step::Reconcile(ticket.clone())
                })
            }
        };
        // A report for a call settled meanwhile (as absent, by a resolver or
        // a cancellation) answers what is stored; an effect it reported was
        // kept as evidence.
        self.or_settled(id, recorded)
    }

    /// The next attempt of a retryable failure, unless its operation was
    /// cancelled meanwhile (then it is cancelled, and nothing runs). When
    /// another caller moved the execution on while this one waited (it ran
    /// the next attempt, or is running it, or left it as an orphan, or it
    /// became unknown), the step is what a new ask would get: a replay,
    /// `InFlight`, a takeover of this executor's orphan, a reconciliation.
    pub(super) fn next_attempt(&self, tool: &dyn ToolHandler, id: &ExecutionId) -> Result<Step> {
        match self.ledger().mark_executing(id) {
            Ok(t) => Ok(Step::Perform(t)),
            Err(ledger::Error::OperationCancelled(_)) => Ok(Step::Done(self.current_outcome(id)?)),
            Err(ledger::Error::InvalidTransition { .. }) => {
                let begin = self.ledger().continue_execution(id)?;
                self.first_step(tool, begin)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// A step refused as stale ends with the execution's current truth; any
    /// other result passes through.
    pub(super) fn or_current(
        &self,
        id: &ExecutionId,
        step: std::result::Result<Step, ledger::Error>,
    ) -> Result<Step> {
        match step {
            Ok(step) => Ok(step),
            Err(ledger::Error::StaleAttempt { .. }) => {
                self.metrics_sink().stale_attempt();
                Ok(Step::Done(self.current_outcome(id)?))
            }
            // Two reconcilers of the same attempt (any session may resolve
            // an unknown outcome): the other one committed it first, so
            // this one's resolution finds the row committed. The stored
            // result is the answer; nothing was sent by either.
            Err(ledger::Error::InvalidTransition { from, .. }) if from.is_committed() => {
                self.metrics_sink().stale_attempt();
                Ok(Step::Done(self.current_outcome(id)?))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// [`Executor::or_current`] for a resolution of an unknown attempt (a
    /// found effect, a resend, an abandon): another resolver may have
    /// settled the call as absent meanwhile (the app's `NotFoundAbandon`),
    /// and then the ledger refuses this one (`InvalidTransition`, nothing
    /// sent; a found effect kept as evidence). The answer is what is stored,
    /// not the refusal.
    pub(super) fn or_settled(
        &self,
        id: &ExecutionId,
        step: std::result::Result<Step, ledger::Error>,
    ) -> Result<Step> {
        match step {
            Err(ledger::Error::InvalidTransition {
                from:
                    ExecutionStatus::FailedBeforeCommit
                    | ExecutionStatus::CancelledBeforeCommit
                    | ExecutionStatus::Rejected,
                ..
            }) => Ok(Step::Done(self.current_outcome(id)?)),
            other => self.or_current(id, other),
        }
    }

    /// `Pending` for a job recorded on a running execution; what is
    /// stored when the execution had been marked unknown meanwhile (the job
    /// id is kept with it).
    fn current_or_pending(&self, id: &ExecutionId, job_id: String) -> Result<CallOutcome> {
        let rec = self.ledger().get(id)?;
        if rec.is_some_and(|r| r.status == ExecutionStatus::OutcomeUnknown) {
            return self.current_outcome(id);
        }
        Ok(CallOutcome::Pending {
            execution_id: id.clone(),
            job_id,
        })
    }

    /// What the ledger says about `id` now, without running anything.
    pub(super) fn current_outcome(&self, id: &ExecutionId) -> Result<CallOutcome> {
        use ExecutionStatus as S;
        let rec = self
            .ledger()
            .get(id)?
            .ok_or_else(|| ledger::Error::NotFound(id.clone()))?;
        let execution_id = id.clone();
        Ok(match rec.status {
            S::Committed | S::ResultDelivered => completed(StoredResult::of(&rec), true),
            S::Executing | S::Approved | S::Prepared => CallOutcome::InFlight {
                execution_id,
                retry_after: None,
            },
            S::OutcomeUnknown => CallOutcome::Unknown {
                execution_id,
                attempt: rec.attempt_count,
                reason: rec.last_reason.unwrap_or_else(|| "outcome unknown".into()),
                retry_after: None,
            },
            S::FailedBeforeCommit => CallOutcome::Failed {
                execution_id,
                reason: rec.last_reason.unwrap_or_default(),
                retryable: rec.retryable == Some(true),
            },
            S::Rejected => CallOutcome::Rejected { execution_id },
            S::CancelledBeforeCommit => CallOutcome::Cancelled { execution_id },
        })
    }

    /// True when the execution's operation was cancelled.
    pub(super) fn operation_cancelled(&self, id: &ExecutionId) -> Result<bool> {
        let ledger = self.ledger();
        let Some(rec) = ledger.get(id)? else {
            return Ok(false);
        };
        Ok(matches!(
            ledger.operation_status(&rec.operation_id)?,
            Some(OperationStatus::Cancelled | OperationStatus::CancelledAfterSideEffect)
        ))
    }

    /// For an attempt resent under its key while an earlier request may
    /// still land (`earlier_unknown`, set when the resend was handed out
    /// inside the landing window): how long that remains so, zero once the
    /// window has passed. `None` otherwise. A refusal of such a resend never
    /// proves the earlier request absent, however late it is reported: the
    /// downstream refused it when it received it, which was no earlier than
    /// the hand-out, inside the window (a caller-driven report held past the
    /// window, or a slow answer, said "in progress" about a request that
    /// then landed).
    pub(super) fn earlier_may_land(
        &self,
        desc: &ToolDescriptor,
        ticket: &Ticket,
    ) -> Option<Duration> {
        let earlier = ticket.earlier_unknown.as_ref()?;
        let window = i64::try_from(desc.landing_window.as_millis()).unwrap_or(i64::MAX);
        let left = window.saturating_sub(self.ledger().clock().monotonic().since(earlier));
        Some(Duration::from_millis(u64::try_from(left).unwrap_or(0)))
    }

    /// How long until a lookup's "not found" for `ticket` counts as absent:
    /// a request sent before the outcome became unknown may land until the
    /// tool's landing window has passed. `None` once it has.
    pub(super) fn landing_wait(&self, desc: &ToolDescriptor, ticket: &Ticket) -> Option<Duration> {
        let window = i64::try_from(desc.landing_window.as_millis()).unwrap_or(i64::MAX);
        let now = self.ledger().clock().monotonic();
        // No time recorded (cannot happen for tickets of this build): the
        // whole window is still ahead.
        let elapsed = ticket.unknown_since.as_ref().map_or(0, |s| now.since(s));
        let left = window.saturating_sub(elapsed);
        (left > 0).then(|| Duration::from_millis(u64::try_from(left).unwrap_or(0)))
    }

    /// For a lookup's "not found" for `ticket`, given when the lookup was
    /// asked (`asked`; `None`: not known here): `None` when it proves the
    /// effect absent, i.e. the lookup was asked once the landing window had
    /// passed since the outcome became unknown; otherwise how long until a
    /// new lookup would (zero when that is now). A lookup answers for the
    /// moment it looked, not the moment its answer came back: a slow
    /// lookup (or a caller that reports it late) that looked inside the
    /// window proves nothing about a request landing after it looked.
    pub(super) fn lookup_unproven(
        &self,
        desc: &ToolDescriptor,
        ticket: &Ticket,
        asked: Option<&Monotonic>,
    ) -> Option<Duration> {
        let window = i64::try_from(desc.landing_window.as_millis()).unwrap_or(i64::MAX);
        if let (Some(asked), Some(since)) = (asked, ticket.unknown_since.as_ref()) {
            if asked.since(since) >= window {
                return None;
            }
        }
        Some(self.landing_wait(desc, ticket).unwrap_or(Duration::ZERO))
    }

    /// Reconcile before anything else: lookup, then same-key retry, then
    /// surface. A lookup's "not found" inside the landing window leaves the
    /// outcome unknown (nothing is sent again) and says when to ask again.
    async fn reconcile(
        &self,
        tool: &dyn ToolHandler,
        desc: &ToolDescriptor,
        ticket: Ticket,
    ) -> Result<Step> {
        match self.reconcile_start(desc, &ticket)? {
            Reconciling::Settled(step) => Ok(*step),
            Reconciling::Lookup => {
                let asked = self.ledger().clock().monotonic();
                let found = tool.lookup(request_for(&ticket)).await;
                self.reconcile_after_lookup(desc, ticket, found, Some(&asked))
            }
        }
    }

    /// The part of reconciliation before a lookup: a pending background job
    /// is not unknown; a tool with a lookup looks first; the rest is settled
    /// by [`Executor::reconcile_without_lookup`].
    pub(super) fn reconcile_start(
        &self,
        desc: &ToolDescriptor,
        ticket: &Ticket,
    ) -> Result<Reconciling> {
        let id = &ticket.execution_id;
        // A background job the downstream accepted is pending, not unknown:
        // its completion arrives by polling or webhook. Its stored state is
        // the downstream's own label (a `Progress` may say "succeeded" or
        // "failed" of a job still running), never a sign it finished: a job
        // that finished committed or failed its execution (never retried),
        // which is then not reconciled.
        if let Some((job_id, _label)) = self.ledger().job(id)? {
            return Ok(Reconciling::Settled(Box::new(Step::Done(
                CallOutcome::Pending {
                    execution_id: id.clone(),
                    job_id,
                },
            ))));
        }
        if desc.lookup {
            return Ok(Reconciling::Lookup);
        }
        self.reconcile_without_lookup(desc, ticket)
            .map(|step| Reconciling::Settled(Box::new(step)))
    }

    /// Whether another attempt may be sent for `ticket`'s execution: not
    /// after a cancellation (only a lookup may settle the outcome then), and
    /// only while attempts last. Returns (cancelled, attempts left).
    fn may_resend(&self, ticket: &Ticket) -> Result<(bool, bool)> {
        let cancelled = self.operation_cancelled(&ticket.execution_id)?;
        Ok((
            cancelled,
            !cancelled && ticket.attempt < self.config().max_attempts,
        ))
    }

    /// A resend under the same key (a new attempt). When nothing proved the
    /// earlier request absent (it may still land), the new attempt carries
    /// when that request's outcome became unknown (see `after_perform`).
    /// `proven`: a lookup past the landing window found nothing; otherwise
    /// the resend only relies on the downstream's dedupe, and an operation
    /// cancelled since `may_resend` looked leaves the outcome unknown (the
    /// ledger refuses the resend and writes nothing).
    fn resend(&self, desc: &ToolDescriptor, ticket: &Ticket, proven: bool) -> Result<Step> {
        let attempt = ticket.attempt_id();
        let earlier = self
            .landing_wait(desc, ticket)
            .and(ticket.unknown_since.clone());
        let resolved = if proven {
            self.ledger()
                .resolve_unknown(&attempt, Resolution::NotFoundRetry)
        } else {
            self.ledger().resend_unknown(&attempt)
        };
        if let Err(ledger::Error::OperationCancelled(_)) = resolved {
            return Ok(Step::Done(self.current_outcome(&ticket.execution_id)?));
        }
        self.or_settled(
            &ticket.execution_id,
            resolved.map(|r| match self.after_resolution(&attempt, r) {
                Step::Perform(mut t) => {
                    t.earlier_unknown = earlier.clone();
                    t.resend = true;
                    Step::Perform(t)
                }
                other => other,
            }),
        )
    }

    /// Settles an unknown outcome after the tool's lookup answered `found`.
    /// A "not found" of a lookup asked inside the landing window (`asked`:
    /// when it was asked; `None` when not known here) leaves it unknown
    /// (nothing is sent again) and says when to ask again.
    pub(super) fn reconcile_after_lookup(
        &self,
        desc: &ToolDescriptor,
        ticket: Ticket,
        found: std::result::Result<LookupOutcome, ToolError>,
        asked: Option<&Monotonic>,
    ) -> Result<Step> {
        let ledger = self.ledger();
        let id = ticket.execution_id.clone();
        let attempt = ticket.attempt_id();
        match found {
            Ok(LookupOutcome::Found {
                result_json,
                external_id,
            }) => {
                self.metrics_sink().reconciled(true);
                let result_json = storable_result(result_json, &ledger.config().json_limits);
                let resolved = ledger
                    .resolve_unknown(
                        &attempt,
                        Resolution::Found {
                            result_json,
                            external_id: storable_id(external_id),
                        },
                    )
                    .map(|r| self.after_resolution(&attempt, r));
                // Settled as absent meanwhile by another resolver (the app's
                // "not found"): the ledger kept the found result as
                // evidence; the answer is what is stored.
                self.or_settled(&id, resolved)
            }
            Ok(LookupOutcome::NotFound) => {
                self.metrics_sink().reconciled(false);
                let (cancelled, attempts_left) = self.may_resend(&ticket)?;
                // The downstream dedupes by our key: a resend is safe even
                // if the first request is still on its way.
                if desc.idempotency_key && attempts_left {
                    let proven = self.lookup_unproven(desc, &ticket, asked).is_none();
                    return self.resend(desc, &ticket, proven);
                }
                if let Some(wait) = self.lookup_unproven(desc, &ticket, asked) {
                    return Ok(Step::Done(CallOutcome::Unknown {
                        execution_id: id,
                        attempt: attempt.attempt,
                        reason: "not found downstream yet; the request sent may still land".into(),
                        retry_after: Some(wait),
                    }));
                }
                if attempts_left {
                    return self.resend(desc, &ticket, true);
                }
                if cancelled {
                    let resolved = ledger
                        .resolve_unknown(
                            &attempt,
                            Resolution::NotFoundAbandon {
                                reason: "not found downstream after cancellation".into(),
                            },
                        )
                        .map(|r| self.after_resolution(&attempt, r));
                    return self.or_settled(&id, resolved);
                }
                Ok(Step::Done(unknown(
                    &attempt,
                    "not found downstream and no attempts left; resolve it",
                )))
            }
            Ok(LookupOutcome::Unsupported) => self.reconcile_without_lookup(desc, &ticket),
            Err(e) => {
                self.metrics_sink().reconcile_failed();
                Ok(Step::Done(unknown(
                    &attempt,
                    &format!("lookup failed: {}", e.message),
                )))
            }
        }
    }

    /// Reconciliation with no lookup to ask: a same-key resend to a
    /// downstream that dedupes by key, else the unknown outcome surfaces.
    fn reconcile_without_lookup(&self, desc: &ToolDescriptor, ticket: &Ticket) -> Result<Step> {
        let (_, attempts_left) = self.may_resend(ticket)?;
        if desc.idempotency_key && attempts_left {
            // The downstream dedupes by our key: sending it again either
            // returns the original effect or performs it the one time.
            return self.resend(desc, ticket, false);
        }
        let reason = self
            .ledger()
            .get(&ticket.execution_id)?
            .and_then(|r| r.last_reason)
            .unwrap_or_else(|| "outcome unknown".into());
        Ok(Step::Done(unknown(&ticket.attempt_id(), &reason)))
    }

    /// The step a resolution leads to.
    pub(super) fn after_resolution(&self, attempt: &AttemptId, resolved: Resolved) -> Step {
        // Settled or resent (here, by `recover` or by the app): no lookup
        // handed out for the unknown attempt counts any more.
        self.forget_lookups(&attempt.execution_id);
        match resolved {
            Resolved::Retry(t) => Step::Perform(t),
            Resolved::Committed(r) | Resolved::Partial(r) => Step::Done(completed(r, false)),
            Resolved::Failed => Step::Done(unknown(attempt, "reconciliation failed")),
            Resolved::Cancelled => Step::Done(CallOutcome::Cancelled {
                execution_id: attempt.execution_id.clone(),
            }),
        }
    }

    /// Runs `perform` with the timeout. Transport errors and timeouts come
    /// back as `Unknown`. (No lease to renew: a running session owns its
    /// attempts for as long as it holds its session lock.)
    pub(super) async fn perform_guarded(
        &self,
        tool: &dyn ToolHandler,
        tool_name: &str,
        request: ToolRequest,
    ) -> PerformOutcome {
        let started = Instant::now();
        self.metrics_sink().attempt();
        let perform = tool.perform(request);
        let outcome = match self.config().perform_timeout {
            Some(timeout) => match tokio::time::timeout(timeout, perform).await {
                Ok(out) => out,
                Err(_) => Ok(PerformOutcome::Unknown {
                    reason: "timed out waiting for the downstream".into(),
                }),
            },
            None => perform.await,
        };
        let outcome = outcome.unwrap_or_else(|e| PerformOutcome::Unknown {
            reason: format!("tool error: {}", e.message),
        });
        self.metrics_sink().latency(tool_name, started.elapsed());
        outcome
    }
}

/// The request for one attempt (or lookup) of a whole-call execution.
pub(super) fn request_for(ticket: &Ticket) -> ToolRequest {
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

pub(super) fn unknown(attempt: &AttemptId, reason: &str) -> CallOutcome {
    CallOutcome::Unknown {
        execution_id: attempt.execution_id.clone(),
        attempt: attempt.attempt,
        reason: reason.to_owned(),
        retry_after: None,
    }
}

/// The downstream's id for an effect as the executor records it: an id the
/// ledger refuses (empty, or longer than
/// [`crate::model::text::MAX_FOREIGN_ID_BYTES`]) is not recorded, so that
/// the effect's result still is (once committed, nothing needs the id;
/// docs/design.md, "Sizes of stored text").
pub(super) fn storable_id(external_id: Option<String>) -> Option<String> {
    external_id.filter(|id| check_foreign_id("external id", id).is_ok())
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
    if crate::model::canonical::validate(&result_json, limits).is_ok() {
        result_json
    } else {
        let mut s = String::with_capacity(result_json.len() + 2);
        write_json_string(&mut s, &result_json);
        s
    }
}
