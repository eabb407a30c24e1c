//! The UniFFI surface: what Swift, Kotlin and Python see.
//!
//! A thin skin over the core. Each exported object holds a core object and
//! forwards every call, converting arguments in and errors out; records and
//! enums are declared here and converted from the core types with `From`.
//! Nothing here decides anything the core does not.
//!
//! | exported | wraps | |
//! |---|---|---|
//! | [`Ledger`] | `ledger::Ledger` | the durable state machine; sync methods (short SQLite transactions: call them off the main thread) |
//! | [`ToolExecutor`] | `executor::Executor` | runs foreign [`ToolHandler`]s; async methods on a tokio runtime inside the library; caller-driven sync methods (`start` → [`CallerStep`] → `report`) that run the tool on the caller's thread |
//! | [`parse_tool_calls`], [`render_tool_result`], [`ToolCallStream`] … | `provider` | provider wire formats, stream assembly |
//!
//! Errors: every fallible function returns [`LedgerError`], one structured
//! enum with only the cases an app acts on. Nothing exported panics on bad
//! input: a malformed id or JSON is `LedgerError::InvalidInput`. A foreign
//! tool that throws from `perform` produces an unknown outcome, never a
//! crash and never a "failed".
//!
//! Identifiers (`ExecutionId`, `OperationId`, `ArgsDigest`, `DownstreamKey`)
//! cross as strings and are validated on the way in (see `ids`).
//!
//! This crate's library is named `toolledger`, so the artefact the platform
//! scripts and the generated bindings load is `libtoolledger`; the core
//! crate (also `toolledger`) is `toolledger_core` here.
#![warn(missing_docs)]

mod direct;
mod driven;
mod error;
mod execution;
mod executor;
mod ids;
mod ledger;
mod outcome;
mod privacy;
mod provider;
mod records;
mod redact;
mod tool;

pub use driven::{CallerAttempt, CallerStep};
pub use error::{LedgerError, StorageKind};
pub use execution::{
    CancelOutcome, Execution, ExecutionStatus, JobApplied, JobUpdate, LedgerStats, OperationStatus,
    OperationSummary, StatusCount, TransitionEntry,
};
pub use executor::{Recovery, RecoveryFailure, RecoveryFailureKind, ToolExecutor};
pub use ledger::Ledger;
pub use outcome::{CallOutcome, ExecutorConfig, LatencySummary, MetricsSnapshot};
pub use privacy::{
    encrypt_ledger, generate_ledger_key, rotate_ledger_key, LedgerEvent, LedgerObserver,
    ObserverError, ReasonKind,
};
pub use provider::{
    mcp_request_protocol_version, parse_tool_calls, render_anthropic_user_message,
    render_gemini_user_turn, render_mcp_batch_response, render_mcp_result, render_tool_result,
    ToolCallStream, ToolResult,
};
pub use records::{
    ApprovalRequest, Begin, CallSpec, LedgerConfig, Provider, Resolution, Resolved, StoredResult,
    Ticket, ToolCall,
};
pub use tool::{
    BatchMode, EffectClass, LookupOutcome, PerformOutcome, ToolCallError, ToolDescriptor,
    ToolHandler, ToolRequest,
};

// UniFFI scaffolding (the `UniFfiTag` the derives refer to) sits at the crate
// root.
uniffi::setup_scaffolding!("toolledger");
