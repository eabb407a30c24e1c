//! What the executor hands back for one tool call.

use crate::model::{ArgsDigest, ExecutionId};

/// The result of running (or replaying, or refusing) one tool call.
#[derive(Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// A result for the model. `replayed` is true when it is the stored
    /// snapshot of an earlier run (nothing ran now).
    Completed {
        /// The execution.
        execution_id: ExecutionId,
        /// The result JSON, byte for byte as committed.
        result_json: String,
        /// The downstream's id for the effect.
        external_id: Option<String>,
        /// True for a replay of a stored result.
        replayed: bool,
        /// True for an independent batch that committed only some of its
        /// items: `result_json` says which happened and which did not.
        partial: bool,
    },
    /// The call waits for a human. Approve `args_digest`, then run again.
    NeedsApproval {
        /// The execution.
        execution_id: ExecutionId,
        /// Tool name.
        tool_name: String,
        /// The digest the approval must name.
        args_digest: ArgsDigest,
        /// The tool's preview for the approval prompt.
        preview_json: Option<String>,
    },
    /// A background job runs downstream; its result arrives by polling or
    /// webhook.
    Pending {
        /// The execution.
        execution_id: ExecutionId,
        /// The downstream's job id.
        job_id: String,
    },
    /// The effect may or may not have happened and nothing can tell yet.
    /// With `retry_after`, ask again (run the same call, or `recover`) after
    /// that long: a request already sent may still land until then, and
    /// nothing is sent again meanwhile. Without it the app must resolve it
    /// (`resolve_unknown`), usually by asking the user.
    Unknown {
        /// The execution.
        execution_id: ExecutionId,
        /// The attempt whose outcome is unknown: name it when resolving
        /// (`resolve_unknown`), so a resolution meant for it never applies
        /// to a later attempt.
        attempt: u32,
        /// Why it is unknown.
        reason: String,
        /// When to ask again, if waiting can settle it.
        retry_after: Option<std::time::Duration>,
    },
    /// Provably not committed.
    Failed {
        /// The execution.
        execution_id: ExecutionId,
        /// Why.
        reason: String,
        /// Whether a later run may try again (same key).
        retryable: bool,
    },
    /// The call id is known with different arguments; nothing ran.
    Conflict {
        /// The execution.
        execution_id: ExecutionId,
        /// Digest of the recorded arguments.
        stored_digest: ArgsDigest,
        /// Digest of the offered arguments.
        new_digest: ArgsDigest,
    },
    /// Another live session is running it (or a suspended one, whose claim
    /// lapses after `retry_after`).
    InFlight {
        /// The execution.
        execution_id: ExecutionId,
        /// When to ask again, if known.
        retry_after: Option<std::time::Duration>,
    },
    /// A human rejected it.
    Rejected {
        /// The execution.
        execution_id: ExecutionId,
    },
    /// It or its operation was cancelled and it did not happen: it never
    /// ran, or a lookup after the stop found nothing.
    Cancelled {
        /// The execution.
        execution_id: ExecutionId,
    },
}

impl CallOutcome {
    /// The execution this outcome is about.
    pub fn execution_id(&self) -> &ExecutionId {
        match self {
            CallOutcome::Completed { execution_id, .. }
            | CallOutcome::NeedsApproval { execution_id, .. }
            | CallOutcome::Pending { execution_id, .. }
            | CallOutcome::Unknown { execution_id, .. }
            | CallOutcome::Failed { execution_id, .. }
            | CallOutcome::Conflict { execution_id, .. }
            | CallOutcome::InFlight { execution_id, .. }
            | CallOutcome::Rejected { execution_id }
            | CallOutcome::Cancelled { execution_id } => execution_id,
        }
    }

    /// For `Unknown`: the attempt to name when resolving it.
    pub fn unknown_attempt(&self) -> Option<crate::ledger::AttemptId> {
        match self {
            CallOutcome::Unknown {
                execution_id,
                attempt,
                ..
            } => Some(crate::ledger::AttemptId::new(
                execution_id.clone(),
                *attempt,
            )),
            _ => None,
        }
    }

    /// The result JSON when the outcome is `Completed`.
    pub fn result_json(&self) -> Option<&str> {
        match self {
            CallOutcome::Completed { result_json, .. } => Some(result_json),
            _ => None,
        }
    }

    /// A short label for logs and metrics ("completed", "replayed", …).
    pub fn label(&self) -> &'static str {
        match self {
            CallOutcome::Completed { partial: true, .. } => "partial",
            CallOutcome::Completed { replayed: true, .. } => "replayed",
            CallOutcome::Completed { .. } => "completed",
            CallOutcome::NeedsApproval { .. } => "needs_approval",
            CallOutcome::Pending { .. } => "pending",
            CallOutcome::Unknown { .. } => "unknown",
            CallOutcome::Failed { .. } => "failed",
            CallOutcome::Conflict { .. } => "conflict",
            CallOutcome::InFlight { .. } => "in_flight",
            CallOutcome::Rejected { .. } => "rejected",
            CallOutcome::Cancelled { .. } => "cancelled",
        }
    }
}

impl std::fmt::Debug for CallOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({})", self.label(), self.execution_id())
    }
}
