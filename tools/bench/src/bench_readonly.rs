//! The read-only figure of `toolledger-bench`: a read-only tool through the
//! Executor against the same tool called directly, in alternating batches,
//! driven from inside a runtime task or with `block_on` from outside.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tokio::runtime::Runtime;
use toolledger::executor::{Executor, ExecutorConfig, ToolHandler, ToolRequest};
use toolledger::ledger::Ledger;
use toolledger::model::{ExecutionId, ExecutionIdParts, OperationId, ToolCall};

use crate::bench_figures::commits_between;
use crate::bench_support::{wal_commits, Samples, Weather};
use crate::{CliError, CliResult};

fn other(msg: impl Into<String>) -> CliError {
    CliError::Other(msg.into())
}

/// How the read-only figure drives the futures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// From inside a task on the runtime (an async agent loop in the app).
    InTask,
    /// `Runtime::block_on` from a thread outside the runtime (a synchronous
    /// caller or a foreign thread).
    BlockOn,
}

/// Read-only calls through the Executor and straight to the tool, in
/// alternating batches. Returns (executor, direct, WAL commits caused).
pub fn read_only(
    ledger: &Arc<Ledger>,
    path: &Path,
    rt: &Runtime,
    driver: Driver,
    samples: u64,
) -> CliResult<(Samples, Samples, u64)> {
    let executor = Executor::new(ledger.clone(), ExecutorConfig::default());
    executor
        .register(Arc::new(Weather))
        .map_err(|e| other(format!("bench: {e}")))?;
    let before = wal_commits(path)?;
    let measured = match driver {
        Driver::BlockOn => read_only_loop_blocking(&executor, rt, samples),
        Driver::InTask => rt
            .block_on(rt.spawn(async move { read_only_loop_async(&executor, samples).await }))
            .map_err(|e| other(format!("bench: read-only task: {e}")))?,
    }?;
    let after = wal_commits(path)?;
    Ok((measured.0, measured.1, commits_between(before, after)))
}

/// The read-only call, its direct request, and the operation.
fn read_only_call() -> CliResult<(OperationId, ToolCall, ToolRequest)> {
    let op = OperationId::new("bench_read_only")?;
    let call = ToolCall::custom("call_w", "weather", r#"{"city":"Lisbon"}"#);
    let id = ExecutionId::derive(&ExecutionIdParts {
        operation: &op,
        round: 0,
        call_id: &call.call_id,
        tool_name: &call.tool_name,
        tool_version: 1,
    })?;
    let request = ToolRequest {
        downstream_key: id.downstream_key(),
        execution_id: id,
        tool_name: call.tool_name.clone(),
        arguments_json: call.arguments.clone(),
        attempt: 1,
        item_index: None,
        external_id: None,
    };
    Ok((op, call, request))
}

type Pair = (Samples, Samples);

fn read_only_loop_blocking(executor: &Executor, rt: &Runtime, samples: u64) -> CliResult<Pair> {
    let (op, call, request) = read_only_call()?;
    let tool = Weather;
    let (mut via, mut direct) = (Samples::default(), Samples::default());
    let batch = 500.min(samples).max(1);
    let mut done = 0;
    while done < samples {
        for _ in 0..batch {
            let started = Instant::now();
            let out = rt.block_on(tool.perform(request.clone()));
            direct.push(started.elapsed());
            if out.is_err() {
                return Err(other("bench: the read-only tool failed"));
            }
        }
        for _ in 0..batch {
            let started = Instant::now();
            let out = rt
                .block_on(executor.execute(&op, 0, call.clone()))
                .map_err(|e| other(format!("bench: executor: {e}")))?;
            via.push(started.elapsed());
            if out.result_json().is_none() {
                return Err(other("bench: a read-only call did not complete"));
            }
        }
        done += batch;
    }
    Ok((via, direct))
}

async fn read_only_loop_async(executor: &Executor, samples: u64) -> CliResult<Pair> {
    let (op, call, request) = read_only_call()?;
    let tool = Weather;
    let (mut via, mut direct) = (Samples::default(), Samples::default());
    let batch = 500.min(samples).max(1);
    let mut done = 0;
    while done < samples {
        for _ in 0..batch {
            let started = Instant::now();
            let out = tool.perform(request.clone()).await;
            direct.push(started.elapsed());
            if out.is_err() {
                return Err(other("bench: the read-only tool failed"));
            }
        }
        for _ in 0..batch {
            let started = Instant::now();
            let out = executor
                .execute(&op, 0, call.clone())
                .await
                .map_err(|e| other(format!("bench: executor: {e}")))?;
            via.push(started.elapsed());
            if out.result_json().is_none() {
                return Err(other("bench: a read-only call did not complete"));
            }
        }
        done += batch;
    }
    Ok((via, direct))
}
