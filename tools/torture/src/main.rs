//! `torture`: the crash-boundary torture harness (needs `--features crash-points`).
//!
//! ```text
//! torture [--kills N] [--seed S] [--jobs J] [--modes keys,lookup,neither]
//!         [--max-kills-per-run K] [--workdir DIR] [--keep] [--keep-going] [--verbose]
//!         [--live]
//! torture worker --db P --service ADDR --mode M --op OP --transcript P   (internal)
//! ```
//!
//! The supervisor (default command) runs a loopback downstream service in
//! its own process, spawns worker processes that run a multi-round,
//! multi-tool workload through the `Executor`, kills them (armed crash points
//! or SIGKILL at a random moment), restarts them until the workload completes,
//! and checks after every run that each logical effect happened exactly once
//! (or is reported `outcome_unknown`), that the model always got the same
//! result for a call, and that no committed record was downgraded. It ends
//! with one machine-readable line:
//!
//! ```text
//! kills=<n> logical_calls=<n> duplicates=<n> unknown_unresolved=<n> lost_records=<n>
//! ```
//!
//! With `--live` nobody is killed: two live workers race each run while the
//! supervisor stops and continues them (SIGSTOP/SIGCONT), their wall clocks
//! are off and they suspend and resume their ledgers all along
//! (`live.rs`); `--kills N` then counts stops. The summary
//! line is the same.
//!
//! Exit codes: 0 every invariant held; 1 a violation or a worker error
//! (details on stderr, files kept in the workdir); 2 bad arguments.
//! See `supervisor.rs` for the schedule and RELIABILITY.md.

mod live;
mod report;
mod rng;
mod service;
mod supervisor;
mod verify;
mod worker;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use supervisor::Options;
use worker::WorkerArgs;
use workload::Mode;

const USAGE: &str =
    "usage: torture [--kills N] [--seed S] [--jobs J] [--modes keys,lookup,neither] \
[--max-kills-per-run K] [--workdir DIR] [--keep] [--keep-going] [--verbose] [--live]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        return match parse_worker(&args[1..]).and_then(|w| worker::run(&w)) {
            Ok(summary) => {
                println!("worker done: {summary}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("worker error: {e}");
                ExitCode::from(2)
            }
        };
    }
    let opts = match parse_supervisor(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let workdir = opts.workdir.clone();
    let seed = opts.seed;
    let started = std::time::Instant::now();
    let live = opts.live;
    let result = if live {
        live::run(&opts)
    } else {
        supervisor::run(opts)
    };
    match result {
        Ok(t) => {
            let f = &t.findings;
            let points: Vec<String> = t
                .per_point
                .iter()
                .map(|(p, n)| format!("{}={n}", p.name()))
                .collect();
            println!(
                "seed={seed} runs={} lives={} crash_point_kills={} sigkills={} failed_runs={} secs={:.1}",
                t.runs,
                t.lives,
                t.crash_point_kills,
                t.sigkills,
                t.failed_runs,
                started.elapsed().as_secs_f64()
            );
            if live {
                println!(
                    "live: stops={} suspends={} in_flight_waits={}",
                    t.stops, t.suspends, t.in_flight_waits
                );
            } else {
                println!("crash_points: {}", points.join(" "));
            }
            println!(
                "app_resolved_unknowns={} replays={} duplicate_webhooks_ignored={} transcript_mismatches={} undelivered={} downgrades={}",
                t.app_resolved_unknowns,
                t.replays,
                t.duplicate_webhooks_ignored,
                f.transcript_mismatches,
                f.undelivered,
                f.downgrades
            );
            println!(
                "kills={} logical_calls={} duplicates={} unknown_unresolved={} lost_records={}",
                t.kills(),
                f.logical_calls,
                f.duplicates,
                f.unknown_unresolved,
                f.lost_records
            );
            if t.failed_runs == 0 && f.ok() {
                if workdir.starts_with(std::env::temp_dir()) {
                    let _ = std::fs::remove_dir(&workdir);
                }
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("torture: {e}");
            ExitCode::FAILURE
        }
    }
}

fn value<'a>(args: &'a [String], i: &mut usize, flag: &str) -> Result<&'a str, String> {
    *i += 1;
    args.get(*i)
        .map(String::as_str)
        .ok_or_else(|| format!("{flag} needs a value"))
}

fn number<T: std::str::FromStr>(s: &str, flag: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("{flag}: not a number: {s}"))
}

fn parse_supervisor(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        kills: 300,
        seed: 1,
        jobs: 2,
        modes: Mode::ALL.to_vec(),
        max_kills_per_run: 8,
        workdir: std::env::temp_dir().join(format!("toolledger-torture-{}", std::process::id())),
        keep: false,
        verbose: false,
        keep_going: false,
        live: false,
    };
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        match flag {
            "--kills" => opts.kills = number(value(args, &mut i, flag)?, flag)?,
            "--seed" => opts.seed = number(value(args, &mut i, flag)?, flag)?,
            "--jobs" => opts.jobs = number(value(args, &mut i, flag)?, flag)?,
            "--max-kills-per-run" => {
                opts.max_kills_per_run = number(value(args, &mut i, flag)?, flag)?
            }
            "--workdir" => opts.workdir = PathBuf::from(value(args, &mut i, flag)?),
            "--modes" => {
                opts.modes = value(args, &mut i, flag)?
                    .split(',')
                    .map(|m| Mode::parse(m).ok_or_else(|| format!("unknown mode {m}")))
                    .collect::<Result<_, _>>()?;
                if opts.modes.is_empty() {
                    return Err("--modes needs at least one mode".into());
                }
            }
            "--keep" => opts.keep = true,
            "--keep-going" => opts.keep_going = true,
            "--live" => opts.live = true,
            "--verbose" => opts.verbose = true,
            "-h" | "--help" => return Err("help".into()),
            other => return Err(format!("unknown argument {other}")),
        }
        i += 1;
    }
    Ok(opts)
}

fn parse_worker(args: &[String]) -> Result<WorkerArgs, String> {
    let (mut db, mut service, mut mode, mut op, mut transcript) = (None, None, None, None, None);
    let (mut live_offset, mut live_seed): (Option<i64>, Option<u64>) = (None, None);
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        let v = value(args, &mut i, flag)?;
        match flag {
            "--db" => db = Some(PathBuf::from(v)),
            "--service" => service = Some(v.parse().map_err(|_| format!("bad address {v}"))?),
            "--mode" => mode = Some(Mode::parse(v).ok_or_else(|| format!("unknown mode {v}"))?),
            "--op" => op = Some(v.to_owned()),
            "--transcript" => transcript = Some(PathBuf::from(v)),
            "--live-offset-ms" => live_offset = Some(number(v, flag)?),
            "--live-seed" => live_seed = Some(number(v, flag)?),
            other => return Err(format!("unknown worker argument {other}")),
        }
        i += 1;
    }
    Ok(WorkerArgs {
        live: live_seed.map(|seed| worker::Live {
            wall_offset_ms: live_offset.unwrap_or(0),
            seed,
        }),
        db: db.ok_or("--db is required")?,
        service: service.ok_or("--service is required")?,
        mode: mode.ok_or("--mode is required")?,
        op: op.ok_or("--op is required")?,
        transcript: transcript.ok_or("--transcript is required")?,
    })
}
