//! How exported values print: ids, tool, status, attempt and byte lengths,
//! never an argument, a result, a preview, an external id, a job id or a
//! reason (which may carry a tool's exception text).
//!
//! Every record, enum and error below that can hold one implements `Debug`
//! and `Display` here by hand and exports both through UniFFI
//! (`#[uniffi::export(Debug, Display)]` on its definition), so the
//! generated code prints this too: Python's `__repr__`/`__str__`, Kotlin's
//! `toString()`, Swift's `description`/`debugDescription`. The values stay
//! reachable through the fields themselves.

use std::fmt;

use super::execution::{Execution, JobApplied, JobUpdate, TransitionEntry};
use super::executor::Recovery;
use super::outcome::CallOutcome;
use super::provider::ToolResult;
use super::records::{
    ApprovalRequest, Begin, CallSpec, Resolution, Resolved, StoredResult, Ticket, ToolCall,
};
use super::tool::{LookupOutcome, PerformOutcome, ToolCallError, ToolRequest};

/// A value shown by its size only.
struct Len<'a>(&'a str);

impl fmt::Debug for Len<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

/// An optional value shown by its size only.
struct OptLen<'a>(Option<&'a str>);

impl fmt::Debug for OptLen<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => Len(v).fmt(f),
            None => f.write_str("None"),
        }
    }
}

fn len(v: &str) -> Len<'_> {
    Len(v)
}

fn opt(v: &Option<String>) -> OptLen<'_> {
    OptLen(v.as_deref())
}

/// `Display` prints what `Debug` prints.
macro_rules! display_as_debug {
    ($($t:ty),* $(,)?) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self, f)
            }
        }
    )*};
}

display_as_debug!(
    ToolCall,
    CallSpec,
    Ticket,
    StoredResult,
    ApprovalRequest,
    Begin,
    Resolution,
    Resolved,
    Execution,
    JobUpdate,
    JobApplied,
    TransitionEntry,
    Recovery,
    CallOutcome,
    ToolResult,
    ToolRequest,
    PerformOutcome,
    LookupOutcome,
    ToolCallError,
);

impl fmt::Debug for ToolCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolCall")
            .field("provider", &self.provider)
            .field("call_id", &self.call_id)
            .field("tool_name", &self.tool_name)
            .field("arguments", &len(&self.arguments))
            .field("position", &self.position)
            .finish()
    }
}

impl fmt::Debug for CallSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallSpec")
            .field("call", &self.call)
            .field("tool_version", &self.tool_version)
            .field("requires_approval", &self.requires_approval)
            .field("idempotency_key", &self.idempotency_key)
            .field("lookup", &self.lookup)
            .field("key_lifetime_ms", &self.key_lifetime_ms)
            .finish()
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("execution_id", &self.execution_id.as_str())
            .field("attempt", &self.attempt)
            .field("tool_name", &self.tool_name)
            .field("args_json", &len(&self.args_json))
            .field("external_id", &opt(&self.external_id))
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for StoredResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredResult")
            .field("execution_id", &self.execution_id.as_str())
            .field("result_json", &len(&self.result_json))
            .field("external_id", &opt(&self.external_id))
            .field("partial", &self.partial)
            .finish()
    }
}

impl fmt::Debug for ApprovalRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApprovalRequest")
            .field("execution_id", &self.execution_id.as_str())
            .field("tool_name", &self.tool_name)
            .field("args_json", &len(&self.args_json))
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Begin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Begin::Execute { ticket } => f.debug_tuple("Execute").field(ticket).finish(),
            Begin::Reconcile { ticket } => f.debug_tuple("Reconcile").field(ticket).finish(),
            Begin::NeedsApproval { request } => {
                f.debug_tuple("NeedsApproval").field(request).finish()
            }
            Begin::Replay { result } => f.debug_tuple("Replay").field(result).finish(),
            Begin::Conflict { execution_id, .. } => f
                .debug_struct("Conflict")
                .field("execution_id", &execution_id.as_str())
                .finish_non_exhaustive(),
            Begin::InFlight {
                execution_id,
                retry_after_ms,
            } => f
                .debug_struct("InFlight")
                .field("execution_id", &execution_id.as_str())
                .field("retry_after_ms", retry_after_ms)
                .finish(),
            Begin::Failed {
                execution_id,
                reason,
            } => f
                .debug_struct("Failed")
                .field("execution_id", &execution_id.as_str())
                .field("reason", &len(reason))
                .finish(),
            Begin::Rejected { execution_id } => f
                .debug_struct("Rejected")
                .field("execution_id", &execution_id.as_str())
                .finish(),
            Begin::Cancelled { execution_id } => f
                .debug_struct("Cancelled")
                .field("execution_id", &execution_id.as_str())
                .finish(),
        }
    }
}

impl fmt::Debug for Resolution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resolution::Found {
                result_json,
                external_id,
            } => f
                .debug_struct("Found")
                .field("result_json", &len(result_json))
                .field("external_id", &opt(external_id))
                .finish(),
            Resolution::NotFoundRetry => f.write_str("NotFoundRetry"),
            Resolution::NotFoundAbandon { reason } => f
                .debug_struct("NotFoundAbandon")
                .field("reason", &len(reason))
                .finish(),
        }
    }
}

impl fmt::Debug for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resolved::Committed { result } => f.debug_tuple("Committed").field(result).finish(),
            Resolved::Partial { result } => f.debug_tuple("Partial").field(result).finish(),
            Resolved::Retry { ticket } => f.debug_tuple("Retry").field(ticket).finish(),
            Resolved::Failed => f.write_str("Failed"),
            Resolved::Cancelled => f.write_str("Cancelled"),
        }
    }
}

impl fmt::Debug for Execution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Execution")
            .field("execution_id", &self.execution_id.as_str())
            .field("tool_name", &self.tool_name)
            .field("tool_version", &self.tool_version)
            .field("status", &self.status)
            .field("attempt_count", &self.attempt_count)
            .field("args_json", &len(&self.args_json))
            .field("result_json", &opt(&self.result_json))
            .field("external_id", &opt(&self.external_id))
            .field("last_reason", &opt(&self.last_reason))
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for JobUpdate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobUpdate::Progress { state } => f
                .debug_struct("Progress")
                .field("state", &len(state))
                .finish(),
            JobUpdate::Succeeded { result_json } => f
                .debug_struct("Succeeded")
                .field("result_json", &len(result_json))
                .finish(),
            JobUpdate::Failed { reason } => f
                .debug_struct("Failed")
                .field("reason", &len(reason))
                .finish(),
        }
    }
}

impl fmt::Debug for JobApplied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobApplied::Progress => f.write_str("Progress"),
            JobApplied::Committed { result } => f.debug_tuple("Committed").field(result).finish(),
            JobApplied::Failed => f.write_str("Failed"),
            JobApplied::AlreadyFinal { status } => f
                .debug_struct("AlreadyFinal")
                .field("status", status)
                .finish(),
            JobApplied::DuplicateEvent => f.write_str("DuplicateEvent"),
        }
    }
}

impl fmt::Debug for TransitionEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransitionEntry")
            .field("from_status", &self.from_status)
            .field("to_status", &self.to_status)
            .field("transition", &self.transition)
            .field("attempt", &self.attempt)
            .field("reason", &opt(&self.reason))
            .field("at_ms", &self.at_ms)
            .finish()
    }
}

impl fmt::Debug for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recovery")
            .field("outcomes", &self.outcomes)
            .field("failed", &self.failed)
            .finish()
    }
}

impl fmt::Debug for CallOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallOutcome::Completed {
                execution_id,
                result_json,
                external_id,
                replayed,
                partial,
            } => f
                .debug_struct("Completed")
                .field("execution_id", &execution_id.as_str())
                .field("result_json", &len(result_json))
                .field("external_id", &opt(external_id))
                .field("replayed", replayed)
                .field("partial", partial)
                .finish(),
            CallOutcome::NeedsApproval {
                execution_id,
                tool_name,
                preview_json,
                ..
            } => f
                .debug_struct("NeedsApproval")
                .field("execution_id", &execution_id.as_str())
                .field("tool_name", tool_name)
                .field("preview_json", &opt(preview_json))
                .finish_non_exhaustive(),
            CallOutcome::Pending {
                execution_id,
                job_id,
            } => f
                .debug_struct("Pending")
                .field("execution_id", &execution_id.as_str())
                .field("job_id", &len(job_id))
                .finish(),
            CallOutcome::Unknown {
                execution_id,
                attempt,
                reason,
                retry_after_ms,
            } => f
                .debug_struct("Unknown")
                .field("execution_id", &execution_id.as_str())
                .field("attempt", attempt)
                .field("reason", &len(reason))
                .field("retry_after_ms", retry_after_ms)
                .finish(),
            CallOutcome::Failed {
                execution_id,
                reason,
                retryable,
            } => f
                .debug_struct("Failed")
                .field("execution_id", &execution_id.as_str())
                .field("reason", &len(reason))
                .field("retryable", retryable)
                .finish(),
            CallOutcome::Conflict { execution_id, .. } => f
                .debug_struct("Conflict")
                .field("execution_id", &execution_id.as_str())
                .finish_non_exhaustive(),
            CallOutcome::InFlight {
                execution_id,
                retry_after_ms,
            } => f
                .debug_struct("InFlight")
                .field("execution_id", &execution_id.as_str())
                .field("retry_after_ms", retry_after_ms)
                .finish(),
            CallOutcome::Rejected { execution_id } => f
                .debug_struct("Rejected")
                .field("execution_id", &execution_id.as_str())
                .finish(),
            CallOutcome::Cancelled { execution_id } => f
                .debug_struct("Cancelled")
                .field("execution_id", &execution_id.as_str())
                .finish(),
        }
    }
}

impl fmt::Debug for ToolResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolResult")
            .field("call", &self.call)
            .field("output_json", &len(&self.output_json))
            .field("is_error", &self.is_error)
            .finish()
    }
}

impl fmt::Debug for ToolRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRequest")
            .field("execution_id", &self.execution_id.as_str())
            .field("tool_name", &self.tool_name)
            .field("attempt", &self.attempt)
            .field("item_index", &self.item_index)
            .field("arguments_json", &len(&self.arguments_json))
            .field("external_id", &opt(&self.external_id))
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for PerformOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PerformOutcome::Committed {
                result_json,
                external_id,
            } => f
                .debug_struct("Committed")
                .field("result_json", &len(result_json))
                .field("external_id", &opt(external_id))
                .finish(),
            PerformOutcome::JobStarted { job_id } => f
                .debug_struct("JobStarted")
                .field("job_id", &len(job_id))
                .finish(),
            PerformOutcome::FailedBeforeCommit { reason, retryable } => f
                .debug_struct("FailedBeforeCommit")
                .field("reason", &len(reason))
                .field("retryable", retryable)
                .finish(),
            PerformOutcome::Unknown { reason } => f
                .debug_struct("Unknown")
                .field("reason", &len(reason))
                .finish(),
        }
    }
}

impl fmt::Debug for LookupOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LookupOutcome::Found {
                result_json,
                external_id,
            } => f
                .debug_struct("Found")
                .field("result_json", &len(result_json))
                .field("external_id", &opt(external_id))
                .finish(),
            LookupOutcome::NotFound => f.write_str("NotFound"),
            LookupOutcome::Unsupported => f.write_str("Unsupported"),
        }
    }
}

impl fmt::Debug for ToolCallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, message) = match self {
            ToolCallError::Transport { message } => ("Transport", message),
            ToolCallError::Tool { message } => ("Tool", message),
            ToolCallError::Unexpected { message } => ("Unexpected", message),
        };
        f.debug_struct(name)
            .field("message", &len(message))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::Provider;
    use toolledger_core::model::{ArgsDigest, DownstreamKey, ExecutionId};

    const CANARY: &str = "CANARY-4111-1111";

    #[test]
    fn no_printed_form_shows_a_value() {
        let id = ExecutionId::parse("op:round_0:c:t:v1").unwrap();
        let ticket = Ticket {
            execution_id: id.clone(),
            downstream_key: DownstreamKey::parse("tl_abc").unwrap(),
            attempt: 1,
            tool_name: "pay".into(),
            tool_version: 1,
            args_json: format!("{{\"a\":\"{CANARY}\"}}"),
            args_digest: ArgsDigest::parse("a".repeat(64)).unwrap(),
            external_id: Some(CANARY.into()),
        };
        let printed = [
            format!(
                "{:?}",
                ToolCall {
                    provider: Provider::Custom,
                    call_id: "c".into(),
                    tool_name: "pay".into(),
                    arguments: CANARY.into(),
                    position: 0,
                    call_id_derived: false
                }
            ),
            format!("{ticket} {ticket:?}"),
            format!("{}", Begin::Execute { ticket }),
            format!(
                "{}",
                CallOutcome::Unknown {
                    execution_id: id.clone(),
                    attempt: 1,
                    reason: CANARY.into(),
                    retry_after_ms: None
                }
            ),
            format!(
                "{:?}",
                PerformOutcome::Committed {
                    result_json: CANARY.into(),
                    external_id: Some(CANARY.into())
                }
            ),
            format!(
                "{}",
                ToolCallError::Tool {
                    message: CANARY.into()
                }
            ),
            format!(
                "{}",
                Resolution::Found {
                    result_json: CANARY.into(),
                    external_id: None
                }
            ),
        ];
        for p in &printed {
            assert!(!p.contains(CANARY), "{p}");
            assert!(p.contains("bytes>"), "{p}");
        }
    }
}
