//! Caller-driven calls: the same protocol as [`Executor::execute`], with the
//! tool run by the caller, inline, on its own thread.
//!
//! `execute` calls the tool back (`ToolHandler::perform`) from the
//! executor's task. From Swift, Kotlin or Python that costs a hop to the
//! library's async runtime and a call from a library thread back into the
//! language (attach a JVM thread, take Python's GIL, schedule on the app's
//! event loop), once or more per call. A caller that can run the tool itself
//! asks the executor what to do instead, one synchronous step at a time:
//!
//! ```text
//! start(op, round, call) ─► Done(outcome)          a replay, a conflict, in flight, …
//!                        ─► Perform(attempt) ──► the caller runs the tool ──► report(attempt, outcome)
//!                        ─► Lookup(attempt)  ──► the caller runs its lookup ─► report_lookup(attempt, found)
//!                        ─► Retry{attempt, after} ─► the caller waits ──────► retry(attempt)
//! ```
//!
//! Every rule of `execute` holds, because every decision is the same code
//! (`first_step`, `after_perform`, `reconcile_*`): the intent is durable
//! before `Perform` is handed out; a `Perform` hands out one attempt, owned
//! by this session; the report names that attempt ([`CallerAttempt`] carries
//! the execution id and attempt number, the attempt's fencing token), and the
//! ledger applies it only while that attempt is current and owned here — a
//! stale report is refused, what it carried kept as evidence, and the caller
//! gets the execution's current truth. A second caller of the same call
//! while the first one runs it gets `InFlight`; a process that dies between
//! the tool's effect and its report leaves a durable intent that the next
//! `start` (or `recover`) reconciles.
//!
//! Until its report, a handed-out attempt counts as running in this process
//! (`InFlight` to other callers): report every `Perform`, with
//! `Err(ToolError)` (an unknown outcome) when the tool threw or the caller
//! gave up. The executor's `perform_timeout` does not apply (the caller runs
//! the tool and owns its deadline). Independent batch tools are not offered
//! (their items are steps of their own): run them through `execute`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::protocol::{request_for, storable_id, storable_result, Reconciling, Step};
use super::readonly::{self, ReadOnlyNext};
use super::tool::{
    BatchMode, EffectClass, LookupOutcome, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};
use super::{CallOutcome, Error, Executor, Result};
use crate::crashpoint::{self, CrashPoint};
use crate::ledger::{self, AttemptId, Begin, CallSpec, Resolution, Ticket};
use crate::model::{ExecutionId, ExecutionStatus, OperationId, ToolCall};

/// One attempt (or lookup) that the caller runs itself. Its execution id and
/// attempt number are the attempt's fencing token: hand it back unchanged
/// with the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerAttempt {
    /// What the tool gets: arguments, the downstream key to send, the
    /// attempt number.
    pub request: ToolRequest,
    /// A read-only call: nothing is recorded for it.
    pub read_only: bool,
}

/// What the caller does next for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum CallerStep {
    /// Run the tool now with `request` (its intent is durable), then
    /// [`Executor::report`] what it did.
    Perform(CallerAttempt),
    /// An earlier attempt's outcome is unknown and the tool can look effects
    /// up: run its lookup with `request`, then [`Executor::report_lookup`].
    Lookup(CallerAttempt),
    /// A retryable failure with attempts left: wait `after`, then
    /// [`Executor::retry`].
    Retry {
        /// The attempt that failed.
        attempt: CallerAttempt,
        /// The backoff.
        after: Duration,
    },
    /// Finished: the answer for the model (or the app).
    Done(CallOutcome),
}

/// How many unreported lookups of one execution an executor remembers.
const MAX_LOOKUPS_HANDED_OUT: usize = 16;

/// An attempt this executor handed out and has not had reported yet.
pub(super) struct Driven {
    ticket: Ticket,
    started: Instant,
}

impl Executor {
    /// Starts one tool call that the caller runs itself (see the module
    /// docs): validates and begins it exactly as [`Executor::execute`]
    /// does, and answers what to do next. Nothing runs here.
    ///
    /// # Errors
    /// As `execute`: [`Error::UnknownTool`] and bad input (nothing
    /// recorded), storage failures (nothing handed out without its durable
    /// intent); [`Error::CallerDriven`] for an independent batch tool.
    pub fn start(&self, op: &OperationId, round: u32, call: ToolCall) -> Result<CallerStep> {
        let (tool, desc) = self.startable(&call)?;
        if desc.effect == EffectClass::ReadOnly {
            let request = readonly::prepare(self, op, round, &call, &desc)?;
            self.metrics_sink().attempt();
            return Ok(CallerStep::Perform(CallerAttempt {
                request,
                read_only: true,
            }));
        }
        let spec = CallSpec {
            call,
            tool_version: desc.version,
            requires_approval: desc.requires_approval,
            downstream: desc.downstream(),
        };
        let (mut begins, marked) =
            self.ledger()
                .begin_round_marking(op, round, std::slice::from_ref(&spec))?;
        let begin = begins
            .pop()
            .ok_or_else(|| Error::Internal("missing begin answer".into()))?;
        if let Begin::Reconcile(t) = &begin {
            if marked.contains(&t.execution_id) {
                self.metrics_sink().outcome_unknown(&desc.name);
            }
        }
        let step = self.first_step(tool.as_ref(), begin)?;
        self.hand_over(&desc, step)
    }

    /// Starts every call of one model response that the caller runs itself,
    /// as [`Executor::execute_round`] begins them: every call is checked
    /// first (an unknown tool, an independent batch tool, oversized or
    /// invalid arguments anywhere stop the whole round with nothing
    /// recorded), then the side-effecting calls are begun in one durable
    /// transaction (one sync for the round), and each call gets its first
    /// step, in call order. The caller walks each step as it walks
    /// [`Executor::start`]'s, in parallel if it likes (`max_parallel` is
    /// the caller's to keep here).
    ///
    /// If a call's first step fails after the round was begun (a storage
    /// error while an earlier attempt of it is reconciled), the attempts
    /// already handed out for the other calls are recorded as never sent
    /// ([`Executor::abandon_attempt`]: nothing is left in flight; the next
    /// ask runs them) and the error is returned.
    ///
    /// # Errors
    /// As [`Executor::start`], for any call of the round.
    pub fn start_round(
        &self,
        op: &OperationId,
        round: u32,
        calls: Vec<ToolCall>,
    ) -> Result<Vec<CallerStep>> {
        let mut checked = Vec::with_capacity(calls.len());
        for call in &calls {
            checked.push(self.startable(call)?);
        }
        let mut steps: Vec<Option<CallerStep>> = vec![None; calls.len()];
        let mut specs = Vec::new();
        let mut begun = Vec::new();
        for (index, (call, (tool, desc))) in calls.into_iter().zip(checked).enumerate() {
            if desc.effect == EffectClass::ReadOnly {
                let request = readonly::prepare(self, op, round, &call, &desc)?;
                if let Some(slot) = steps.get_mut(index) {
                    *slot = Some(CallerStep::Perform(CallerAttempt {
                        request,
                        read_only: true,
                    }));
                }
            } else {
                specs.push(CallSpec {
                    call,
                    tool_version: desc.version,
                    requires_approval: desc.requires_approval,
                    downstream: desc.downstream(),
                });
                begun.push((index, tool, desc));
            }
        }
        if !specs.is_empty() {
            let (begins, marked) = self.ledger().begin_round_marking(op, round, &specs)?;
            if begins.len() != begun.len() {
                return Err(Error::Internal("missing begin answer".into()));
            }
            let mut first_error = None;
            for ((index, tool, desc), begin) in begun.into_iter().zip(begins) {
                if let Begin::Reconcile(t) = &begin {
                    if marked.contains(&t.execution_id) {
                        self.metrics_sink().outcome_unknown(&desc.name);
                    }
                }
                // Every begun call gets its step, even after an error: a
                // call begun and left without one would stay in flight.
                match self
                    .first_step(tool.as_ref(), begin)
                    .and_then(|step| self.hand_over(&desc, step))
                {
                    Ok(step) => {
                        if let Some(slot) = steps.get_mut(index) {
                            *slot = Some(step);
                        }
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_error {
                for step in steps.iter().flatten() {
                    if let CallerStep::Perform(a) = step {
                        if !a.read_only {
                            // A failure to record it leaves the attempt this
                            // executor's orphan (reconciled at the next ask).
                            let _ = self.abandon_attempt(
                                &a.request.execution_id,
                                a.request.attempt,
                                "its round failed to start; it was never sent",
                            );
                        }
                    }
                }
                return Err(e);
            }
        }
        let mut out = Vec::with_capacity(steps.len());
        for step in steps {
            let step = step.ok_or_else(|| Error::Internal("missing step of a round".into()))?;
            if matches!(&step, CallerStep::Perform(a) if a.read_only) {
                self.metrics_sink().attempt();
            }
            out.push(step);
        }
        Ok(out)
    }

    /// [`Executor::start`] answered at once, on the caller's thread, where
    /// it needs no write and no wait: the replay of a call that committed
    /// with the same arguments (`CallerStep::Done`, exactly `start`'s
    /// answer), read only if the ledger's connection is free at this moment
    /// ([`crate::ledger::Ledger::begin_now`]). `Ok(None)` — call `start`,
    /// where waiting is allowed — for a new call, any other stored state, a
    /// read-only tool (its tool must run) and whenever the read would wait
    /// (another call holds the connection across its fsync, or SQLite is
    /// busy). Nothing is written or queued, whatever the answer.
    ///
    /// # Errors
    /// As `start` for what it checks first: [`Error::UnknownTool`], bad
    /// input (nothing recorded), [`Error::CallerDriven`]; a suspended
    /// ledger's `Suspended`, as `start`; storage errors of the read.
    pub fn start_now(
        &self,
        op: &OperationId,
        round: u32,
        call: &ToolCall,
    ) -> Result<Option<CallerStep>> {
        let (tool, desc) = self.startable(call)?;
        if desc.effect == EffectClass::ReadOnly {
            return Ok(None);
        }
        let spec = CallSpec {
            call: call.clone(),
            tool_version: desc.version,
            requires_approval: desc.requires_approval,
            downstream: desc.downstream(),
        };
        let Some(begin) = self.ledger().begin_now(op, round, &spec)? else {
            return Ok(None);
        };
        let step = self.first_step(tool.as_ref(), begin)?;
        self.hand_over(&desc, step).map(Some)
    }

    /// The checks `start` and `start_now` make before anything else: the
    /// tool is registered, not an independent batch, the arguments within
    /// the size limit.
    fn startable(&self, call: &ToolCall) -> Result<(Arc<dyn ToolHandler>, ToolDescriptor)> {
        let tool = self.tool(&call.tool_name)?;
        let desc = tool.descriptor();
        if desc.batch == BatchMode::Independent {
            return Err(Error::CallerDriven(desc.name));
        }
        let max = self.ledger().config().json_limits.max_bytes;
        if call.arguments.len() > max {
            return Err(crate::model::JsonError::TooLarge {
                size: call.arguments.len(),
                max,
            }
            .into());
        }
        Ok((tool, desc))
    }

    /// Reports what the tool did for a [`CallerStep::Perform`] attempt
    /// (`Err`: it threw, or the caller gave up on it — an unknown outcome),
    /// and answers what to do next. The ledger applies it only while that
    /// attempt is current and owned by this session; a stale report changes
    /// nothing (a result it carried is kept as evidence) and gets the
    /// execution's current truth.
    ///
    /// # Errors
    /// [`Error::CallerDriven`] for an attempt whose kind does not match its
    /// tool; ledger errors (`NoSuchAttempt` for an attempt the execution
    /// never had, `NotFound`, storage).
    pub fn report(
        &self,
        attempt: &CallerAttempt,
        outcome: std::result::Result<PerformOutcome, ToolError>,
    ) -> Result<CallerStep> {
        let outcome = outcome.unwrap_or_else(|e| PerformOutcome::Unknown {
            reason: format!("tool error: {}", e.message),
        });
        let desc = self.checked_descriptor(attempt)?;
        let request = &attempt.request;
        if attempt.read_only {
            return Ok(match readonly::settle(self, request, outcome) {
                ReadOnlyNext::Done(outcome) => CallerStep::Done(outcome),
                ReadOnlyNext::Retry(after) => {
                    let mut next = attempt.clone();
                    next.request.attempt = request.attempt.saturating_add(1);
                    CallerStep::Retry {
                        attempt: next,
                        after,
                    }
                }
            });
        }
        // The attempt is reported under the tool it was handed out for (or
        // the stored execution's): another tool's name would apply that
        // tool's rules (its durability policy, its reconciliation) to this
        // execution. Checked before the attempt is taken.
        // An attempt not outstanding here is read once: for the check and
        // for its report.
        let (real_tool, stored) = match self.driven_tool(&request.execution_id, request.attempt) {
            Some(name) => (name, None),
            None => {
                let (name, ticket) = self.ticket_of(&request.execution_id, request.attempt)?;
                (name, Some(ticket))
            }
        };
        if real_tool != desc.name {
            return Err(Error::CallerDriven(request.tool_name.clone()));
        }
        let taken = match stored {
            Some(_) => None,
            None => self.take_driven(&request.execution_id, request.attempt),
        };
        let (ticket, outcome) = match taken {
            Some(driven) => {
                self.metrics_sink()
                    .latency(&desc.name, driven.started.elapsed());
                (driven.ticket, outcome)
            }
            None => {
                // Not outstanding, or reported meanwhile by another thread.
                let ticket = match stored {
                    Some(ticket) => ticket,
                    None => self.ticket_of(&request.execution_id, request.attempt)?.1,
                };
                let step = self.record_not_handed_out(&desc, ticket, outcome)?;
                return self.hand_over(&desc, step);
            }
        };
        let step = self.record_report(&desc, ticket, outcome)?;
        if let Step::Retry { after, .. } = step {
            return Ok(CallerStep::Retry {
                attempt: attempt.clone(),
                after,
            });
        }
        self.hand_over(&desc, step)
    }

    /// [`Executor::report`] for a side-effecting attempt named by its
    /// fencing token alone — execution id and attempt number — for callers
    /// that keep no copy of the attempt's request (the bindings: handing
    /// the whole attempt back costs a language more than the report). The
    /// rules are `report`'s: the tool is the one the attempt was handed out
    /// for (or the stored execution's), applied only while that attempt is
    /// current and owned here. A read-only attempt is reported with
    /// `report`: nothing is stored for a token to name.
    ///
    /// # Errors
    /// As [`Executor::report`] (`NotFound` for a read-only call's id too).
    pub fn report_attempt(
        &self,
        id: &ExecutionId,
        attempt: u32,
        outcome: std::result::Result<PerformOutcome, ToolError>,
    ) -> Result<CallerStep> {
        let outcome = outcome.unwrap_or_else(|e| PerformOutcome::Unknown {
            reason: format!("tool error: {}", e.message),
        });
        // The descriptor is checked before the attempt is taken, as
        // `report` does: a refused report leaves the attempt outstanding.
        let (desc, ticket, outcome) = match self.driven_tool(id, attempt) {
            Some(tool_name) => {
                let desc = self.side_effect_descriptor(&tool_name)?;
                match self.take_driven(id, attempt) {
                    Some(driven) => {
                        self.metrics_sink()
                            .latency(&desc.name, driven.started.elapsed());
                        (desc, driven.ticket, outcome)
                    }
                    // Reported meanwhile by another thread: the fence decides.
                    None => {
                        let ticket = self.ticket_of(id, attempt)?.1;
                        let step = self.record_not_handed_out(&desc, ticket, outcome)?;
                        return self.hand_over(&desc, step);
                    }
                }
            }
            None if self.running_here(id, attempt) => {
                // This executor runs that attempt itself (`execute`): a
                // report from outside would take it from under its own
                // `perform`. Refused: the call is in flight, nothing changes.
                return Ok(CallerStep::Done(CallOutcome::InFlight {
                    execution_id: id.clone(),
                    retry_after: None,
                }));
            }
            None => {
                let (tool_name, ticket) = self.ticket_of(id, attempt)?;
                let desc = self.side_effect_descriptor(&tool_name)?;
                let step = self.record_not_handed_out(&desc, ticket, outcome)?;
                return self.hand_over(&desc, step);
            }
        };
        let step = self.record_report(&desc, ticket, outcome)?;
        self.hand_over(&desc, step)
    }

    /// Reports that the caller was interrupted while it ran side-effecting
    /// attempt `attempt` of `id` (a cancelled task, a `KeyboardInterrupt`):
    /// the request may have left, so the outcome is unknown. Unlike a
    /// report of `Unknown`, which answers the next step at once (for a key
    /// tool a same-key resend, already executing, that an interrupted
    /// caller would not run), nothing is handed out: the call is left
    /// unknown for the next ask (or `recover()`) to reconcile — a resend
    /// under the same key, a lookup, or the unknown outcome for the app —
    /// and a caller interrupted again while this report returns leaves
    /// nothing running. An attempt this executor has not outstanding
    /// changes nothing and gets the current truth. `reason` is stored.
    ///
    /// # Errors
    /// [`Error::CallerDriven`] for a read-only tool's call; ledger errors
    /// (`NotFound`, storage: the attempt is then this executor's orphan,
    /// reconciled at the next ask).
    pub fn report_interrupted(
        &self,
        id: &ExecutionId,
        attempt: u32,
        reason: &str,
    ) -> Result<CallerStep> {
        let Some(tool_name) = self.driven_tool(id, attempt) else {
            return Ok(CallerStep::Done(self.current_outcome(id)?));
        };
        let desc = self.side_effect_descriptor(&tool_name)?;
        let Some(driven) = self.take_driven(id, attempt) else {
            return Ok(CallerStep::Done(self.current_outcome(id)?));
        };
        self.metrics_sink()
            .latency(&desc.name, driven.started.elapsed());
        let recorded = self
            .ledger()
            .mark_outcome_unknown(&driven.ticket.attempt_id(), reason)
            .map(|_| {
                self.metrics_sink().outcome_unknown(&desc.name);
                Step::Done(CallOutcome::Unknown {
                    execution_id: id.clone(),
                    attempt,
                    reason: reason.to_owned(),
                    retry_after: None,
                })
            });
        let step = self
            .or_current(id, recorded)
            .inspect_err(|_| self.orphan(id, attempt))?;
        self.hand_over(&desc, step)
    }

    /// Reports that the caller never sent side-effecting attempt `attempt`
    /// of `id`, which this executor handed out (`Perform`) and which has
    /// not been reported: the caller was interrupted after it got the
    /// attempt and before the request left. Nothing more is handed out and
    /// the call is left for the next ask, as what was true before the
    /// attempt:
    ///
    /// - a resend under the same key after an earlier attempt's outcome
    ///   became unknown: still unknown (`Done(Unknown)`); the next ask
    ///   reconciles it (a resend under the same key, a lookup, or the
    ///   unknown outcome for the app). Reporting such a resend as
    ///   `FailedBeforeCommit` would be wrong: a refusal of the resend is
    ///   evidence about the earlier request, an attempt never sent is not.
    /// - any other attempt (the first, or one after a proven failure):
    ///   failed before commit, retryable (`Done(Failed)`); the next ask
    ///   runs it.
    ///
    /// The abandoned attempt counts towards `max_attempts` (its number was
    /// handed out). An attempt this executor has not outstanding (reported
    /// already, or handed out elsewhere) changes nothing: the answer is the
    /// execution's current truth. `reason` is stored: no argument values.
    ///
    /// # Errors
    /// [`Error::CallerDriven`] for a read-only tool's call; ledger errors
    /// (`NotFound`, storage: the attempt is then this executor's orphan,
    /// reconciled at the next ask).
    pub fn abandon_attempt(
        &self,
        id: &ExecutionId,
        attempt: u32,
        reason: &str,
    ) -> Result<CallerStep> {
        let Some(tool_name) = self.driven_tool(id, attempt) else {
            return Ok(CallerStep::Done(self.current_outcome(id)?));
        };
        let desc = self.side_effect_descriptor(&tool_name)?;
        let Some(driven) = self.take_driven(id, attempt) else {
            // Reported meanwhile by another thread.
            return Ok(CallerStep::Done(self.current_outcome(id)?));
        };
        let ticket = driven.ticket;
        let attempt_id = ticket.attempt_id();
        let ledger = self.ledger();
        let recorded = if ticket.resend {
            let reason =
                format!("resend not sent ({reason}); the earlier attempt's outcome is unknown");
            ledger.mark_outcome_unknown(&attempt_id, &reason).map(|_| {
                self.metrics_sink().outcome_unknown(&desc.name);
                Step::Done(CallOutcome::Unknown {
                    execution_id: id.clone(),
                    attempt,
                    reason,
                    retry_after: None,
                })
            })
        } else {
            let reason = format!("not sent ({reason})");
            ledger
                .fail_before_commit(&attempt_id, &reason, true)
                .map(|()| {
                    Step::Done(CallOutcome::Failed {
                        execution_id: id.clone(),
                        reason,
                        retryable: true,
                    })
                })
        };
        let step = self
            .or_current(id, recorded)
            .inspect_err(|_| self.orphan(id, attempt))?;
        self.hand_over(&desc, step)
    }

    /// Records a report of an attempt this executor has not outstanding
    /// (reported twice, handed out by another executor, or by a session of
    /// this ledger file that is gone): the ledger's fence decides, and a
    /// refusal is not taken as proof (`not_handed_out`). One exception: a
    /// result for the execution's *current* attempt whose owner session is
    /// dead (the app closed or lost its ledger, opened it again and reports
    /// what the tool did) is the truth about that attempt, and nobody else
    /// sent it again: the execution is taken over as a new ask would take
    /// it (the attempt becomes unknown) and settled with the result, as a
    /// lookup that found it settles it. Refused by the fence instead, the
    /// result was kept only as evidence and the caller told `InFlight`; a
    /// tool with neither key nor lookup then needed the app to resolve a
    /// call whose result the ledger held.
    fn record_not_handed_out(
        &self,
        desc: &ToolDescriptor,
        ticket: Ticket,
        outcome: PerformOutcome,
    ) -> Result<Step> {
        if let PerformOutcome::Committed {
            result_json,
            external_id,
        } = &outcome
        {
            if let Some(step) =
                self.settle_a_dead_owners_attempt(&ticket, result_json, external_id)?
            {
                return Ok(step);
            }
        }
        self.record_report(desc, ticket, not_handed_out(outcome))
    }

    /// See [`Self::record_not_handed_out`]: `None` when the attempt is not
    /// the current one of a running execution owned by a dead session.
    fn settle_a_dead_owners_attempt(
        &self,
        ticket: &Ticket,
        result_json: &str,
        external_id: &Option<String>,
    ) -> Result<Option<Step>> {
        let ledger = self.ledger();
        let id = &ticket.execution_id;
        let Some(rec) = ledger.get(id)? else {
            return Ok(None);
        };
        if rec.status != ExecutionStatus::Executing
            || rec.attempt_count != ticket.attempt
            || rec.owner_session.as_ref() == Some(ledger.session_id())
        {
            return Ok(None);
        }
        // What a new ask does with it: a live owner's attempt is left
        // alone (nothing written), a dead owner's becomes unknown. Never a
        // new attempt: had the row moved on since the check (the owner's
        // own refusal, retryable), `continue_execution` started the next
        // attempt, owned here and run by nobody (`InFlight` to everyone
        // else, the owner's retry included, for the life of this process).
        let Some(taken) = ledger.take_over_dead_attempt(&ticket.attempt_id())? else {
            return Ok(None);
        };
        // Settled as a lookup that found it settles it. Committed
        // meanwhile by another reconciler (another session's lookup) with
        // another result (another external id), the ledger refuses this
        // one and keeps it as evidence (the same result keeps nothing); the
        // answer is the stored result.
        let attempt = taken.attempt_id();
        let resolved = ledger.resolve_unknown(
            &attempt,
            Resolution::Found {
                result_json: storable_result(result_json.to_owned(), &ledger.config().json_limits),
                external_id: storable_id(external_id.clone()),
            },
        );
        match resolved {
            Ok(r) => {
                self.metrics_sink().reconciled(true);
                Ok(Some(self.after_resolution(&attempt, r)))
            }
            Err(e) => self.or_current(id, Err(e)).map(Some),
        }
    }

    /// Records a reported outcome (the ledger's fence decides whether it
    /// applies) and decides the next step.
    fn record_report(
        &self,
        desc: &ToolDescriptor,
        ticket: Ticket,
        outcome: PerformOutcome,
    ) -> Result<Step> {
        let id = ticket.execution_id.clone();
        let attempt_no = ticket.attempt;
        self.after_perform(desc, ticket, outcome).inspect_err(|_| {
            // Not recorded (a storage failure): nobody in this process will
            // finish the attempt, so the next ask reconciles it, as for an
            // `execute` whose step failed.
            self.orphan(&id, attempt_no);
        })
    }

    /// Reports what the tool's lookup found for a [`CallerStep::Lookup`]
    /// (`Err`: the lookup failed; the outcome stays unknown), and answers
    /// what to do next: commit a found effect, resend under the same key, or
    /// surface the unknown outcome. A lookup for an attempt that is no longer
    /// the unknown one changes nothing and gets the current truth.
    ///
    /// # Errors
    /// As [`Executor::report`].
    pub fn report_lookup(
        &self,
        attempt: &CallerAttempt,
        found: std::result::Result<LookupOutcome, ToolError>,
    ) -> Result<CallerStep> {
        let desc = self.checked_descriptor(attempt)?;
        if attempt.read_only {
            return Err(Error::CallerDriven(desc.name));
        }
        let id = &attempt.request.execution_id;
        let rec = self
            .ledger()
            .get(id)?
            .ok_or_else(|| ledger::Error::NotFound(id.clone()))?;
        if rec.status != ExecutionStatus::OutcomeUnknown
            || rec.attempt_count != attempt.request.attempt
        {
            if let Ok(LookupOutcome::Found {
                result_json,
                external_id,
            }) = found
            {
                // An effect found for an attempt settled or superseded
                // meanwhile (another session's "not found", a resend): the
                // ledger's fence keeps it as evidence, as for the executor's
                // own lookup, instead of dropping it.
                let limits = &self.ledger().config().json_limits;
                let looked = AttemptId::new(id.clone(), attempt.request.attempt);
                let kept = self.ledger().resolve_unknown(
                    &looked,
                    Resolution::Found {
                        result_json: storable_result(result_json, limits),
                        external_id: storable_id(external_id),
                    },
                );
                match kept {
                    Err(ledger::Error::StaleAttempt { .. })
                    | Err(ledger::Error::InvalidTransition { .. }) => {}
                    Err(e) => return Err(e.into()),
                    // Unknown again at this attempt since the read: found.
                    Ok(r) => {
                        let step = self.after_resolution(&looked, r);
                        return self.hand_over(&desc, step);
                    }
                }
            }
            return Ok(CallerStep::Done(self.current_outcome(id)?));
        }
        // When the lookup was handed out: its "not found" proves nothing
        // about a request landing after it looked (a lookup reported late,
        // or one this executor did not hand out, looked when it looked).
        // A report that is no "not found" (a failed lookup) is judged by
        // nothing and takes the latest hand-out: taking the earliest would
        // leave a "not found" seen inside the window, reported after it, to
        // be judged by a later hand-out.
        let not_found = matches!(found, Ok(LookupOutcome::NotFound));
        let asked = self.take_lookup(id, attempt.request.attempt, not_found);
        let step =
            self.reconcile_after_lookup(&desc, Ticket::from_record(&rec), found, asked.as_ref())?;
        self.hand_over(&desc, step)
    }

    /// After a [`CallerStep::Retry`]'s wait: starts the next attempt (unless
    /// the operation was cancelled meanwhile, or the call moved on) and
    /// answers what to do next.
    ///
    /// # Errors
    /// As [`Executor::report`].
    pub fn retry(&self, attempt: &CallerAttempt) -> Result<CallerStep> {
        let desc = self.checked_descriptor(attempt)?;
        if attempt.read_only {
            self.metrics_sink().attempt();
            return Ok(CallerStep::Perform(attempt.clone()));
        }
        let tool = self.tool(&desc.name)?;
        let begin = self
            .ledger()
            .continue_execution(&attempt.request.execution_id)?;
        let step = self.first_step(tool.as_ref(), begin)?;
        self.hand_over(&desc, step)
    }

    /// The descriptor of `attempt`'s tool, checking that the attempt's kind
    /// (read-only or not) is the tool's: a read-only "attempt" for a
    /// side-effecting tool would skip the ledger.
    fn checked_descriptor(&self, attempt: &CallerAttempt) -> Result<ToolDescriptor> {
        self.kind_checked(&attempt.request.tool_name, attempt.read_only)
    }

    /// The descriptor of side-effecting tool `name`, checked as
    /// [`Self::checked_descriptor`] checks a side-effecting attempt's.
    fn side_effect_descriptor(&self, name: &str) -> Result<ToolDescriptor> {
        self.kind_checked(name, false)
    }

    fn kind_checked(&self, name: &str, read_only: bool) -> Result<ToolDescriptor> {
        let desc = self.tool(name)?.descriptor();
        if (desc.effect == EffectClass::ReadOnly) != read_only
            || desc.batch == BatchMode::Independent
        {
            return Err(Error::CallerDriven(desc.name));
        }
        Ok(desc)
    }

    /// Turns a step into what the caller does next, running the steps that
    /// need no tool (reconciliation without a lookup, a resolution) here.
    /// Bounded: a reconciliation settles into a perform or an answer.
    fn hand_over(&self, desc: &ToolDescriptor, mut step: Step) -> Result<CallerStep> {
        loop {
            step = match step {
                Step::Done(outcome) => {
                    if matches!(
                        outcome,
                        CallOutcome::Completed { .. }
                            | CallOutcome::Failed { .. }
                            | CallOutcome::Rejected { .. }
                            | CallOutcome::Cancelled { .. }
                    ) {
                        self.forget_lookups(outcome.execution_id());
                    }
                    return Ok(CallerStep::Done(outcome));
                }
                Step::Perform(ticket) => {
                    // A new attempt: no lookup of an earlier one counts.
                    self.forget_lookups(&ticket.execution_id);
                    let request = request_for(&ticket);
                    self.drive_by_caller(ticket);
                    crashpoint::hit(CrashPoint::BeforeRequest);
                    return Ok(CallerStep::Perform(CallerAttempt {
                        request,
                        read_only: false,
                    }));
                }
                Step::Reconcile(ticket) => match self.reconcile_start(desc, &ticket)? {
                    Reconciling::Lookup => {
                        self.hand_out_lookup(&ticket);
                        return Ok(CallerStep::Lookup(CallerAttempt {
                            request: request_for(&ticket),
                            read_only: false,
                        }));
                    }
                    Reconciling::Settled(next) => *next,
                },
                Step::Retry { id, after } => {
                    let rec = self
                        .ledger()
                        .get(&id)?
                        .ok_or_else(|| ledger::Error::NotFound(id.clone()))?;
                    return Ok(CallerStep::Retry {
                        attempt: CallerAttempt {
                            request: request_for(&Ticket::from_record(&rec)),
                            read_only: false,
                        },
                        after,
                    });
                }
            };
        }
    }

    /// Counts `ticket`'s attempt as running in this process until its report.
    fn drive_by_caller(&self, ticket: Ticket) {
        self.metrics_sink().attempt();
        if let Ok(mut a) = self.inner.attempts.lock() {
            let id = ticket.execution_id.clone();
            a.orphans.remove(&id);
            a.running.insert(id.clone(), ticket.attempt);
            a.driven.insert(
                id,
                Driven {
                    ticket,
                    started: Instant::now(),
                },
            );
        }
    }

    /// Notes that a lookup for `ticket`'s unknown attempt is handed out now.
    fn hand_out_lookup(&self, ticket: &Ticket) {
        let asked = self.ledger().clock().monotonic();
        if let Ok(mut a) = self.inner.attempts.lock() {
            let handed = a.lookups.entry(ticket.execution_id.clone()).or_default();
            handed.retain(|(attempt, _)| *attempt == ticket.attempt);
            // Bounded: past the bound a report takes an older hand-out's
            // time, which only ever proves less.
            if handed.len() < MAX_LOOKUPS_HANDED_OUT {
                handed.push((ticket.attempt, asked));
            }
        }
    }

    /// The earliest (`earliest`; else the latest) time a lookup for
    /// attempt `attempt` of `id` still unreported was handed out by this
    /// executor (taken: each hand-out answers one report). A report cannot
    /// tell which of several it answers, so a "not found" is judged by the
    /// earliest; any other report takes the latest, so the hand-outs left
    /// are never later than those of the callers still to report.
    fn take_lookup(
        &self,
        id: &ExecutionId,
        attempt: u32,
        earliest: bool,
    ) -> Option<crate::model::Monotonic> {
        let mut a = self.inner.attempts.lock().ok()?;
        let handed = a.lookups.get_mut(id)?;
        let of_attempt = handed
            .iter()
            .enumerate()
            .filter(|(_, (a_no, _))| *a_no == attempt);
        let pick = if earliest {
            of_attempt.min_by_key(|(_, (_, at))| at.ms)
        } else {
            of_attempt.max_by_key(|(_, (_, at))| at.ms)
        }
        .map(|(i, _)| i)?;
        let (_, at) = handed.swap_remove(pick);
        if handed.is_empty() {
            a.lookups.remove(id);
        }
        Some(at)
    }

    /// Forgets the lookups handed out for `id`: the call was settled or
    /// moved on to a new attempt, so no report of them can count (a report
    /// of a lookup not remembered proves nothing). Without this, a lookup
    /// handed out and never reported (an interrupted caller) was kept for
    /// the life of the executor.
    pub(super) fn forget_lookups(&self, id: &ExecutionId) {
        if let Ok(mut a) = self.inner.attempts.lock() {
            a.lookups.remove(id);
        }
    }

    /// Marks attempt `attempt` of `id` as nobody's in this process (see
    /// `Executor::take_over_orphan`).
    fn orphan(&self, id: &ExecutionId, attempt: u32) {
        if let Ok(mut a) = self.inner.attempts.lock() {
            if !a.running.contains_key(id) {
                a.orphans.insert(id.clone(), attempt);
            }
        }
    }

    /// Takes the outstanding attempt `attempt` of `id`, if this executor
    /// handed it out and it was not reported yet.
    fn take_driven(&self, id: &ExecutionId, attempt: u32) -> Option<Driven> {
        let mut a = self.inner.attempts.lock().ok()?;
        if a.driven.get(id).map(|d| d.ticket.attempt) != Some(attempt) {
            return None;
        }
        a.running.remove(id);
        a.driven.remove(id)
    }

    /// Is attempt `attempt` of `id` one an executor of this ledger runs in
    /// its own `perform` (not handed to a caller)? A report through any
    /// executor would take it from under that `perform`.
    fn running_here(&self, id: &ExecutionId, attempt: u32) -> bool {
        self.inner.ledger.runs_here(id, attempt)
            && self
                .inner
                .attempts
                .lock()
                .is_ok_and(|a| !a.driven.contains_key(id))
    }

    /// The tool of attempt `attempt` of `id`, if this executor handed it
    /// out and it was not reported yet.
    fn driven_tool(&self, id: &ExecutionId, attempt: u32) -> Option<String> {
        let a = self.inner.attempts.lock().ok()?;
        a.driven
            .get(id)
            .filter(|d| d.ticket.attempt == attempt)
            .map(|d| d.ticket.tool_name.clone())
    }

    /// A ticket for a reported attempt this executor did not hand out: the
    /// stored execution, at the attempt the report names (the ledger
    /// refuses it unless that attempt is current and owned here), and its
    /// tool's name.
    fn ticket_of(&self, id: &ExecutionId, attempt: u32) -> Result<(String, Ticket)> {
        let rec = self
            .ledger()
            .get(id)?
            .ok_or_else(|| ledger::Error::NotFound(id.clone()))?;
        let mut ticket = Ticket::from_record(&rec);
        ticket.attempt = attempt;
        Ok((rec.tool_name, ticket))
    }
}

/// What a report for an attempt this executor has not outstanding
/// (reported twice, or handed out by another executor of this ledger)
/// counts as: the ledger's fence decides, and without the attempt's context
/// a refusal is not taken as proof that an earlier request cannot land.
fn not_handed_out(outcome: PerformOutcome) -> PerformOutcome {
    match outcome {
        PerformOutcome::FailedBeforeCommit { reason, .. } => PerformOutcome::Unknown {
            reason: format!("refused ({reason}); reported for an attempt not handed out here"),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Ledger, LedgerConfig, ManualClock};
    use crate::model::ToolCall;

    struct Found;

    #[async_trait::async_trait]
    impl ToolHandler for Found {
        fn descriptor(&self) -> ToolDescriptor {
            ToolDescriptor {
                lookup: true,
                ..ToolDescriptor::side_effect("pay", 1)
            }
        }
        async fn perform(&self, _: ToolRequest) -> std::result::Result<PerformOutcome, ToolError> {
            unreachable!("caller-driven")
        }
    }

    fn lookups_kept(exec: &Executor) -> usize {
        exec.inner.attempts.lock().unwrap().lookups.len()
    }

    /// A Lookup handed out and never reported (the caller was interrupted:
    /// Python drops the one an interrupted attempt's report hands out) was
    /// kept for the life of the executor once the call was settled by
    /// another report: one entry per such call, never freed.
    #[test]
    fn a_settled_call_keeps_no_lookup_hand_out() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let ledger = Ledger::open_in_memory(LedgerConfig::default(), clock).unwrap();
        let exec = Executor::new(Arc::new(ledger), super::super::ExecutorConfig::default());
        exec.register(Arc::new(Found)).unwrap();
        for n in 0..3 {
            let op = OperationId::new(format!("op{n}")).unwrap();
            let call = ToolCall::custom("c1", "pay", "{}");
            let CallerStep::Perform(a1) = exec.start(&op, 0, call.clone()).unwrap() else {
                panic!()
            };
            let step = exec
                .report(
                    &a1,
                    Ok(PerformOutcome::Unknown {
                        reason: "interrupted".into(),
                    }),
                )
                .unwrap();
            // Dropped: its caller was interrupted.
            let CallerStep::Lookup(_) = step else {
                panic!("{step:?}")
            };
            let CallerStep::Lookup(l) = exec.start(&op, 0, call).unwrap() else {
                panic!()
            };
            let step = exec
                .report_lookup(
                    &l,
                    Ok(LookupOutcome::Found {
                        result_json: "{}".into(),
                        external_id: None,
                    }),
                )
                .unwrap();
            assert!(
                matches!(step, CallerStep::Done(CallOutcome::Completed { .. })),
                "{step:?}"
            );
        }
        assert_eq!(lookups_kept(&exec), 0);
    }
}
