//! Plumbing for `toolledger-bench`: the raw-SQLite floor, the no-op tools,
//! latency samples, counting WAL commits, strace runs and peak RSS.
//!
//! The floor is deliberately bare rusqlite (it is what toolledger is compared
//! against, so it cannot go through the store): one table, the same pragmas
//! as the ledger (WAL, `synchronous=FULL`, incremental auto-vacuum, foreign
//! keys, busy timeout) and per call the same two durable commits the ledger's
//! happy path needs: `BEGIN IMMEDIATE; INSERT; COMMIT` (the intent) and
//! `BEGIN IMMEDIATE; UPDATE; COMMIT` (the result).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, TransactionBehavior};
use toolledger::executor::{PerformOutcome, ToolDescriptor, ToolError, ToolHandler, ToolRequest};
use toolledger::ledger::Downstream;

use crate::{Class, CliError, CliResult};

/// The arguments of every benchmark call (an ordinary small email).
pub const ARGS: &str =
    r#"{"body":"See the attached figures.","subject":"Quarterly report","to":"ada@example.com"}"#;

/// A result of exactly 200 bytes of JSON.
pub fn result_200() -> String {
    let head = r#"{"id":"msg_0001","status":"sent","note":""#;
    let tail = r#""}"#;
    let pad = 200 - head.len() - tail.len();
    let s = format!("{head}{}{tail}", "x".repeat(pad));
    debug_assert_eq!(s.len(), 200);
    s
}

/// The tool the benchmark calls for a class, and what it declares.
pub fn tool_of(class: Class) -> (&'static str, Downstream) {
    match class {
        Class::Key => ("send_email", Downstream::keyed(Duration::MAX)),
        Class::Lookup => ("send_lookup", Downstream::lookup()),
        Class::Neither => ("send_blind", Downstream::default()),
    }
}

/// A side-effecting tool that does nothing and commits at once.
pub struct NoopSend {
    pub result: String,
    pub class: Class,
}

#[async_trait]
impl ToolHandler for NoopSend {
    fn descriptor(&self) -> ToolDescriptor {
        let (name, downstream) = tool_of(self.class);
        let mut d = ToolDescriptor::side_effect(name, 1);
        d.idempotency_key = downstream.idempotency_key;
        d.lookup = downstream.lookup;
        d.key_lifetime = downstream.key_lifetime;
        d
    }

    async fn perform(&self, _request: ToolRequest) -> Result<PerformOutcome, ToolError> {
        Ok(PerformOutcome::Committed {
            result_json: self.result.clone(),
            external_id: None,
        })
    }
}

/// A read-only tool that answers at once.
pub struct Weather;

/// What `Weather` answers.
pub const WEATHER: &str = r#"{"city":"Lisbon","temp_c":21}"#;

#[async_trait]
impl ToolHandler for Weather {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::read_only("weather", 1)
    }

    async fn perform(&self, _request: ToolRequest) -> Result<PerformOutcome, ToolError> {
        Ok(PerformOutcome::Committed {
            result_json: WEATHER.to_owned(),
            external_id: None,
        })
    }
}

/// The raw-SQLite floor.
pub struct Floor {
    conn: Connection,
}

impl Floor {
    /// Creates the floor database at `path` with the ledger's pragmas.
    pub fn open(path: &Path) -> CliResult<Floor> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL;")?;
        let _: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        conn.execute_batch(
            "PRAGMA synchronous=FULL;
             PRAGMA foreign_keys=ON;
             CREATE TABLE IF NOT EXISTS calls (
                id TEXT PRIMARY KEY NOT NULL,
                args TEXT NOT NULL,
                status TEXT NOT NULL,
                result TEXT
             );",
        )?;
        conn.set_prepared_statement_cache_capacity(16);
        Ok(Floor { conn })
    }

    /// The lower floor: ONE durable commit (`BEGIN IMMEDIATE; INSERT;
    /// COMMIT`), what a call costs when only its intent must be durable.
    pub fn call1(&mut self, id: &str, result: &str) -> CliResult<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached(
            "INSERT INTO calls (id, args, status, result) VALUES (?1, ?2, 'committed', ?3)",
        )?
        .execute(params![id, ARGS, result])?;
        tx.commit()?;
        Ok(())
    }

    /// One call: the intent and the result, each its own durable commit.
    pub fn call(&mut self, id: &str, result: &str) -> CliResult<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached("INSERT INTO calls (id, args, status) VALUES (?1, ?2, 'executing')")?
            .execute(params![id, ARGS])?;
        tx.commit()?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached("UPDATE calls SET status = 'committed', result = ?2 WHERE id = ?1")?
            .execute(params![id, result])?;
        tx.commit()?;
        Ok(())
    }
}

/// Latency samples in nanoseconds.
#[derive(Debug, Default, Clone)]
pub struct Samples(pub Vec<u64>);

impl Samples {
    /// Adds one sample.
    pub fn push(&mut self, d: Duration) {
        self.0.push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    fn sorted(&self) -> Vec<u64> {
        let mut v = self.0.clone();
        v.sort_unstable();
        v
    }

    /// The `q` quantile (nearest rank), microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        let v = self.sorted();
        if v.is_empty() {
            return 0.0;
        }
        let rank = ((v.len() as f64) * q).ceil().max(1.0) as usize;
        v[rank.min(v.len()) - 1] as f64 / 1000.0
    }

    /// The mean, microseconds.
    pub fn mean_us(&self) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.iter().map(|&n| n as f64).sum::<f64>() / self.0.len() as f64 / 1000.0
    }
}

/// `<db>-wal`.
pub fn wal_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-wal");
    PathBuf::from(name)
}

/// The WAL's salt and its number of valid commit frames (frames whose
/// "database size after commit" field is set): the commits since the WAL was
/// last restarted. With `synchronous=FULL` each such commit is one sync.
pub fn wal_commits(db: &Path) -> CliResult<(u64, u64)> {
    let scan = wal_scan(db)?;
    Ok((scan.salt, scan.commits))
}

/// The WAL's salt and its number of valid frames: the pages written since
/// the WAL was last restarted (each frame is one page image).
pub fn wal_frames(db: &Path) -> CliResult<(u64, u64)> {
    let scan = wal_scan(db)?;
    Ok((scan.salt, scan.frames))
}

/// What a read of the WAL's valid frames found.
struct WalScan {
    salt: u64,
    frames: u64,
    commits: u64,
}

fn wal_scan(db: &Path) -> CliResult<WalScan> {
    let none = WalScan {
        salt: 0,
        frames: 0,
        commits: 0,
    };
    let Ok(mut f) = File::open(wal_path(db)) else {
        return Ok(none);
    };
    let len = f.metadata()?.len();
    let mut header = [0u8; 32];
    if len < 32 || f.read_exact(&mut header).is_err() {
        return Ok(none);
    }
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    let page_size = u64::from(be(&header[8..12]));
    let salt = (u64::from(be(&header[16..20])) << 32) | u64::from(be(&header[20..24]));
    let mut scan = WalScan {
        salt,
        frames: 0,
        commits: 0,
    };
    let mut offset = 32;
    let mut frame = [0u8; 24];
    while offset + 24 + page_size <= len {
        f.seek(SeekFrom::Start(offset))?;
        f.read_exact(&mut frame)?;
        let frame_salt = (u64::from(be(&frame[8..12])) << 32) | u64::from(be(&frame[12..16]));
        if frame_salt != salt {
            break;
        }
        scan.frames += 1;
        if be(&frame[4..8]) != 0 {
            scan.commits += 1;
        }
        offset += 24 + page_size;
    }
    Ok(scan)
}

/// A strace marker: one `getppid` system call between measured calls.
pub fn marker() {
    let _ = std::os::unix::process::parent_id();
}

/// fsync/fdatasync calls per measured call, counted by strace.
#[derive(Debug, Clone, Copy, Default)]
pub struct SyncCounts {
    /// Measured calls.
    pub calls: u64,
    /// Syncs in all of them.
    pub total: u64,
    /// The median call's syncs.
    pub median: u64,
    /// The most any one call needed (a WAL checkpoint adds some).
    pub max: u64,
}

impl SyncCounts {
    /// Syncs per call on average.
    pub fn mean(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.total as f64 / self.calls as f64
        }
    }
}

/// Runs `toolledger-bench --only <only> --calls <calls> --markers` under
/// `strace` and counts syncs between markers. `None` when strace is missing.
pub fn strace_syncs(
    only: &str,
    class: &str,
    calls: u64,
    dir: &Path,
) -> CliResult<Option<SyncCounts>> {
    let exe = std::env::current_exe()?;
    let log = dir.join(format!("strace-{only}-{class}.txt"));
    let work = dir.join(format!("strace-{only}-{class}"));
    std::fs::create_dir_all(&work)?;
    let status = Command::new("strace")
        .args([
            "-f",
            "--seccomp-bpf",
            "-qq",
            "-e",
            "trace=fsync,fdatasync,getppid",
            "-o",
        ])
        .arg(&log)
        .arg(&exe)
        .args(["--only", only, "--class", class, "--markers", "--calls"])
        .arg(calls.to_string())
        .arg("--dir")
        .arg(&work)
        .stdout(std::process::Stdio::null())
        .status();
    let status = match status {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if !status.success() {
        return Err(CliError::Other(format!(
            "strace run of `bench --only {only}` failed ({status})"
        )));
    }
    let text = std::fs::read_to_string(&log)?;
    let mut per_call: Vec<u64> = Vec::new();
    let mut current: Option<u64> = None;
    for line in text.lines() {
        if line.contains("getppid(") {
            if let Some(n) = current {
                per_call.push(n);
            }
            current = Some(0);
        } else if line.contains("fsync(") || line.contains("fdatasync(") {
            if let Some(n) = current.as_mut() {
                *n += 1;
            }
        }
    }
    per_call.sort_unstable();
    let n = per_call.len() as u64;
    Ok(Some(SyncCounts {
        calls: n,
        total: per_call.iter().sum(),
        median: per_call.get(per_call.len() / 2).copied().unwrap_or(0),
        max: per_call.last().copied().unwrap_or(0),
    }))
}

/// The happy path against the floor on storage whose every fsync/fdatasync
/// takes `delay_us` longer, emulated by strace's delay injection: `batches`
/// alternating child runs of `calls` floor and `calls` Ledger calls (fresh
/// files each). Returns (floor mean µs, ledger mean µs), or `None` without
/// strace.
pub fn delayed_sync_means(
    dir: &Path,
    delay_us: u64,
    calls: u64,
    batches: u64,
) -> CliResult<Option<(f64, f64)>> {
    let exe = std::env::current_exe()?;
    let inject = format!("inject=fsync,fdatasync:delay_exit={delay_us}");
    let mut sums = [0.0f64; 2];
    for batch in 0..batches {
        // ONE durable commit against the key tool's happy path.
        for (k, only) in ["floor1", "happy-path"].iter().enumerate() {
            let work = dir.join(format!("delay-{only}-{batch}"));
            std::fs::create_dir_all(&work)?;
            let out = Command::new("strace")
                .args([
                    "-f",
                    "--seccomp-bpf",
                    "-qq",
                    "-e",
                    "trace=fsync,fdatasync",
                    "-e",
                    &inject,
                ])
                .args(["-o", "/dev/null"])
                .arg(&exe)
                .args(["--only", only, "--calls"])
                .arg(calls.to_string())
                .arg("--dir")
                .arg(&work)
                .output();
            let out = match out {
                Ok(o) => o,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let mean = String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("mean_us=")?.parse::<f64>().ok())
                .ok_or_else(|| {
                    CliError::Other(format!(
                        "strace delay run of `bench --only {only}` failed ({})",
                        out.status
                    ))
                })?;
            sums[k] += mean;
        }
    }
    let n = batches.max(1) as f64;
    Ok(Some((sums[0] / n, sums[1] / n)))
}

/// Instructions per call of `toolledger-bench --only <only> --class
/// <class>`, counted by valgrind's callgrind: two runs of different lengths
/// in a fresh directory on `dir`, their difference divided by the
/// difference in calls (so opening and creating the file cancel out).
/// `None` when valgrind is missing.
pub fn callgrind_instructions(only: &str, class: &str, dir: &Path) -> CliResult<Option<f64>> {
    const SHORT: u64 = 100;
    const LONG: u64 = 300;
    let exe = std::env::current_exe()?;
    let mut collected = [0u64; 2];
    for (k, calls) in [SHORT, LONG].into_iter().enumerate() {
        let work = dir.join(format!("callgrind-{only}-{class}-{calls}"));
        std::fs::create_dir_all(&work)?;
        let out = Command::new("valgrind")
            .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
            .arg(&exe)
            .args(["--only", only, "--class", class, "--calls"])
            .arg(calls.to_string())
            .arg("--dir")
            .arg(&work)
            .output();
        let out = match out {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        collected[k] = stderr
            .lines()
            .find_map(|l| {
                let (_, n) = l.split_once("Collected :")?;
                n.trim().replace(',', "").parse().ok()
            })
            .ok_or_else(|| {
                CliError::Other(format!(
                    "callgrind run of `bench --only {only}` failed ({})",
                    out.status
                ))
            })?;
    }
    Ok(Some(
        collected[1].saturating_sub(collected[0]) as f64 / (LONG - SHORT) as f64,
    ))
}

/// Peak resident set size of this process (`VmHWM`), KiB.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A fresh directory for one benchmark run inside `base`.
pub fn fresh_dir(base: &Path) -> CliResult<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = base.join(format!("toolledger-bench-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
