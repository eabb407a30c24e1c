//! Read-only tools: no records, no syncs, retries inside the call.

use super::tool::{PerformOutcome, ToolDescriptor, ToolHandler, ToolRequest};
use super::{backoff, CallOutcome, Executor, Result};
use crate::model::{canonical::validate, ExecutionId, ExecutionIdParts, OperationId, ToolCall};

/// Validates a read-only call and builds its request (nothing is written).
pub(super) fn prepare(
    exec: &Executor,
    op: &OperationId,
    round: u32,
    call: &ToolCall,
    desc: &ToolDescriptor,
) -> Result<ToolRequest> {
    // Checked, not rewritten: the tool gets the arguments the model sent.
    validate(&call.arguments, &exec.ledger().config().json_limits)?;
    let arguments_json = call.arguments.clone();
    let execution_id = ExecutionId::derive(&ExecutionIdParts {
        operation: op,
        round,
        call_id: &call.call_id,
        tool_name: &call.tool_name,
        tool_version: desc.version,
    })?;
    Ok(ToolRequest {
        downstream_key: execution_id.downstream_key(),
        execution_id,
        tool_name: call.tool_name.clone(),
        arguments_json,
        attempt: 1,
        item_index: None,
        external_id: None,
    })
}

/// What comes after one attempt of a read-only call.
pub(super) enum ReadOnlyNext {
    /// The answer for the model.
    Done(CallOutcome),
    /// A transient failure with attempts left: try again after this long.
    Retry(std::time::Duration),
}

/// Judges one attempt of a read-only call: a result, a failure for good,
/// or a retry after the backoff (transient failures, while attempts last).
pub(super) fn settle(
    exec: &Executor,
    request: &ToolRequest,
    outcome: PerformOutcome,
) -> ReadOnlyNext {
    let max = exec.config().read_only_max_attempts.max(1);
    let id = request.execution_id.clone();
    let (reason, transient) = match outcome {
        PerformOutcome::Committed {
            result_json,
            external_id,
        } => {
            return ReadOnlyNext::Done(CallOutcome::Completed {
                execution_id: id,
                result_json: super::protocol::storable_result(
                    result_json,
                    &exec.ledger().config().json_limits,
                ),
                external_id,
                replayed: false,
                partial: false,
            })
        }
        PerformOutcome::FailedBeforeCommit { reason, retryable } => (reason, retryable),
        PerformOutcome::Unknown { reason } => (reason, true),
        PerformOutcome::JobStarted { .. } => {
            ("a read-only tool cannot start a job".to_owned(), false)
        }
    };
    if !transient || request.attempt >= max {
        return ReadOnlyNext::Done(CallOutcome::Failed {
            execution_id: id,
            reason,
            retryable: transient,
        });
    }
    ReadOnlyNext::Retry(backoff(exec.config(), request.attempt, id.as_str()))
}

/// Runs a read-only call, retrying transient failures with backoff.
pub(super) async fn run(
    exec: &Executor,
    tool: &dyn ToolHandler,
    desc: &ToolDescriptor,
    mut request: ToolRequest,
) -> Result<CallOutcome> {
    // Bounded: `settle` stops once `read_only_max_attempts` is reached.
    loop {
        let outcome = exec
            .perform_guarded(tool, &desc.name, request.clone())
            .await;
        match settle(exec, &request, outcome) {
            ReadOnlyNext::Done(outcome) => return Ok(outcome),
            ReadOnlyNext::Retry(after) => {
                tokio::time::sleep(after).await;
                request.attempt += 1;
            }
        }
    }
}
