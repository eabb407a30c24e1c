//! The tool contract as a foreign trait: apps implement [`ToolHandler`] in
//! Swift, Kotlin or Python, and a private adapter plugs it into the core
//! executor.
//!
//! Whatever the foreign code throws from `perform` (a `ToolCallError` or any
//! other exception) becomes an *unknown outcome* for a side-effecting tool,
//! never a failure and never a crash: the request may have reached the
//! downstream, so the executor reconciles (lookup, same-key retry) or reports
//! `CallOutcome.Unknown`.

use std::sync::Arc;

use async_trait::async_trait;

use toolledger_core::executor as core;
use toolledger_core::model::{DownstreamKey, ExecutionId};

/// Whether a tool changes the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum EffectClass {
    /// No durable side effect (weather, search): no records, no syncs;
    /// transient errors are retried inside the same call.
    ReadOnly,
    /// A durable side effect (email, payment): the full protocol.
    SideEffect,
}

/// How a side-effecting tool's arguments map to downstream commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum BatchMode {
    /// One commit boundary for the whole call.
    Atomic,
    /// The arguments hold an `items` array; each item is its own commit with
    /// its own key, so a crash after item 3 resumes at item 4.
    Independent,
}

/// What a tool declares about itself. Must not change while registered.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct ToolDescriptor {
    /// The name the model calls it by.
    pub name: String,
    /// Contract version: part of the identity and of the digest.
    pub version: u32,
    /// Read-only or side-effecting.
    pub effect: EffectClass,
    /// Batch behaviour (`Atomic` for an ordinary tool).
    pub batch: BatchMode,
    /// The downstream deduplicates requests by the downstream key.
    #[uniffi(default = false)]
    pub idempotency_key: bool,
    /// The tool implements `lookup` (find an effect by key or reference).
    #[uniffi(default = false)]
    pub lookup: bool,
    /// A human must approve the exact arguments first.
    #[uniffi(default = false)]
    pub requires_approval: bool,
    /// How long after an attempt's outcome became unknown a request it sent
    /// may still take effect downstream, in ms (the downstream's own deadline
    /// for a late request). Until then a lookup's "not found" does not prove
    /// the effect absent: nothing is sent again (except under the same key to
    /// a downstream that dedupes by key).
    #[uniffi(default = 120000)]
    pub landing_window_ms: u64,
    /// How long the downstream honours an idempotency key after its first
    /// request, in ms (its idempotency window); `u64::MAX` when keys never
    /// expire; none when not declared. A tool with a lookup, or with a key
    /// that outlives any reconciliation, commits with one sync per call.
    #[uniffi(default = None)]
    pub key_lifetime_ms: Option<u64>,
}

impl From<ToolDescriptor> for core::ToolDescriptor {
    fn from(d: ToolDescriptor) -> core::ToolDescriptor {
        core::ToolDescriptor {
            name: d.name,
            version: d.version,
            effect: match d.effect {
                EffectClass::ReadOnly => core::EffectClass::ReadOnly,
                EffectClass::SideEffect => core::EffectClass::SideEffect,
            },
            idempotency_key: d.idempotency_key,
            lookup: d.lookup,
            requires_approval: d.requires_approval,
            batch: match d.batch {
                BatchMode::Atomic => core::BatchMode::Atomic,
                BatchMode::Independent => core::BatchMode::Independent,
            },
            landing_window: std::time::Duration::from_millis(d.landing_window_ms),
            key_lifetime: d.key_lifetime_ms.map(super::records::lifetime),
        }
    }
}

/// One attempt (or one lookup) of one execution.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub struct ToolRequest {
    /// The execution (for read-only tools: the id it would have).
    pub execution_id: ExecutionId,
    /// The idempotency key to send downstream (the item key for batch items).
    pub downstream_key: DownstreamKey,
    /// Tool name.
    pub tool_name: String,
    /// The arguments as the model sent them (for a batch item: the item's
    /// JSON, as sent).
    pub arguments_json: String,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// The batch item index, for independent batches.
    pub item_index: Option<u32>,
    /// The downstream's id for the effect, if an earlier attempt learnt it.
    pub external_id: Option<String>,
}

impl From<core::ToolRequest> for ToolRequest {
    fn from(r: core::ToolRequest) -> ToolRequest {
        ToolRequest {
            execution_id: r.execution_id,
            downstream_key: r.downstream_key,
            tool_name: r.tool_name,
            arguments_json: r.arguments_json,
            attempt: r.attempt,
            item_index: r.item_index,
            external_id: r.external_id,
        }
    }
}

impl From<ToolRequest> for core::ToolRequest {
    fn from(r: ToolRequest) -> core::ToolRequest {
        core::ToolRequest {
            execution_id: r.execution_id,
            downstream_key: r.downstream_key,
            tool_name: r.tool_name,
            arguments_json: r.arguments_json,
            attempt: r.attempt,
            item_index: r.item_index,
            external_id: r.external_id,
        }
    }
}

/// What one `perform` did. Return `Unknown` (or throw) when the request may
/// have reached the downstream and you cannot tell whether it committed.
#[derive(Clone, PartialEq, Eq, uniffi::Enum)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
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

impl From<PerformOutcome> for core::PerformOutcome {
    fn from(o: PerformOutcome) -> core::PerformOutcome {
        match o {
            PerformOutcome::Committed {
                result_json,
                external_id,
            } => core::PerformOutcome::Committed {
                result_json,
                external_id,
            },
            PerformOutcome::JobStarted { job_id } => core::PerformOutcome::JobStarted { job_id },
            PerformOutcome::FailedBeforeCommit { reason, retryable } => {
                core::PerformOutcome::FailedBeforeCommit { reason, retryable }
            }
            PerformOutcome::Unknown { reason } => core::PerformOutcome::Unknown { reason },
        }
    }
}

/// What a `lookup` found downstream.
#[derive(Clone, PartialEq, Eq, uniffi::Enum)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
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

impl From<LookupOutcome> for core::LookupOutcome {
    fn from(o: LookupOutcome) -> core::LookupOutcome {
        match o {
            LookupOutcome::Found {
                result_json,
                external_id,
            } => core::LookupOutcome::Found {
                result_json,
                external_id,
            },
            LookupOutcome::NotFound => core::LookupOutcome::NotFound,
            LookupOutcome::Unsupported => core::LookupOutcome::Unsupported,
        }
    }
}

/// An error a tool throws when it cannot classify what happened. For a
/// side-effecting tool every variant means "outcome unknown", never "failed".
/// Keep argument values out of the messages: they are stored and returned.
#[derive(Clone, PartialEq, Eq, uniffi::Error)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub enum ToolCallError {
    /// The transport failed (timeout, connection reset) after the request
    /// may have been sent.
    Transport {
        /// What happened.
        message: String,
    },
    /// The tool's own code failed unexpectedly.
    Tool {
        /// What happened.
        message: String,
    },
    /// The foreign code threw an exception of another type (filled in by the
    /// bindings; apps do not throw this themselves).
    Unexpected {
        /// A fixed description (the exception's text may hold user data).
        message: String,
    },
}

impl From<uniffi::UnexpectedUniFFICallbackError> for ToolCallError {
    fn from(_: uniffi::UnexpectedUniFFICallbackError) -> ToolCallError {
        // The foreign exception's text may carry argument values; the
        // bindings print it to stderr, the ledger stores only this.
        ToolCallError::Unexpected {
            message: "unexpected exception in a foreign tool".to_owned(),
        }
    }
}

impl std::error::Error for ToolCallError {}

impl From<ToolCallError> for core::ToolError {
    fn from(e: ToolCallError) -> core::ToolError {
        // The message is the tool's: kept (sealed in an encrypted ledger) as
        // the execution's reason, reachable by `Execution.last_reason`,
        // never printed by the ledger.
        core::ToolError::new(match e {
            ToolCallError::Transport { message } => format!("transport: {message}"),
            ToolCallError::Tool { message } => format!("tool: {message}"),
            ToolCallError::Unexpected { .. } => "unexpected exception in a foreign tool".into(),
        })
    }
}

/// A tool the executor can run, implemented by the app.
///
/// `perform` must send `request.downstream_key` as the idempotency key when
/// the downstream supports one. Async methods run on the app's own async
/// runtime (Swift concurrency, Kotlin coroutines, Python asyncio).
#[uniffi::export(with_foreign)]
#[async_trait]
pub trait ToolHandler: Send + Sync {
    /// What the tool is and what its downstream offers. Read once, when the
    /// tool is registered.
    fn descriptor(&self) -> Result<ToolDescriptor, ToolCallError>;

    /// Runs one attempt. Throwing means the outcome is unknown.
    async fn perform(&self, request: ToolRequest) -> Result<PerformOutcome, ToolCallError>;

    /// Looks the effect of `request` up downstream (reconciliation after an
    /// unknown outcome). Return `Unsupported` if the tool cannot.
    async fn lookup(&self, request: ToolRequest) -> Result<LookupOutcome, ToolCallError>;

    /// A human-readable preview of the arguments for an approval prompt
    /// (e.g. `{"amount":"12.50 EUR","to":"Bob"}`), or none. A throw shows none.
    fn approval_preview(&self, arguments_json: String) -> Result<Option<String>, ToolCallError>;
}

/// The core tool that forwards to a foreign [`ToolHandler`]. The descriptor is
/// read once at registration, so the executor's frequent reads never cross
/// the FFI (and cannot fail).
pub(crate) struct ForeignTool {
    handler: Arc<dyn ToolHandler>,
    descriptor: core::ToolDescriptor,
}

impl ForeignTool {
    /// Reads the handler's descriptor and wraps it.
    pub(crate) fn new(handler: Arc<dyn ToolHandler>) -> Result<ForeignTool, ToolCallError> {
        let descriptor = handler.descriptor()?.into();
        Ok(ForeignTool {
            handler,
            descriptor,
        })
    }
}

#[async_trait]
impl core::ToolHandler for ForeignTool {
    fn descriptor(&self) -> core::ToolDescriptor {
        self.descriptor.clone()
    }

    async fn perform(
        &self,
        request: core::ToolRequest,
    ) -> Result<core::PerformOutcome, core::ToolError> {
        Ok(self.handler.perform(request.into()).await?.into())
    }

    async fn lookup(
        &self,
        request: core::ToolRequest,
    ) -> Result<core::LookupOutcome, core::ToolError> {
        Ok(self.handler.lookup(request.into()).await?.into())
    }

    fn approval_preview(&self, arguments_json: &str) -> Option<String> {
        self.handler
            .approval_preview(arguments_json.to_owned())
            .ok()
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn descriptor_defaults_match_the_core() {
        // The `#[uniffi(default = …)]` literal above must track the core.
        assert_eq!(
            toolledger_core::executor::DEFAULT_LANDING_WINDOW,
            std::time::Duration::from_millis(120000)
        );
    }
}
