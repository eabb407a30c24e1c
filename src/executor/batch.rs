//! Independent batches: each item is its own commit with its own key and its
//! own durable completion record.
//!
//! The arguments are an object with an `items` array. Items run in order; an
//! item's completion is recorded (one sync) before the next starts, so after a
//! crash only the first unrecorded item can have reached the downstream. That
//! item alone is reconciled (lookup, or a resend under its own key); the ones
//! after it are simply performed.

use std::collections::BTreeMap;

use super::protocol::{storable_result, unknown, Step};
use super::tool::{LookupOutcome, PerformOutcome, ToolDescriptor, ToolHandler, ToolRequest};
use super::{CallOutcome, Executor, Result};
use crate::crashpoint::{self, CrashPoint};
use crate::ledger::{Resolution, Resolved, Ticket};
use crate::model::canonical::canonicalize;

/// Parses the `items` of a batch call into canonical JSON texts.
fn items_of(args_json: &str, limits: &crate::model::JsonLimits) -> Option<Vec<String>> {
    let value: serde_json::Value = serde_json::from_str(args_json).ok()?;
    let items = value.get("items")?.as_array()?;
    items
        .iter()
        .map(|item| {
            serde_json::to_string(item)
                .ok()
                .and_then(|t| canonicalize(&t, limits).ok())
        })
        .collect()
}

/// Runs (or, with `reconcile`, first reconciles) the unfinished items.
pub(super) async fn perform_items(
    exec: &Executor,
    tool: &dyn ToolHandler,
    desc: &ToolDescriptor,
    mut ticket: Ticket,
    reconcile: bool,
) -> Result<Step> {
    let ledger = exec.ledger();
    let id = ticket.execution_id.clone();
    let limits = ledger.config().json_limits;
    let Some(items) = items_of(&ticket.args_json, &limits) else {
        if reconcile {
            return Ok(Step::Done(unknown(
                &id,
                "batch arguments have no items array",
            )));
        }
        let reason = "batch arguments have no \"items\" array";
        ledger.fail_before_commit(&id, reason, false)?;
        return Ok(Step::Done(CallOutcome::Failed {
            execution_id: id,
            reason: reason.into(),
            retryable: false,
        }));
    };
    let mut done: BTreeMap<u32, String> = ledger
        .batch_items(&id)?
        .into_iter()
        .map(|(i, result, _)| (i, result))
        .collect();
    let mut unknown_state = reconcile;
    let mut first_checked = false;
    for (index, item_json) in (0u32..).zip(items.iter()) {
        if done.contains_key(&index) {
            continue;
        }
        let request = ToolRequest {
            execution_id: id.clone(),
            downstream_key: id.batch_item(index).downstream_key(),
            tool_name: ticket.tool_name.clone(),
            arguments_json: item_json.clone(),
            attempt: ticket.attempt,
            item_index: Some(index),
            external_id: None,
        };
        if unknown_state {
            if !first_checked {
                // Only this item can have reached the downstream.
                first_checked = true;
                let mut found = false;
                if desc.lookup {
                    match tool.lookup(request.clone()).await {
                        Ok(LookupOutcome::Found {
                            result_json,
                            external_id,
                        }) => {
                            let result = storable_result(result_json, &limits);
                            ledger.record_batch_item(
                                &id,
                                index,
                                &result,
                                external_id.as_deref(),
                            )?;
                            done.insert(index, result);
                            found = true;
                        }
                        Ok(LookupOutcome::NotFound) => {}
                        Ok(LookupOutcome::Unsupported) if desc.idempotency_key => {}
                        Ok(LookupOutcome::Unsupported) => {
                            return Ok(Step::Done(unknown(
                                &id,
                                "batch item outcome unknown and cannot be looked up",
                            )))
                        }
                        Err(e) => {
                            return Ok(Step::Done(unknown(
                                &id,
                                &format!("lookup failed: {}", e.message),
                            )))
                        }
                    }
                } else if !desc.idempotency_key {
                    return Ok(Step::Done(unknown(
                        &id,
                        "batch item outcome unknown; the downstream has no key or lookup",
                    )));
                }
                if found {
                    continue;
                }
            }
            // More items must run: a new attempt under the same item keys.
            if ticket.attempt >= exec.config().max_attempts {
                return Ok(Step::Done(unknown(
                    &id,
                    "batch item not found downstream and no attempts left; resolve it",
                )));
            }
            match ledger.resolve_unknown(&id, Resolution::NotFoundRetry)? {
                Resolved::Retry(t) => ticket = t,
                _ => return Ok(Step::Done(unknown(&id, "reconciliation failed"))),
            }
            unknown_state = false;
        }
        let request = ToolRequest {
            attempt: ticket.attempt,
            ..request
        };
        crashpoint::hit(CrashPoint::BeforeRequest);
        match exec.perform_guarded(tool, &desc.name, request).await {
            PerformOutcome::Committed {
                result_json,
                external_id,
            } => {
                crashpoint::hit(CrashPoint::AfterRemoteCommit);
                let result = storable_result(result_json, &limits);
                ledger.record_batch_item(&id, index, &result, external_id.as_deref())?;
                done.insert(index, result);
                crashpoint::hit(CrashPoint::AfterBatchItem);
            }
            PerformOutcome::JobStarted { .. } => {
                let outcome = PerformOutcome::Unknown {
                    reason: "a batch item started a background job".into(),
                };
                return exec.after_perform(desc, ticket, outcome).await;
            }
            other => return exec.after_perform(desc, ticket, other).await,
        }
    }
    // Every item committed: one result holding the items' results in order.
    let mut result = String::from("{\"items\":[");
    for (n, item_result) in done.values().enumerate() {
        if n > 0 {
            result.push(',');
        }
        result.push_str(item_result);
    }
    result.push_str("]}");
    let stored = ledger.commit(&id, &result, None)?;
    crashpoint::hit(CrashPoint::AfterLocalCommit);
    Ok(Step::Done(CallOutcome::Completed {
        execution_id: stored.execution_id,
        result_json: stored.result_json,
        external_id: stored.external_id,
        replayed: false,
    }))
}
