//! The ledger's values as FFI records and enums, each converted from (and,
//! where apps send it, into) its core type with `From`. No logic here.

use std::time::Duration;

use toolledger_core::ledger;
use toolledger_core::model::{self, ArgsDigest, DownstreamKey, ExecutionId, JsonLimits};

/// The model provider (or protocol) a tool call came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum Provider {
    /// OpenAI Chat Completions (`choices[].message.tool_calls`).
    OpenAiChat,
    /// OpenAI Responses API (`output[]` items of type `function_call`).
    OpenAiResponses,
    /// Anthropic Messages (`content[]` blocks of type `tool_use`).
    Anthropic,
    /// Google Gemini (`candidates[].content.parts[].functionCall`).
    Gemini,
    /// Model Context Protocol `tools/call` JSON-RPC requests.
    Mcp,
    /// A call built by the app itself.
    Custom,
}

impl From<model::Provider> for Provider {
    fn from(p: model::Provider) -> Provider {
        match p {
            model::Provider::OpenAiChat => Provider::OpenAiChat,
            model::Provider::OpenAiResponses => Provider::OpenAiResponses,
            model::Provider::Anthropic => Provider::Anthropic,
            model::Provider::Gemini => Provider::Gemini,
            model::Provider::Mcp => Provider::Mcp,
            model::Provider::Custom => Provider::Custom,
        }
    }
}

impl From<Provider> for model::Provider {
    fn from(p: Provider) -> model::Provider {
        match p {
            Provider::OpenAiChat => model::Provider::OpenAiChat,
            Provider::OpenAiResponses => model::Provider::OpenAiResponses,
            Provider::Anthropic => model::Provider::Anthropic,
            Provider::Gemini => model::Provider::Gemini,
            Provider::Mcp => model::Provider::Mcp,
            Provider::Custom => model::Provider::Custom,
        }
    }
}

/// One tool call the model asked for, in provider-neutral form.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub struct ToolCall {
    /// Where the call came from (`Custom` for calls the app builds).
    pub provider: Provider,
    /// The provider's call id (`call_…`, `toolu_…`, an MCP request id).
    pub call_id: String,
    /// The tool (function) name the model chose.
    pub tool_name: String,
    /// The arguments as JSON text (an object).
    pub arguments: String,
    /// Position of the call within its model response, from 0.
    #[uniffi(default = 0)]
    pub position: u32,
    /// True when `call_id` was derived because the provider sent none.
    #[uniffi(default = false)]
    pub call_id_derived: bool,
}

impl From<model::ToolCall> for ToolCall {
    fn from(c: model::ToolCall) -> ToolCall {
        ToolCall {
            provider: c.provider.into(),
            call_id: c.call_id,
            tool_name: c.tool_name,
            arguments: c.arguments,
            position: c.position,
            call_id_derived: c.call_id_derived,
        }
    }
}

impl From<ToolCall> for model::ToolCall {
    fn from(c: ToolCall) -> model::ToolCall {
        model::ToolCall {
            provider: c.provider.into(),
            call_id: c.call_id,
            call_id_derived: c.call_id_derived,
            tool_name: c.tool_name,
            arguments: c.arguments,
            position: c.position,
        }
    }
}

/// One call to begin with the ledger directly: the call plus what the app's
/// tool registry knows about the tool.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub struct CallSpec {
    /// The call as the model asked for it.
    pub call: ToolCall,
    /// The tool's version (part of the identity and of the digest).
    pub tool_version: u32,
    /// Whether a human must approve these exact arguments first.
    #[uniffi(default = false)]
    pub requires_approval: bool,
    /// The tool's downstream deduplicates requests by the downstream key.
    #[uniffi(default = false)]
    pub idempotency_key: bool,
    /// The tool can look an effect up downstream.
    #[uniffi(default = false)]
    pub lookup: bool,
    /// How long the downstream honours a key, in ms (`u64::MAX`: for
    /// ever; none: not declared). With a lookup, or a key that outlives any
    /// reconciliation, `commit` costs no sync of its own: see the ledger's
    /// durability policy.
    #[uniffi(default = None)]
    pub key_lifetime_ms: Option<u64>,
}

impl From<CallSpec> for ledger::CallSpec {
    fn from(s: CallSpec) -> ledger::CallSpec {
        ledger::CallSpec {
            call: s.call.into(),
            tool_version: s.tool_version,
            requires_approval: s.requires_approval,
            downstream: ledger::Downstream {
                idempotency_key: s.idempotency_key,
                lookup: s.lookup,
                key_lifetime: s.key_lifetime_ms.map(lifetime),
            },
        }
    }
}

/// A key lifetime in ms as the core reads it (`u64::MAX`: for ever).
pub(crate) fn lifetime(ms: u64) -> Duration {
    if ms == u64::MAX {
        Duration::MAX
    } else {
        Duration::from_millis(ms)
    }
}

/// Permission to run one attempt: the record is durably `executing`.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub struct Ticket {
    /// The execution.
    pub execution_id: ExecutionId,
    /// The idempotency key to send downstream (the same on every attempt).
    pub downstream_key: DownstreamKey,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// Tool name.
    pub tool_name: String,
    /// Tool version.
    pub tool_version: u32,
    /// The arguments as the model sent them (checked JSON, not rewritten).
    pub args_json: String,
    /// Their digest.
    pub args_digest: ArgsDigest,
    /// An external id already known from an earlier attempt.
    pub external_id: Option<String>,
}

impl Ticket {
    pub(crate) fn attempt_id(&self) -> ledger::AttemptId {
        ledger::AttemptId::new(self.execution_id.clone(), self.attempt)
    }
}

impl From<ledger::Ticket> for Ticket {
    fn from(t: ledger::Ticket) -> Ticket {
        Ticket {
            execution_id: t.execution_id,
            downstream_key: t.downstream_key,
            attempt: t.attempt,
            tool_name: t.tool_name,
            tool_version: t.tool_version,
            args_json: t.args_json,
            args_digest: t.args_digest,
            external_id: t.external_id,
        }
    }
}

/// A committed result as stored: hand it to the model, again and again.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub struct StoredResult {
    /// The execution.
    pub execution_id: ExecutionId,
    /// The result JSON, byte for byte as committed.
    pub result_json: String,
    /// The downstream's id for the effect, if any.
    pub external_id: Option<String>,
    /// True for an independent batch that committed only some items (the
    /// result says which happened and which did not).
    pub partial: bool,
}

impl From<ledger::StoredResult> for StoredResult {
    fn from(r: ledger::StoredResult) -> StoredResult {
        StoredResult {
            execution_id: r.execution_id,
            result_json: r.result_json,
            external_id: r.external_id,
            partial: r.partial,
        }
    }
}

/// What an approver must see: the tool and the exact arguments, by digest.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub struct ApprovalRequest {
    /// The execution waiting for approval.
    pub execution_id: ExecutionId,
    /// Tool name.
    pub tool_name: String,
    /// The arguments as the model sent them, for the app's preview (never
    /// log them).
    pub args_json: String,
    /// The digest an approval must name.
    pub args_digest: ArgsDigest,
}

impl From<ledger::ApprovalRequest> for ApprovalRequest {
    fn from(a: ledger::ApprovalRequest) -> ApprovalRequest {
        ApprovalRequest {
            execution_id: a.execution_id,
            tool_name: a.tool_name,
            args_json: a.args_json,
            args_digest: a.args_digest,
        }
    }
}

/// The answer of `begin`: what the caller must do with this call now.
#[derive(Clone, PartialEq, Eq, uniffi::Enum)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub enum Begin {
    /// Run the tool now, sending the ticket's downstream key.
    Execute {
        /// The attempt's ticket.
        ticket: Ticket,
    },
    /// Ask a human; nothing runs until `approve` names this digest.
    NeedsApproval {
        /// What to show.
        request: ApprovalRequest,
    },
    /// Already committed: hand this stored result to the model. Never run.
    Replay {
        /// The stored result.
        result: StoredResult,
    },
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
    /// again after `retry_after_ms`; its claim ends once its lease lapsed
    /// and its process is gone).
    InFlight {
        /// The execution.
        execution_id: ExecutionId,
        /// When to ask again, in ms, if known.
        retry_after_ms: Option<u64>,
    },
    /// The outcome is unknown: reconcile (look the effect up) first.
    Reconcile {
        /// The ticket of the attempt whose outcome is unknown.
        ticket: Ticket,
    },
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

impl From<ledger::Begin> for Begin {
    fn from(b: ledger::Begin) -> Begin {
        use ledger::Begin as B;
        match b {
            B::Execute(ticket) => Begin::Execute {
                ticket: ticket.into(),
            },
            B::NeedsApproval(request) => Begin::NeedsApproval {
                request: request.into(),
            },
            B::Replay(result) => Begin::Replay {
                result: result.into(),
            },
            B::Conflict {
                execution_id,
                stored_digest,
                new_digest,
            } => Begin::Conflict {
                execution_id,
                stored_digest,
                new_digest,
            },
            B::InFlight {
                execution_id,
                retry_after,
            } => Begin::InFlight {
                execution_id,
                retry_after_ms: retry_after.map(millis),
            },
            B::Reconcile(ticket) => Begin::Reconcile {
                ticket: ticket.into(),
            },
            B::Failed {
                execution_id,
                reason,
            } => Begin::Failed {
                execution_id,
                reason,
            },
            B::Rejected { execution_id } => Begin::Rejected { execution_id },
            B::Cancelled { execution_id } => Begin::Cancelled { execution_id },
        }
    }
}

/// How the app resolved an unknown outcome (e.g. the user checked their bank).
#[derive(Clone, PartialEq, Eq, uniffi::Enum)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
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

impl From<Resolution> for ledger::Resolution {
    fn from(r: Resolution) -> ledger::Resolution {
        match r {
            Resolution::Found {
                result_json,
                external_id,
            } => ledger::Resolution::Found {
                result_json,
                external_id,
            },
            Resolution::NotFoundRetry => ledger::Resolution::NotFoundRetry,
            Resolution::NotFoundAbandon { reason } => {
                ledger::Resolution::NotFoundAbandon { reason }
            }
        }
    }
}

/// What `resolve_unknown` on the ledger led to.
#[derive(Clone, PartialEq, Eq, uniffi::Enum)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub enum Resolved {
    /// Committed with the found result.
    Committed {
        /// The stored result.
        result: StoredResult,
    },
    /// Back to `executing` for the next attempt under the same key: run it.
    Retry {
        /// The new attempt's ticket.
        ticket: Ticket,
    },
    /// Recorded as failed before commit.
    Failed,
    /// Not found, in a cancelled operation: recorded as cancelled; nothing
    /// is sent again.
    Cancelled,
    /// Not found, and items of the batch committed: recorded as the partial
    /// commit it is.
    Partial {
        /// The stored (partial) result.
        result: StoredResult,
    },
}

impl From<ledger::Resolved> for Resolved {
    fn from(r: ledger::Resolved) -> Resolved {
        match r {
            ledger::Resolved::Committed(s) => Resolved::Committed { result: s.into() },
            ledger::Resolved::Retry(t) => Resolved::Retry { ticket: t.into() },
            ledger::Resolved::Failed => Resolved::Failed,
            ledger::Resolved::Cancelled => Resolved::Cancelled,
            ledger::Resolved::Partial(s) => Resolved::Partial { result: s.into() },
        }
    }
}

/// A duration in whole milliseconds (saturating).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The largest busy timeout SQLite accepts, in milliseconds (`i32::MAX`).
const MAX_BUSY_TIMEOUT_MS: u64 = 2_147_483_647;

/// How a ledger behaves. Every field has a default.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct LedgerConfig {
    /// How long a suspended session stays the owner of the calls it was
    /// running whatever becomes of its process, in ms (boot clock, from
    /// `suspend()`); after that, other sessions reconcile them once its
    /// process is gone (a frozen app can be thawed and send). A running
    /// session owns its calls for as long as it lives.
    #[uniffi(default = 60000)]
    pub lease_ms: u64,
    /// How long a write waits for another process's lock, in ms (at most
    /// 2^31 - 1; larger values are clamped).
    #[uniffi(default = 5000)]
    pub busy_timeout_ms: u64,
    /// Deepest accepted nesting of argument and result JSON.
    #[uniffi(default = 64)]
    pub max_json_depth: u32,
    /// Largest accepted argument or result JSON, in bytes.
    #[uniffi(default = 1048576)]
    pub max_json_bytes: u64,
    /// The durability policy: the commit of a call whose downstream dedupes
    /// by a key that outlives reconciliation, or can be looked up, is
    /// written without a sync of its own and made durable by the next
    /// durable write, `suspend()`, closing the ledger or
    /// `deferred_deadline_ms` later.
    /// Off: every commit is durable before it returns.
    #[uniffi(default = true)]
    pub deferred_commits: bool,
    /// The longest a deferred commit stays without a sync, in ms.
    #[uniffi(default = 1000)]
    pub deferred_deadline_ms: u64,
    /// How soon after any restart the app is sure to call `recover()`, in
    /// ms; none: nothing promised (then only keys that never expire let a
    /// key-only tool defer its commit).
    #[uniffi(default = None)]
    pub reconcile_within_ms: Option<u64>,
    /// How long the ledger must have written nothing before its background
    /// thread copies the write-ahead log into the database file, in ms, so
    /// that a call made after a pause never pays SQLite's own checkpoint
    /// inside its commit (a few milliseconds on a phone, every few hundred
    /// calls). 0: never (SQLite checkpoints in the commit that fills the
    /// log, as it does by default).
    #[uniffi(default = 250)]
    pub idle_checkpoint_ms: u64,
}

#[cfg(test)]
impl LedgerConfig {
    /// The foreign languages' defaults (the `#[uniffi(default)]`s above),
    /// for the crate's own tests.
    pub(crate) fn for_tests() -> LedgerConfig {
        LedgerConfig {
            lease_ms: 60_000,
            busy_timeout_ms: 5_000,
            max_json_depth: 64,
            max_json_bytes: 1 << 20,
            deferred_commits: true,
            deferred_deadline_ms: 1_000,
            reconcile_within_ms: None,
            idle_checkpoint_ms: 250,
        }
    }
}

impl From<LedgerConfig> for ledger::LedgerConfig {
    fn from(c: LedgerConfig) -> ledger::LedgerConfig {
        ledger::LedgerConfig {
            lease: Duration::from_millis(c.lease_ms),
            // SQLite takes the busy timeout as an i32 of milliseconds (and
            // rusqlite panics above that): ~24 days is "forever" anyway.
            busy_timeout: Duration::from_millis(c.busy_timeout_ms.min(MAX_BUSY_TIMEOUT_MS)),
            json_limits: JsonLimits {
                max_depth: usize::try_from(c.max_json_depth).unwrap_or(usize::MAX),
                max_bytes: usize::try_from(c.max_json_bytes).unwrap_or(usize::MAX),
            },
            deferred_commits: ledger::DeferredCommits {
                enabled: c.deferred_commits,
                deadline: lifetime(c.deferred_deadline_ms),
                reconcile_within: c.reconcile_within_ms.map(Duration::from_millis),
            },
            sqlite_vfs: None,
            idle_checkpoint: match c.idle_checkpoint_ms {
                0 => ledger::IdleCheckpoint::OFF,
                ms => ledger::IdleCheckpoint {
                    after: Duration::from_millis(ms),
                    ..ledger::IdleCheckpoint::default()
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_match_the_core() {
        // The `#[uniffi(default = …)]` literals above must track the core.
        let core = ledger::LedgerConfig::default();
        assert_eq!(core.lease, Duration::from_millis(60000));
        assert_eq!(core.busy_timeout, Duration::from_millis(5000));
        assert_eq!(core.json_limits.max_depth, 64);
        assert_eq!(core.json_limits.max_bytes, 1048576);
        assert!(core.deferred_commits.enabled);
        assert_eq!(core.deferred_commits.deadline, Duration::from_millis(1000));
        assert_eq!(core.deferred_commits.reconcile_within, None);
        assert_eq!(core.idle_checkpoint.after, Duration::from_millis(250));
    }

    #[test]
    fn an_idle_checkpoint_of_0_ms_turns_it_off() {
        let on: ledger::LedgerConfig = LedgerConfig::for_tests().into();
        assert_eq!(on.idle_checkpoint, ledger::IdleCheckpoint::default());
        let later: ledger::LedgerConfig = LedgerConfig {
            idle_checkpoint_ms: 2_000,
            ..LedgerConfig::for_tests()
        }
        .into();
        assert_eq!(later.idle_checkpoint.after, Duration::from_millis(2_000));
        assert_eq!(
            later.idle_checkpoint.writes,
            ledger::IdleCheckpoint::default().writes
        );
        let off: ledger::LedgerConfig = LedgerConfig {
            idle_checkpoint_ms: 0,
            ..LedgerConfig::for_tests()
        }
        .into();
        assert_eq!(off.idle_checkpoint, ledger::IdleCheckpoint::OFF);
        assert!(!off.idle_checkpoint.is_on());
    }
}
