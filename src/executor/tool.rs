//! The tool contract: what a tool declares and what it is asked to do.
//!
//! A [`ToolHandler`] is implemented by the app (in Rust, or in Swift, Kotlin
//! or Python through the bindings). Its arguments are owned and its answers
//! are values, so the same trait can be a UniFFI foreign trait.

use async_trait::async_trait;

use crate::ledger::Downstream;
use crate::model::{DownstreamKey, ExecutionId};

/// Whether a tool changes the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectClass {
    /// No durable side effect (weather, search): no records, no syncs; the
    /// executor retries transient errors inside the same call.
    ReadOnly,
    /// A durable side effect (email, payment): the full protocol.
    SideEffect,
}

/// How a side-effecting tool's arguments map to downstream commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchMode {
    /// One commit boundary for the whole call (also: an atomic batch that the
    /// downstream commits in one transaction).
    Atomic,
    /// The arguments are an object with an `items` array; each item is its
    /// own commit with its own key `<execution id>#item_<n>` and its own
    /// durable completion record, so a crash after item 3 resumes at item 4.
    Independent,
}

/// What a tool declares about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolDescriptor {
    /// The name the model calls it by.
    pub name: String,
    /// Contract version: part of the identity and of the digest.
    pub version: u32,
    /// Read-only or side-effecting.
    pub effect: EffectClass,
    /// The downstream deduplicates requests by our idempotency key.
    pub idempotency_key: bool,
    /// The tool can look an effect up downstream (by key, reference, tag).
    pub lookup: bool,
    /// A human must approve the exact arguments first.
    pub requires_approval: bool,
    /// Batch behaviour.
    pub batch: BatchMode,
    /// How long after an attempt's outcome became unknown (a timeout, a
    /// dropped connection, a dead owner) a request it sent may still take
    /// effect downstream: the downstream's own deadline for a request it
    /// received late. Until it has passed, a lookup's "not found" does not
    /// prove the effect absent, so nothing is sent again (a same-key resend to
    /// a downstream that dedupes by key excepted) and the caller is told
    /// when to ask again. Default [`DEFAULT_LANDING_WINDOW`].
    pub landing_window: std::time::Duration,
    /// How long the downstream honours an idempotency key after its first
    /// request (its idempotency window, e.g. 24 h); `Some(Duration::MAX)`
    /// when its keys never expire; `None` (the default) when not declared.
    /// A tool that dedupes by a key that outlives any reconciliation, or
    /// that can look effects up, commits with one sync per call instead of
    /// two (see [`crate::ledger::durability`]).
    pub key_lifetime: Option<std::time::Duration>,
}

/// The default [`ToolDescriptor::landing_window`]: 120 s, longer than the
/// request timeouts of common HTTP stacks and load balancers (30–60 s) plus
/// the executor's default `perform_timeout`. Set a tool's own when its
/// downstream documents one.
pub const DEFAULT_LANDING_WINDOW: std::time::Duration = std::time::Duration::from_secs(120);

impl ToolDescriptor {
    /// A read-only tool.
    pub fn read_only(name: impl Into<String>, version: u32) -> ToolDescriptor {
        ToolDescriptor {
            name: name.into(),
            version,
            effect: EffectClass::ReadOnly,
            idempotency_key: false,
            lookup: false,
            requires_approval: false,
            batch: BatchMode::Atomic,
            landing_window: DEFAULT_LANDING_WINDOW,
            key_lifetime: None,
        }
    }

    /// A side-effecting tool; set the capability fields as needed.
    pub fn side_effect(name: impl Into<String>, version: u32) -> ToolDescriptor {
        ToolDescriptor {
            effect: EffectClass::SideEffect,
            ..ToolDescriptor::read_only(name, version)
        }
    }

    /// What the downstream offers to settle an unknown outcome, as the
    /// ledger's durability policy reads it.
    pub fn downstream(&self) -> Downstream {
        Downstream {
            idempotency_key: self.idempotency_key,
            lookup: self.lookup,
            key_lifetime: self.key_lifetime,
        }
    }
}

/// One attempt (or one lookup) of one execution.
#[derive(Clone, PartialEq, Eq)]
pub struct ToolRequest {
    /// The execution (for read-only tools: the id it would have).
    pub execution_id: ExecutionId,
    /// The idempotency key to send downstream (item key for batch items).
    pub downstream_key: DownstreamKey,
    /// Tool name.
    pub tool_name: String,
    /// Canonical arguments (for a batch item: the item's JSON).
    pub arguments_json: String,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// The batch item index, for independent batches.
    pub item_index: Option<u32>,
    /// The downstream's id for the effect, if an earlier attempt learnt it.
    pub external_id: Option<String>,
}

impl std::fmt::Debug for ToolRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRequest")
            .field("execution_id", &self.execution_id)
            .field("attempt", &self.attempt)
            .field("item_index", &self.item_index)
            .finish_non_exhaustive()
    }
}

/// What one `perform` did.
#[derive(Clone, PartialEq, Eq)]
pub enum PerformOutcome {
    /// The effect committed downstream; this is its result.
    Committed {
        /// Result JSON for the model.
        result_json: String,
        /// The downstream's id for the effect.
        external_id: Option<String>,
    },
    /// The downstream accepted a background job; its completion arrives
    /// later by polling or webhook.
    JobStarted {
        /// The downstream's job id.
        job_id: String,
    },
    /// Provably not committed (refused, validation error, never sent).
    FailedBeforeCommit {
        /// Why (no argument values).
        reason: String,
        /// Whether trying again may succeed.
        retryable: bool,
    },
    /// The request may have reached the downstream (timeout, dropped
    /// connection, 5xx after send).
    Unknown {
        /// Why.
        reason: String,
    },
}

impl std::fmt::Debug for PerformOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PerformOutcome::Committed { .. } => f.write_str("Committed"),
            PerformOutcome::JobStarted { .. } => f.write_str("JobStarted"),
            PerformOutcome::FailedBeforeCommit { reason, retryable } => {
                // A reason may carry the downstream's or the tool's words.
                write!(
                    f,
                    "FailedBeforeCommit(<{} bytes>, retryable={retryable})",
                    reason.len()
                )
            }
            PerformOutcome::Unknown { reason } => write!(f, "Unknown(<{} bytes>)", reason.len()),
        }
    }
}

/// What a `lookup` found downstream.
#[derive(Clone, PartialEq, Eq)]
pub enum LookupOutcome {
    /// The effect exists; this is its result.
    Found {
        /// Result JSON for the model.
        result_json: String,
        /// The downstream's id for it.
        external_id: Option<String>,
    },
    /// Provably absent.
    NotFound,
    /// This tool cannot look effects up.
    Unsupported,
}

impl std::fmt::Debug for LookupOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LookupOutcome::Found { .. } => "Found",
            LookupOutcome::NotFound => "NotFound",
            LookupOutcome::Unsupported => "Unsupported",
        })
    }
}

/// A tool failed in a way it could not classify (transport error, crash in
/// the tool's own code). For a side-effecting tool this is an unknown
/// outcome, never a failure: the request may have reached the downstream.
///
/// Its message is stored as the execution's reason (reachable through
/// `ExecutionRecord::last_reason`); `Debug` and `Display` show its length
/// only, since a tool may put data in it.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool error (<{} bytes>)", message.len())]
pub struct ToolError {
    /// What happened (no argument values).
    pub message: String,
}

impl std::fmt::Debug for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ToolError(<{} bytes>)", self.message.len())
    }
}

impl ToolError {
    /// A tool error with this message.
    pub fn new(message: impl Into<String>) -> ToolError {
        ToolError {
            message: message.into(),
        }
    }
}

/// A tool the executor can run.
#[async_trait]
pub trait ToolHandler: Send + Sync {
    /// What the tool is and what its downstream offers.
    fn descriptor(&self) -> ToolDescriptor;

    /// Runs one attempt. Must send `request.downstream_key` as the
    /// idempotency key when the downstream supports one.
    async fn perform(&self, request: ToolRequest) -> Result<PerformOutcome, ToolError>;

    /// Looks the effect of `request` up downstream (reconciliation).
    async fn lookup(&self, request: ToolRequest) -> Result<LookupOutcome, ToolError> {
        let _ = request;
        Ok(LookupOutcome::Unsupported)
    }

    /// A human-readable preview of the arguments for an approval prompt
    /// (e.g. `{"amount":"12.50 EUR","to":"Bob"}`); `None` shows nothing.
    fn approval_preview(&self, arguments_json: &str) -> Option<String> {
        let _ = arguments_json;
        None
    }
}
