//! The measurements of `toolledger-bench`, one function per figure. Each one
//! uses its own database file in the run's directory, so one figure's WAL or
//! history never colours another's.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use toolledger::executor::{CallOutcome, Executor, ExecutorConfig};
use toolledger::ledger::{Begin, CallSpec, IdleCheckpoint, Ledger, LedgerConfig};
use toolledger::model::{ExecutionId, ExecutionIdParts, OperationId, ToolCall};

use crate::bench_support::{
    marker, result_200, tool_of, wal_commits, wal_frames, Floor, NoopSend, Samples, ARGS,
};
use crate::{Class, CliError, CliResult};

fn other(msg: impl Into<String>) -> CliError {
    CliError::Other(msg.into())
}

/// The operation, round and call of happy-path call `i` of series `series`
/// to the tool of `class`: 8 rounds of one call per operation.
fn call_of(series: &str, i: u64, class: Class) -> CliResult<(OperationId, u32, ToolCall)> {
    let op = OperationId::new(format!("bench_{series}_op_{}", i / 8))?;
    let call = ToolCall::custom(format!("call_{i}"), tool_of(class).0, ARGS);
    Ok((op, (i % 8) as u32, call))
}

/// One side-effecting call through the Ledger API: durable intent, the no-op
/// tool, the result committed as the tool's class allows (deferred for a key
/// or lookup tool, durable for a neither-tool), lazy delivery mark.
pub fn ledger_call(
    ledger: &Ledger,
    series: &str,
    i: u64,
    result: &str,
    class: Class,
) -> CliResult<u64> {
    let (op, round, call) = call_of(series, i, class)?;
    let spec = CallSpec::new(call, 1).with_downstream(tool_of(class).1);
    let started = Instant::now();
    let Begin::Execute(ticket) = ledger.begin(&op, round, &spec)? else {
        return Err(other("bench: a fresh call was not answered Execute"));
    };
    ledger.commit(&ticket.attempt_id(), result, None)?;
    ledger.mark_delivered(std::slice::from_ref(&ticket.execution_id))?;
    Ok(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

fn executor_call(
    rt: &Runtime,
    executor: &Executor,
    series: &str,
    i: u64,
    class: Class,
) -> CliResult<u64> {
    let (op, round, call) = call_of(series, i, class)?;
    let started = Instant::now();
    let outcome = rt
        .block_on(executor.execute(&op, round, call))
        .map_err(|e| other(format!("bench: executor: {e}")))?;
    let CallOutcome::Completed {
        execution_id,
        replayed: false,
        ..
    } = outcome
    else {
        return Err(other(format!("bench: executor answered {outcome:?}")));
    };
    executor
        .ledger()
        .mark_delivered(std::slice::from_ref(&execution_id))?;
    Ok(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// An executor over `ledger` with the no-op tool of every class.
pub fn bench_executor(ledger: &Arc<Ledger>) -> CliResult<Executor> {
    let executor = Executor::new(ledger.clone(), ExecutorConfig::default());
    for class in [Class::Key, Class::Lookup, Class::Neither] {
        executor
            .register(Arc::new(NoopSend {
                result: result_200(),
                class,
            }))
            .map_err(|e| other(format!("bench: {e}")))?;
    }
    Ok(executor)
}

fn floor_id(series: &str, i: u64) -> CliResult<String> {
    let (op, round, call) = call_of(series, i, Class::Key)?;
    Ok(ExecutionId::derive(&ExecutionIdParts {
        operation: &op,
        round,
        call_id: &call.call_id,
        tool_name: &call.tool_name,
        tool_version: 1,
    })?
    .to_string())
}

/// Opens a ledger file with the system clock.
pub fn open_ledger(path: &Path) -> CliResult<Arc<Ledger>> {
    Ok(Arc::new(Ledger::open(path, LedgerConfig::default())?))
}

/// One ledger's side of the paced figure.
#[derive(Debug, Default)]
pub struct PacedRun {
    /// Every call's time.
    pub samples: Samples,
    /// Calls during which the database file itself changed (size or
    /// modification time): the calls that ran a WAL checkpoint, the only
    /// writer of that file in WAL mode.
    pub checkpointing: u64,
}

/// Side-effecting calls in bursts with a pause after each, as a chat app
/// makes them (one model turn's calls, then the model's own time), on two
/// ledgers in the same run: the default configuration (the idle
/// checkpoint on) and the same with it off.
#[derive(Debug)]
pub struct PacedFigure {
    /// The default configuration.
    pub on: PacedRun,
    /// `IdleCheckpoint::OFF`.
    pub off: PacedRun,
    /// Bursts on each ledger.
    pub bursts: u64,
    /// Calls per burst.
    pub calls: u64,
    /// The pause after each burst.
    pub pause: Duration,
}

/// The paced figure: `bursts` bursts of `calls` key-tool calls on each
/// ledger (the two bursts back to back, so both see the same machine), then
/// a pause a little longer than the default idle time.
pub fn paced(dir: &Path, bursts: u64, calls: u64) -> CliResult<PacedFigure> {
    let result = result_200();
    let pause = IdleCheckpoint::default().after + Duration::from_millis(150);
    let on_path = dir.join("paced_on.db");
    let off_path = dir.join("paced_off.db");
    let on = Ledger::open(&on_path, LedgerConfig::default())?;
    let off = Ledger::open(
        &off_path,
        LedgerConfig {
            idle_checkpoint: IdleCheckpoint::OFF,
            ..LedgerConfig::default()
        },
    )?;
    let stamp = |path: &Path| -> CliResult<(u64, Option<std::time::SystemTime>)> {
        let meta = std::fs::metadata(path)?;
        Ok((meta.len(), meta.modified().ok()))
    };
    let mut figure = PacedFigure {
        on: PacedRun::default(),
        off: PacedRun::default(),
        bursts,
        calls,
        pause,
    };
    let mut i = 0u64;
    for _ in 0..bursts {
        for (ledger, path, run, series) in [
            (&on, &on_path, &mut figure.on, "paced_on"),
            (&off, &off_path, &mut figure.off, "paced_off"),
        ] {
            for k in 0..calls {
                let before = stamp(path)?;
                let ns = ledger_call(ledger, series, i + k, &result, Class::Key)?;
                run.samples.0.push(ns);
                if stamp(path)? != before {
                    run.checkpointing += 1;
                }
            }
        }
        i += calls;
        std::thread::sleep(pause);
    }
    Ok(figure)
}

/// The series of the happy-path figure, in their rotation order.
pub const SERIES: [&str; 6] = [
    "floor2",
    "floor1",
    "ledger_key",
    "executor_key",
    "ledger_neither",
    "ledger_key_encrypted",
];

/// Latencies of the happy paths and the floors, measured side by side.
pub struct HappyPath {
    /// (a) the raw-SQLite floor of two durable commits.
    pub floor: Samples,
    /// (a1) the raw-SQLite floor of ONE durable commit.
    pub floor1: Samples,
    /// (b) the Ledger API, a key tool (commit deferred: one sync).
    pub ledger: Samples,
    /// (b') the Executor (plus `mark_delivered`), a key tool.
    pub executor: Samples,
    /// (c) the Ledger API, a neither-tool (durable commit: two syncs).
    pub neither: Samples,
    /// (b'') the Ledger API, a key tool, on an encrypted ledger (values
    /// sealed, digests keyed).
    pub encrypted: Samples,
    /// Wall time of each series, nanoseconds (the ratios use these), in
    /// the order of [`SERIES`].
    pub totals: [u64; 6],
}

/// Runs `batches` rounds of `calls` calls of each series, in a rotating
/// order so that machine noise hits all of them alike.
pub fn happy_path(
    dir: &Path,
    rt: &Runtime,
    calls: u64,
    batches: u64,
) -> CliResult<(HappyPath, Arc<Ledger>)> {
    let mut floor = Floor::open(&dir.join("floor.db"))?;
    let mut floor1 = Floor::open(&dir.join("floor1.db"))?;
    let ledger = open_ledger(&dir.join("happy.db"))?;
    let executor = bench_executor(&ledger)?;
    let key = toolledger::ledger::LedgerKey::generate().map_err(toolledger::ledger::Error::from)?;
    let encrypted =
        Ledger::open_encrypted(&dir.join("encrypted.db"), LedgerConfig::default(), &key)?;
    let result = result_200();
    let mut out = HappyPath {
        floor: Samples::default(),
        floor1: Samples::default(),
        ledger: Samples::default(),
        executor: Samples::default(),
        neither: Samples::default(),
        encrypted: Samples::default(),
        totals: [0; 6],
    };
    let mut next = [0u64; 6];
    let n = SERIES.len() as u64;
    for batch in 0..batches {
        for k in 0..n {
            let kind = ((k + batch) % n) as usize;
            for _ in 0..calls {
                let i = next[kind];
                next[kind] += 1;
                let ns = match kind {
                    0 | 1 => {
                        let id = floor_id(if kind == 0 { "f" } else { "g" }, i)?;
                        let started = Instant::now();
                        if kind == 0 {
                            floor.call(&id, &result)?;
                        } else {
                            floor1.call1(&id, &result)?;
                        }
                        u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX)
                    }
                    2 => ledger_call(&ledger, "l", i, &result, Class::Key)?,
                    3 => executor_call(rt, &executor, "x", i, Class::Key)?,
                    4 => ledger_call(&ledger, "n", i, &result, Class::Neither)?,
                    _ => ledger_call(&encrypted, "e", i, &result, Class::Key)?,
                };
                let samples = match kind {
                    0 => &mut out.floor,
                    1 => &mut out.floor1,
                    2 => &mut out.ledger,
                    3 => &mut out.executor,
                    4 => &mut out.neither,
                    _ => &mut out.encrypted,
                };
                samples.0.push(ns);
                out.totals[kind] += ns;
            }
        }
    }
    Ok((out, ledger))
}

/// Replay latency of a committed call and the WAL commits it caused.
pub fn replay(ledger: &Ledger, path: &Path, samples: u64) -> CliResult<(Samples, u64)> {
    let (op, round, call) = call_of("l", 0, Class::Key)?;
    let spec = CallSpec::new(call, 1).with_downstream(tool_of(Class::Key).1);
    let before = wal_commits(path)?;
    let mut out = Samples::default();
    for _ in 0..samples {
        let started = Instant::now();
        let answer = ledger.begin(&op, round, &spec)?;
        out.push(started.elapsed());
        if !matches!(answer, Begin::Replay(_)) {
            return Err(other("bench: a committed call was not replayed"));
        }
    }
    let after = wal_commits(path)?;
    Ok((out, commits_between(before, after)))
}

/// WAL commits between two readings (a restarted WAL counts from zero).
pub fn commits_between(before: (u64, u64), after: (u64, u64)) -> u64 {
    if before.0 == after.0 {
        after.1.saturating_sub(before.1)
    } else {
        after.1
    }
}

/// Latency of `begin_round` with 8 new calls and the WAL commits per round
/// (in-process cross-check; rounds spanning a WAL restart are skipped).
pub fn round8(dir: &Path, rounds: u64, markers: bool) -> CliResult<(Samples, Vec<u64>)> {
    let path = dir.join("round8.db");
    let ledger = open_ledger(&path)?;
    let mut latency = Samples::default();
    let mut commits = Vec::new();
    for r in 0..rounds {
        let op = OperationId::new(format!("r8_op_{r}"))?;
        let specs: Vec<CallSpec> = (0..8u32)
            .map(|p| {
                let mut call = ToolCall::custom(format!("call_{p}"), tool_of(Class::Key).0, ARGS);
                call.position = p;
                CallSpec::new(call, 1)
            })
            .collect();
        let before = if markers { (0, 0) } else { wal_commits(&path)? };
        if markers {
            marker();
        }
        let started = Instant::now();
        let answers = ledger.begin_round(&op, 0, &specs)?;
        latency.push(started.elapsed());
        if answers.iter().any(|a| !matches!(a, Begin::Execute(_))) {
            return Err(other("bench: a fresh round was not answered Execute"));
        }
        if !markers {
            let after = wal_commits(&path)?;
            if before.0 == after.0 {
                commits.push(after.1.saturating_sub(before.1));
            }
        }
    }
    if markers {
        marker();
    }
    commits.sort_unstable();
    Ok((latency, commits))
}

/// WAL frames (pages written) per call, each series on a fresh file: the
/// Ledger API with a key tool, and the floors of one and of two durable
/// commits. Every page a call touches is written to the WAL (and
/// checksummed, and later copied back by a checkpoint), so this is the disk
/// side of a call's cost. Calls whose writes span a WAL restart are skipped.
pub struct WalFrames {
    /// The Ledger API, a key tool (begin, commit, delivery mark).
    pub ledger: f64,
    /// The floor of one durable commit.
    pub floor1: f64,
    /// The floor of two durable commits.
    pub floor: f64,
}

/// Measures [`WalFrames`] over `calls` calls of each series.
pub fn wal_frames_per_call(dir: &Path, calls: u64) -> CliResult<WalFrames> {
    fn mean_frames(
        path: &Path,
        calls: u64,
        mut call: impl FnMut(u64) -> CliResult<()>,
    ) -> CliResult<f64> {
        let (mut frames, mut counted) = (0u64, 0u64);
        for i in 0..calls {
            let before = wal_frames(path)?;
            call(i)?;
            let after = wal_frames(path)?;
            if before.0 == after.0 {
                frames += after.1.saturating_sub(before.1);
                counted += 1;
            }
        }
        Ok(if counted == 0 {
            0.0
        } else {
            frames as f64 / counted as f64
        })
    }
    let result = result_200();
    let path = dir.join("frames.db");
    let ledger = open_ledger(&path)?;
    let ledger_frames = mean_frames(&path, calls, |i| {
        ledger_call(&ledger, "w", i, &result, Class::Key).map(|_| ())
    })?;
    drop(ledger);
    let mut floors = [0.0; 2];
    for (k, name) in ["frames_floor1.db", "frames_floor.db"]
        .into_iter()
        .enumerate()
    {
        let path = dir.join(name);
        let mut floor = Floor::open(&path)?;
        floors[k] = mean_frames(&path, calls, |i| {
            let id = floor_id("w", i)?;
            if k == 0 {
                floor.call1(&id, &result)
            } else {
                floor.call(&id, &result)
            }
        })?;
    }
    Ok(WalFrames {
        ledger: ledger_frames,
        floor1: floors[0],
        floor: floors[1],
    })
}

/// Database bytes per execution (after a checkpoint, result excluded) and
/// the bytes per table and index, from `dbstat`.
pub fn bytes_per_execution(dir: &Path, calls: u64) -> CliResult<(f64, Vec<(String, f64)>)> {
    let path = dir.join("bytes.db");
    let ledger = open_ledger(&path)?;
    let result = result_200();
    // Warm up: schema pages and the first pages of every table exist.
    for i in 0..64 {
        ledger_call(&ledger, "w", i, &result, Class::Key)?;
    }
    ledger.checkpoint()?;
    let before_file = std::fs::metadata(&path)?.len();
    let before_tables = table_bytes(&path)?;
    for i in 0..calls {
        ledger_call(&ledger, "b", i, &result, Class::Key)?;
    }
    ledger.checkpoint()?;
    let after_file = std::fs::metadata(&path)?.len();
    let after_tables = table_bytes(&path)?;
    let per = (after_file.saturating_sub(before_file)) as f64 / calls as f64 - 200.0;
    let breakdown = after_tables
        .into_iter()
        .map(|(name, bytes)| {
            let old = before_tables
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, b)| *b);
            (name, bytes.saturating_sub(old) as f64 / calls as f64)
        })
        .filter(|(_, b)| *b > 0.0)
        .collect();
    Ok((per, breakdown))
}

/// Bytes per table and index (SQLite's `dbstat`), largest first, read on a
/// read-only connection of the benchmark's own.
fn table_bytes(path: &Path) -> CliResult<Vec<(String, u64)>> {
    let conn = raw_read_only(path)?;
    let mut stmt = conn
        .prepare("SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY sum(pgsize) DESC")
        .map_err(sql_err)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(sql_err)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(sql_err)
}

fn raw_read_only(path: &Path) -> CliResult<rusqlite::Connection> {
    rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(sql_err)
}

fn sql_err(e: rusqlite::Error) -> CliError {
    other(format!("bench: sqlite: {e}"))
}

/// What the recover figure found.
pub struct RecoverFigure {
    /// The first `recover()` after opening (it marks the dead session's rows
    /// `outcome_unknown`: one lazy write, no sync).
    pub first_ms: f64,
    /// Further `recover()` calls (nothing to write).
    pub repeat: Samples,
    /// What it returned.
    pub pending: usize,
    /// Historical rows.
    pub rows: u64,
    /// Seconds spent building the database.
    pub build_s: f64,
}

/// Builds a database of `rows` delivered executions plus 100 pending ones
/// (25 executing in a dead session, 25 awaiting approval, 25 committed but
/// not delivered, 25 outcome unknown), then times `recover()`.
pub fn recover(dir: &Path, rows: u64) -> CliResult<RecoverFigure> {
    let path = dir.join("recover.db");
    let started = Instant::now();
    fill_history(&path, rows)?;
    let result = result_200();
    {
        // 25 executing rows owned by a session that then dies.
        let dead = open_ledger(&path)?;
        for i in 0..25 {
            let (op, round, call) = call_of("dead", i, Class::Key)?;
            let _ = dead.begin(&op, round, &CallSpec::new(call, 1))?;
        }
    }
    {
        let ledger = open_ledger(&path)?;
        for i in 0..25 {
            let (op, round, call) = call_of("approve", i, Class::Key)?;
            let _ = ledger.begin(&op, round, &CallSpec::new(call, 1).with_approval())?;
            let (op, round, call) = call_of("undelivered", i, Class::Key)?;
            if let Begin::Execute(t) = ledger.begin(&op, round, &CallSpec::new(call, 1))? {
                ledger.commit(&t.attempt_id(), &result, None)?;
            }
            let (op, round, call) = call_of("unknown", i, Class::Key)?;
            if let Begin::Execute(t) = ledger.begin(&op, round, &CallSpec::new(call, 1))? {
                ledger.mark_outcome_unknown(&t.attempt_id(), "bench: timed out")?;
            }
        }
        ledger.checkpoint()?;
    }
    let build_s = started.elapsed().as_secs_f64();
    let ledger = open_ledger(&path)?;
    let started = Instant::now();
    let pending = ledger.recover()?;
    let first_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut repeat = Samples::default();
    for _ in 0..20 {
        let started = Instant::now();
        let again = ledger.recover()?;
        repeat.push(started.elapsed());
        if again.len() != pending.len() {
            return Err(other("bench: recover() changed its answer"));
        }
    }
    Ok(RecoverFigure {
        first_ms,
        repeat,
        pending: pending.len(),
        rows,
        build_s,
    })
}

/// Builds `rows` delivered executions quickly: one real call through the
/// ledger (begin, commit, deliver) is the template, and SQL copies it
/// `rows` times under new ids (8 per operation, 4 per round), so every
/// stored value — the transition log included — is one the ledger wrote.
/// A `recover()` then sweeps the history, as an app's would.
fn fill_history(path: &Path, rows: u64) -> CliResult<()> {
    const TEMPLATE: &str = "hist_template";
    let template = {
        let ledger = open_ledger(path)?;
        let (op, round, call) = call_of(TEMPLATE, 0, Class::Key)?;
        match ledger.begin(&op, round, &CallSpec::new(call, 1))? {
            Begin::Execute(t) => {
                ledger.commit(&t.attempt_id(), &result_200(), Some("msg_0"))?;
                ledger.mark_delivered(std::slice::from_ref(&t.execution_id))?;
                t.execution_id
            }
            _ => return Err(other("bench: the template call did not execute")),
        }
    };
    let mut conn = rusqlite::Connection::open(path).map_err(sql_err)?;
    let chunk = 100_000u64;
    let start_ms = 1_600_000_000_000i64;
    let mut done = 0;
    while done < rows {
        let n = chunk.min(rows - done);
        let batch = format!("{:04}", done / chunk);
        let tx = conn.transaction().map_err(sql_err)?;
        // Ids are zero-padded so rows arrive in key order (fast B-tree appends).
        tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2)
             INSERT INTO operations (operation_id, status, created_ms, updated_ms)
             SELECT printf('hist_%s_op_%08d', ?1, i), 'open', ?3 + i * 8, ?3 + i * 8 FROM n",
            rusqlite::params![batch, n.div_ceil(8), start_ms + done as i64],
        )
        .map_err(sql_err)?;
        tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2)
             INSERT INTO executions (execution_id, operation_id, round, position, provider,
                provider_call_id, tool_name, tool_version, args_digest, args_json,
                downstream_key, requires_approval, status, attempt_count, external_id,
                result_json, created_ms, updated_ms, history, digest_scheme)
             SELECT printf('hist_%s_op_%08d:round_%d:call_%d:send_email:v1',
                           ?1, i / 8, (i % 8) / 4, i % 4),
                printf('hist_%s_op_%08d', ?1, i / 8), (i % 8) / 4, i % 4, t.provider,
                printf('call_%d', i % 4), t.tool_name, t.tool_version,
                lower(hex(randomblob(32))), t.args_json,
                'tl_' || substr(lower(hex(randomblob(24))), 1, 48), t.requires_approval,
                t.status, t.attempt_count, printf('msg_%d', i), t.result_json,
                ?3 + i, ?3 + i + 1, t.history, t.digest_scheme
             FROM n, executions AS t WHERE t.execution_id = ?4",
            rusqlite::params![batch, n, start_ms + done as i64, template.as_str()],
        )
        .map_err(sql_err)?;
        tx.commit().map_err(sql_err)?;
        done += n;
        eprintln!("bench: recover database: {done}/{rows} historical executions");
    }
    drop(conn);
    let ledger = open_ledger(path)?;
    ledger.recover()?;
    ledger.checkpoint()?;
    Ok(())
}

/// `--only happy-path|executor|floor|floor1 --markers`: N calls with a
/// strace marker before each and after the last.
pub fn only_calls(
    dir: &Path,
    only: crate::BenchOnly,
    class: Class,
    calls: u64,
    markers: bool,
) -> CliResult<()> {
    use crate::BenchOnly;
    let result = result_200();
    let mut total_ns = 0u64;
    {
        let mut each = |f: &mut dyn FnMut(u64) -> CliResult<u64>| -> CliResult<()> {
            for i in 0..calls {
                if markers {
                    marker();
                }
                total_ns += f(i)?;
            }
            if markers {
                marker();
            }
            Ok(())
        };
        match only {
            BenchOnly::Floor | BenchOnly::Floor1 => {
                let mut f = Floor::open(&dir.join("floor.db"))?;
                each(&mut |i| {
                    let id = floor_id("f", i)?;
                    let started = Instant::now();
                    if only == BenchOnly::Floor {
                        f.call(&id, &result)?;
                    } else {
                        f.call1(&id, &result)?;
                    }
                    Ok(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX))
                })?;
            }
            BenchOnly::Executor => {
                let ledger = open_ledger(&dir.join("happy.db"))?;
                let executor = bench_executor(&ledger)?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                each(&mut |i| executor_call(&rt, &executor, "x", i, class))?;
            }
            BenchOnly::Replay => {
                let ledger = open_ledger(&dir.join("replay.db"))?;
                ledger_call(&ledger, "l", 0, &result, Class::Key)?;
                let (op, round, call) = call_of("l", 0, Class::Key)?;
                let spec = CallSpec::new(call, 1).with_downstream(tool_of(Class::Key).1);
                each(&mut |_| {
                    let started = Instant::now();
                    let answer = ledger.begin(&op, round, &spec)?;
                    if !matches!(answer, Begin::Replay(_)) {
                        return Err(other("bench: a committed call was not replayed"));
                    }
                    Ok(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX))
                })?;
            }
            _ => {
                let ledger = open_ledger(&dir.join("happy.db"))?;
                each(&mut |i| ledger_call(&ledger, "l", i, &result, class))?;
            }
        }
    }
    // For the parent: the mean per call, in microseconds.
    say!(
        "mean_us={:.1}",
        total_ns as f64 / calls.max(1) as f64 / 1000.0
    );
    Ok(())
}
