//! What toolledger's tests share: small helpers for ledgers and calls, and
//! [`downstream`], a loopback service with tools that talk to it.
#![allow(dead_code, missing_docs)]

pub mod downstream;
pub mod http;
pub mod power_vfs;

use std::path::Path;
use std::sync::Arc;

use toolledger::executor::{Executor, ExecutorConfig};
use toolledger::ledger::{Begin, CallSpec, Ledger, LedgerConfig, ManualClock, Ticket};
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

/// The ticket of an `Execute` answer (any other answer fails the test).
pub fn ticket(answer: Begin) -> Ticket {
    match answer {
        Begin::Execute(t) => t,
        other => panic!("expected Execute, got {other:?}"),
    }
}

/// An executor over a ledger on `path` (system clock), with
/// [`downstream::fast_config`].
pub fn executor_at(path: &Path) -> Executor {
    executor_with(path, downstream::fast_config())
}

/// An executor over a ledger on `path` (system clock) with `config`.
pub fn executor_with(path: &Path, config: ExecutorConfig) -> Executor {
    let ledger = Ledger::open(path, LedgerConfig::default()).unwrap();
    Executor::new(Arc::new(ledger), config)
}

/// How long [`wait_until`] waits: generous, for other processes on a
/// loaded machine.
pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits (polling every 2 ms, at most [`PATIENCE`]) until `cond` holds;
/// fails the test naming `what` when it never does.
pub fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Makes the session `session` of the ledger file `db` look, to the other
/// sessions, like a process they cannot match: its lock file's recorded
/// start time is moved by one (as when its process id now belongs to another
/// process, or it runs in a pid namespace they cannot see). Past its lease
/// (or without one) such an owner is judged by its lease alone. Returns
/// false when the file records no start time (a platform without `/proc`).
pub fn pretend_another_process(db: &Path, session: &str) -> bool {
    let mut name = db.as_os_str().to_os_string();
    name.push("-sessions");
    let lock = Path::new(&name).join(format!("{session}.lock"));
    let Ok(record) = std::fs::read_to_string(&lock) else {
        return false;
    };
    let Some(start) = record
        .lines()
        .find_map(|l| l.strip_prefix("start "))
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return false;
    };
    std::fs::write(
        &lock,
        record.replace(&format!("start {start}"), &format!("start {}", start + 1)),
    )
    .is_ok()
}
