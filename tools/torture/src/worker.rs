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
use toolledger::ledger::{
    AttemptId, Clock, JobApplied, JobUpdate, Ledger, LedgerConfig, Resolution, SystemClock,
};
use toolledger::model::{ExecutionId, OperationId};

use super::workload::{self, Mode, BATCH_TOOL};

/// What a worker is told on its command line.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// A live-owner run: another worker runs the same workload at the same
    /// time, the supervisor stops and continues both (SIGSTOP/SIGCONT), and
    /// this one suspends and resumes its ledger all along, with its wall
    /// clock off by `wall_offset_ms`.
    pub live: Option<Live>,
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

/// The live-owner settings of a worker.
#[derive(Debug, Clone, Copy)]
pub struct Live {
    /// How far this worker's wall clock is off (either way).
    pub wall_offset_ms: i64,
    /// Seed of its suspend/resume storm.
    pub seed: u64,
}

/// The system clocks, with the wall clock off by a fixed amount.
#[derive(Debug)]
struct OffsetClock(i64);

impl Clock for OffsetClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms().saturating_add(self.0)
    }
    fn monotonic(&self) -> toolledger::ledger::Monotonic {
        SystemClock.monotonic()
    }
}

/// Errors a live worker waits out and tries again: its own ledger is
/// suspended (the storm), or another process holds the write lock.
fn transient(e: &toolledger::executor::Error) -> bool {
    matches!(e, toolledger::executor::Error::Ledger(l) if transient_ledger(l))
}

/// [`transient`] for a ledger error.
fn transient_ledger(e: &toolledger::ledger::Error) -> bool {
    use toolledger::ledger::Error as L;
    use toolledger::ledger::StorageError as S;
    matches!(e, L::Store(S::Suspended | S::Busy) | L::StaleAttempt { .. })
}

/// Pause between two tries of a step in a live run.
const LIVE_PAUSE: Duration = Duration::from_millis(5);
/// Most tries of one step in a live run (the storm and the stops delay, they
/// never stop a step for long).
const LIVE_TRIES: usize = 4_000;

#[derive(Default)]
struct Counters {
    given: AtomicU64,
    replays: AtomicU64,
    resolved: AtomicU64,
    unresolved: AtomicU64,
    webhooks: AtomicU64,
    duplicate_webhooks: AtomicU64,
    in_flight_waits: AtomicU64,
    suspends: AtomicU64,
}

struct App {
    exec: Executor,
    addr: SocketAddr,
    transcript: Mutex<File>,
    counters: Counters,
    live: bool,
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
        for _ in 0..LIVE_TRIES {
            match self.exec.ledger().mark_delivered(std::slice::from_ref(id)) {
                Ok(()) => return Ok(()),
                Err(e) if self.live && transient_ledger(&e) => std::thread::sleep(LIVE_PAUSE),
                Err(e) => return Err(format!("mark_delivered {id}: {e}")),
            }
        }
        Err(format!("mark_delivered {id}: never settled"))
    }

    /// Runs a ledger step, waiting out transient failures in a live run.
    fn retry<T>(
        &self,
        mut step: impl FnMut() -> Result<T, toolledger::ledger::Error>,
    ) -> Result<T, toolledger::ledger::Error> {
        let mut tries = 0;
        loop {
            match step() {
                Err(e) if self.live && transient_ledger(&e) && tries < LIVE_TRIES => {
                    tries += 1;
                    std::thread::sleep(LIVE_PAUSE);
                }
                other => return other,
            }
        }
    }

    /// Asks again for an execution another session runs (or ran), by the
    /// same table as a repeated call; transient failures are waited out.
    async fn again(&self, id: &ExecutionId) -> Result<CallOutcome, String> {
        for _ in 0..LIVE_TRIES {
            match self.exec.run_existing(id).await {
                Ok(outcome) => return Ok(outcome),
                Err(e) if transient(&e) => tokio::time::sleep(LIVE_PAUSE).await,
                Err(e) => return Err(format!("run_existing {id}: {e}")),
            }
        }
        Err(format!("run_existing {id}: never settled"))
    }

    /// Carries one outcome to a result the model gets (or to an unknown
    /// the app could not resolve).
    async fn settle(&self, mut outcome: CallOutcome) -> Result<(), String> {
        let steps = if self.live { LIVE_TRIES } else { SETTLE_STEPS };
        for _ in 0..steps {
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
                } => match self
                    .exec
                    .approve(&execution_id, &args_digest, preview_json.as_deref())
                    .await
                {
                    Ok(next) => next,
                    // Live: the other worker approved it first, or the
                    // storm suspended us; ask again.
                    Err(_) if self.live => self.again(&execution_id).await?,
                    Err(e) => return Err(format!("approve {execution_id}: {e}")),
                },
                CallOutcome::InFlight {
                    execution_id,
                    retry_after,
                } if self.live => {
                    self.counters
                        .in_flight_waits
                        .fetch_add(1, Ordering::Relaxed);
                    let wait = retry_after.unwrap_or(Duration::from_millis(20));
                    tokio::time::sleep(wait.min(Duration::from_secs(2))).await;
                    self.again(&execution_id).await?
                }
                CallOutcome::Unknown {
                    execution_id,
                    retry_after: Some(wait),
                    ..
                } => {
                    tokio::time::sleep(wait.min(Duration::from_secs(5))).await;
                    self.again(&execution_id).await?
                }
                CallOutcome::Pending {
                    execution_id,
                    job_id,
                } => self.deliver_webhook(&execution_id, &job_id)?,
                CallOutcome::Unknown { execution_id, .. } => {
                    if self.live {
                        // A request of the other worker may still land: the
                        // app asks the truth only after the tools' window.
                        tokio::time::sleep(workload::LIVE_LANDING_WINDOW).await;
                    }
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
                .retry(|| {
                    self.exec
                        .ledger()
                        .ingest_webhook("exports", &event_id, id, &update)
                })
                .map_err(|e| format!("webhook {id}: {e}"))?;
            match (delivery, applied) {
                (0, JobApplied::Committed(_) | JobApplied::AlreadyFinal(_)) => {
                    self.counters.webhooks.fetch_add(1, Ordering::Relaxed);
                }
                (0, JobApplied::DuplicateEvent) if self.live => {
                    // The other worker delivered it first.
                    self.counters
                        .duplicate_webhooks
                        .fetch_add(1, Ordering::Relaxed);
                }
                (1, JobApplied::DuplicateEvent) => {
                    self.counters
                        .duplicate_webhooks
                        .fetch_add(1, Ordering::Relaxed);
                }
                (n, other) => return Err(format!("webhook delivery {n} of {id}: {other:?}")),
            }
        }
        // Live: the storm may suspend the ledger between the webhook and
        // this read; wait it out like every other step.
        let rec = self
            .retry(|| self.exec.ledger().get(id))
            .map_err(|e| format!("read job {id}: {e}"))?
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
        let rec = self
            .retry(|| ledger.get(id))
            .map_err(|e| e.to_string())?
            .ok_or("unknown execution vanished")?;
        let addr = self.addr;
        // The attempt whose outcome is unknown: the resolution names it.
        let attempt = AttemptId::new(id.clone(), rec.attempt_count);
        let resolution = if rec.tool_name == BATCH_TOOL {
            let done: Vec<u32> = self
                .retry(|| ledger.batch_items(id))
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
                match self
                    .retry(|| ledger.record_batch_item(&attempt, index, &result, ext.as_deref()))
                {
                    Ok(_) => {}
                    // Live: the other worker moved on meanwhile.
                    Err(_) if self.live => return self.again(id).await.map(Some),
                    Err(e) => return Err(format!("record item {index} of {id}: {e}")),
                }
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
        match self.exec.resolve_unknown(&attempt, resolution).await {
            Ok(outcome) => Ok(Some(outcome)),
            // Live: the other worker settled it first.
            Err(e) if self.live && transient(&e) => self.again(id).await.map(Some),
            Err(e) if self.live => match self.again(id).await {
                Ok(outcome) => Ok(Some(outcome)),
                Err(_) => Err(format!("resolve {id}: {e}")),
            },
            Err(e) => Err(format!("resolve {id}: {e}")),
        }
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
    let ledger = match args.live {
        None => Ledger::open(&args.db, LedgerConfig::default()),
        Some(live) => Ledger::open_with_clock(
            &args.db,
            LedgerConfig {
                // Suspensions are short and many: a suspended worker's calls
                // are taken over quickly.
                lease: Duration::from_millis(300),
                ..LedgerConfig::default()
            },
            Arc::new(OffsetClock(live.wall_offset_ms)),
        ),
    }
    .map_err(|e| format!("open ledger: {e}"))?;
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
    for tool in workload::tools(args.mode, args.service, args.live.is_some()) {
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
        live: args.live.is_some(),
    };
    // Live: the ledger is suspended and resumed all along, as an app that
    // goes to the background and back again and again.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let app = Arc::new(app);
    let storm = args.live.map(|live| {
        let ledger = exec.ledger().clone();
        let done = done.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let mut rng = super::rng::Rng::new(live.seed);
            while !done.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(rng.range(10, 80))).await;
                app.counters.suspends.fetch_add(1, Ordering::Relaxed);
                let _ = ledger.suspend();
                tokio::time::sleep(Duration::from_millis(rng.range(0, 40))).await;
                let _ = ledger.resume();
            }
        })
    });
    let op = OperationId::new(args.op.clone()).map_err(|e| e.to_string())?;

    let mut tries = 0;
    let recovered = loop {
        match exec.recover().await {
            // Live: the storm can suspend the ledger between two rows of
            // the sweep; those rows are reported failed with the transient
            // error and a second sweep settles them.
            Ok(r)
                if app.live
                    && tries < LIVE_TRIES
                    && !r.failed.is_empty()
                    && r.failed.iter().all(|f| transient(&f.error)) =>
            {
                tries += 1;
                tokio::time::sleep(LIVE_PAUSE).await;
            }
            Ok(r) => break r,
            Err(e) if app.live && transient(&e) && tries < LIVE_TRIES => {
                tries += 1;
                tokio::time::sleep(LIVE_PAUSE).await;
            }
            Err(e) => return Err(format!("recover: {e}")),
        }
    };
    if let Some(f) = recovered.failed.first() {
        return Err(format!("recover: {}: {}", f.execution_id, f.error));
    }
    let recovered_count = recovered.outcomes.len();
    for outcome in recovered.outcomes {
        app.settle(outcome).await?;
    }
    for (round, calls) in workload::rounds() {
        let mut tries = 0;
        let outcomes = loop {
            match exec.execute_round(&op, round, calls.clone()).await {
                Ok(outcomes) => break outcomes,
                Err(e) if app.live && transient(&e) && tries < LIVE_TRIES => {
                    tries += 1;
                    tokio::time::sleep(LIVE_PAUSE).await;
                }
                Err(e) => return Err(format!("round {round}: {e}")),
            }
        };
        for outcome in outcomes {
            app.settle(outcome).await?;
        }
    }
    done.store(true, Ordering::Relaxed);
    if let Some(storm) = storm {
        let _ = storm.await;
        let _ = exec.ledger().resume();
    }
    let c = &app.counters;
    Ok(format!(
        "recovered={recovered_count} given={} replays={} resolved_unknowns={} unresolved={} webhooks={} duplicate_webhooks={} suspends={} in_flight_waits={}",
        c.given.load(Ordering::Relaxed),
        c.replays.load(Ordering::Relaxed),
        c.resolved.load(Ordering::Relaxed),
        c.unresolved.load(Ordering::Relaxed),
        c.webhooks.load(Ordering::Relaxed),
        c.duplicate_webhooks.load(Ordering::Relaxed),
        c.suspends.load(Ordering::Relaxed),
        c.in_flight_waits.load(Ordering::Relaxed),
    ))
}
