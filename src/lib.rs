//! toolledger: a durable on-device ledger that makes AI tool calls effectively
//! once.
//!
//! One logical tool call (send an email, pay) is one *execution*. Its intent
//! is durable before the request leaves, its result is durable before the
//! model sees it, and asked again (a retry, a restart, a second process) it
//! is replayed, reconciled or refused, never run twice. The design is in
//! `docs/design.md`.
//!
//! | module | what it is |
//! |---|---|
//! | [`model`] | pure types: ids, canonical JSON and digests, statuses and the moves between them |
//! | [`ledger`] | the durable state machine over one SQLite file: [`ledger::Ledger`] |
//! | [`executor`] | runs tools under the whole protocol: [`executor::Executor`] |
//! | [`provider`] | OpenAI, Anthropic, Gemini and MCP tool calls in and results out |
//! | [`store`] | SQLite: the only module that knows SQL |
//!
//! The Swift, Kotlin and Python APIs are generated from the `toolledger-ffi`
//! crate, a thin layer over this one.
//!
//! ```
//! use toolledger::ledger::{Begin, CallSpec, Ledger, LedgerConfig};
//! use toolledger::model::{OperationId, ToolCall};
//!
//! # fn main() -> Result<(), toolledger::ledger::Error> {
//! # let dir = tempfile::tempdir().map_err(|e| toolledger::ledger::Error::Session(e.to_string()))?;
//! let ledger = Ledger::open(&dir.path().join("ledger.db"), LedgerConfig::default())?;
//! let op = OperationId::new("op_77")?;
//! let call = ToolCall::custom("call_1", "send_email", r#"{"to":"a@example.com"}"#);
//! if let Begin::Execute(ticket) = ledger.begin(&op, 0, &CallSpec::new(call.clone(), 1))? {
//!     // ... send with ticket.downstream_key as the idempotency key ...
//!     ledger.commit(&ticket.attempt_id(), r#"{"sent":true}"#, None)?;
//! }
//! // Asked again: the stored result, nothing runs.
//! let again = ledger.begin(&op, 0, &CallSpec::new(call, 1))?;
//! assert!(matches!(again, Begin::Replay(_)));
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

// Named crash points: a public module only for the torture harness, which
// enables `crash-points`; in every other build the hooks compile to nothing.
#[cfg(feature = "crash-points")]
#[doc(hidden)]
pub mod crashpoint;
#[cfg(not(feature = "crash-points"))]
#[allow(dead_code)]
mod crashpoint;
pub mod executor;
pub mod ledger;
pub mod model;
pub mod provider;
mod store;

/// The README's Rust blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
