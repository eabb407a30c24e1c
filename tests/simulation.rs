//! A deterministic simulation of live owners: several sessions over one
//! ledger file, driven by a seed on virtual time (tokio's paused clock).
//!
//! Each schedule runs two to three sessions ("processes") of one app over
//! one file. They run the same eight logical calls (two operations × one
//! tool of each downstream class: idempotency key, lookup, neither, and an
//! independent batch of five items under keys; the key and lookup tools'
//! commits are deferred by the durability policy) concurrently, while the
//! schedule suspends and resumes them, steps their wall clocks forwards and
//! back, kills them (a dead process's requests stay on the wire), reboots
//! the machine, cancels operations and lets the app resolve unknown
//! outcomes from the downstream's ground truth. The simulated downstream
//! applies a request at once, or after the client gave up (within the
//! tools' declared landing window), or never; it answers, drops the answer,
//! or refuses. Some calls are caller-driven (`Executor::start`, the tool run
//! by the caller; or `Executor::start_round`, the three classes' calls begun
//! together and walked in parallel): the session runs the tool, then holds its report for a
//! while — across its own suspension, another session's takeover of the
//! call, a resend — and reports it later, so that stale reports reach the
//! ledger's fence (the schedules count how many it refused).
//!
//! A suspended session's process still runs it, so it stays owner past its
//! lease; half the suspensions also make its process one the others cannot
//! match (`support::pretend_another_process`: the lease alone decides),
//! which lets live owners' calls be taken over and their reports reach the
//! fence.
//!
//! After every schedule, once the downstream is quiet and a last session has
//! settled everything, the invariants are checked:
//! - at most one effect per logical call (per batch item) at the downstream;
//! - no committed result lost: every effect is recorded as committed (or as
//!   a committed item of a batch), with the downstream's result;
//! - no tool started after its operation's cancellation returned;
//! - every execution ends in a status that says what happened (committed ⇔
//!   effect; failed, cancelled, rejected ⇔ none);
//! - an owner is judged dead only after it was killed, or suspended as a
//!   process the others cannot match (read
//!   from each execution's transition log), and a running attempt commits
//!   only through the session that owns it.
//!
//! `TOOLLEDGER_SIM_SCHEDULES=<n>` runs n schedules (CI default 2000);
//! `TOOLLEDGER_SIM_SEED=<seed>` replays one. A failing schedule prints its
//! seed and the command that replays it.

use toolledger_test_support as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use toolledger::executor::{
    BatchMode, CallOutcome, CallerAttempt, CallerStep, Executor, ExecutorConfig, LookupOutcome,
    PerformOutcome, ToolDescriptor, ToolError, ToolHandler, ToolRequest,
};
use toolledger::ledger::{AttemptId, Clock, Ledger, LedgerConfig, Monotonic, Resolution};
use toolledger::model::{ExecutionStatus, OperationId, ToolCall};

/// The landing window every simulated tool declares (and the downstream
/// honours: nothing it receives applies later than this after it was sent).
const WINDOW_MS: u64 = 5_000;
/// The executor's perform timeout.
const TIMEOUT_MS: u64 = 1_000;
/// The suspension lease.
const LEASE_MS: u64 = 3_000;
const OPS: [&str; 2] = ["op_a", "op_b"];
const BATCH_ITEMS: usize = 5;

// ---------------------------------------------------------------------------
// Randomness and time
// ---------------------------------------------------------------------------

/// splitmix64: small, seedable, good enough to pick schedules.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The machine's time: the boot clock follows tokio's (virtual) clock.
#[derive(Debug)]
struct Machine {
    base: tokio::time::Instant,
    boot: Mutex<(String, i64)>,
}

impl Machine {
    fn elapsed_ms(&self) -> i64 {
        i64::try_from(self.base.elapsed().as_millis()).unwrap_or(i64::MAX)
    }
    fn reboot(&self, n: u64) {
        let now = self.elapsed_ms();
        *self.boot.lock().unwrap() = (format!("boot-{n}"), now);
    }
}

/// One process's clock: the machine's boot clock, and a wall clock of its
/// own that the schedule steps.
#[derive(Debug)]
struct SimClock {
    machine: Arc<Machine>,
    wall_offset: AtomicI64,
}

impl Clock for SimClock {
    fn now_ms(&self) -> i64 {
        1_700_000_000_000 + self.machine.elapsed_ms() + self.wall_offset.load(Ordering::SeqCst)
    }
    fn monotonic(&self) -> Monotonic {
        let (boot, start) = self.machine.boot.lock().unwrap().clone();
        // A fresh boot starts its clock at 1 s of uptime.
        Monotonic::new(boot.as_str(), 1_000 + self.machine.elapsed_ms() - start)
    }
}

// ---------------------------------------------------------------------------
// The downstream
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Key,
    Lookup,
    Neither,
    Batch,
}

impl Class {
    const ALL: [Class; 4] = [Class::Key, Class::Lookup, Class::Neither, Class::Batch];
    fn tool(self) -> &'static str {
        match self {
            Class::Key => "pay_key",
            Class::Lookup => "pay_lookup",
            Class::Neither => "pay_blind",
            Class::Batch => "invite_all",
        }
    }
    fn of_tool(name: &str) -> Class {
        Class::ALL
            .into_iter()
            .find(|c| c.tool() == name)
            .unwrap_or(Class::Neither)
    }
}

#[derive(Debug, Default)]
struct World {
    rng: Option<Rng>,
    /// Global event counter (orders sends and cancellations).
    seq: u64,
    /// Effects applied, per downstream key: (result, how many times).
    applied: BTreeMap<String, (String, u32)>,
    /// Requests on the wire that may still apply, per key.
    pending: BTreeMap<String, u32>,
    /// Keys a deduping downstream refused for good (a late arrival of the
    /// same key is refused too, as a real one answers from its key store).
    refused: std::collections::BTreeSet<String>,
    /// When (event number) each operation's cancellation returned.
    cancelled: BTreeMap<String, u64>,
    /// Invariant violations seen while running.
    violations: Vec<String>,
    sends: u64,
    /// Sessions that may rightly be judged dead: killed (a kill, a reboot)
    /// or suspended as a process the others cannot match at some point
    /// (their lease may lapse; a suspension alone never makes a live
    /// process dead).
    deadable: std::collections::BTreeSet<String>,
}

type Shared = Arc<Mutex<World>>;

fn rnd(world: &Shared, n: u64) -> u64 {
    world.lock().unwrap().rng.as_mut().map_or(0, |r| r.below(n))
}

/// Applies `key` once: a downstream that dedupes by key returns the effect
/// it has (and never applies a key it refused); one that does not makes
/// another.
fn apply(world: &Shared, key: &str, dedupe: bool) -> String {
    let mut w = world.lock().unwrap();
    if dedupe && w.refused.contains(key) {
        return String::new();
    }
    let result = format!(r#"{{"effect":"{key}"}}"#);
    match w.applied.get_mut(key) {
        Some((stored, _)) if dedupe => stored.clone(),
        Some((_, times)) => {
            *times += 1;
            result
        }
        None => {
            w.applied.insert(key.to_owned(), (result.clone(), 1));
            result
        }
    }
}

struct SimTool {
    class: Class,
    world: Shared,
}

#[async_trait]
impl ToolHandler for SimTool {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            idempotency_key: matches!(self.class, Class::Key | Class::Batch),
            lookup: self.class == Class::Lookup,
            batch: if self.class == Class::Batch {
                BatchMode::Independent
            } else {
                BatchMode::Atomic
            },
            landing_window: Duration::from_millis(WINDOW_MS),
            // The key tool's keys never expire, so its commit is deferred
            // (as the lookup tool's is): the durability policy runs under
            // live owners too. The batch's keys are undeclared: durable.
            key_lifetime: (self.class == Class::Key).then_some(Duration::MAX),
            ..ToolDescriptor::side_effect(self.class.tool(), 1)
        }
    }

    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let key = req.downstream_key.as_str().to_owned();
        let op = req
            .execution_id
            .as_str()
            .split(':')
            .next()
            .unwrap_or("")
            .to_owned();
        let dedupe = self.descriptor().idempotency_key;
        {
            let mut w = self.world.lock().unwrap();
            w.seq += 1;
            w.sends += 1;
            if let Some(at) = w.cancelled.get(&op) {
                let msg = format!(
                    "{} sent at event {} after its operation was cancelled at {at}",
                    req.execution_id, w.seq
                );
                w.violations.push(msg);
            }
        }
        if dedupe {
            // A downstream with an idempotency-key store answers a known key
            // from it: the stored effect, "in progress" while an earlier
            // request with the key is still being handled, or the stored
            // refusal.
            let w = self.world.lock().unwrap();
            if let Some((result, _)) = w.applied.get(&key) {
                return Ok(PerformOutcome::Committed {
                    result_json: result.clone(),
                    external_id: Some(key),
                });
            }
            if w.pending.get(&key).copied().unwrap_or(0) > 0 {
                return Ok(PerformOutcome::FailedBeforeCommit {
                    reason: "409 in progress".into(),
                    retryable: true,
                });
            }
            if w.refused.contains(&key) {
                return Ok(PerformOutcome::FailedBeforeCommit {
                    reason: "422 (stored)".into(),
                    retryable: false,
                });
            }
        }
        // The network and the server take a moment: other work (a stop,
        // another session) interleaves with every request.
        tokio::time::sleep(Duration::from_millis(rnd(&self.world, 300))).await;
        match rnd(&self.world, 10) {
            // Applied and answered.
            0..=4 => Ok(PerformOutcome::Committed {
                result_json: apply(&self.world, &key, dedupe),
                external_id: Some(key),
            }),
            // Applied, the answer lost.
            5 => {
                apply(&self.world, &key, dedupe);
                Err(ToolError::new("connection reset"))
            }
            // Applied after the client gave up (within the window), or lost
            // on the wire; the client times out either way.
            6 | 7 => {
                let lands = rnd(&self.world, 2) == 0;
                let delay = TIMEOUT_MS + rnd(&self.world, WINDOW_MS - TIMEOUT_MS);
                *self
                    .world
                    .lock()
                    .unwrap()
                    .pending
                    .entry(key.clone())
                    .or_default() += 1;
                let world = self.world.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    if lands {
                        apply(&world, &key, dedupe);
                    }
                    if let Some(n) = world.lock().unwrap().pending.get_mut(&key) {
                        *n -= 1;
                    }
                });
                tokio::time::sleep(Duration::from_millis(TIMEOUT_MS * 10)).await;
                Err(ToolError::new("the sleep outlived the timeout"))
            }
            // Refused before anything happened.
            8 => Ok(PerformOutcome::FailedBeforeCommit {
                reason: "429".into(),
                retryable: true,
            }),
            _ => {
                let retryable = rnd(&self.world, 2) == 0;
                if dedupe && !retryable {
                    self.world.lock().unwrap().refused.insert(key);
                }
                Ok(PerformOutcome::FailedBeforeCommit {
                    reason: "422".into(),
                    retryable,
                })
            }
        }
    }

    async fn lookup(&self, req: ToolRequest) -> Result<LookupOutcome, ToolError> {
        if self.class != Class::Lookup {
            return Ok(LookupOutcome::Unsupported);
        }
        let w = self.world.lock().unwrap();
        Ok(match w.applied.get(req.downstream_key.as_str()) {
            Some((result, _)) => LookupOutcome::Found {
                result_json: result.clone(),
                external_id: Some(req.downstream_key.as_str().to_owned()),
            },
            None => LookupOutcome::NotFound,
        })
    }
}

// ---------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------

struct Session {
    ledger: Arc<Ledger>,
    exec: Executor,
    clock: Arc<SimClock>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    suspended: bool,
    /// Caller-driven attempts whose tool ran and whose report this session
    /// holds back (reported at a later event, or lost with the process).
    held: Held,
}

/// A caller-driven attempt that ran, and what its tool did.
type Held = Arc<Mutex<Vec<(CallerAttempt, Result<PerformOutcome, ToolError>)>>>;

fn open_session(path: &Path, machine: &Arc<Machine>, world: &Shared) -> Session {
    let clock = Arc::new(SimClock {
        machine: machine.clone(),
        wall_offset: AtomicI64::new(0),
    });
    let ledger = Arc::new(
        Ledger::open_with_clock(
            path,
            LedgerConfig {
                lease: Duration::from_millis(LEASE_MS),
                ..LedgerConfig::default()
            },
            clock.clone(),
        )
        .expect("open"),
    );
    let exec = Executor::new(
        ledger.clone(),
        ExecutorConfig {
            max_attempts: 3,
            read_only_max_attempts: 1,
            perform_timeout: Some(Duration::from_millis(TIMEOUT_MS)),
            // No jitter: the schedule must replay exactly.
            backoff_base: Duration::ZERO,
            backoff_max: Duration::ZERO,
            max_parallel: 2,
        },
    );
    for class in Class::ALL {
        exec.register(Arc::new(SimTool {
            class,
            world: world.clone(),
        }))
        .expect("register");
    }
    Session {
        ledger,
        exec,
        clock,
        tasks: Vec::new(),
        suspended: false,
        held: Arc::default(),
    }
}

fn kill(session: &mut Session) {
    for task in session.tasks.drain(..) {
        task.abort();
    }
    // A dead process reports nothing.
    session.held.lock().unwrap().clear();
    session.ledger.abandon();
}

/// Walks a caller-driven call from `step` the way an app's tool loop does,
/// except that a `Perform`'s report is held back: the tool runs, and the
/// attempt with its outcome goes to `held` for a later event to report.
/// Bounded by the executor's attempts (and 20 steps).
async fn drive_held(exec: Executor, world: Shared, held: Held, class: Class, first: CallerStep) {
    let tool = SimTool { class, world };
    let mut step = first;
    for _ in 0..20 {
        step = match step {
            CallerStep::Done(_) => return,
            CallerStep::Perform(a) => {
                let outcome = tool.perform(a.request.clone()).await;
                held.lock().unwrap().push((a, outcome));
                return;
            }
            CallerStep::Lookup(a) => {
                let found = tool.lookup(a.request.clone()).await;
                match exec.report_lookup(&a, found) {
                    Ok(next) => next,
                    Err(_) => return,
                }
            }
            CallerStep::Retry { attempt, after } => {
                tokio::time::sleep(after).await;
                match exec.retry(&attempt) {
                    Ok(next) => next,
                    Err(_) => return,
                }
            }
        };
    }
}

/// Reports the oldest attempt `session` holds back and walks on from the
/// answer (a resend is run and held again).
fn report_held(session: &mut Session, world: &Shared) {
    let Some((attempt, outcome)) = ({
        let mut held = session.held.lock().unwrap();
        (!held.is_empty()).then(|| held.remove(0))
    }) else {
        return;
    };
    let class = Class::of_tool(&attempt.request.tool_name);
    let exec = session.exec.clone();
    let (world, held) = (world.clone(), session.held.clone());
    session.tasks.push(tokio::spawn(async move {
        if let Ok(next) = exec.report(&attempt, outcome) {
            drive_held(exec, world, held, class, next).await;
        }
    }));
}

fn call_of(class: Class) -> ToolCall {
    let args = match class {
        Class::Batch => r#"{"items":[{"to":"a"},{"to":"b"},{"to":"c"},{"to":"d"},{"to":"e"}]}"#,
        _ => r#"{"amount":"12.50","to":"bob"}"#,
    };
    ToolCall::custom(format!("c_{}", class.tool()), class.tool(), args)
}

/// The app resolves an unknown outcome from the downstream's ground truth,
/// the way a user checks their bank: only once nothing of that call is on
/// the wire any more.
async fn resolve_from_truth(session: &Session, world: &Shared, op: &OperationId) {
    let Ok(records) = session.ledger.list(op) else {
        return;
    };
    for rec in records {
        if rec.status != ExecutionStatus::OutcomeUnknown {
            continue;
        }
        let class = Class::of_tool(&rec.tool_name);
        let keys: Vec<String> = if class == Class::Batch {
            (0..BATCH_ITEMS as u32)
                .map(|i| {
                    Ledger::batch_item_key(&rec.execution_id, i)
                        .as_str()
                        .to_owned()
                })
                .collect()
        } else {
            vec![rec.downstream_key.as_str().to_owned()]
        };
        let (quiet, found) = {
            let w = world.lock().unwrap();
            let quiet = keys
                .iter()
                .all(|k| w.pending.get(k).copied().unwrap_or(0) == 0);
            let found = w.applied.get(&keys[0]).map(|(r, _)| r.clone());
            (quiet, found)
        };
        if !quiet {
            continue;
        }
        let attempt = AttemptId::new(rec.execution_id.clone(), rec.attempt_count);
        let resolution = if class == Class::Batch {
            // Record what the items did, then let the batch go on (or end).
            let done: Vec<u32> = session
                .ledger
                .batch_items(&rec.execution_id)
                .map(|v| v.into_iter().map(|(i, _, _)| i).collect())
                .unwrap_or_default();
            for (i, key) in keys.iter().enumerate() {
                let i = i as u32;
                let result = world
                    .lock()
                    .unwrap()
                    .applied
                    .get(key)
                    .map(|(r, _)| r.clone());
                if let (false, Some(result)) = (done.contains(&i), result) {
                    let _ = session.ledger.record_batch_item(&attempt, i, &result, None);
                }
            }
            Resolution::NotFoundRetry
        } else {
            match found {
                Some(result_json) => Resolution::Found {
                    result_json,
                    external_id: Some(keys[0].clone()),
                },
                None => Resolution::NotFoundRetry,
            }
        };
        let _ = session.exec.resolve_unknown(&attempt, resolution).await;
    }
}

// ---------------------------------------------------------------------------
// One schedule
// ---------------------------------------------------------------------------

struct Summary {
    effects: u64,
    sends: u64,
    /// Reports the ledger's fence refused (kept as evidence).
    refused_reports: u64,
}

// Each arm is one kind of event with its own share of the draw; folding an
// arm's `if` into a guard would hand the draw to the next arm instead.
#[allow(clippy::collapsible_match)]
async fn schedule(seed: u64, path: &Path) -> Result<Summary, String> {
    let world: Shared = Arc::new(Mutex::new(World {
        rng: Some(Rng(seed ^ 0x5eed)),
        ..World::default()
    }));
    let machine = Arc::new(Machine {
        base: tokio::time::Instant::now(),
        boot: Mutex::new(("boot-0".into(), 0)),
    });
    let mut rng = Rng(seed);
    let n_sessions = 2 + rng.below(2) as usize;
    let mut sessions: Vec<Session> = (0..n_sessions)
        .map(|_| open_session(path, &machine, &world))
        .collect();
    let mut reboots = 0;
    let steps = 20 + rng.below(30);
    for _ in 0..steps {
        let s = rng.below(n_sessions as u64) as usize;
        let op = OperationId::new(OPS[rng.below(2) as usize]).unwrap();
        match rng.below(100) {
            // Run (or ask again for) a call.
            0..=44 => {
                let session = &mut sessions[s];
                if session.suspended {
                    continue;
                }
                let class = Class::ALL[rng.below(4) as usize];
                let exec = session.exec.clone();
                let world = world.clone();
                session.tasks.push(tokio::spawn(async move {
                    let out = exec.execute(&op, 0, call_of(class)).await;
                    if let Ok(CallOutcome::Completed { result_json, .. }) = &out {
                        if result_json.is_empty() {
                            world.lock().unwrap().violations.push("empty result".into());
                        }
                    }
                }));
            }
            45..=54 => {
                let session = &mut sessions[s];
                if !session.suspended {
                    let exec = session.exec.clone();
                    session.tasks.push(tokio::spawn(async move {
                        let _ = exec.recover().await;
                    }));
                }
            }
            55..=64 => {
                let session = &mut sessions[s];
                if session.suspended {
                    session.suspended = false;
                    let _ = session.ledger.resume();
                } else {
                    session.suspended = true;
                    let _ = session.ledger.suspend();
                    // Half the time the others cannot match its process (its
                    // id taken by another process, or a pid namespace they
                    // cannot see), and the lease alone decides:
                    // its calls are taken over while it lives, and its later
                    // reports meet the fence.
                    if rng.below(2) == 0 {
                        deadable(&world, session);
                        support::pretend_another_process(
                            path,
                            session.ledger.session_id().as_str(),
                        );
                    }
                }
            }
            65..=71 => {
                // A wall-clock step, either way, up to a day.
                let step = rng.below(2 * 86_400_000) as i64 - 86_400_000;
                sessions[s]
                    .clock
                    .wall_offset
                    .fetch_add(step, Ordering::SeqCst);
            }
            72..=76 => {
                // The process is killed; the app starts again.
                deadable(&world, &sessions[s]);
                kill(&mut sessions[s]);
                sessions[s] = open_session(path, &machine, &world);
            }
            77..=81 => {
                if !sessions[s].suspended && sessions[s].ledger.cancel_operation(&op).is_ok() {
                    let mut w = world.lock().unwrap();
                    w.seq += 1;
                    let at = w.seq;
                    w.cancelled.entry(op.as_str().to_owned()).or_insert(at);
                }
            }
            82..=86 => {
                if !sessions[s].suspended {
                    resolve_from_truth(&sessions[s], &world, &op).await;
                }
            }
            89..=93 => {
                // A caller-driven call (not the batch: independent batches
                // are not offered to callers), or a caller-driven round of
                // one call of each other class; reports are held back.
                let session = &mut sessions[s];
                if session.suspended {
                    continue;
                }
                let pick = rng.below(4) as usize;
                let exec = session.exec.clone();
                let (world, held) = (world.clone(), session.held.clone());
                session.tasks.push(tokio::spawn(async move {
                    if pick < 3 {
                        let class = Class::ALL[pick];
                        if let Ok(step) = exec.start(&op, 0, call_of(class)) {
                            drive_held(exec, world, held, class, step).await;
                        }
                        return;
                    }
                    // A caller-driven round of the three classes: one begin,
                    // the three walks run together inside this task (so a
                    // killed session's walks die with it, at once).
                    let calls = [Class::Key, Class::Lookup, Class::Neither]
                        .map(call_of)
                        .to_vec();
                    let Ok(steps) = exec.start_round(&op, 0, calls) else {
                        return;
                    };
                    let Ok([key, lookup, neither]) = <[CallerStep; 3]>::try_from(steps) else {
                        return;
                    };
                    tokio::join!(
                        drive_held(exec.clone(), world.clone(), held.clone(), Class::Key, key),
                        drive_held(
                            exec.clone(),
                            world.clone(),
                            held.clone(),
                            Class::Lookup,
                            lookup
                        ),
                        drive_held(exec, world, held, Class::Neither, neither),
                    );
                }));
            }
            94..=98 => {
                if !sessions[s].suspended {
                    report_held(&mut sessions[s], &world);
                }
            }
            87..=88 => {
                // The machine reboots: every process dies.
                reboots += 1;
                for session in sessions.iter_mut() {
                    deadable(&world, session);
                    kill(session);
                }
                machine.reboot(reboots);
                sessions = (0..n_sessions)
                    .map(|_| open_session(path, &machine, &world))
                    .collect();
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(rng.below(2_000))).await;
    }

    // Quiesce: every request on the wire lands or is lost, every task ends.
    tokio::time::sleep(Duration::from_millis(WINDOW_MS * 20)).await;
    for session in sessions.iter_mut() {
        for task in session.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(600), task).await;
        }
        if session.suspended {
            let _ = session.ledger.resume();
            session.suspended = false;
        }
        // The reports held back arrive now, late (bounded: each report
        // holds at most one new attempt, and attempts are bounded).
        for _ in 0..64 {
            if session.held.lock().unwrap().is_empty() {
                break;
            }
            report_held(session, &world);
            for task in session.tasks.drain(..) {
                let _ = tokio::time::timeout(Duration::from_secs(600), task).await;
            }
        }
    }
    // Settle: the app, on a fresh launch, recovers, asks the truth for what
    // stays unknown and asks again for every call, until nothing is open.
    // (The sessions that may rightly have been judged dead so far: the ones
    // killed here are, from here on, but only the settling session judges
    // after this point.)
    let deadable_before_settle = world.lock().unwrap().deadable.clone();
    for session in sessions.iter_mut() {
        kill(session);
    }
    let last = open_session(path, &machine, &world);
    for round in 0..30 {
        let _ = last.exec.recover().await;
        for op in OPS {
            let op = OperationId::new(op).unwrap();
            resolve_from_truth(&last, &world, &op).await;
            for class in Class::ALL {
                let _ = last.exec.execute(&op, 0, call_of(class)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(WINDOW_MS * 2)).await;
        let open = OPS.iter().any(|op| {
            last.ledger
                .list(&OperationId::new(*op).unwrap())
                .unwrap()
                .iter()
                .any(|r| {
                    matches!(
                        r.status,
                        ExecutionStatus::Executing | ExecutionStatus::OutcomeUnknown
                    )
                })
        });
        if !open {
            break;
        }
        if round == 29 {
            return Err("calls still open after 30 settle rounds".into());
        }
    }
    let judged = live_owners_judged_dead(
        path,
        &deadable_before_settle,
        last.ledger.session_id().as_str(),
    )?;
    let summary = check(&last.ledger, &world);
    match (summary, judged.is_empty()) {
        (Ok(summary), true) => Ok(summary),
        (Ok(_), false) => Err(judged.join("; ")),
        (Err(e), true) => Err(e),
        (Err(e), false) => Err(format!("{e}; {}", judged.join("; "))),
    }
}

/// A session that may rightly be judged dead from now on.
fn deadable(world: &Shared, session: &Session) {
    world
        .lock()
        .unwrap()
        .deadable
        .insert(session.ledger.session_id().as_str().to_owned());
}

/// Ownership: an attempt's owner is judged dead (its outcome marked unknown
/// for a reason of the owner's death) only if that owner was killed, or
/// suspended as a process the others cannot match, before (`deadable`), or by the settling session after every
/// other was killed; and a running attempt commits only through the session
/// that owns it. Read from each execution's transition log (the
/// `history` column: `at|transition|from|to|attempt|session[|reason]`): the
/// owner of attempt k is the session of the line that started it.
fn live_owners_judged_dead(
    path: &Path,
    deadable: &std::collections::BTreeSet<String>,
    settling: &str,
) -> Result<Vec<String>, String> {
    const DEATHS: [&str; 3] = [
        "owner session died while executing",
        "owner session suspended past its lease",
        "owner session ended with a reboot",
    ];
    let conn = rusqlite::Connection::open(path).map_err(|e| e.to_string())?;
    let mut stmt = conn
        .prepare("SELECT execution_id, CAST(history AS TEXT) FROM executions")
        .map_err(|e| e.to_string())?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(|e| e.to_string())?;
    let mut wrong = Vec::new();
    for row in rows {
        let (id, history) = row.map_err(|e| e.to_string())?;
        let mut owners: BTreeMap<String, String> = BTreeMap::new();
        for line in history.lines() {
            let fields: Vec<&str> = line.splitn(7, '|').collect();
            let [_, transition, _, to, attempt, session, rest @ ..] = fields.as_slice() else {
                continue;
            };
            if *to == "executing" {
                owners.insert((*attempt).to_owned(), (*session).to_owned());
            }
            let from = fields.get(2).copied().unwrap_or("");
            if *transition == "commit" && from == "executing" {
                // A running attempt commits only through its owner (the
                // fence): another session's report is kept as evidence.
                let owner = owners.get(*attempt).map_or("?", String::as_str);
                if owner != *session {
                    wrong.push(format!(
                        "{id}: attempt {attempt} of {owner} committed by {session}"
                    ));
                }
            }
            let reason = rest.first().copied().unwrap_or("");
            let death = DEATHS.iter().any(|d| reason.starts_with(d));
            if *transition == "mark_unknown" && death && *session != settling {
                let owner = owners.get(*attempt).map_or("?", String::as_str);
                if !deadable.contains(owner) {
                    wrong.push(format!(
                        "{id}: attempt {attempt} of live session {owner} judged dead ({reason}) by {session}"
                    ));
                }
            }
        }
    }
    Ok(wrong)
}

fn check(ledger: &Ledger, world: &Shared) -> Result<Summary, String> {
    let w = world.lock().unwrap();
    let mut problems = w.violations.clone();
    // At most one effect per logical call (per item).
    for (key, (_, times)) in &w.applied {
        if *times > 1 {
            problems.push(format!("{key}: {times} effects"));
        }
    }
    let mut effects = 0;
    let mut refused = 0;
    for op in OPS {
        let op = OperationId::new(op).unwrap();
        for rec in ledger.list(&op).map_err(|e| e.to_string())? {
            let id = &rec.execution_id;
            if Class::of_tool(&rec.tool_name) == Class::Batch {
                let items = ledger.batch_items(id).map_err(|e| e.to_string())?;
                for i in 0..BATCH_ITEMS as u32 {
                    let key = Ledger::batch_item_key(id, i);
                    let happened = w.applied.contains_key(key.as_str());
                    let recorded = items.iter().any(|(n, _, _)| *n == i);
                    effects += u64::from(happened);
                    if happened != recorded {
                        problems.push(format!(
                            "{id} item {i}: downstream {happened}, recorded {recorded} ({})",
                            rec.status
                        ));
                    }
                }
                if !items.is_empty() && !rec.status.is_committed() {
                    problems.push(format!("{id}: items committed, status {}", rec.status));
                }
                continue;
            }
            refused += ledger.evidence(id).map_err(|e| e.to_string())?.len() as u64;
            let happened = w.applied.get(rec.downstream_key.as_str());
            effects += u64::from(happened.is_some());
            match (rec.status.is_committed(), happened) {
                (true, Some((result, _))) => {
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
    }
    // Every effect belongs to a recorded call.
    let recorded = effects;
    let applied = w.applied.len() as u64;
    if recorded != applied {
        problems.push(format!(
            "{applied} effects downstream, {recorded} accounted for"
        ));
    }
    if !problems.is_empty() && std::env::var("TOOLLEDGER_SIM_SEED").is_ok() {
        // Replaying one seed: show what the ledger recorded.
        for op in OPS {
            for rec in ledger
                .list(&OperationId::new(op).unwrap())
                .unwrap_or_default()
            {
                println!(
                    "{} {} attempt {}",
                    rec.execution_id, rec.status, rec.attempt_count
                );
                for t in ledger.transitions(&rec.execution_id).unwrap_or_default() {
                    println!(
                        "    {}: {:?} -> {} @{} {}",
                        t.transition,
                        t.from,
                        t.to,
                        t.attempt,
                        t.reason.unwrap_or_default()
                    );
                }
            }
        }
        println!("world: {:?} cancelled {:?}", w.applied, w.cancelled);
    }
    if problems.is_empty() {
        Ok(Summary {
            effects,
            sends: w.sends,
            refused_reports: refused,
        })
    } else {
        Err(problems.join("; "))
    }
}

fn run_one(seed: u64) -> Result<Summary, String> {
    let dir = tempfile::Builder::new()
        .prefix("toolledger-sim")
        .tempdir_in(fast_dir())
        .map_err(|e| e.to_string())?;
    let path = dir.path().join("l.db");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(schedule(seed, &path))
}

/// tmpfs when there is one (no fsync cost), else the system temp dir.
fn fast_dir() -> std::path::PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

#[test]
fn live_owners_never_produce_a_second_effect_over_many_seeded_schedules() {
    if let Ok(seed) = std::env::var("TOOLLEDGER_SIM_SEED") {
        let seed: u64 = seed.parse().expect("TOOLLEDGER_SIM_SEED is a number");
        match run_one(seed) {
            Ok(s) => println!(
                "seed={seed} effects={} sends={} refused_reports={} ok",
                s.effects, s.sends, s.refused_reports
            ),
            Err(e) => panic!("seed={seed}: {e}"),
        }
        return;
    }
    let schedules: u64 = std::env::var("TOOLLEDGER_SIM_SCHEDULES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    let base: u64 = std::env::var("TOOLLEDGER_SIM_BASE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_261_130);
    let (mut effects, mut sends, mut refused) = (0, 0, 0);
    for seed in base..base + schedules {
        match run_one(seed) {
            Ok(s) => {
                effects += s.effects;
                sends += s.sends;
                refused += s.refused_reports;
            }
            Err(e) => panic!(
                "seed={seed}: {e}\nreplay: TOOLLEDGER_SIM_SEED={seed} cargo test --test simulation -- --nocapture"
            ),
        }
    }
    println!(
        "schedules={schedules} effects={effects} sends={sends} refused_reports={refused} \
         duplicates=0 violations=0"
    );
    // The schedules reach the fence: stale reports (a session's report
    // after its call was taken over) were refused, so the invariants above
    // held with the fence deciding.
    if schedules >= 200 {
        assert!(refused > 0, "no schedule produced a stale report");
    }
    let _ = support::op;
}
