//! The live-owner mode (`torture --live`): nobody dies, everybody is slow.
//!
//! Each run starts two workers at once on one ledger file and one operation:
//! two live sessions of one app racing the same workload. While they run,
//! the supervisor stops one of them (SIGSTOP) for up to 200 ms and
//! continues it (SIGCONT), again and again; each worker's wall clock is off
//! by up to a day either way; each worker suspends and resumes its own
//! ledger all along (every 10–80 ms, for up to 40 ms). The service drops a
//! request it has not received in full within
//! [`workload::LIVE_REQUEST_DEADLINE`] of its connection, so a stopped
//! worker's request lands within the tools' declared
//! [`workload::LIVE_LANDING_WINDOW`] or never. After both workers finished,
//! the same checks as the kill runs hold: one effect per logical call, one
//! result per call for the model, no downgrade.

use std::fs::{self, File, OpenOptions};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::report::{End, RunReport, Totals};
use super::rng::Rng;
use super::service::Service;
use super::supervisor::Options;
use super::verify::{self, Findings};
use super::workload::{self, Mode};

/// Longest a live run may take (a bound against a hang; both torture tests
/// took 36 s together on a quiet machine, a live run passed 180 s at load 10).
const RUN_MAX: Duration = Duration::from_secs(420);

/// Runs live-owner runs until `opts.kills` stops were made.
pub fn run(opts: &Options) -> Result<Totals, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    fs::create_dir_all(&opts.workdir).map_err(|e| format!("workdir: {e}"))?;
    let mut totals = Totals::default();
    let mut r = 0u64;
    while totals.stops < opts.kills {
        let mode = opts.modes[(r % opts.modes.len() as u64) as usize];
        let dir = opts.workdir.join(format!("live_{r:05}_{}", mode.name()));
        let mut rng = Rng::new(opts.seed ^ r.wrapping_mul(0xa076_1d64_78bd_642f));
        let (report, stops) = run_one(&exe, &dir, mode, &format!("op_live_{r}"), &mut rng)?;
        totals.stops += stops;
        let passed = report.passed();
        if opts.verbose || !passed {
            eprintln!(
                "live run {r} ({}): stops={stops} {}{}",
                mode.name(),
                if passed { "ok" } else { "FAILED: " },
                report.problems.join("; ")
            );
        }
        totals.add_run(&report);
        if !passed {
            eprintln!("  files kept in {}", dir.display());
            if !opts.keep_going {
                break;
            }
        } else if !opts.keep {
            let _ = fs::remove_dir_all(&dir);
        }
        r += 1;
    }
    Ok(totals)
}

fn signal(child: &Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: a plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// One live run: two workers, stopped and continued until both finish.
fn run_one(
    exe: &Path,
    dir: &Path,
    mode: Mode,
    op: &str,
    rng: &mut Rng,
) -> Result<(RunReport, u64), String> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let service = Service::start_with(mode, Some(workload::LIVE_REQUEST_DEADLINE))
        .map_err(|e| format!("service: {e}"))?;
    let db = dir.join("ledger.db");
    let transcript = dir.join("transcript.jsonl");
    let mut children = Vec::new();
    for w in 0..2 {
        let out = File::create(dir.join(format!("worker{w}.out"))).map_err(|e| e.to_string())?;
        let err = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("worker{w}.err")))
            .map_err(|e| e.to_string())?;
        let offset = i64::try_from(rng.range(0, 2 * 86_400_000)).unwrap_or(0) - 86_400_000;
        let child = Command::new(exe)
            .arg("worker")
            .arg("--db")
            .arg(&db)
            .arg("--service")
            .arg(service.addr().to_string())
            .arg("--mode")
            .arg(mode.name())
            .arg("--op")
            .arg(op)
            .arg("--transcript")
            .arg(&transcript)
            .arg("--live-offset-ms")
            .arg(offset.to_string())
            .arg("--live-seed")
            .arg(rng.next_u64().to_string())
            .env_remove("TOOLLEDGER_CRASH_AT")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn worker: {e}"))?;
        children.push(Some(child));
    }
    let mut statuses = vec![None, None];
    let mut stops = 0;
    let started = Instant::now();
    let mut problems = Vec::new();
    loop {
        for (slot, status) in children.iter_mut().zip(statuses.iter_mut()) {
            if let Some(child) = slot {
                if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
                    *status = Some(s);
                    *slot = None;
                }
            }
        }
        if children.iter().all(Option::is_none) {
            break;
        }
        if started.elapsed() > RUN_MAX {
            for child in children.iter_mut().flatten() {
                let _ = child.kill();
                let _ = child.wait();
            }
            problems.push(format!("the workers did not finish in {RUN_MAX:?}"));
            break;
        }
        std::thread::sleep(Duration::from_millis(rng.range(5, 40)));
        let running: Vec<usize> = (0..2).filter(|i| children[*i].is_some()).collect();
        let pick = running[(rng.next_u64() % running.len() as u64) as usize];
        if let Some(child) = &children[pick] {
            signal(child, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(rng.range(5, 200)));
            signal(child, libc::SIGCONT);
            stops += 1;
        }
    }
    let mut lives = Vec::new();
    for (w, status) in statuses.into_iter().enumerate() {
        let last = |name: &str| {
            fs::read_to_string(dir.join(format!("worker{w}.{name}")))
                .unwrap_or_default()
                .lines()
                .last()
                .unwrap_or("")
                .to_owned()
        };
        match status {
            Some(s) if s.success() => lives.push(End::Finished(last("out"))),
            Some(s) => {
                let e = format!("worker {w} exited with {s}; stderr: {}", last("err"));
                problems.push(e.clone());
                lives.push(End::Error(e));
            }
            None => lives.push(End::Error(format!("worker {w} did not finish"))),
        }
    }
    let effects = service.effects();
    drop(service);
    let mut report = RunReport {
        lives,
        first_life_ms: started.elapsed().as_secs_f64() * 1000.0,
        findings: Findings::default(),
        problems,
    };
    match verify::check(&db, &transcript, op, &effects, &mut report.problems) {
        Ok(f) => report.findings = f,
        Err(e) => report.problems.push(format!("verification: {e}")),
    }
    Ok((report, stops))
}
