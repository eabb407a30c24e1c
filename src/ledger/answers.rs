//! What the ledger answers: the outcome of `begin` and of the steps after it.

use std::time::Duration;

use super::durability::Downstream;
use crate::model::{ArgsDigest, DownstreamKey, ExecutionId, ExecutionRecord, Monotonic, ToolCall};

/// Names one attempt of one execution: the fencing token that every step of
/// that attempt carries (`commit`, `fail_before_commit`,
/// `mark_outcome_unknown`, `record_external_id`, batch items, jobs,
/// `resolve_unknown`). The store applies a step only while the execution is
/// still at this attempt (and, for the steps of a running attempt, owned by
/// the session that asks); a stale attempt gets [`super::Error::StaleAttempt`]
/// and what it learnt is kept as evidence.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttemptId {
    /// The execution.
    pub execution_id: ExecutionId,
    /// The attempt's number, from 1.
    pub attempt: u32,
}

impl AttemptId {
    /// Attempt `attempt` of `execution_id`.
    pub fn new(execution_id: ExecutionId, attempt: u32) -> AttemptId {
        AttemptId {
            execution_id,
            attempt,
        }
    }
}

/// One call to begin: the neutral call plus what the app's tool registry
/// knows about the tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSpec {
    /// The call as the model asked for it.
    pub call: ToolCall,
    /// The tool's version (part of the identity and of the digest).
    pub tool_version: u32,
    /// Whether a human must approve these exact arguments first.
    pub requires_approval: bool,
    /// What the tool's downstream offers to settle an unknown outcome: with
    /// a long-lived key or a lookup, the commit of an attempt begun with
    /// this spec may be deferred (one sync per call instead of two; see
    /// [`super::durability`]). The default (neither) keeps it durable.
    pub downstream: Downstream,
}

impl CallSpec {
    /// A spec for a call that needs no approval, to a downstream with
    /// neither key nor lookup (every commit durable).
    pub fn new(call: ToolCall, tool_version: u32) -> CallSpec {
        CallSpec {
            call,
            tool_version,
            requires_approval: false,
            downstream: Downstream::default(),
        }
    }

    /// The same spec, requiring approval.
    pub fn with_approval(mut self) -> CallSpec {
        self.requires_approval = true;
        self
    }

    /// The same spec, for a call to `downstream`.
    pub fn with_downstream(mut self, downstream: Downstream) -> CallSpec {
        self.downstream = downstream;
        self
    }
}

/// Permission to run one attempt: the record is durably `executing`, owned by
/// this session, before this value exists.
#[derive(Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The execution.
    pub execution_id: ExecutionId,
    /// The key to send downstream (the same on every attempt).
    pub downstream_key: DownstreamKey,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// Tool name.
    pub tool_name: String,
    /// Tool version.
    pub tool_version: u32,
    /// Canonical arguments.
    pub args_json: String,
    /// Their digest.
    pub args_digest: ArgsDigest,
    /// An external id already known from an earlier attempt.
    pub external_id: Option<String>,
    /// For a `Reconcile` ticket: when (boot clock) the outcome became
    /// unknown; a lookup's "not found" counts once the tool's landing window
    /// has passed since then.
    pub unknown_since: Option<Monotonic>,
    /// For an attempt sent again under the same key without proof that the
    /// earlier one is absent: when that earlier attempt's outcome became
    /// unknown. Until the landing window has passed since then, a refusal
    /// of this attempt proves nothing about the earlier request (it may
    /// still land), so the outcome stays unknown. Set by the executor.
    pub earlier_unknown: Option<Monotonic>,
    /// This attempt is a resend under the same key after an earlier
    /// attempt's outcome became unknown (set by the executor): if it is
    /// never sent, the earlier attempt's outcome is still unknown.
    pub resend: bool,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("execution_id", &self.execution_id)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// The fencing token of this ticket's attempt.
    pub fn attempt_id(&self) -> AttemptId {
        AttemptId::new(self.execution_id.clone(), self.attempt)
    }

    pub(crate) fn from_record(rec: &ExecutionRecord) -> Ticket {
        Ticket {
            execution_id: rec.execution_id.clone(),
            downstream_key: rec.downstream_key.clone(),
            attempt: rec.attempt_count,
            tool_name: rec.tool_name.clone(),
            tool_version: rec.tool_version,
            args_json: rec.args_json.clone(),
            args_digest: rec.args_digest.clone(),
            external_id: rec.external_id.clone(),
            unknown_since: rec.unknown_since.clone(),
            earlier_unknown: None,
            resend: false,
        }
    }
}

/// A committed result as stored: handed to the model, again and again.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredResult {
    /// The execution.
    pub execution_id: ExecutionId,
    /// The result JSON, byte for byte as committed.
    pub result_json: String,
    /// The downstream's id for the effect, if any.
    pub external_id: Option<String>,
    /// True for an independent batch that committed in part (the result
    /// says which items happened and which did not).
    pub partial: bool,
}

impl StoredResult {
    pub(crate) fn of(rec: &ExecutionRecord) -> StoredResult {
        StoredResult {
            execution_id: rec.execution_id.clone(),
            result_json: rec.result_json.clone().unwrap_or_default(),
            external_id: rec.external_id.clone(),
            partial: rec.partial,
        }
    }
}

impl std::fmt::Debug for StoredResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredResult")
            .field("execution_id", &self.execution_id)
            .field("partial", &self.partial)
            .finish_non_exhaustive()
    }
}

/// What an approver must see: the tool and the exact arguments, by digest.
#[derive(Clone, PartialEq, Eq)]
pub struct ApprovalRequest {
    /// The execution waiting for approval.
    pub execution_id: ExecutionId,
    /// Tool name.
    pub tool_name: String,
    /// Canonical arguments (for the app's preview; never logged).
    pub args_json: String,
    /// The digest an approval must name.
    pub args_digest: ArgsDigest,
}

impl std::fmt::Debug for ApprovalRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalRequest")
            .field("execution_id", &self.execution_id)
            .field("tool_name", &self.tool_name)
            .field("args_digest", &self.args_digest)
            .finish_non_exhaustive()
    }
}

/// The answer of `begin`: what the caller must do with this call now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "the answer says whether to run the tool; ignoring it loses that"]
pub enum Begin {
    /// Run the tool now with the ticket's downstream key.
    Execute(Ticket),
    /// Ask a human; nothing runs until `approve` names this digest.
    NeedsApproval(ApprovalRequest),
    /// Already committed: hand this stored result to the model. Never run.
    Replay(StoredResult),
    /// The id is known with different arguments. Never run.
    Conflict {
        /// The execution.
        execution_id: ExecutionId,
        /// Digest of the recorded arguments.
        stored_digest: ArgsDigest,
        /// Digest of the arguments just offered.
        new_digest: ArgsDigest,
    },
    /// A live session is running it right now (or a suspended one: ask
    /// again after `retry_after`; its claim ends once its lease lapsed and
    /// its process is gone).
    InFlight {
        /// The execution.
        execution_id: ExecutionId,
        /// When to ask again, if known: a suspended owner's remaining lease,
        /// or past it (its process may still run it) a whole lease.
        retry_after: Option<Duration>,
    },
    /// The outcome is unknown: reconcile (lookup) before anything else.
    Reconcile(Ticket),
    /// It failed before committing and may not be retried.
    Failed {
        /// The execution.
        execution_id: ExecutionId,
        /// The recorded reason.
        reason: String,
    },
    /// A human rejected it.
    Rejected {
        /// The execution.
        execution_id: ExecutionId,
    },
    /// It (or its operation) was cancelled before committing.
    Cancelled {
        /// The execution.
        execution_id: ExecutionId,
    },
}

impl Begin {
    /// The execution this answer is about.
    pub fn execution_id(&self) -> &ExecutionId {
        match self {
            Begin::Execute(t) | Begin::Reconcile(t) => &t.execution_id,
            Begin::NeedsApproval(a) => &a.execution_id,
            Begin::Replay(r) => &r.execution_id,
            Begin::Conflict { execution_id, .. }
            | Begin::InFlight { execution_id, .. }
            | Begin::Failed { execution_id, .. }
            | Begin::Rejected { execution_id }
            | Begin::Cancelled { execution_id } => execution_id,
        }
    }
}

/// How the app (or the executor's lookup) resolved an unknown outcome.
#[derive(Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The effect exists downstream: commit this result.
    Found {
        /// The result to store and hand to the model.
        result_json: String,
        /// The downstream's id for it.
        external_id: Option<String>,
    },
    /// Provably absent downstream: run again under the same key.
    NotFoundRetry,
    /// Provably absent, and no retry is wanted.
    NotFoundAbandon {
        /// Why (no argument values).
        reason: String,
    },
}

impl std::fmt::Debug for Resolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resolution::Found { .. } => f.write_str("Found"),
            Resolution::NotFoundRetry => f.write_str("NotFoundRetry"),
            Resolution::NotFoundAbandon { reason } => write!(f, "NotFoundAbandon({reason})"),
        }
    }
}

/// What `resolve_unknown` led to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a retry ticket must be executed"]
pub enum Resolved {
    /// Committed with the found result.
    Committed(StoredResult),
    /// Back to `executing` for the next attempt under the same key.
    Retry(Ticket),
    /// Recorded as failed before commit.
    Failed,
    /// Not found, and its operation was cancelled: nothing is sent again;
    /// it is recorded as cancelled before commit.
    Cancelled,
    /// Not found, and items of the batch committed: recorded as the partial
    /// commit it is.
    Partial(StoredResult),
}

/// What `cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Cancelled; it never ran (or provably never committed).
    Cancelled,
    /// Too late: it committed (in part, for a batch whose items committed:
    /// that partial commit is recorded now). The effect stands; compensate
    /// to undo it.
    AlreadyCommitted,
    /// It may be running or its outcome is unknown: nothing was changed.
    NotCancellable,
    /// It was already rejected or cancelled.
    AlreadyFinal,
}
