//! Independent batches: each item is its own commit with its own key and its
//! own durable completion record.
//!
//! The arguments are an object with an `items` array. Items run in order; an
//! item's completion is recorded (one sync) before the next starts, so after a
//! crash only the first unrecorded item can have reached the downstream. That
//! item alone is reconciled (lookup, or a resend under its own key); the ones
//! after it are simply performed. Each item goes to the tool as the exact
//! text the model sent.
//!
//! A batch is never reported as "nothing happened" once an item committed:
//! an item that fails for good, or a cancellation of the operation (checked
//! before every item: no item starts after a stop), ends it as a partial
//! commit whose result says which items happened and which did not.

use std::collections::BTreeSet;

use super::protocol::{completed, storable_id, storable_result, unknown, Step};
use super::tool::{LookupOutcome, PerformOutcome, ToolDescriptor, ToolHandler, ToolRequest};
use super::{backoff, CallOutcome, Executor, Result};
use crate::crashpoint::{self, CrashPoint};
use crate::ledger::{Resolution, Resolved, Ticket};
use crate::model::canonical::object_array_member;

/// Runs (or, with `reconcile`, first reconciles) the unfinished items.
pub(super) async fn perform_items(
    exec: &Executor,
    tool: &dyn ToolHandler,
    desc: &ToolDescriptor,
    ticket: Ticket,
    reconcile: bool,
) -> Result<Step> {
    // A resend starts a new attempt here, not in `drive`: it is this
    // executor's while it runs, and an orphan when the caller goes away
    // (dropped before the end) or a step fails.
    let mut resent = None;
    let step = perform_items_in(exec, tool, desc, ticket, reconcile, &mut resent).await?;
    if let Some(running) = resent {
        running.finish();
    }
    Ok(step)
}

async fn perform_items_in(
    exec: &Executor,
    tool: &dyn ToolHandler,
    desc: &ToolDescriptor,
    mut ticket: Ticket,
    reconcile: bool,
    resent: &mut Option<super::Running>,
) -> Result<Step> {
    let ledger = exec.ledger();
    let id = ticket.execution_id.clone();
    let limits = ledger.config().json_limits;
    let args = ticket.args_json.clone();
    let Some(items) = object_array_member(&args, "items", &limits).ok().flatten() else {
        if reconcile {
            return Ok(Step::Done(unknown(
                &ticket.attempt_id(),
                "batch arguments have no items array",
            )));
        }
        let reason = "batch arguments have no \"items\" array";
        let failed = ledger
            .fail_before_commit(&ticket.attempt_id(), reason, false)
            .map(|()| {
                Step::Done(CallOutcome::Failed {
                    execution_id: id.clone(),
                    reason: reason.into(),
                    retryable: false,
                })
            });
        return exec.or_current(&id, failed);
    };
    let mut done: BTreeSet<u32> = ledger
        .batch_items(&id)?
        .into_iter()
        .map(|(i, _, _)| i)
        .collect();
    let mut unknown_state = reconcile;
    let mut first_checked = false;
    // Set while the uncertain item is resent under its key without proof
    // that its earlier request cannot land any more.
    let mut earlier_unknown = None;
    // Set while the uncertain item is only resendable (a key), not proven
    // absent: a stop before its resend leaves the batch unknown.
    let mut in_doubt = false;
    for (index, item_json) in (0u32..).zip(items.iter()) {
        if done.contains(&index) {
            continue;
        }
        let request = ToolRequest {
            execution_id: id.clone(),
            downstream_key: id.batch_item(index).downstream_key(),
            tool_name: ticket.tool_name.clone(),
            arguments_json: (*item_json).to_owned(),
            attempt: ticket.attempt,
            item_index: Some(index),
            external_id: None,
        };
        if unknown_state {
            if !first_checked {
                // Only this item can have reached the downstream.
                first_checked = true;
                match settle_uncertain_item(exec, tool, desc, &ticket, &request).await? {
                    Settled::Found(result, external_id) => {
                        let recorded = ledger
                            .record_batch_item(
                                &ticket.attempt_id(),
                                index,
                                &result,
                                external_id.as_deref(),
                            )
                            .map(|_| ());
                        if let Err(e) = recorded {
                            // Settled as absent meanwhile by another
                            // resolver: the item is kept as evidence.
                            return exec.or_settled(&id, Err(e));
                        }
                        done.insert(index);
                        continue;
                    }
                    Settled::Absent => {}
                    Settled::Resendable if exec.operation_cancelled(&id)? => {
                        // Nothing proves the item absent and nothing may be
                        // sent after a stop: the app must settle it.
                        return Ok(Step::Done(unknown(
                            &ticket.attempt_id(),
                            "batch item outcome unknown after the operation was cancelled",
                        )));
                    }
                    Settled::Resendable => {
                        in_doubt = true;
                        earlier_unknown = exec
                            .landing_wait(desc, &ticket)
                            .and(ticket.unknown_since.clone());
                    }
                    Settled::Stop(step) => return Ok(step),
                }
            }
            // More items must run: a new attempt under the same item keys,
            // unless the operation was cancelled (then the batch ends here
            // if the uncertain item was proven absent above; if it is only
            // resendable, its outcome stays unknown for the app to settle).
            let stop = "batch item outcome unknown after the operation was cancelled";
            if exec.operation_cancelled(&id)? {
                if in_doubt {
                    return Ok(Step::Done(unknown(&ticket.attempt_id(), stop)));
                }
                return end_batch(exec, &ticket, &done, "operation cancelled", true);
            }
            if ticket.attempt >= exec.config().max_attempts {
                return Ok(Step::Done(unknown(
                    &ticket.attempt_id(),
                    "batch item not found downstream and no attempts left; resolve it",
                )));
            }
            let resolved = if in_doubt {
                ledger.resend_unknown(&ticket.attempt_id())
            } else {
                ledger.resolve_unknown(&ticket.attempt_id(), Resolution::NotFoundRetry)
            };
            match resolved {
                Ok(Resolved::Retry(t)) => {
                    if let Some(previous) = resent.take() {
                        previous.finish();
                    }
                    *resent = Some(exec.running(&t));
                    ticket = t;
                }
                // Cancelled since the check above: nothing was written.
                Err(crate::ledger::Error::OperationCancelled(_)) => {
                    return Ok(Step::Done(unknown(&ticket.attempt_id(), stop)));
                }
                Ok(other) => return Ok(exec.after_resolution(&ticket.attempt_id(), other)),
                Err(e) => return exec.or_settled(&id, Err(e)),
            }
            unknown_state = false;
        }
        // A stop halts the batch before its next item.
        if exec.operation_cancelled(&id)? {
            return end_batch(exec, &ticket, &done, "operation cancelled", false);
        }
        let request = ToolRequest {
            attempt: ticket.attempt,
            ..request
        };
        // Only the item that was uncertain is resent in doubt.
        ticket.earlier_unknown = earlier_unknown.take();
        crashpoint::hit(CrashPoint::BeforeRequest);
        match exec.perform_guarded(tool, &desc.name, request).await {
            PerformOutcome::Committed {
                result_json,
                external_id,
            } => {
                crashpoint::hit(CrashPoint::AfterRemoteCommit);
                let result = storable_result(result_json, &limits);
                let external_id = storable_id(external_id);
                let recorded = ledger
                    .record_batch_item(&ticket.attempt_id(), index, &result, external_id.as_deref())
                    .map(|_| ());
                if let Err(e) = recorded {
                    if let crate::ledger::Error::Store(_) = &e {
                        // Not written (suspended meanwhile, a full disk): kept
                        // with the attempt, which becomes this executor's
                        // orphan, for the next ask to record and go on.
                        exec.keep_unrecorded_item(
                            &ticket.attempt_id(),
                            index,
                            &result,
                            external_id.as_deref(),
                        );
                    }
                    return exec.or_current(&id, Err(e));
                }
                done.insert(index);
                crashpoint::hit(CrashPoint::AfterBatchItem);
            }
            PerformOutcome::JobStarted { .. } => {
                let outcome = PerformOutcome::Unknown {
                    reason: "a batch item started a background job".into(),
                };
                return exec.after_perform(desc, ticket, outcome);
            }
            PerformOutcome::FailedBeforeCommit { .. }
                if exec.earlier_may_land(desc, &ticket).is_some() =>
            {
                // The resend of the uncertain item was refused while its
                // earlier request may still land: still unknown.
                let wait = exec.earlier_may_land(desc, &ticket);
                let reason = format!(
                    "batch item {index}: resend refused while its earlier request may still land"
                );
                let marked = ledger
                    .mark_outcome_unknown(&ticket.attempt_id(), &reason)
                    .map(|_| {
                        Step::Done(CallOutcome::Unknown {
                            execution_id: id.clone(),
                            attempt: ticket.attempt,
                            reason,
                            retry_after: wait,
                        })
                    });
                return exec.or_current(&id, marked);
            }
            PerformOutcome::FailedBeforeCommit { reason, retryable } if !done.is_empty() => {
                // Items committed already: retry this item while attempts
                // last, else end as the partial commit it is.
                let reason = format!("item {index}: {reason}");
                if retryable && ticket.attempt < exec.config().max_attempts {
                    let failed = ledger.fail_before_commit(&ticket.attempt_id(), &reason, true);
                    if let Err(e) = failed {
                        return exec.or_current(&id, Err(e));
                    }
                    return Ok(Step::Retry {
                        after: backoff(exec.config(), ticket.attempt, id.as_str()),
                        id,
                    });
                }
                return end_batch(exec, &ticket, &done, &reason, false);
            }
            other => return exec.after_perform(desc, ticket, other),
        }
    }
    // Every item committed: one result holding the items' results in order.
    let stored = ledger.commit_batch(&ticket.attempt_id(), None);
    let step = stored.map(|s| {
        crashpoint::hit(CrashPoint::AfterLocalCommit);
        Step::Done(completed(s, false))
    });
    exec.or_current(&id, step)
}

/// What reconciling the one uncertain item found.
enum Settled {
    /// It committed: its result and external id.
    Found(String, Option<String>),
    /// Provably absent (a lookup past the landing window).
    Absent,
    /// Not proven absent, but a resend under its own key is safe.
    Resendable,
    /// Nothing more can be done now.
    Stop(Step),
}

async fn settle_uncertain_item(
    exec: &Executor,
    tool: &dyn ToolHandler,
    desc: &ToolDescriptor,
    ticket: &Ticket,
    request: &ToolRequest,
) -> Result<Settled> {
    let attempt = ticket.attempt_id();
    if desc.lookup {
        // A "not found" answers for the moment the lookup looked.
        let asked = exec.ledger().clock().monotonic();
        return Ok(match tool.lookup(request.clone()).await {
            Ok(LookupOutcome::Found {
                result_json,
                external_id,
            }) => {
                exec.metrics_sink().reconciled(true);
                let limits = exec.ledger().config().json_limits;
                Settled::Found(
                    storable_result(result_json, &limits),
                    storable_id(external_id),
                )
            }
            Ok(LookupOutcome::NotFound) => {
                exec.metrics_sink().reconciled(false);
                match exec.lookup_unproven(desc, ticket, Some(&asked)) {
                    // A same-key resend to a deduping downstream is safe.
                    Some(_) if desc.idempotency_key => Settled::Resendable,
                    Some(wait) => Settled::Stop(Step::Done(CallOutcome::Unknown {
                        execution_id: attempt.execution_id.clone(),
                        attempt: attempt.attempt,
                        reason:
                            "batch item not found downstream yet; the request sent may still land"
                                .into(),
                        retry_after: Some(wait),
                    })),
                    None => Settled::Absent,
                }
            }
            Ok(LookupOutcome::Unsupported) if desc.idempotency_key => Settled::Resendable,
            Ok(LookupOutcome::Unsupported) => Settled::Stop(Step::Done(unknown(
                &attempt,
                "batch item outcome unknown and cannot be looked up",
            ))),
            Err(e) => {
                exec.metrics_sink().reconcile_failed();
                Settled::Stop(Step::Done(unknown(
                    &attempt,
                    &format!("lookup failed: {}", e.message),
                )))
            }
        });
    }
    if desc.idempotency_key {
        return Ok(Settled::Resendable);
    }
    Ok(Settled::Stop(Step::Done(unknown(
        &attempt,
        "batch item outcome unknown; the downstream has no key or lookup",
    ))))
}

/// Ends a batch before all its items ran: a partial commit when some
/// committed, otherwise nothing happened (cancelled or failed for good).
fn end_batch(
    exec: &Executor,
    ticket: &Ticket,
    done: &BTreeSet<u32>,
    reason: &str,
    from_unknown: bool,
) -> Result<Step> {
    let ledger = exec.ledger();
    let attempt = ticket.attempt_id();
    let id = &ticket.execution_id;
    if !done.is_empty() {
        let step = if from_unknown {
            ledger
                .resolve_unknown(
                    &attempt,
                    Resolution::NotFoundAbandon {
                        reason: reason.to_owned(),
                    },
                )
                .map(|r| exec.after_resolution(&attempt, r))
        } else {
            ledger
                .commit_batch(&attempt, Some(reason))
                .map(|s| Step::Done(completed(s, false)))
        };
        return exec.or_current(id, step);
    }
    // Nothing committed: the attempt provably did nothing.
    let step = if from_unknown {
        ledger
            .resolve_unknown(
                &attempt,
                Resolution::NotFoundAbandon {
                    reason: reason.to_owned(),
                },
            )
            .map(|r| exec.after_resolution(&attempt, r))
    } else {
        ledger
            .fail_before_commit(&attempt, reason, false)
            .and_then(|()| ledger.cancel(id))
            .map(|_| {
                Step::Done(CallOutcome::Cancelled {
                    execution_id: id.clone(),
                })
            })
    };
    exec.or_current(id, step)
}
