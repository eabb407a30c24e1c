//! What the ledger knows about executions and operations, as FFI values:
//! statuses, the stored record, job updates, counts.

use toolledger_core::ledger;
use toolledger_core::ledger::StoreStats;
use toolledger_core::model::{self, ArgsDigest, DownstreamKey, ExecutionId, OperationId};

use super::records::{Provider, StoredResult};

/// Where one execution stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum ExecutionStatus {
    /// Recorded, waiting for approval (or for `mark_executing`).
    Prepared,
    /// A human approved these exact arguments (bound to the digest).
    Approved,
    /// The durable intent: the side effect may be under way.
    Executing,
    /// The side effect committed and its result is stored.
    Committed,
    /// The stored result was handed to the model.
    ResultDelivered,
    /// A human refused the call; it never ran.
    Rejected,
    /// Cancelled while nothing could have reached the downstream.
    CancelledBeforeCommit,
    /// The request may have reached the downstream; nobody knows yet.
    /// Not a failure: reconcile or resolve it.
    OutcomeUnknown,
    /// Provably not committed (the downstream refused it, or it never left).
    FailedBeforeCommit,
}

impl From<model::ExecutionStatus> for ExecutionStatus {
    fn from(s: model::ExecutionStatus) -> ExecutionStatus {
        use model::ExecutionStatus as S;
        match s {
            S::Prepared => ExecutionStatus::Prepared,
            S::Approved => ExecutionStatus::Approved,
            S::Executing => ExecutionStatus::Executing,
            S::Committed => ExecutionStatus::Committed,
            S::ResultDelivered => ExecutionStatus::ResultDelivered,
            S::Rejected => ExecutionStatus::Rejected,
            S::CancelledBeforeCommit => ExecutionStatus::CancelledBeforeCommit,
            S::OutcomeUnknown => ExecutionStatus::OutcomeUnknown,
            S::FailedBeforeCommit => ExecutionStatus::FailedBeforeCommit,
        }
    }
}

/// Where one operation (conversation turn / workflow) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum OperationStatus {
    /// Calls may still be begun.
    Open,
    /// The app finished the operation.
    Completed,
    /// Cancelled, and none of its executions can have had an effect.
    Cancelled,
    /// Cancelled while an effect may exist: an execution committed (in
    /// part, for a batch), or was running or had an unknown outcome when it
    /// was stopped. A committed effect stays; undoing it is a compensation.
    CancelledAfterSideEffect,
}

impl From<model::OperationStatus> for OperationStatus {
    fn from(s: model::OperationStatus) -> OperationStatus {
        use model::OperationStatus as S;
        match s {
            S::Open => OperationStatus::Open,
            S::Completed => OperationStatus::Completed,
            S::Cancelled => OperationStatus::Cancelled,
            S::CancelledAfterSideEffect => OperationStatus::CancelledAfterSideEffect,
        }
    }
}

/// What `cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum CancelOutcome {
    /// Cancelled; it never ran (or provably never committed).
    Cancelled,
    /// Too late: it committed. The effect stands; compensate to undo it.
    AlreadyCommitted,
    /// It may be running or its outcome is unknown: nothing was changed.
    NotCancellable,
    /// It was already rejected or cancelled.
    AlreadyFinal,
}

impl From<ledger::CancelOutcome> for CancelOutcome {
    fn from(c: ledger::CancelOutcome) -> CancelOutcome {
        match c {
            ledger::CancelOutcome::Cancelled => CancelOutcome::Cancelled,
            ledger::CancelOutcome::AlreadyCommitted => CancelOutcome::AlreadyCommitted,
            ledger::CancelOutcome::NotCancellable => CancelOutcome::NotCancellable,
            ledger::CancelOutcome::AlreadyFinal => CancelOutcome::AlreadyFinal,
        }
    }
}

/// One operation and where it stands (`operations()`).
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct OperationSummary {
    /// The operation.
    pub operation_id: OperationId,
    /// Its status.
    pub status: OperationStatus,
}

/// One stored execution. Holds argument and result values (replay needs
/// them): never log it.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub struct Execution {
    /// The unit of idempotency.
    pub execution_id: ExecutionId,
    /// The operation it belongs to.
    pub operation_id: OperationId,
    /// The model response (round) within the operation.
    pub round: u32,
    /// Position of the call within its round.
    pub position: u32,
    /// The provider the call came from.
    pub provider: Provider,
    /// The provider's call id (correlation metadata).
    pub provider_call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Tool version.
    pub tool_version: u32,
    /// Digest of the canonical arguments.
    pub args_digest: ArgsDigest,
    /// The arguments as the model sent them.
    pub args_json: String,
    /// The idempotency key sent downstream on every attempt.
    pub downstream_key: DownstreamKey,
    /// Whether a human must approve before it runs.
    pub requires_approval: bool,
    /// Current status.
    pub status: ExecutionStatus,
    /// How many attempts have started (0 before the first): the current
    /// attempt's number (name it when resolving an unknown outcome).
    pub attempt_count: u32,
    /// The session that started the current attempt.
    pub owner_session: Option<String>,
    /// True for an independent batch committed in part.
    pub partial: bool,
    /// The downstream's own id for the effect (payment id, event id, job id).
    pub external_id: Option<String>,
    /// The stored result JSON, once committed.
    pub result_json: Option<String>,
    /// The last failure or unknown-outcome reason.
    pub last_reason: Option<String>,
    /// For `FailedBeforeCommit`: whether another attempt is allowed.
    pub retryable: Option<bool>,
    /// For a compensation: the execution it undoes.
    pub compensates: Option<ExecutionId>,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: i64,
    /// Last update time, ms since the Unix epoch.
    pub updated_ms: i64,
}

impl From<model::ExecutionRecord> for Execution {
    fn from(r: model::ExecutionRecord) -> Execution {
        Execution {
            execution_id: r.execution_id,
            operation_id: r.operation_id,
            round: r.round,
            position: r.position,
            provider: r.provider.into(),
            provider_call_id: r.provider_call_id,
            tool_name: r.tool_name,
            tool_version: r.tool_version,
            args_digest: r.args_digest,
            args_json: r.args_json,
            downstream_key: r.downstream_key,
            requires_approval: r.requires_approval,
            status: r.status.into(),
            attempt_count: r.attempt_count,
            owner_session: r.owner_session.map(|s| s.as_str().to_owned()),
            partial: r.partial,
            external_id: r.external_id,
            result_json: r.result_json,
            last_reason: r.last_reason,
            retryable: r.retryable,
            compensates: r.compensates,
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
        }
    }
}

/// A state change of a background job, from polling or a webhook.
#[derive(Clone, PartialEq, Eq, uniffi::Enum)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
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

impl From<JobUpdate> for ledger::JobUpdate {
    fn from(u: JobUpdate) -> ledger::JobUpdate {
        match u {
            JobUpdate::Progress { state } => ledger::JobUpdate::Progress { state },
            JobUpdate::Succeeded { result_json } => ledger::JobUpdate::Succeeded { result_json },
            JobUpdate::Failed { reason } => ledger::JobUpdate::Failed { reason },
        }
    }
}

/// What applying a job update or webhook did.
#[derive(Clone, PartialEq, Eq, uniffi::Enum)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub enum JobApplied {
    /// Recorded progress; the execution is still waiting.
    Progress,
    /// The execution committed with the job's result.
    Committed {
        /// The stored result.
        result: StoredResult,
    },
    /// The execution is recorded as failed before commit.
    Failed,
    /// The execution had already reached a final status; nothing changed.
    AlreadyFinal {
        /// That status.
        status: ExecutionStatus,
    },
    /// This webhook event was processed before; ignored.
    DuplicateEvent,
}

impl From<ledger::JobApplied> for JobApplied {
    fn from(a: ledger::JobApplied) -> JobApplied {
        match a {
            ledger::JobApplied::Progress => JobApplied::Progress,
            ledger::JobApplied::Committed(r) => JobApplied::Committed { result: r.into() },
            ledger::JobApplied::Failed => JobApplied::Failed,
            ledger::JobApplied::AlreadyFinal(s) => JobApplied::AlreadyFinal { status: s.into() },
            ledger::JobApplied::DuplicateEvent => JobApplied::DuplicateEvent,
        }
    }
}

/// How many executions have one status.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct StatusCount {
    /// The status name as stored (`committed`, `outcome_unknown` …).
    pub status: String,
    /// How many executions have it.
    pub count: u64,
}

/// Row counts of the ledger (for diagnostics screens).
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct LedgerStats {
    /// Number of operations.
    pub operations: u64,
    /// Number of executions per status.
    pub executions_by_status: Vec<StatusCount>,
    /// Rows in the transition log.
    pub transitions: u64,
}

impl From<StoreStats> for LedgerStats {
    fn from(s: StoreStats) -> LedgerStats {
        LedgerStats {
            operations: s.operations,
            executions_by_status: s
                .executions_by_status
                .into_iter()
                .map(|(status, count)| StatusCount { status, count })
                .collect(),
            transitions: s.transitions,
        }
    }
}

/// One entry of an execution's transition log.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub struct TransitionEntry {
    /// The status before (none for the creation of the record).
    pub from_status: Option<ExecutionStatus>,
    /// The status after.
    pub to_status: ExecutionStatus,
    /// The step (`prepare`, `start`, `retry`, `commit`, `mark_unknown` …).
    pub transition: String,
    /// The attempt number at that moment.
    pub attempt: u32,
    /// Why (failures, unknown outcomes), never argument values.
    pub reason: Option<String>,
    /// When, ms since the Unix epoch.
    pub at_ms: i64,
}

impl From<model::TransitionEntry> for TransitionEntry {
    fn from(t: model::TransitionEntry) -> TransitionEntry {
        TransitionEntry {
            from_status: t.from.map(Into::into),
            to_status: t.to.into(),
            transition: t.transition,
            attempt: t.attempt,
            reason: t.reason,
            at_ms: t.at_ms,
        }
    }
}
