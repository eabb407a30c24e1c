//! One run of the power-cut simulation: the downstream (which a power cut
//! on the phone does not touch), the tools of each class, the workload of a
//! seed, the cut, the recovery and the checks.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use toolledger::executor::{
    BatchMode, CallOutcome, Executor, ExecutorConfig, LookupOutcome, PerformOutcome,
    ToolDescriptor, ToolError, ToolHandler, ToolRequest,
};
use toolledger::ledger::{
    AttemptId, Begin, CallSpec, JobApplied, JobUpdate, Ledger, ManualClock, Resolution,
};
use toolledger::model::{ExecutionId, ExecutionStatus, OperationId, ToolCall};
use toolledger_test_support::power_vfs::{Loss, Machine};

// ---------------------------------------------------------------------------
// Randomness
// ---------------------------------------------------------------------------

/// splitmix64.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

// ---------------------------------------------------------------------------
// The plan of a seed
// ---------------------------------------------------------------------------

/// What a tool's downstream offers (the truth, whatever the tool declares).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Dedupes by the key, for ever.
    Key,
    /// Can look an effect up.
    Lookup,
    /// Neither.
    Neither,
}

impl Class {
    const ALL: [Class; 3] = [Class::Key, Class::Lookup, Class::Neither];
    fn name(self) -> &'static str {
        match self {
            Class::Key => "key",
            Class::Lookup => "lookup",
            Class::Neither => "neither",
        }
    }
}

/// How a tool is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Atomic,
    Batch,
    Approval,
    Job,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Atomic, Kind::Batch, Kind::Approval, Kind::Job];
    fn tool(self, class: Class) -> String {
        match self {
            Kind::Atomic => class.name().to_owned(),
            Kind::Batch => format!("batch_{}", class.name()),
            Kind::Approval => format!("approve_{}", class.name()),
            Kind::Job => format!("job_{}", class.name()),
        }
    }
}

/// One step of a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// One call through the executor.
    Call(Kind, Class),
    /// A model response with three calls.
    Round([Class; 3]),
    /// One call through the Ledger API (begin → request → commit → deliver).
    LedgerApi(Class),
    /// The first completed call asked for again.
    Replay,
    /// The deferred commits' deadline passes.
    Deadline,
    /// The app is suspended and resumed.
    Suspend,
    /// `recover()`, as at launch.
    Recover,
    /// Another process's connection to the file (an app extension's ledger:
    /// `synchronous=NORMAL`) checkpoints the WAL; the ledger's next write
    /// then starts the WAL over.
    OtherCheckpoint,
}

/// A seed's workload.
#[derive(Debug, Clone)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Start from a ledger created and closed beforehand (most seeds: the
    /// migrations are then not run again); otherwise from an empty disk, so
    /// that cuts also fall in the creation of the database.
    pub from_template: bool,
}

/// A fresh ledger, created and closed cleanly once per test process: the
/// bytes of its database file.
/// The calls of one step, each with its kind and true class.
type StepCalls = Vec<(Kind, Class, ToolCall)>;

fn template() -> Result<Vec<u8>, String> {
    static TEMPLATE: std::sync::OnceLock<Result<Vec<u8>, String>> = std::sync::OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            let machine = Machine::new();
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let path = dir.path().join("ledger.db");
            let ledger = Ledger::open(&path, super::config(&machine, true))
                .map_err(|e| format!("template: {e}"))?;
            drop(ledger);
            machine
                .durable_file(&path.to_string_lossy())
                .ok_or_else(|| "template: no database file".to_owned())
        })
        .clone()
}

impl Plan {
    pub fn draw(seed: u64) -> Plan {
        let mut rng = Rng::new(seed);
        let from_template = rng.below(8) != 0;
        let n = 3 + rng.below(5);
        let class = |rng: &mut Rng| Class::ALL[rng.below(3) as usize];
        let steps = (0..n)
            .map(|_| match rng.below(22) {
                0..=5 => {
                    let kind = Kind::ALL[rng.below(4) as usize];
                    Step::Call(kind, class(&mut rng))
                }
                6..=8 => Step::Round([class(&mut rng), class(&mut rng), class(&mut rng)]),
                9..=11 => Step::LedgerApi(class(&mut rng)),
                12..=13 => Step::Replay,
                14..=16 => Step::Deadline,
                17..=18 => Step::Suspend,
                19 => Step::Recover,
                _ => Step::OtherCheckpoint,
            })
            .collect();
        Plan {
            steps,
            from_template,
        }
    }

    /// Every logical call of the plan: (step, calls with their kind and true
    /// class), in order.
    fn calls(&self) -> Vec<(usize, StepCalls)> {
        self.steps
            .iter()
            .enumerate()
            .filter_map(|(i, step)| {
                let make = |k: usize, kind: Kind, class: Class| {
                    let args = match kind {
                        Kind::Batch => r#"{"items":[{"n":0},{"n":1},{"n":2}]}"#.to_owned(),
                        _ => format!(r#"{{"step":{i},"n":{k}}}"#),
                    };
                    let mut call = ToolCall::custom(format!("c{i}_{k}"), kind.tool(class), args);
                    call.position = k as u32;
                    (kind, class, call)
                };
                match step {
                    Step::Call(kind, class) => Some((i, vec![make(0, *kind, *class)])),
                    Step::LedgerApi(class) => Some((i, vec![make(0, Kind::Atomic, *class)])),
                    Step::Round(classes) => Some((
                        i,
                        classes
                            .iter()
                            .enumerate()
                            .map(|(k, c)| make(k, Kind::Atomic, *c))
                            .collect(),
                    )),
                    _ => None,
                }
            })
            .collect()
    }
}

fn op() -> OperationId {
    OperationId::new("op").unwrap()
}

// ---------------------------------------------------------------------------
// The downstream: survives every power cut of the phone
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
pub struct Truth {
    /// Per key: the execution that asked, the first effect's result, and
    /// how many effects were made.
    applied: BTreeMap<String, (ExecutionId, String, u32)>,
    seq: u64,
}

type Shared = Arc<Mutex<Truth>>;

impl Truth {
    /// One request with `key`: a keyed downstream returns the effect it
    /// has; the others make another.
    fn request(&mut self, class: Class, key: &str, id: &ExecutionId) -> String {
        self.seq += 1;
        let fresh = format!(r#"{{"effect":"{key}","seq":{}}}"#, self.seq);
        match self.applied.get_mut(key) {
            Some((_, result, _)) if class == Class::Key => result.clone(),
            Some((_, _, times)) => {
                *times += 1;
                fresh
            }
            None => {
                self.applied
                    .insert(key.to_owned(), (id.clone(), fresh.clone(), 1));
                fresh
            }
        }
    }

    fn stored(&self, key: &str) -> Option<String> {
        self.applied.get(key).map(|(_, r, _)| r.clone())
    }
}

struct SimTool {
    class: Class,
    kind: Kind,
    /// Declare a key that never expires whatever the truth (a wrong
    /// declaration for a neither-tool).
    lie: bool,
    truth: Shared,
}

#[async_trait]
impl ToolHandler for SimTool {
    fn descriptor(&self) -> ToolDescriptor {
        let keyed = self.class == Class::Key || (self.lie && self.class == Class::Neither);
        ToolDescriptor {
            idempotency_key: keyed,
            lookup: self.class == Class::Lookup,
            key_lifetime: keyed.then_some(Duration::MAX),
            requires_approval: self.kind == Kind::Approval,
            batch: if self.kind == Kind::Batch {
                BatchMode::Independent
            } else {
                BatchMode::Atomic
            },
            // The downstream applies a request before it answers: nothing
            // lands late.
            landing_window: Duration::ZERO,
            ..ToolDescriptor::side_effect(self.kind.tool(self.class), 1)
        }
    }

    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let key = req.downstream_key.as_str().to_owned();
        let result = self
            .truth
            .lock()
            .unwrap()
            .request(self.class, &key, &req.execution_id);
        if self.kind == Kind::Job {
            return Ok(PerformOutcome::JobStarted {
                job_id: format!("job_{key}"),
            });
        }
        Ok(PerformOutcome::Committed {
            result_json: result,
            external_id: Some(key),
        })
    }

    async fn lookup(&self, req: ToolRequest) -> Result<LookupOutcome, ToolError> {
        if self.class != Class::Lookup {
            return Ok(LookupOutcome::Unsupported);
        }
        let key = req.downstream_key.as_str();
        Ok(match self.truth.lock().unwrap().stored(key) {
            Some(result_json) => LookupOutcome::Found {
                result_json,
                external_id: Some(key.to_owned()),
            },
            None => LookupOutcome::NotFound,
        })
    }
}

/// Walks one caller-driven call from `step` to its outcome, running `tool`
/// here; `None` when a step fails (the power went).
async fn walk(
    exec: &Executor,
    tool: &SimTool,
    mut step: toolledger::executor::CallerStep,
) -> Option<CallOutcome> {
    use toolledger::executor::CallerStep;
    for _ in 0..20 {
        step = match step {
            CallerStep::Done(outcome) => return Some(outcome),
            CallerStep::Perform(a) => {
                let done = tool.perform(a.request.clone()).await;
                exec.report(&a, done).ok()?
            }
            CallerStep::Lookup(a) => {
                let found = tool.lookup(a.request.clone()).await;
                exec.report_lookup(&a, found).ok()?
            }
            CallerStep::Retry { attempt, .. } => exec.retry(&attempt).ok()?,
        };
    }
    None
}

// ---------------------------------------------------------------------------
// One process
// ---------------------------------------------------------------------------

struct Process {
    ledger: Arc<Ledger>,
    exec: Executor,
    truth: Shared,
    lie: bool,
}

fn open_process(
    path: &Path,
    machine: &Machine,
    clock: &Arc<ManualClock>,
    truth: &Shared,
    deferred: bool,
    lie: bool,
) -> Result<Process, String> {
    let ledger = Ledger::open_with_clock(path, super::config(machine, deferred), clock.clone())
        .map_err(|e| format!("the database did not open: {e}"))?;
    let ledger = Arc::new(ledger);
    let exec = Executor::new(
        ledger.clone(),
        ExecutorConfig {
            max_attempts: 3,
            read_only_max_attempts: 1,
            perform_timeout: None,
            backoff_base: Duration::ZERO,
            backoff_max: Duration::ZERO,
            max_parallel: 1,
        },
    );
    for class in Class::ALL {
        for kind in Kind::ALL {
            exec.register(Arc::new(SimTool {
                class,
                kind,
                lie,
                truth: truth.clone(),
            }))
            .map_err(|e| e.to_string())?;
        }
    }
    Ok(Process {
        ledger,
        exec,
        truth: truth.clone(),
        lie,
    })
}

/// What the app was told, per execution.
#[derive(Debug, Default)]
struct App {
    /// Results handed to the model: (true class, result, made durable by a
    /// write the policy syncs at once).
    results: BTreeMap<ExecutionId, (Class, String, bool)>,
    /// Approvals recorded.
    approved: Vec<ExecutionId>,
    /// Background jobs whose start was recorded.
    jobs: Vec<ExecutionId>,
    /// The first completed call of an `Call` step (for `Replay`).
    first: Option<(usize, ToolCall, String)>,
    problems: Vec<String>,
}

impl App {
    fn ack(&mut self, id: &ExecutionId, class: Class, result: &str, durable: bool) {
        self.results
            .entry(id.clone())
            .or_insert((class, result.to_owned(), durable));
    }
}

/// Whether the policy (on or off) must have made this ack durable at once.
fn durable_ack(deferred: bool, kind: Kind, class: Class) -> bool {
    // Batches, jobs and webhooks commit durably; a neither-tool's commit is
    // never deferred.
    !deferred || class == Class::Neither || matches!(kind, Kind::Batch | Kind::Job)
}

/// Runs the workload until it ends or the power goes.
async fn workload(p: &Process, plan: &Plan, machine: &Machine, app: &mut App, deferred: bool) {
    let calls: BTreeMap<usize, Vec<(Kind, Class, ToolCall)>> = plan.calls().into_iter().collect();
    for (i, step) in plan.steps.iter().enumerate() {
        if machine.is_dead() {
            return;
        }
        let round = i as u32;
        match step {
            Step::Call(kind, class) => {
                let (_, _, call) = calls[&i][0].clone();
                let Ok(out) = p.exec.execute(&op(), round, call.clone()).await else {
                    return;
                };
                match out {
                    CallOutcome::Completed {
                        execution_id,
                        result_json,
                        ..
                    } => {
                        app.ack(
                            &execution_id,
                            *class,
                            &result_json,
                            durable_ack(deferred, *kind, *class),
                        );
                        if app.first.is_none() {
                            app.first = Some((i, call, result_json));
                        }
                        let _ = p.ledger.mark_delivered(&[execution_id]);
                    }
                    CallOutcome::NeedsApproval {
                        execution_id,
                        args_digest,
                        ..
                    } => {
                        if p.ledger.approve(&execution_id, &args_digest, None).is_err() {
                            return;
                        }
                        app.approved.push(execution_id.clone());
                        let Ok(out) = p.exec.run_existing(&execution_id).await else {
                            return;
                        };
                        match out {
                            CallOutcome::Completed { result_json, .. } => {
                                app.ack(
                                    &execution_id,
                                    *class,
                                    &result_json,
                                    durable_ack(deferred, *kind, *class),
                                );
                                let _ = p.ledger.mark_delivered(&[execution_id]);
                            }
                            other => app.problems.push(format!("approved: {other:?}")),
                        }
                    }
                    CallOutcome::Pending { execution_id, .. } => {
                        app.jobs.push(execution_id.clone());
                        let key = execution_id.downstream_key();
                        let stored = p.truth.lock().unwrap().stored(key.as_str());
                        let Some(result) = stored else {
                            app.problems.push("a started job has no effect".into());
                            return;
                        };
                        let update = JobUpdate::Succeeded {
                            result_json: result,
                        };
                        let event = format!("evt_{execution_id}");
                        let Ok(applied) =
                            p.exec.ingest_webhook("sim", &event, &execution_id, &update)
                        else {
                            return;
                        };
                        match applied {
                            JobApplied::Committed(stored) => {
                                app.ack(&execution_id, *class, &stored.result_json, true);
                            }
                            other => app.problems.push(format!("webhook: {other:?}")),
                        }
                        // The service sends it again.
                        match p.exec.ingest_webhook("sim", &event, &execution_id, &update) {
                            Ok(JobApplied::DuplicateEvent) | Err(_) => {}
                            Ok(other) => app.problems.push(format!("second webhook: {other:?}")),
                        }
                    }
                    other => app.problems.push(format!("step {i}: {other:?}")),
                }
            }
            Step::Round(_) => {
                let round_calls: Vec<ToolCall> =
                    calls[&i].iter().map(|(_, _, c)| c.clone()).collect();
                // A round at an odd position of the plan is caller-driven
                // (`start_round`, each call walked here), the others the
                // library's.
                let outs = if i % 2 == 1 {
                    let Ok(steps) = p.exec.start_round(&op(), round, round_calls) else {
                        return;
                    };
                    let mut outs = Vec::new();
                    for ((kind, class, _), step) in calls[&i].iter().zip(steps) {
                        let tool = SimTool {
                            class: *class,
                            kind: *kind,
                            lie: p.lie,
                            truth: p.truth.clone(),
                        };
                        let Some(out) = walk(&p.exec, &tool, step).await else {
                            return;
                        };
                        outs.push(out);
                    }
                    outs
                } else {
                    let Ok(outs) = p.exec.execute_round(&op(), round, round_calls).await else {
                        return;
                    };
                    outs
                };
                for ((kind, class, _), out) in calls[&i].iter().zip(outs) {
                    match out {
                        CallOutcome::Completed {
                            execution_id,
                            result_json,
                            ..
                        } => {
                            app.ack(
                                &execution_id,
                                *class,
                                &result_json,
                                durable_ack(deferred, *kind, *class),
                            );
                            let _ = p.ledger.mark_delivered(&[execution_id]);
                        }
                        other => app.problems.push(format!("round {i}: {other:?}")),
                    }
                }
            }
            Step::LedgerApi(class) => {
                let (_, _, call) = calls[&i][0].clone();
                let desc = p.declared(*class);
                let spec = CallSpec::new(call, 1).with_downstream(desc);
                let Ok(answer) = p.ledger.begin(&op(), round, &spec) else {
                    return;
                };
                let Begin::Execute(ticket) = answer else {
                    app.problems.push(format!("ledger api begin: {answer:?}"));
                    return;
                };
                let key = ticket.downstream_key.as_str().to_owned();
                let result = p
                    .truth
                    .lock()
                    .unwrap()
                    .request(*class, &key, &ticket.execution_id);
                if p.ledger
                    .commit(&ticket.attempt_id(), &result, Some(&key))
                    .is_err()
                {
                    return;
                }
                app.ack(
                    &ticket.execution_id,
                    *class,
                    &result,
                    durable_ack(deferred, Kind::Atomic, *class),
                );
                let _ = p.ledger.mark_delivered(&[ticket.execution_id]);
            }
            Step::Replay => {
                let Some((step, call, result)) = app.first.clone() else {
                    continue;
                };
                let Ok(out) = p.exec.execute(&op(), step as u32, call).await else {
                    return;
                };
                match out {
                    CallOutcome::Completed {
                        result_json,
                        replayed: true,
                        ..
                    } if result_json == result => {}
                    other => app.problems.push(format!("replay: {other:?}")),
                }
            }
            Step::Deadline => {
                if p.ledger.sync_deferred().is_err() {
                    return;
                }
            }
            Step::Suspend => {
                if p.ledger.suspend().is_err() || p.ledger.resume().is_err() {
                    return;
                }
            }
            Step::Recover => {
                if p.exec.recover().await.is_err() {
                    return;
                }
            }
            Step::OtherCheckpoint => {
                let Some(path) = p.ledger.path() else {
                    continue;
                };
                let Ok(other) = rusqlite::Connection::open_with_flags_and_vfs(
                    path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE,
                    machine.vfs_name(),
                ) else {
                    return;
                };
                let checkpointed =
                    other
                        .execute_batch("PRAGMA synchronous=NORMAL")
                        .and_then(|()| {
                            other.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                        });
                // Not the last connection: closing it checkpoints nothing.
                drop(other);
                if checkpointed.is_err() {
                    return;
                }
            }
        }
    }
}

impl Process {
    /// What an atomic tool of `class` declares to the ledger.
    fn declared(&self, class: Class) -> toolledger::ledger::Downstream {
        SimTool {
            class,
            kind: Kind::Atomic,
            lie: self.lie,
            truth: self.truth.clone(),
        }
        .descriptor()
        .downstream()
    }
}

// ---------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------

/// What one run found.
#[derive(Debug, Default)]
pub struct Found {
    /// Mutating disk operations of the workload (with the cut: up to it).
    pub ops: u64,
    /// Results handed to the model before the cut.
    pub acked: u64,
    /// Effects at the downstream.
    pub effects: u64,
    /// Acknowledged results found not committed on reopening (lost with a
    /// deferred commit) and committed again by reconciliation.
    pub reconciled: u64,
}

fn open_states(status: ExecutionStatus) -> bool {
    matches!(
        status,
        ExecutionStatus::Executing
            | ExecutionStatus::OutcomeUnknown
            | ExecutionStatus::Prepared
            | ExecutionStatus::Approved
    )
}

/// Runs `plan` once. `cut`: the power goes off before that mutating
/// operation of the workload (after the workload if it has fewer); `None`:
/// no cut, the process exits cleanly (the dry run). Then the machine
/// restarts (`loss` decides what the unsynced writes left), a new process
/// recovers and settles, and the checks run.
pub fn run(
    plan: &Plan,
    cut: Option<u64>,
    loss: Loss,
    seed: u64,
    deferred: bool,
    lie: bool,
    verbose: bool,
) -> Result<Found, String> {
    let machine = Machine::new();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("ledger.db");
    if plan.from_template {
        machine.put_file(&path.to_string_lossy(), template()?);
    }
    let truth: Shared = Arc::new(Mutex::new(Truth::default()));
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut app = App::default();

    // Life 1: the workload, until it ends or the power goes.
    if let Some(k) = cut {
        machine.cut_at(k);
    }
    match open_process(&path, &machine, &clock, &truth, deferred, lie) {
        Ok(p) => {
            rt.block_on(workload(&p, plan, &machine, &mut app, deferred));
            if cut.is_some() {
                // The power goes now if it has not yet; the process dies
                // with it.
                machine.cut_now();
                p.ledger.abandon();
            }
        }
        Err(_) if machine.is_dead() => {}
        Err(e) => return Err(e),
    }
    let ops = machine.ops();
    if let Some(problem) = app.problems.first() {
        return Err(format!("before the cut: {problem}"));
    }
    let mut rng = Rng::new(seed ^ 0x0DD5_EED5);
    machine.restart(loss, &mut |n| rng.below(n));
    clock.reboot("boot-1", 1_000);
    clock.advance(60_000);

    // Life 2: a fresh process on the rebooted machine.
    let p = open_process(&path, &machine, &clock, &truth, deferred, lie)?;
    let integrity = integrity(&path, &machine)?;
    if integrity != "ok" {
        return Err(format!("integrity_check: {integrity}"));
    }
    let mut problems = Vec::new();
    let mut reconciled = 0;
    // Before any recovery: what must have been durable is there.
    {
        let t = truth.lock().unwrap();
        for (key, (id, _, _)) in &t.applied {
            if p.ledger.get(id).map_err(|e| e.to_string())?.is_none() {
                problems.push(format!(
                    "an effect ({key}) without its execution: the intent was not durable"
                ));
            }
        }
    }
    for (id, (class, result, durable)) in &app.results {
        let rec = p.ledger.get(id).map_err(|e| e.to_string())?;
        let committed = rec.as_ref().is_some_and(|r| {
            r.status.is_committed() && r.result_json.as_deref() == Some(result.as_str())
        });
        if *durable && !committed {
            problems.push(format!(
                "{id} ({class:?}): a result handed out was lost ({:?})",
                rec.map(|r| r.status)
            ));
        }
        if !committed {
            reconciled += 1;
        }
    }
    for id in &app.approved {
        let rec = p.ledger.get(id).map_err(|e| e.to_string())?;
        if rec.is_none_or(|r| r.status == ExecutionStatus::Prepared) {
            problems.push(format!("{id}: an approval recorded was lost"));
        }
    }
    for id in &app.jobs {
        if p.ledger.job(id).map_err(|e| e.to_string())?.is_none() {
            problems.push(format!("{id}: a started job was lost"));
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }

    // Recovery, and the app asking for every call until all is settled.
    let app_resolved = rt.block_on(settle(&p, plan, &truth, verbose))?;

    // The checks after recovery.
    let t = truth.lock().unwrap();
    for (key, (_, _, times)) in &t.applied {
        if *times > 1 {
            problems.push(format!("{key}: {times} effects"));
        }
    }
    for (id, (class, result, _)) in &app.results {
        let rec = p.ledger.get(id).map_err(|e| e.to_string())?;
        let ok = rec.as_ref().is_some_and(|r| {
            r.status.is_committed() && r.result_json.as_deref() == Some(result.as_str())
        });
        if !ok {
            problems.push(format!(
                "{id} ({class:?}): the result handed out was lost for good ({:?})",
                rec.map(|r| (r.status, r.result_json))
            ));
        }
    }
    for rec in p.ledger.list(&op()).map_err(|e| e.to_string())? {
        let id = &rec.execution_id;
        if rec.tool_name.starts_with("batch_") {
            let items = p.ledger.batch_items(id).map_err(|e| e.to_string())?;
            for i in 0..3 {
                let key = Ledger::batch_item_key(id, i);
                let happened = t.applied.contains_key(key.as_str());
                let recorded = items.iter().any(|(n, _, _)| *n == i);
                if happened != recorded {
                    problems.push(format!(
                        "{id} item {i}: downstream {happened}, recorded {recorded}"
                    ));
                }
            }
            continue;
        }
        let happened = t.applied.get(rec.downstream_key.as_str());
        match (rec.status.is_committed(), happened) {
            (true, Some((_, result, _))) => {
                if rec.result_json.as_deref() != Some(result.as_str()) {
                    problems.push(format!("{id}: committed result differs from the effect"));
                }
            }
            (false, None) => {}
            (committed, happened) => problems.push(format!(
                "{id}: status {} (committed {committed}) but downstream effect {}",
                rec.status,
                happened.is_some()
            )),
        }
    }
    for (class, id) in app_resolved {
        if class != Class::Neither || lie {
            problems.push(format!(
                "{id} ({class:?}): needed the app to resolve it (reconciliation did not)"
            ));
        }
    }
    if verbose {
        println!(
            "cut={cut:?} loss={loss:?} ops={ops} acked={} effects={} reconciled={reconciled}",
            app.results.len(),
            t.applied.len()
        );
        if !problems.is_empty() {
            for rec in p.ledger.list(&op()).unwrap_or_default() {
                println!(
                    "  {} {} attempt {}",
                    rec.execution_id, rec.status, rec.attempt_count
                );
                for tr in p.ledger.transitions(&rec.execution_id).unwrap_or_default() {
                    println!(
                        "      {}: {:?} -> {} @{} {}",
                        tr.transition,
                        tr.from,
                        tr.to,
                        tr.attempt,
                        tr.reason.unwrap_or_default()
                    );
                }
            }
            println!("  downstream: {:?}", t.applied);
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    Ok(Found {
        ops,
        acked: app.results.len() as u64,
        effects: t.applied.len() as u64,
        reconciled,
    })
}

fn integrity(path: &Path, machine: &Machine) -> Result<String, String> {
    let conn = rusqlite::Connection::open_with_flags_and_vfs(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        machine.vfs_name(),
    )
    .map_err(|e| format!("integrity connection: {e}"))?;
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| format!("integrity_check: {e}"))
}

/// The new process recovers, then asks for every call of the plan again
/// (approving what waits for approval, redelivering webhooks) until nothing
/// is open. Unknown outcomes are resolved from the downstream's truth, as a
/// user checking their bank would; the calls that needed it are returned.
async fn settle(
    p: &Process,
    plan: &Plan,
    truth: &Shared,
    verbose: bool,
) -> Result<Vec<(Class, ExecutionId)>, String> {
    let mut resolved = Vec::new();
    if let Err(e) = p.exec.recover().await {
        return Err(format!("recover: {e}"));
    }
    for _ in 0..8 {
        for (step, calls) in plan.calls() {
            let round = step as u32;
            let round_calls: Vec<ToolCall> = calls.iter().map(|(_, _, c)| c.clone()).collect();
            let outs = if calls.len() == 1 {
                vec![p
                    .exec
                    .execute(&op(), round, round_calls[0].clone())
                    .await
                    .map_err(|e| format!("settle: {e}"))?]
            } else {
                p.exec
                    .execute_round(&op(), round, round_calls)
                    .await
                    .map_err(|e| format!("settle: {e}"))?
            };
            for ((kind, class, _), out) in calls.iter().zip(outs) {
                if verbose {
                    println!("  settle step {step}: {out:?}");
                }
                match out {
                    CallOutcome::Completed { execution_id, .. } => {
                        let _ = p.ledger.mark_delivered(&[execution_id]);
                    }
                    CallOutcome::NeedsApproval {
                        execution_id,
                        args_digest,
                        ..
                    } => {
                        p.ledger
                            .approve(&execution_id, &args_digest, None)
                            .map_err(|e| format!("approve: {e}"))?;
                        let _ = p.exec.run_existing(&execution_id).await;
                    }
                    // A job started again by this process's recovery runs
                    // under a live owner: its completion comes by webhook.
                    CallOutcome::InFlight { execution_id, .. }
                        if p.ledger
                            .job(&execution_id)
                            .map_err(|e| e.to_string())?
                            .is_some() =>
                    {
                        deliver_webhook(p, truth, &execution_id)?;
                    }
                    CallOutcome::Pending { execution_id, .. } => {
                        deliver_webhook(p, truth, &execution_id)?;
                    }
                    CallOutcome::Unknown {
                        execution_id,
                        attempt,
                        ..
                    } => {
                        resolved.push((*class, execution_id.clone()));
                        resolve_from_truth(p, truth, *kind, &execution_id, attempt).await?;
                    }
                    other => return Err(format!("settle step {step}: {other:?}")),
                }
            }
        }
        let open = p
            .ledger
            .list(&op())
            .map_err(|e| e.to_string())?
            .into_iter()
            .any(|r| open_states(r.status));
        if !open {
            return Ok(resolved);
        }
    }
    Err("calls still open after 8 settle rounds".into())
}

/// The service's webhook for the job of `id`, with the effect's result.
fn deliver_webhook(p: &Process, truth: &Shared, id: &ExecutionId) -> Result<(), String> {
    let key = id.downstream_key();
    let stored = truth.lock().unwrap().stored(key.as_str());
    if let Some(result_json) = stored {
        let event = format!("evt_{id}");
        let update = JobUpdate::Succeeded { result_json };
        p.exec
            .ingest_webhook("sim", &event, id, &update)
            .map_err(|e| format!("webhook: {e}"))?;
    }
    Ok(())
}

async fn resolve_from_truth(
    p: &Process,
    truth: &Shared,
    kind: Kind,
    id: &ExecutionId,
    attempt: u32,
) -> Result<(), String> {
    let attempt = AttemptId::new(id.clone(), attempt);
    let resolution = if kind == Kind::Batch {
        let done: Vec<u32> = p
            .ledger
            .batch_items(id)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|(i, _, _)| i)
            .collect();
        for i in 0..3u32 {
            let key = Ledger::batch_item_key(id, i);
            let stored = truth.lock().unwrap().stored(key.as_str());
            if let (false, Some(result)) = (done.contains(&i), stored) {
                p.ledger
                    .record_batch_item(&attempt, i, &result, None)
                    .map_err(|e| format!("record item: {e}"))?;
            }
        }
        Resolution::NotFoundRetry
    } else {
        let key = id.downstream_key();
        match truth.lock().unwrap().stored(key.as_str()) {
            Some(result_json) => Resolution::Found {
                result_json,
                external_id: Some(key.as_str().to_owned()),
            },
            None => Resolution::NotFoundRetry,
        }
    };
    p.exec
        .resolve_unknown(&attempt, resolution)
        .await
        .map_err(|e| format!("resolve: {e}"))?;
    Ok(())
}
