//! Identifiers cross the FFI as strings (`typealias ExecutionId = String` in
//! Swift and Kotlin) and are validated on the way in: a malformed id from the
//! app becomes [`LedgerError::InvalidInput`], never a panic.

use toolledger_core::model::{ArgsDigest, DownstreamKey, ExecutionId, OperationId};

use super::error::LedgerError;

fn invalid(e: toolledger_core::model::IdError) -> uniffi::deps::anyhow::Error {
    // UniFFI downcasts this back to the function's `LedgerError`.
    LedgerError::from(e).into()
}

uniffi::custom_type!(
    /// One user-visible conversation turn or workflow, chosen by the app
    /// (`op_77`): 1–256 bytes.
    OperationId, String, {
    remote,
    lower: |id| id.as_str().to_owned(),
    try_lift: |s| OperationId::new(s).map_err(invalid),
});

uniffi::custom_type!(
    /// The durable identity of one logical tool call
    /// (`op_77:round_3:call_123:send_email:v1`), derived by the ledger; pass
    /// back exactly what it handed out. Empty strings and control characters
    /// (NUL included) are refused.
    ExecutionId, String, {
    remote,
    lower: |id| id.as_str().to_owned(),
    try_lift: |s| ExecutionId::parse(s).map_err(invalid),
});

uniffi::custom_type!(
    /// SHA-256 (64 lowercase hex characters) of a call's canonical arguments,
    /// tool name and version. An approval names the digest it approves.
    ArgsDigest, String, {
    remote,
    lower: |d| d.as_str().to_owned(),
    try_lift: |s| ArgsDigest::parse(s).map_err(invalid),
});

uniffi::custom_type!(
    /// The idempotency key to send to the downstream service: the same on
    /// every attempt of one execution (ASCII, at most 64 characters).
    DownstreamKey, String, {
    remote,
    lower: |k| k.as_str().to_owned(),
    try_lift: |s| DownstreamKey::parse(s).map_err(invalid),
});
