//! `toolledger-crossing-reference`: the Rust side of the per-language
//! crossing benchmarks (bindings/python/bench/crossing_overhead.py, the
//! Kotlin and Swift `CrossingBench`). Each of them starts this program and
//! alternates batches between it and its own calls, so that the Rust figures
//! and the language's figures come from one run on one disk, under the same
//! load.
//!
//! ```text
//! toolledger-crossing-reference <dir>
//! stdin:  <figure> <n>     figure: ledger | executor | replay | read_only | round8
//! stdout: one line per request: n durations in ns, separated by spaces
//! ```
//!
//! The figures, as the language benchmarks time them through the bindings:
//! `ledger` is `begin` → `commit` → `mark_delivered` of a new call (two
//! durable commits); `executor` is `execute` of a new call to a no-op
//! side-effecting tool that dedupes by key; `replay` is `execute` of a call
//! that committed; `read_only` is `execute` of a no-op read-only tool;
//! `round8` is `execute_round` of eight new calls to the side-effecting tool
//! (one durable begin for the eight, then a commit each). The
//! futures are driven with `block_on` on a current-thread runtime, as a
//! synchronous Rust caller would. The ledger file is `<dir>/rust.db`.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use toolledger::executor::{
    Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError, ToolHandler, ToolRequest,
};
use toolledger::ledger::{Begin, CallSpec, Ledger, LedgerConfig};
use toolledger::model::{OperationId, ToolCall};

/// A tool that does nothing and answers `"ok"`.
struct Noop(ToolDescriptor);

#[async_trait]
impl ToolHandler for Noop {
    fn descriptor(&self) -> ToolDescriptor {
        self.0.clone()
    }

    async fn perform(&self, _request: ToolRequest) -> Result<PerformOutcome, ToolError> {
        Ok(PerformOutcome::Committed {
            result_json: "\"ok\"".into(),
            external_id: None,
        })
    }
}

type Failure = Box<dyn std::error::Error>;

struct Reference {
    ledger: Arc<Ledger>,
    executor: Executor,
    rt: tokio::runtime::Runtime,
    op: OperationId,
    next: u64,
}

impl Reference {
    fn open(dir: PathBuf) -> Result<Reference, Failure> {
        let ledger = Arc::new(Ledger::open(&dir.join("rust.db"), LedgerConfig::default())?);
        let executor = Executor::new(ledger.clone(), ExecutorConfig::default());
        executor.register(Arc::new(Noop(ToolDescriptor {
            idempotency_key: true,
            ..ToolDescriptor::side_effect("noop", 1)
        })))?;
        executor.register(Arc::new(Noop(ToolDescriptor::read_only("noop_read", 1))))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let this = Reference {
            ledger,
            executor,
            rt,
            op: OperationId::new("crossing")?,
            next: 0,
        };
        // The call every replay asks for.
        this.rt
            .block_on(this.executor.execute(&this.op, 0, replayed_call()))?;
        Ok(this)
    }

    fn call_id(&mut self) -> String {
        self.next += 1;
        format!("rust_{}", self.next)
    }

    fn one(&mut self, figure: &str) -> Result<(), Failure> {
        match figure {
            "ledger" => {
                let call = ToolCall::custom(self.call_id(), "noop", "{}");
                let Begin::Execute(ticket) =
                    self.ledger.begin(&self.op, 1, &CallSpec::new(call, 1))?
                else {
                    return Err("a new call was not executed".into());
                };
                self.ledger.commit(&ticket.attempt_id(), "\"ok\"", None)?;
                self.ledger.mark_delivered(&[ticket.execution_id])?;
            }
            "executor" => {
                let call = ToolCall::custom(self.call_id(), "noop", "{}");
                self.rt.block_on(self.executor.execute(&self.op, 2, call))?;
            }
            "replay" => {
                self.rt
                    .block_on(self.executor.execute(&self.op, 0, replayed_call()))?;
            }
            "read_only" => {
                let call = ToolCall::custom("read", "noop_read", "{}");
                self.rt.block_on(self.executor.execute(&self.op, 3, call))?;
            }
            "round8" => {
                let calls = (0..8)
                    .map(|_| ToolCall::custom(self.call_id(), "noop", "{}"))
                    .collect();
                self.rt
                    .block_on(self.executor.execute_round(&self.op, 4, calls))?;
            }
            other => return Err(format!("unknown figure {other}").into()),
        }
        Ok(())
    }
}

fn replayed_call() -> ToolCall {
    ToolCall::custom("replayed", "noop", "{}")
}

fn run() -> Result<(), Failure> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .ok_or("usage: toolledger-crossing-reference <dir>")?;
    let mut reference = Reference::open(dir)?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        let (Some(figure), Some(n)) = (words.next(), words.next()) else {
            break;
        };
        let n: usize = n.parse()?;
        let mut line = String::with_capacity(n * 8);
        for i in 0..n {
            let started = Instant::now();
            reference.one(figure)?;
            if i > 0 {
                line.push(' ');
            }
            line.push_str(&started.elapsed().as_nanos().to_string());
        }
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("toolledger-crossing-reference: {e}");
            ExitCode::FAILURE
        }
    }
}
