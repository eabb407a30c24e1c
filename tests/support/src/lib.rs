//! What toolledger's tests share: small helpers for ledgers and calls, and
//! [`downstream`], a loopback service with tools that talk to it.
#![allow(dead_code, missing_docs)]

pub mod downstream;
pub mod power_vfs;

use std::path::Path;
use std::sync::Arc;

use toolledger::ledger::{CallSpec, Ledger, LedgerConfig, ManualClock};
use toolledger::model::{OperationId, Provider, ToolCall};

/// A ledger on a file in `dir` with a manual clock at t = 1_000_000 ms.
pub fn open_at(path: &Path) -> (Ledger, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let ledger = Ledger::open_with_clock(path, LedgerConfig::default(), clock.clone()).unwrap();
    (ledger, clock)
}

/// A ledger sharing `clock`.
pub fn open_with(path: &Path, clock: &Arc<ManualClock>) -> Ledger {
    Ledger::open_with_clock(path, LedgerConfig::default(), clock.clone()).unwrap()
}

pub fn op(name: &str) -> OperationId {
    OperationId::new(name).unwrap()
}

pub fn call(id: &str, tool: &str, args: &str) -> ToolCall {
    ToolCall {
        provider: Provider::OpenAiChat,
        call_id: id.to_owned(),
        call_id_derived: false,
        tool_name: tool.to_owned(),
        arguments: args.to_owned(),
        position: 0,
    }
}

pub fn spec(id: &str, tool: &str, args: &str) -> CallSpec {
    CallSpec::new(call(id, tool, args), 1)
}

/// The current attempt of `id` (the fencing token its next step must name).
pub fn current(
    ledger: &Ledger,
    id: &toolledger::model::ExecutionId,
) -> toolledger::ledger::AttemptId {
    let attempt = ledger.get(id).unwrap().map_or(0, |r| r.attempt_count);
    toolledger::ledger::AttemptId::new(id.clone(), attempt)
}
