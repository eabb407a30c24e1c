//! What the ledger knows about one execution, as read back from storage.

use super::call::Provider;
use super::digest::DigestScheme;
use super::ids::{ArgsDigest, DownstreamKey, ExecutionId, OperationId, SessionId};
use super::monotonic::Monotonic;
use super::status::ExecutionStatus;

/// One stored execution. Argument and result values are here because replay
/// needs them; they are never logged (see `Debug` below).
#[derive(Clone, PartialEq, Eq)]
pub struct ExecutionRecord {
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
    /// How `args_digest` was computed (records of schema version 3 read
    /// numbers as doubles).
    pub digest_scheme: DigestScheme,
    /// The arguments as the model sent them (validated JSON, not rewritten;
    /// records of schema version 3 hold their canonical form).
    pub args_json: String,
    /// The idempotency key sent downstream on every attempt.
    pub downstream_key: DownstreamKey,
    /// Whether a human must approve before it runs.
    pub requires_approval: bool,
    /// Current status.
    pub status: ExecutionStatus,
    /// How many attempts have started (0 before the first); the current
    /// attempt's number, and with `owner_session` its fencing token.
    pub attempt_count: u32,
    /// The session that started the current attempt (the owner while it is
    /// `executing`; kept after, so a late answer can be checked against it).
    pub owner_session: Option<SessionId>,
    /// For `outcome_unknown`: when (boot clock) the current attempt's
    /// outcome became unknown. A lookup's "not found" counts as absent only
    /// once the tool's landing window has passed since then.
    pub unknown_since: Option<Monotonic>,
    /// True for an independent batch committed in part (its result says
    /// which items happened and which did not).
    pub partial: bool,
    /// The downstream's own id for the effect (payment id, event id, job id).
    pub external_id: Option<String>,
    /// The stored result JSON, once committed.
    pub result_json: Option<String>,
    /// The last failure or unknown-outcome reason (never argument values).
    pub last_reason: Option<String>,
    /// For `failed_before_commit`: whether another attempt is allowed.
    pub retryable: Option<bool>,
    /// For a compensation: the execution it undoes.
    pub compensates: Option<ExecutionId>,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: i64,
    /// Last update time, ms since the Unix epoch.
    pub updated_ms: i64,
}

impl std::fmt::Debug for ExecutionRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Argument and result values may hold personal data: never printed.
        f.debug_struct("ExecutionRecord")
            .field("execution_id", &self.execution_id)
            .field("tool_name", &self.tool_name)
            .field("status", &self.status)
            .field("attempt_count", &self.attempt_count)
            .field("args_digest", &self.args_digest)
            .finish_non_exhaustive()
    }
}

/// What a stale attempt learnt and could not record as the execution's own
/// (its attempt had been superseded), or an effect found downstream (a
/// lookup, a job's result) after the execution was settled without it
/// (another resolver's "not found"): kept, never dropped, since it may be
/// the only trace of a real effect.
#[derive(Clone, PartialEq, Eq)]
pub struct EvidenceEntry {
    /// The stale attempt (or the attempt whose effect was found).
    pub attempt: u32,
    /// What it tried to record: `commit`, `fail`, `unknown`, `external_id`,
    /// `batch_item` or `job`.
    pub kind: String,
    /// Its result (for `commit` and `batch_item`).
    pub result_json: Option<String>,
    /// The downstream's id it reported.
    pub external_id: Option<String>,
    /// Its reason (failures, unknown outcomes).
    pub reason: Option<String>,
    /// The batch item it concerned.
    pub item_index: Option<u32>,
}

impl std::fmt::Debug for EvidenceEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Results and external ids may hold personal data: never printed.
        f.debug_struct("EvidenceEntry")
            .field("attempt", &self.attempt)
            .field("kind", &self.kind)
            .field("item_index", &self.item_index)
            .finish_non_exhaustive()
    }
}

/// One entry of an execution's append-only transition log. `Debug` shows
/// the reason's length only (a tool's words may be in it).
#[derive(Clone, PartialEq, Eq)]
pub struct TransitionEntry {
    /// The status before (`None` for the creation of the record).
    pub from: Option<ExecutionStatus>,
    /// The status after.
    pub to: ExecutionStatus,
    /// The move's name (`prepare`, `start`, `retry`, `commit`, …).
    pub transition: String,
    /// The attempt number at that moment.
    pub attempt: u32,
    /// Why (failures, unknown outcomes), never argument values.
    pub reason: Option<String>,
    /// When, ms since the Unix epoch.
    pub at_ms: i64,
}

impl std::fmt::Debug for TransitionEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransitionEntry")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("transition", &self.transition)
            .field("attempt", &self.attempt)
            .field(
                "reason",
                &self.reason.as_ref().map(|r| format!("<{} bytes>", r.len())),
            )
            .field("at_ms", &self.at_ms)
            .finish()
    }
}
