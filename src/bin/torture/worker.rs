//! The worker: one "life" of the app. It opens the ledger, calls
//! `Executor::recover()`, then runs the whole workload from the top (every
//! call that completed in an earlier life replays), playing the app's part:
//! it approves the payment, delivers the export job's webhook (twice: the
//! repeat must be ignored), resolves unknown outcomes by asking the service's
//! ground truth, and hands every result to "the model" by appending it to
//! the transcript before marking it delivered.
//!
//! It may die anywhere: at an armed crash point (`TOOLLEDGER_CRASH_AT`,
//! abort) or by the supervisor's SIGKILL. Exit 0 means the workload
//! completed; exit 2 means the worker met something the protocol should
//! never produce here (stderr says what).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use toolledger::crashpoint::{self, CrashPoint};
use toolledger::executor::{CallOutcome, Executor, ExecutorConfig};
use toolledger::ledger::{AttemptId, JobApplied, JobUpdate, Ledger, LedgerConfig, Resolution};
use toolledger::model::{ExecutionId, OperationId};

use super::workload::{self, Mode, BATCH_TOOL};

/// What a worker is told on its command line.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// The ledger file.
    pub db: PathBuf,
    /// The service.
    pub service: SocketAddr,
    /// The service's behaviour.
    pub mode: Mode,
    /// The operation id of this run.
    pub op: String,
    /// The transcript file ("what the model saw").
    pub transcript: PathBuf,
}

#[derive(Default)]
struct Counters {
    given: AtomicU64,
    replays: AtomicU64,
    resolved: AtomicU64,
    unresolved: AtomicU64,
    webhooks: AtomicU64,
    duplicate_webhooks: AtomicU64,
}

struct App {
    exec: Executor,
    addr: SocketAddr,
    transcript: Mutex<File>,
    counters: Counters,
}

/// Bound on how many steps one call's settlement may take.
const SETTLE_STEPS: usize = 16;

impl App {
    /// Hands a committed result to the model: transcript line first, then
    /// (after the `after-model-result` crash point) the delivery mark.
    fn give_to_model(&self, id: &ExecutionId, result: &str, replayed: bool) -> Result<(), String> {
        let line = json!({ "id": id.as_str(), "result": result }).to_string() + "\n";
        {
            let mut file = self.transcript.lock().map_err(|_| "transcript lock")?;
            // One write(2) of a short line: atomic with respect to our death.
            file.write_all(line.as_bytes())
                .map_err(|e| format!("transcript: {e}"))?;
        }
        self.counters.given.fetch_add(1, Ordering::Relaxed);
        if replayed {
            self.counters.replays.fetch_add(1, Ordering::Relaxed);
        }
        crashpoint::hit(CrashPoint::AfterModelResult);
        self.exec
            .ledger()
            .mark_delivered(std::slice::from_ref(id))
            .map_err(|e| format!("mark_delivered {id}: {e}"))
    }

    /// Carries one outcome to a result the model gets (or to an unknown
    /// the app could not resolve).
    async fn settle(&self, mut outcome: CallOutcome) -> Result<(), String> {
        for _ in 0..SETTLE_STEPS {
            outcome = match outcome {
                CallOutcome::Completed {
                    execution_id,
                    result_json,
                    replayed,
                    ..
                } => return self.give_to_model(&execution_id, &result_json, replayed),
                CallOutcome::NeedsApproval {
                    execution_id,
                    args_digest,
                    preview_json,
                    ..
                } => self
                    .exec
                    .approve(&execution_id, &args_digest, preview_json.as_deref())
                    .await
                    .map_err(|e| format!("approve {execution_id}: {e}"))?,
                CallOutcome::Pending {
                    execution_id,
                    job_id,
                } => self.deliver_webhook(&execution_id, &job_id)?,
                CallOutcome::Unknown { execution_id, .. } => {
                    match self.resolve_unknown(&execution_id).await? {
                        Some(next) => next,
                        None => {
                            self.counters.unresolved.fetch_add(1, Ordering::Relaxed);
                            return Ok(());
                        }
                    }
                }
                other => return Err(format!("unexpected outcome {other:?}")),
            };
        }
        Err(format!(
            "no settlement in {SETTLE_STEPS} steps: {outcome:?}"
        ))
    }

    /// The export job finished downstream: deliver its webhook, then a
    /// duplicate of it, and return the committed result.
    fn deliver_webhook(&self, id: &ExecutionId, job_id: &str) -> Result<CallOutcome, String> {
        let (event_id, result_json) = workload::job_event(self.addr, job_id)?;
        let update = JobUpdate::Succeeded { result_json };
        for delivery in 0..2 {
            let applied = self
                .exec
                .ingest_webhook("exports", &event_id, id, &update)
                .map_err(|e| format!("webhook {id}: {e}"))?;
            match (delivery, applied) {
                (0, JobApplied::Committed(_) | JobApplied::AlreadyFinal(_)) => {
                    self.counters.webhooks.fetch_add(1, Ordering::Relaxed);
                }
                (1, JobApplied::DuplicateEvent) => {
                    self.counters
                        .duplicate_webhooks
                        .fetch_add(1, Ordering::Relaxed);
                }
                (n, other) => return Err(format!("webhook delivery {n} of {id}: {other:?}")),
            }
        }
        let rec = self
            .exec
            .ledger()
            .get(id)
            .map_err(|e| e.to_string())?
            .ok_or("job execution vanished")?;
        match (rec.status.is_committed(), rec.result_json) {
            (true, Some(result_json)) => Ok(CallOutcome::Completed {
                execution_id: id.clone(),
                result_json,
                external_id: rec.external_id,
                replayed: false,
                partial: rec.partial,
            }),
            _ => Err(format!("job {id} not committed after its webhook")),
        }
    }

    /// The app asks the service's ground truth and settles the unknown:
    /// found → commit it; absent → retry under the same key. For a batch,
    /// the items found downstream are recorded first, in order. `None` when
    /// the truth cannot be had (the call stays `outcome_unknown`).
    async fn resolve_unknown(&self, id: &ExecutionId) -> Result<Option<CallOutcome>, String> {
        let ledger = self.exec.ledger();
        let rec = ledger
            .get(id)
            .map_err(|e| e.to_string())?
            .ok_or("unknown execution vanished")?;
        let addr = self.addr;
        // The attempt whose outcome is unknown: the resolution names it.
        let attempt = AttemptId::new(id.clone(), rec.attempt_count);
        let resolution = if rec.tool_name == BATCH_TOOL {
            let done: Vec<u32> = ledger
                .batch_items(id)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|(i, _, _)| i)
                .collect();
            for index in (0..workload::BATCH_ITEMS).filter(|i| !done.contains(i)) {
                let key = Ledger::batch_item_key(id, index);
                let found = match blocking(move || workload::truth(addr, key.as_str())).await {
                    Ok(found) => found,
                    Err(_) => return Ok(None),
                };
                let Some((result, ext)) = found else { break };
                ledger
                    .record_batch_item(&attempt, index, &result, ext.as_deref())
                    .map_err(|e| format!("record item {index} of {id}: {e}"))?;
            }
            Resolution::NotFoundRetry
        } else {
            let key = rec.downstream_key.clone();
            match blocking(move || workload::truth(addr, key.as_str())).await {
                Ok(Some((result_json, external_id))) => Resolution::Found {
                    result_json,
                    external_id,
                },
                Ok(None) => Resolution::NotFoundRetry,
                Err(_) => return Ok(None),
            }
        };
        self.counters.resolved.fetch_add(1, Ordering::Relaxed);
        self.exec
            .resolve_unknown(&attempt, resolution)
            .await
            .map(Some)
            .map_err(|e| format!("resolve {id}: {e}"))
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| e.to_string())?
}

/// Runs one life. `Ok(summary)` when the workload completed.
pub fn run(args: &WorkerArgs) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(life(args))
}

async fn life(args: &WorkerArgs) -> Result<String, String> {
    let ledger =
        Ledger::open(&args.db, LedgerConfig::default()).map_err(|e| format!("open ledger: {e}"))?;
    let exec = Executor::new(
        Arc::new(ledger),
        ExecutorConfig {
            // Attempts survive restarts; a run kills a worker a dozen times
            // at most, so the cap is never what stops a call here.
            max_attempts: 64,
            read_only_max_attempts: 3,
            perform_timeout: Some(Duration::from_secs(30)),
            backoff_base: Duration::from_millis(1),
            backoff_max: Duration::from_millis(4),
            max_parallel: 4,
        },
    );
    for tool in workload::tools(args.mode, args.service) {
        exec.register(Arc::new(tool)).map_err(|e| e.to_string())?;
    }
    let transcript = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.transcript)
        .map_err(|e| format!("transcript: {e}"))?;
    let app = App {
        exec: exec.clone(),
        addr: args.service,
        transcript: Mutex::new(transcript),
        counters: Counters::default(),
    };
    let op = OperationId::new(args.op.clone()).map_err(|e| e.to_string())?;

    let recovered = exec.recover().await.map_err(|e| format!("recover: {e}"))?;
    if let Some(f) = recovered.failed.first() {
        return Err(format!("recover: {}: {}", f.execution_id, f.error));
    }
    let recovered_count = recovered.outcomes.len();
    for outcome in recovered.outcomes {
        app.settle(outcome).await?;
    }
    for (round, calls) in workload::rounds() {
        let outcomes = exec
            .execute_round(&op, round, calls)
            .await
            .map_err(|e| format!("round {round}: {e}"))?;
        for outcome in outcomes {
            app.settle(outcome).await?;
        }
    }
    let c = &app.counters;
    Ok(format!(
        "recovered={recovered_count} given={} replays={} resolved_unknowns={} unresolved={} webhooks={} duplicate_webhooks={}",
        c.given.load(Ordering::Relaxed),
        c.replays.load(Ordering::Relaxed),
        c.resolved.load(Ordering::Relaxed),
        c.unresolved.load(Ordering::Relaxed),
        c.webhooks.load(Ordering::Relaxed),
        c.duplicate_webhooks.load(Ordering::Relaxed),
    ))
}
