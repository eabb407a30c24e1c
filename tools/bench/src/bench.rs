//! `toolledger-bench`: is the ledger fast enough for every tool call?
//!
//! One run measures, each on its own file in one fresh directory:
//!
//! - the side-effecting happy path side by side with the raw-SQLite floor
//!   (the same two durable commits with bare rusqlite), through the Ledger
//!   API and through the Executor, interleaved in batches so machine noise
//!   hits all of them, and the ratio to the floor;
//! - fsync/fdatasync calls per call, counted by `strace` in child runs of
//!   `toolledger-bench --only … --markers` (a `getppid` marker separates the
//!   calls, so every call's syncs are counted on their own);
//! - replay latency of a committed call, a round of 8 begins, the read-only
//!   overhead of the Executor, `recover()` on a database of a million
//!   historical executions with 100 pending, database bytes per execution
//!   and peak RSS.
//!
//! The output is a table for people that ends with one `name=value` line per
//! figure for scripts (`scripts/bench.sh` runs it in release mode).

use crate::bench_figures::{self as fig, HappyPath};
use crate::bench_readonly::{read_only, Driver};
use crate::bench_support::{
    callgrind_instructions, delayed_sync_means, fresh_dir, peak_rss_kib, strace_syncs, Samples,
    SyncCounts,
};
use crate::{BenchArgs, BenchOnly};
use crate::{CliError, CliResult};

/// The targets of the issue, shown next to the figures.
const TARGET_RATIO: f64 = 1.15;
const TARGET_REPLAY_US: f64 = 20.0;
const TARGET_READONLY_US: f64 = 10.0;
const TARGET_RECOVER_MS: f64 = 5.0;
const TARGET_BYTES: f64 = 1024.0;
const TARGET_INSTRUCTIONS: f64 = 100_000.0;

/// The extra fsync latency of the emulated phone-like storage, µs.
const DELAY_US: u64 = 2000;

/// Runs `bench`.
///
/// # Errors
/// Ledger, SQLite and I/O errors; a figure that came out inconsistent (a
/// fresh call not answered `Execute`, a replay that was not one).
pub fn run(args: &BenchArgs) -> CliResult<()> {
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base)?;
    if let Some(only) = args.only {
        // Child mode under strace: the directory is the parent's scratch.
        return match only {
            BenchOnly::Round8 => fig::round8(&base, args.calls(), args.markers).map(|_| ()),
            other => fig::only_calls(&base, other, args.class, args.calls(), args.markers),
        };
    }
    let dir = fresh_dir(&base)?;
    let outcome = run_all(args, &dir);
    if !args.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}

struct Figures {
    happy: HappyPath,
    replay: (Samples, u64),
    round8: (Samples, Vec<u64>),
    ro_task: (Samples, Samples, u64),
    ro_block: (Samples, Samples, u64),
    ro_current: (Samples, Samples, u64),
    bytes: (f64, Vec<(String, f64)>),
    frames: fig::WalFrames,
    recover: fig::RecoverFigure,
    paced: fig::PacedFigure,
    syncs: Option<Syncs>,
    delayed: Option<(f64, f64)>,
    instructions: Option<Instructions>,
}

/// fsync counts per call (strace), per path.
struct Syncs {
    floor: SyncCounts,
    floor1: SyncCounts,
    key: SyncCounts,
    lookup: SyncCounts,
    neither: SyncCounts,
    round8: SyncCounts,
}

/// Instructions per call (callgrind), per path.
struct Instructions {
    key: f64,
    neither: f64,
    executor: f64,
    floor: f64,
    floor1: f64,
}

fn progress(what: &str) {
    eprintln!("bench: {what}");
}

fn run_all(args: &BenchArgs, dir: &std::path::Path) -> CliResult<()> {
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    progress("happy path vs floor");
    let (happy, ledger) = fig::happy_path(dir, &multi, args.calls(), args.batches)?;
    progress("replay");
    let happy_db = dir.join("happy.db");
    let replay = fig::replay(&ledger, &happy_db, args.samples)?;
    progress("round of 8");
    let round8 = fig::round8(dir, args.rounds, false)?;
    progress("read-only overhead");
    let ro_task = read_only(&ledger, &happy_db, &multi, Driver::InTask, args.samples)?;
    let ro_block = read_only(&ledger, &happy_db, &multi, Driver::BlockOn, args.samples)?;
    let ro_current = read_only(&ledger, &happy_db, &current, Driver::InTask, args.samples)?;
    drop(ledger);
    progress("bytes per execution");
    let bytes = fig::bytes_per_execution(dir, (args.calls() * args.batches * 2).clamp(100, 2000))?;
    progress("WAL frames per call");
    let frames = fig::wal_frames_per_call(dir, 500)?;
    let (syncs, delayed) = if args.no_strace {
        (None, None)
    } else {
        progress("fsync counts under strace");
        let syncs = count_syncs(dir, args.rounds)?;
        progress("happy path vs floor with a 2 ms fsync (strace delay injection)");
        let delayed = match syncs {
            Some(_) => delayed_sync_means(dir, DELAY_US, 50, 4)?,
            None => None,
        };
        (syncs, delayed)
    };
    let instructions = if args.no_callgrind {
        None
    } else {
        progress("instructions per call under callgrind");
        count_instructions(dir)?
    };
    progress("recover() on a large history");
    let recover = fig::recover(dir, args.recover_rows)?;
    progress("paced calls, the idle checkpoint on and off");
    let paced = fig::paced(dir, args.paced_bursts, args.paced_calls)?;
    let figures = Figures {
        happy,
        replay,
        round8,
        ro_task,
        ro_block,
        ro_current,
        bytes,
        frames,
        recover,
        paced,
        syncs,
        delayed,
        instructions,
    };
    print_report(args, dir, &figures);
    Ok(())
}

fn count_syncs(dir: &std::path::Path, rounds: u64) -> CliResult<Option<Syncs>> {
    let Some(key) = strace_syncs("happy-path", "key", 500, dir)? else {
        progress("strace not found: fsync counts skipped (scripts/bench.sh installs it)");
        return Ok(None);
    };
    let count = |only: &str, class: &str, n: u64| -> CliResult<SyncCounts> {
        Ok(strace_syncs(only, class, n, dir)?.unwrap_or_default())
    };
    let syncs = Syncs {
        key,
        lookup: count("happy-path", "lookup", 500)?,
        neither: count("happy-path", "neither", 500)?,
        floor: count("floor", "key", 500)?,
        floor1: count("floor1", "key", 500)?,
        round8: count("round8", "key", rounds)?,
    };
    if syncs.key.calls == 0 {
        return Err(CliError::Other(
            "strace recorded no markers (is ptrace allowed here?)".into(),
        ));
    }
    Ok(Some(syncs))
}

fn count_instructions(dir: &std::path::Path) -> CliResult<Option<Instructions>> {
    let Some(key) = callgrind_instructions("happy-path", "key", dir)? else {
        progress("valgrind not found: instructions per call skipped (apt-get install valgrind)");
        return Ok(None);
    };
    let count = |only: &str, class: &str| -> CliResult<f64> {
        Ok(callgrind_instructions(only, class, dir)?.unwrap_or(0.0))
    };
    Ok(Some(Instructions {
        key,
        neither: count("happy-path", "neither")?,
        executor: count("executor", "key")?,
        floor: count("floor", "key")?,
        floor1: count("floor1", "key")?,
    }))
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

fn print_report(args: &BenchArgs, dir: &std::path::Path, f: &Figures) {
    let n = args.calls() * args.batches;
    say!("toolledger-bench");
    say!(
        "  dir {}  (SQLite {}, WAL, synchronous=FULL; each figure on its own file)",
        dir.display(),
        rusqlite::version()
    );
    say!();
    say!(
        "side-effecting happy path: {n} calls each, interleaved in {} batches of {}",
        args.batches,
        args.calls()
    );
    say!(
        "  {:<60} {:>9} {:>9} {:>9}",
        "",
        "p50 µs",
        "p99 µs",
        "mean µs"
    );
    let row = |label: &str, s: &Samples| {
        say!(
            "  {label:<60} {:>9.1} {:>9.1} {:>9.1}",
            s.quantile_us(0.5),
            s.quantile_us(0.99),
            s.mean_us()
        );
    };
    row("(a) floor: bare rusqlite, 2 FULL commits", &f.happy.floor);
    row(
        "(a1) floor1: bare rusqlite, ONE FULL commit",
        &f.happy.floor1,
    );
    row(
        "(b) Ledger API, key tool: begin → commit → mark_delivered",
        &f.happy.ledger,
    );
    row(
        "(b') Executor, key tool: execute + mark_delivered",
        &f.happy.executor,
    );
    row(
        "(c) Ledger API, neither-tool (durable commit)",
        &f.happy.neither,
    );
    row(
        "(b'') Ledger API, key tool, encrypted ledger",
        &f.happy.encrypted,
    );
    let total = |k: usize| f.happy.totals[k] as f64;
    let ratio1 = total(2) / total(1).max(1.0);
    let ratio1_x = total(3) / total(1).max(1.0);
    let ratio1_p50 = f.happy.ledger.quantile_us(0.5) / f.happy.floor1.quantile_us(0.5).max(1e-9);
    let ratio = total(4) / total(0).max(1.0);
    let ratio_p50 = f.happy.neither.quantile_us(0.5) / f.happy.floor.quantile_us(0.5).max(1e-9);
    // The key tool on an encrypted ledger, against the same floor as the
    // plain headline (target: within 10 % of it).
    let ratio1_e = total(5) / total(1).max(1.0);
    say!(
        "  ratio b/a1 (total time) {ratio1:.3}  (p50 {ratio1_p50:.3})  target ≤ {TARGET_RATIO}  {}",
        verdict(ratio1 <= TARGET_RATIO)
    );
    say!(
        "  ratio b'/a1 (total time) {ratio1_x:.3}  (Executor; same target {})",
        verdict(ratio1_x <= TARGET_RATIO)
    );
    say!("  ratio c/a (total time) {ratio:.3}  (p50 {ratio_p50:.3}; a neither-tool against two commits)");
    match &f.syncs {
        Some(sy) => {
            let line = |label: &str, c: &SyncCounts| {
                say!(
                    "  fsync+fdatasync per call, {label} (strace, {} calls): median {} mean {:.3} max {}",
                    c.calls,
                    c.median,
                    c.mean(),
                    c.max
                );
            };
            line("floor (2 commits)", &sy.floor);
            line("floor1 (1 commit)", &sy.floor1);
            line("Ledger API, key tool", &sy.key);
            line("Ledger API, lookup tool", &sy.lookup);
            line("Ledger API, neither-tool", &sy.neither);
            say!(
                "  target: median 1 for key and lookup tools, 2 for neither-tools  {}",
                verdict(sy.key.median == 1 && sy.lookup.median == 1 && sy.neither.median == 2)
            );
        }
        None => say!("  fsync per call: not counted (no strace; run scripts/bench.sh)"),
    }
    if let Some((floor_us, ledger_us)) = f.delayed {
        say!(
            "  with every fsync {} ms slower (phone-like storage, strace delay injection; 4 alternating runs of 50 calls): floor1 {floor_us:.0} µs, Ledger (key tool) {ledger_us:.0} µs per call → ratio {:.3}",
            DELAY_US / 1000,
            ledger_us / floor_us.max(1e-9)
        );
    }
    match &f.instructions {
        Some(i) => say!(
            "  instructions per call (callgrind): Ledger API key tool {:.0}, neither-tool {:.0}, Executor key tool {:.0}; floor {:.0}, floor1 {:.0}  target ≤ {TARGET_INSTRUCTIONS}  {}",
            i.key,
            i.neither,
            i.executor,
            i.floor,
            i.floor1,
            verdict(i.key <= TARGET_INSTRUCTIONS)
        ),
        None => say!("  instructions per call: not counted (no valgrind)"),
    }
    say!();
    let (replay, replay_commits) = &f.replay;
    say!(
        "replay of a committed call (Ledger::begin, {} samples): p50 {:.1} µs  p99 {:.1} µs  WAL commits {}  target ≤ {TARGET_REPLAY_US} µs p50, no sync  {}",
        replay.0.len(),
        replay.quantile_us(0.5),
        replay.quantile_us(0.99),
        replay_commits,
        verdict(replay.quantile_us(0.5) <= TARGET_REPLAY_US && *replay_commits == 0)
    );
    let (r8, r8_commits) = &f.round8;
    let r8_commit_median = r8_commits.get(r8_commits.len() / 2).copied().unwrap_or(0);
    let r8_syncs = f.syncs.as_ref().map(|s| s.round8);
    say!(
        "begin_round of 8 new calls ({} rounds): p50 {:.1} µs  p99 {:.1} µs  syncs per round: {}  WAL commits (in-process cross-check, median) {}  target 1 sync  {}",
        r8.0.len(),
        r8.quantile_us(0.5),
        r8.quantile_us(0.99),
        r8_syncs.map_or("n/a (no strace)".to_owned(), |s| format!(
            "median {} mean {:.3} max {} (strace)",
            s.median,
            s.mean(),
            s.max
        )),
        r8_commit_median,
        verdict(r8_syncs.map_or(r8_commit_median, |s| s.median) == 1)
    );
    let ro_overhead = |ro: &(Samples, Samples, u64)| ro.0.quantile_us(0.5) - ro.1.quantile_us(0.5);
    let ro_commits = f.ro_task.2 + f.ro_block.2 + f.ro_current.2;
    let (via, direct, _) = &f.ro_task;
    say!(
        "read-only tool via Executor vs direct ({} samples each; awaited in a task on a 2-worker multi-thread runtime): via p50 {:.1} µs p99 {:.1} µs, direct p50 {:.1} µs → overhead {:.1} µs  WAL commits {ro_commits}  target ≤ {TARGET_READONLY_US} µs, no sync  {}",
        via.0.len(),
        via.quantile_us(0.5),
        via.quantile_us(0.99),
        direct.quantile_us(0.5),
        ro_overhead(&f.ro_task),
        verdict(ro_overhead(&f.ro_task) <= TARGET_READONLY_US && ro_commits == 0)
    );
    say!(
        "  same, current-thread runtime: overhead {:.1} µs; same, block_on from a thread outside the runtime: overhead {:.1} µs (the executor's per-call task spawn then crosses threads twice)",
        ro_overhead(&f.ro_current),
        ro_overhead(&f.ro_block),
    );
    let rec = &f.recover;
    say!(
        "recover() on {} historical executions + 100 pending (built in {:.1} s): first {:.2} ms (it marks 25 dead-session rows outcome_unknown: one lazy write), repeat p50 {:.3} ms; returned {}  target ≤ {TARGET_RECOVER_MS} ms  {}",
        rec.rows,
        rec.build_s,
        rec.first_ms,
        rec.repeat.quantile_us(0.5) / 1000.0,
        rec.pending,
        verdict(rec.first_ms <= TARGET_RECOVER_MS)
    );
    let (bytes, breakdown) = &f.bytes;
    say!(
        "database bytes per execution (200-byte result excluded, after checkpoint): {bytes:.0} B  target ≤ {TARGET_BYTES} B  {}",
        verdict(*bytes <= TARGET_BYTES)
    );
    let parts: Vec<String> = breakdown
        .iter()
        .map(|(name, b)| format!("{name} {b:.0}"))
        .collect();
    say!(
        "  per table/index, B per execution incl. result: {}",
        parts.join(", ")
    );
    say!(
        "WAL frames (pages written) per call, fresh files: Ledger API key tool {:.2}, floor1 {:.2}, floor {:.2}",
        f.frames.ledger,
        f.frames.floor1,
        f.frames.floor
    );
    let p = &f.paced;
    let paced_line = |label: &str, run: &fig::PacedRun| {
        say!(
            "  {label:<44} calls that ran a checkpoint {:>3}  p50 {:>7.1} µs  p99 {:>7.1} µs  max {:>8.1} µs",
            run.checkpointing,
            run.samples.quantile_us(0.5),
            run.samples.quantile_us(0.99),
            run.samples.quantile_us(1.0)
        );
    };
    say!(
        "paced calls: {} bursts of {} key-tool calls per ledger, a {} ms pause after each (both ledgers in the same run)",
        p.bursts,
        p.calls,
        p.pause.as_millis()
    );
    paced_line("idle checkpoint on (the default)", &p.on);
    paced_line("idle checkpoint off (SQLite's, in a commit)", &p.off);
    let rss = peak_rss_kib();
    say!(
        "peak RSS: {}",
        rss.map_or("n/a".to_owned(), |k| format!("{k} KiB"))
    );
    say!();
    let mut lines: Vec<(String, String)> = vec![
        ("happy_path_vs_floor1_ratio".into(), format!("{ratio1:.3}")),
        // The same Ledger API call on an encrypted ledger, against floor1.
        (
            "encrypted_happy_path_vs_floor_ratio".into(),
            format!("{ratio1_e:.3}"),
        ),
        (
            "encrypted_happy_path_p50_us".into(),
            format!("{:.1}", f.happy.encrypted.quantile_us(0.5)),
        ),
        (
            "executor_happy_path_vs_floor1_ratio".into(),
            format!("{ratio1_x:.3}"),
        ),
        (
            "happy_path_vs_floor1_p50_ratio".into(),
            format!("{ratio1_p50:.3}"),
        ),
        // A neither-tool (two durable commits) against the two-commit floor.
        ("happy_path_vs_floor_ratio".into(), format!("{ratio:.3}")),
        (
            "happy_path_vs_floor_p50_ratio".into(),
            format!("{ratio_p50:.3}"),
        ),
        (
            "floor_p50_us".into(),
            format!("{:.1}", f.happy.floor.quantile_us(0.5)),
        ),
        (
            "floor1_p50_us".into(),
            format!("{:.1}", f.happy.floor1.quantile_us(0.5)),
        ),
        (
            "floor1_p99_us".into(),
            format!("{:.1}", f.happy.floor1.quantile_us(0.99)),
        ),
        (
            "happy_path_p50_us".into(),
            format!("{:.1}", f.happy.ledger.quantile_us(0.5)),
        ),
        (
            "happy_path_p99_us".into(),
            format!("{:.1}", f.happy.ledger.quantile_us(0.99)),
        ),
        (
            "executor_happy_path_p50_us".into(),
            format!("{:.1}", f.happy.executor.quantile_us(0.5)),
        ),
        (
            "executor_happy_path_p99_us".into(),
            format!("{:.1}", f.happy.executor.quantile_us(0.99)),
        ),
        (
            "neither_happy_path_p50_us".into(),
            format!("{:.1}", f.happy.neither.quantile_us(0.5)),
        ),
        (
            "replay_p50_us".into(),
            format!("{:.1}", replay.quantile_us(0.5)),
        ),
        (
            "replay_p99_us".into(),
            format!("{:.1}", replay.quantile_us(0.99)),
        ),
        ("replay_wal_commits".into(), replay_commits.to_string()),
        (
            "paced_checkpointing_calls".into(),
            p.on.checkpointing.to_string(),
        ),
        (
            "paced_checkpointing_calls_idle_off".into(),
            p.off.checkpointing.to_string(),
        ),
        (
            "paced_max_us".into(),
            format!("{:.1}", p.on.samples.quantile_us(1.0)),
        ),
        (
            "paced_max_us_idle_off".into(),
            format!("{:.1}", p.off.samples.quantile_us(1.0)),
        ),
        (
            "wal_frames_per_call".into(),
            format!("{:.2}", f.frames.ledger),
        ),
        (
            "floor1_wal_frames_per_call".into(),
            format!("{:.2}", f.frames.floor1),
        ),
        (
            "round8_p50_us".into(),
            format!("{:.1}", r8.quantile_us(0.5)),
        ),
        (
            "round8_p99_us".into(),
            format!("{:.1}", r8.quantile_us(0.99)),
        ),
        (
            "round8_syncs".into(),
            r8_syncs.map_or("n/a".into(), |s| s.median.to_string()),
        ),
        (
            "round8_syncs_mean".into(),
            r8_syncs.map_or("n/a".into(), |s| format!("{:.3}", s.mean())),
        ),
        ("round8_wal_commits".into(), r8_commit_median.to_string()),
        (
            "readonly_overhead_us".into(),
            format!("{:.1}", ro_overhead(&f.ro_task)),
        ),
        (
            "readonly_overhead_current_thread_us".into(),
            format!("{:.1}", ro_overhead(&f.ro_current)),
        ),
        (
            "readonly_overhead_block_on_us".into(),
            format!("{:.1}", ro_overhead(&f.ro_block)),
        ),
        ("readonly_wal_commits".into(), ro_commits.to_string()),
        ("recover_1m_ms".into(), format!("{:.2}", rec.first_ms)),
        (
            "recover_1m_repeat_p50_ms".into(),
            format!("{:.3}", rec.repeat.quantile_us(0.5) / 1000.0),
        ),
        ("recover_rows".into(), rec.rows.to_string()),
        ("bytes_per_execution".into(), format!("{bytes:.0}")),
    ];
    if let Some((floor_us, ledger_us)) = f.delayed {
        lines.push((
            "happy_path_vs_floor1_ratio_2ms_fsync".into(),
            format!("{:.3}", ledger_us / floor_us.max(1e-9)),
        ));
    }
    match &f.syncs {
        Some(sy) => {
            lines.push(("syncs_per_call".into(), sy.key.median.to_string()));
            lines.push(("syncs_per_call_key".into(), sy.key.median.to_string()));
            lines.push(("syncs_per_call_lookup".into(), sy.lookup.median.to_string()));
            lines.push((
                "syncs_per_call_neither".into(),
                sy.neither.median.to_string(),
            ));
            lines.push(("fsyncs_per_call".into(), format!("{:.3}", sy.key.mean())));
            lines.push((
                "fsyncs_per_call_lookup".into(),
                format!("{:.3}", sy.lookup.mean()),
            ));
            lines.push((
                "fsyncs_per_call_neither".into(),
                format!("{:.3}", sy.neither.mean()),
            ));
            lines.push((
                "floor_fsyncs_per_call".into(),
                format!("{:.3}", sy.floor.mean()),
            ));
            lines.push((
                "floor1_fsyncs_per_call".into(),
                format!("{:.3}", sy.floor1.mean()),
            ));
        }
        None => {
            lines.push(("syncs_per_call".into(), "n/a".into()));
            lines.push(("fsyncs_per_call".into(), "n/a".into()));
        }
    }
    match &f.instructions {
        Some(i) => {
            lines.push(("instructions_per_call".into(), format!("{:.0}", i.key)));
            lines.push((
                "instructions_per_call_neither".into(),
                format!("{:.0}", i.neither),
            ));
            lines.push((
                "executor_instructions_per_call".into(),
                format!("{:.0}", i.executor),
            ));
            lines.push((
                "floor_instructions_per_call".into(),
                format!("{:.0}", i.floor),
            ));
            lines.push((
                "floor1_instructions_per_call".into(),
                format!("{:.0}", i.floor1),
            ));
        }
        None => lines.push(("instructions_per_call".into(), "n/a".into())),
    }
    lines.push((
        "peak_rss_kib".into(),
        rss.map_or("n/a".into(), |k| k.to_string()),
    ));
    for (k, v) in lines {
        say!("{k}={v}");
    }
}
