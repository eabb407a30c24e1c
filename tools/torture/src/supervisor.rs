//! The supervisor: runs the service, spawns workers, kills them, restarts
//! them until each run's workload completes, and checks the invariants.
//!
//! A *run* is one fresh ledger file, one fresh service (in one [`Mode`]) and
//! one operation. Its *lives* are worker processes: each is planned, from the
//! run's seeded RNG, to die at an armed crash point (`TOOLLEDGER_CRASH_AT=
//! <point>:<n>`: abort on the n-th hit), to be SIGKILLed after a random
//! fraction of the calibrated workload time, or (once the run's kill budget
//! is spent) to live and finish. Between lives the supervisor waits for the
//! dead worker's requests to settle at the service ([`Service::quiesce`]).
//! Runs go on, cycling through the modes, until the wanted number of kills
//! is reached; `--jobs` runs execute side by side.
//!
//! The schedule — which point, which n, which fraction — is a function of
//! `--seed` and the run number; where a SIGKILL lands inside the worker is
//! up to the OS scheduler, so only the schedule is reproducible.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use toolledger::crashpoint::CrashPoint;

use super::report::{End, RunReport, Totals};
use super::rng::Rng;
use super::service::Service;
use super::verify::{self, Findings};
use super::workload::Mode;

/// Longest a worker that is meant to finish may take.
const LIFE_MAX: Duration = Duration::from_secs(120);
/// Most lives one run may have (kills plus lives that did not reach their
/// crash point), so that every loop ends.
const LIVES_MAX: u32 = 64;

/// The supervisor's options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Stop starting runs once this many workers were killed.
    pub kills: u64,
    /// Seed of the schedule.
    pub seed: u64,
    /// Runs side by side.
    pub jobs: usize,
    /// The modes to cycle through.
    pub modes: Vec<Mode>,
    /// Most kills in one run (each run draws 1..=this).
    pub max_kills_per_run: u32,
    /// Where the runs' files go.
    pub workdir: PathBuf,
    /// Keep the files of passing runs too.
    pub keep: bool,
    /// One line per run on stderr.
    pub verbose: bool,
    /// Go on after a failing run.
    pub keep_going: bool,
    /// Live-owner runs instead of kill runs (see `live.rs`).
    pub live: bool,
}

/// How one life is meant to end.
#[derive(Debug, Clone, Copy)]
enum Plan {
    Crash(CrashPoint, u64),
    /// SIGKILL after this fraction of the calibrated workload time.
    Kill(f64),
    Finish,
}

/// How often a full life passes each point (bounds the drawn `n`).
fn max_hits(point: CrashPoint) -> u64 {
    match point {
        CrashPoint::AfterPrepared => 1,
        CrashPoint::AfterLocalCommit => 5,
        CrashPoint::AfterModelResult | CrashPoint::AfterBatchItem => 6,
        _ => 10,
    }
}

struct Shared {
    opts: Options,
    exe: PathBuf,
    /// Calibrated time of one whole fresh workload, ms, per mode.
    life_ms: Vec<(Mode, f64)>,
    kills: AtomicU64,
    next_run: AtomicU64,
    stop: AtomicBool,
    totals: Mutex<Totals>,
}

/// Runs the whole torture: calibration, then runs until enough kills.
pub fn run(opts: Options) -> Result<Totals, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    fs::create_dir_all(&opts.workdir).map_err(|e| format!("workdir: {e}"))?;
    let mut totals = Totals {
        per_point: CrashPoint::ALL.iter().map(|p| (*p, 0)).collect(),
        ..Totals::default()
    };
    // Calibration: one clean run per mode (also a check that a run with no
    // kill at all passes), timing a whole fresh workload.
    let mut life_ms = Vec::new();
    for (i, mode) in opts.modes.iter().enumerate() {
        let dir = opts.workdir.join(format!("calibrate_{}", mode.name()));
        let mut rng = Rng::new(opts.seed);
        let report = run_one(&exe, &dir, *mode, &format!("op_cal_{i}"), &mut rng, 0, None)?;
        totals.add_run(&report);
        if !report.passed() {
            return Err(format!(
                "calibration run ({}) failed: {}",
                mode.name(),
                report.problems.join("; ")
            ));
        }
        let ms = report.first_life_ms.max(5.0);
        life_ms.push((*mode, ms));
        if !opts.keep {
            let _ = fs::remove_dir_all(&dir);
        }
        if opts.verbose {
            eprintln!("calibrated {}: {ms:.0} ms per fresh workload", mode.name());
        }
    }
    let shared = Arc::new(Shared {
        exe,
        life_ms,
        kills: AtomicU64::new(0),
        next_run: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        totals: Mutex::new(totals),
        opts,
    });
    let threads: Vec<_> = (0..shared.opts.jobs.max(1))
        .map(|_| {
            let shared = shared.clone();
            std::thread::spawn(move || runs_loop(&shared))
        })
        .collect();
    let mut errors = Vec::new();
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("a supervisor thread panicked".into()),
        }
    }
    let totals = std::mem::take(&mut *shared.totals.lock().map_err(|_| "totals lock")?);
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    Ok(totals)
}

fn runs_loop(shared: &Shared) -> Result<(), String> {
    let opts = &shared.opts;
    while shared.kills.load(Ordering::SeqCst) < opts.kills && !shared.stop.load(Ordering::SeqCst) {
        let r = shared.next_run.fetch_add(1, Ordering::SeqCst);
        let mode = opts.modes[(r % opts.modes.len() as u64) as usize];
        let life_ms = shared
            .life_ms
            .iter()
            .find(|(m, _)| *m == mode)
            .map_or(50.0, |(_, ms)| *ms);
        let dir = opts.workdir.join(format!("run_{r:05}_{}", mode.name()));
        let mut rng = Rng::new(opts.seed ^ r.wrapping_mul(0xa076_1d64_78bd_642f));
        let budget = rng.range(1, u64::from(opts.max_kills_per_run.max(1)));
        let first = CrashPoint::ALL[(r % CrashPoint::ALL.len() as u64) as usize];
        let report = run_one(
            &shared.exe,
            &dir,
            mode,
            &format!("op_{r}"),
            &mut rng,
            budget,
            Some((first, life_ms)),
        )?;
        shared.kills.fetch_add(report.kills(), Ordering::SeqCst);
        let passed = report.passed();
        if opts.verbose || !passed {
            eprintln!(
                "run {r} ({}): lives={} kills={} {}{}",
                mode.name(),
                report.lives.len(),
                report.kills(),
                if passed { "ok" } else { "FAILED: " },
                report.problems.join("; ")
            );
        }
        if !passed {
            eprintln!("  files kept in {}", dir.display());
            if !opts.keep_going {
                shared.stop.store(true, Ordering::SeqCst);
            }
        } else if !opts.keep {
            let _ = fs::remove_dir_all(&dir);
        }
        shared
            .totals
            .lock()
            .map_err(|_| "totals lock")?
            .add_run(&report);
    }
    Ok(())
}

/// One run: lives until the workload completes, then the checks.
/// `budget` kills at most; `first` is the crash point of the first life and
/// the calibrated workload time (ms) that SIGKILL delays are drawn against
/// (`None`: no kills at all, a calibration run).
fn run_one(
    exe: &Path,
    dir: &Path,
    mode: Mode,
    op: &str,
    rng: &mut Rng,
    budget: u64,
    first: Option<(CrashPoint, f64)>,
) -> Result<RunReport, String> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let service = Service::start(mode).map_err(|e| format!("service: {e}"))?;
    let db = dir.join("ledger.db");
    let transcript = dir.join("transcript.jsonl");
    let mut schedule = File::create(dir.join("schedule.log")).map_err(|e| e.to_string())?;
    let mut report = RunReport {
        lives: Vec::new(),
        first_life_ms: 0.0,
        findings: Findings::default(),
        problems: Vec::new(),
    };
    let mut kills = 0;
    let mut finished = false;
    for life in 0..LIVES_MAX {
        let plan = match first {
            Some((point, _)) if life == 0 && budget > 0 => {
                Plan::Crash(point, rng.range(1, max_hits(point)))
            }
            Some(_) if kills < budget => {
                if rng.next_u64().is_multiple_of(2) {
                    let point =
                        CrashPoint::ALL[rng.range(0, CrashPoint::ALL.len() as u64 - 1) as usize];
                    Plan::Crash(point, rng.range(1, max_hits(point)))
                } else {
                    Plan::Kill(rng.unit())
                }
            }
            _ => Plan::Finish,
        };
        let life_ms = first.map_or(0.0, |(_, ms)| ms);
        let started = Instant::now();
        let end = live(
            exe,
            dir,
            &service,
            mode,
            op,
            &db,
            &transcript,
            plan,
            life_ms,
        )?;
        let took = started.elapsed().as_secs_f64() * 1000.0;
        if life == 0 {
            report.first_life_ms = took;
        }
        let _ = writeln!(
            schedule,
            "life {life}: plan {plan:?} → {end:?} in {took:.1} ms"
        );
        if !service.quiesce() {
            report
                .problems
                .push("the service did not quiesce after a life".into());
        }
        match &end {
            End::Finished(_) => finished = true,
            End::Aborted(_) | End::Killed => kills += 1,
            End::Error(e) => report.problems.push(format!("life {life}: {e}")),
        }
        let stop = finished || matches!(end, End::Error(_));
        report.lives.push(end);
        if stop {
            break;
        }
    }
    if !finished && report.problems.is_empty() {
        report.problems.push(format!(
            "the workload did not complete in {LIVES_MAX} lives"
        ));
    }
    let effects = service.effects();
    drop(service);
    match verify::check(&db, &transcript, op, &effects, &mut report.problems) {
        Ok(f) => report.findings = f,
        Err(e) => report.problems.push(format!("verification: {e}")),
    }
    let _ = writeln!(schedule, "findings: {:?}", report.findings);
    for p in &report.problems {
        let _ = writeln!(schedule, "problem: {p}");
    }
    Ok(report)
}

/// Starts one worker under `plan` and waits for its end.
#[allow(clippy::too_many_arguments)]
fn live(
    exe: &Path,
    dir: &Path,
    service: &Service,
    mode: Mode,
    op: &str,
    db: &Path,
    transcript: &Path,
    plan: Plan,
    life_ms: f64,
) -> Result<End, String> {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("worker.out"))
        .map_err(|e| e.to_string())?;
    let err = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("worker.err"))
        .map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("worker")
        .arg("--db")
        .arg(db)
        .arg("--service")
        .arg(service.addr().to_string())
        .arg("--mode")
        .arg(mode.name())
        .arg("--op")
        .arg(op)
        .arg("--transcript")
        .arg(transcript)
        .env_remove("TOOLLEDGER_CRASH_AT")
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(err);
    if let Plan::Crash(point, n) = plan {
        cmd.env("TOOLLEDGER_CRASH_AT", format!("{}:{n}", point.name()));
    }
    let mut child = cmd.spawn().map_err(|e| format!("spawn worker: {e}"))?;
    let status = match plan {
        Plan::Kill(fraction) => {
            // Within the calibrated time of a whole fresh workload (later
            // lives replay most of it and are shorter).
            std::thread::sleep(Duration::from_secs_f64(fraction * life_ms / 1000.0));
            // SIGKILL; harmless if it already exited (not yet reaped).
            let _ = child.kill();
            child.wait().map_err(|e| e.to_string())?
        }
        Plan::Crash(..) | Plan::Finish => {
            let deadline = Instant::now() + LIFE_MAX;
            loop {
                if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                    break status;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Ok(End::Error(format!("worker hung for {LIFE_MAX:?}")));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    Ok(match (status.code(), status.signal(), plan) {
        (Some(0), _, _) => End::Finished(last_line(&dir.join("worker.out"))),
        (_, Some(6), Plan::Crash(point, _)) => End::Aborted(point),
        (_, Some(9), Plan::Kill(_)) => End::Killed,
        _ => End::Error(format!(
            "worker exited with {status}; stderr: {}",
            last_line(&dir.join("worker.err"))
        )),
    })
}

fn last_line(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .last()
        .unwrap_or("")
        .to_owned()
}
