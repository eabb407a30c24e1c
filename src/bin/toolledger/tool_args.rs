//! Arguments of the maintenance commands: `stats`, `recover`, `prune`,
//! `export` (inspector tools for a database pulled from a device) and `bench`.
//!
//! Same conventions as `args.rs` (`--flag value` or `--flag=value`, every
//! mistake a usage error).

use std::path::PathBuf;
use std::time::Duration;

use crate::args::{split_flag, usage, value, Command};
use crate::CliResult;

/// Options shared by the inspector tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbArgs {
    /// The ledger file (must exist).
    pub db: PathBuf,
    /// Machine-readable output.
    pub json: bool,
    /// Print argument and result values (off by default: they may be
    /// personal data).
    pub show_args: bool,
}

/// When `prune` cuts off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cutoff {
    /// `--older-than 30d`.
    OlderThan(Duration),
    /// `--before <ms since the epoch>`.
    BeforeMs(i64),
}

/// Options of `toolledger prune`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneArgs {
    /// The database and output options.
    pub db: DbArgs,
    /// What is old enough.
    pub cutoff: Cutoff,
    /// Leave tombstones (default) or forget completely.
    pub keep_tombstones: bool,
    /// Executions per transaction.
    pub batch: u32,
}

/// Options of `toolledger export`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportArgs {
    /// The database and output options.
    pub db: DbArgs,
    /// Where to write the JSON lines (stdout when absent).
    pub out: Option<PathBuf>,
}

/// Which figure `toolledger bench --only` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchOnly {
    /// N side-effecting calls through the Ledger API.
    HappyPath,
    /// N raw-SQLite floor calls (two FULL commits each).
    Floor,
    /// N begins of a round of 8 calls.
    Round8,
}

impl BenchOnly {
    fn parse(name: &str) -> Option<BenchOnly> {
        match name {
            "happy-path" => Some(BenchOnly::HappyPath),
            "floor" => Some(BenchOnly::Floor),
            "round8" => Some(BenchOnly::Round8),
            _ => None,
        }
    }
}

/// Options of `toolledger bench`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchArgs {
    /// Where the benchmark files go (a fresh directory inside it).
    pub dir: Option<PathBuf>,
    /// Only one figure, for running under `strace`.
    pub only: Option<BenchOnly>,
    /// Happy-path calls per batch (with `--only`: calls in total).
    pub calls: u64,
    /// Interleaved batches of floor / Ledger / Executor calls.
    pub batches: u64,
    /// Rounds of 8 for the round figure.
    pub rounds: u64,
    /// Replays (and read-only calls) measured.
    pub samples: u64,
    /// Historical executions in the recover database.
    pub recover_rows: u64,
    /// Emit strace markers (a `getppid` call) around every measured call.
    pub markers: bool,
    /// Do not run the strace child processes.
    pub no_strace: bool,
    /// Keep the benchmark directory.
    pub keep: bool,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            dir: None,
            only: None,
            calls: 50,
            batches: 20,
            rounds: 200,
            samples: 20_000,
            recover_rows: 1_000_000,
            markers: false,
            no_strace: false,
            keep: false,
        }
    }
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> CliResult<T> {
    v.parse()
        .map_err(|_| usage(format!("{flag} needs a number, got `{v}`")))
}

/// Parses `30d`, `12h`, `90m`, `45s`, `1500ms` (a bare number is seconds).
pub fn parse_duration(v: &str) -> Option<Duration> {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: u64 = num.parse().ok()?;
    let ms = match unit {
        "ms" => n,
        "" | "s" => n.checked_mul(1000)?,
        "m" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        "d" => n.checked_mul(86_400_000)?,
        _ => return None,
    };
    Some(Duration::from_millis(ms))
}

/// Parses the flags every inspector tool takes; `extra` handles the rest
/// (returns false for a flag it does not know).
fn parse_db<'a>(
    name: &str,
    mut it: impl Iterator<Item = &'a String>,
    mut extra: impl FnMut(
        &str,
        Option<&'a str>,
        &mut dyn Iterator<Item = &'a String>,
    ) -> CliResult<bool>,
) -> CliResult<Option<DbArgs>> {
    let mut db = None;
    let mut json = false;
    let mut show_args = false;
    while let Some(arg) = it.next() {
        let (flag, inline) = split_flag(arg);
        match flag {
            "-h" | "--help" => return Ok(None),
            "--json" if inline.is_none() => json = true,
            "--show-args" if inline.is_none() => show_args = true,
            f if f.starts_with('-') => {
                if !extra(f, inline, &mut it)? {
                    return Err(usage(format!("{name}: unknown argument `{f}`")));
                }
            }
            path if db.is_none() => db = Some(PathBuf::from(path)),
            _ => return Err(usage(format!("{name} takes exactly one database path"))),
        }
    }
    let db = db.ok_or_else(|| usage(format!("{name} needs a database path")))?;
    Ok(Some(DbArgs {
        db,
        json,
        show_args,
    }))
}

/// `stats <db>`.
pub fn parse_stats<'a>(it: impl Iterator<Item = &'a String>) -> CliResult<Command> {
    Ok(parse_db("stats", it, |_, _, _| Ok(false))?.map_or(Command::Help, Command::Stats))
}

/// `recover <db>`.
pub fn parse_recover<'a>(it: impl Iterator<Item = &'a String>) -> CliResult<Command> {
    Ok(parse_db("recover", it, |_, _, _| Ok(false))?.map_or(Command::Help, Command::Recover))
}

/// `prune <db> --older-than <age> | --before <ms>`.
pub fn parse_prune<'a>(it: impl Iterator<Item = &'a String>) -> CliResult<Command> {
    let mut cutoff = None;
    let mut keep_tombstones = true;
    let mut batch = 500u32;
    let db = parse_db("prune", it, |flag, inline, rest| {
        match flag {
            "--older-than" => {
                let v = value(flag, inline, rest)?;
                let age = parse_duration(v).ok_or_else(|| {
                    usage(format!(
                        "--older-than needs an age like 30d, 12h, 90m, 45s or 1500ms, got `{v}`"
                    ))
                })?;
                cutoff = Some(Cutoff::OlderThan(age));
            }
            "--before" => {
                let v = value(flag, inline, rest)?;
                cutoff = Some(Cutoff::BeforeMs(number(flag, v)?));
            }
            "--no-tombstones" if inline.is_none() => keep_tombstones = false,
            "--batch" => {
                let v = value(flag, inline, rest)?;
                batch = number(flag, v)?;
                if batch == 0 {
                    return Err(usage("--batch must be at least 1"));
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let Some(db) = db else {
        return Ok(Command::Help);
    };
    let cutoff = cutoff.ok_or_else(|| usage("prune needs --older-than <age> or --before <ms>"))?;
    Ok(Command::Prune(PruneArgs {
        db,
        cutoff,
        keep_tombstones,
        batch,
    }))
}

/// `export <db> [--out <file>]`.
pub fn parse_export<'a>(it: impl Iterator<Item = &'a String>) -> CliResult<Command> {
    let mut out = None;
    let db = parse_db("export", it, |flag, inline, rest| {
        if flag == "--out" {
            out = Some(PathBuf::from(value(flag, inline, rest)?));
            return Ok(true);
        }
        Ok(false)
    })?;
    Ok(db.map_or(Command::Help, |db| Command::Export(ExportArgs { db, out })))
}

/// `bench [...]`.
pub fn parse_bench<'a>(mut it: impl Iterator<Item = &'a String>) -> CliResult<Command> {
    let mut out = BenchArgs::default();
    let mut calls_given = false;
    while let Some(arg) = it.next() {
        let (flag, inline) = split_flag(arg);
        match flag {
            "-h" | "--help" => return Ok(Command::Help),
            "--dir" => out.dir = Some(PathBuf::from(value(flag, inline, &mut it)?)),
            "--only" => {
                let v = value(flag, inline, &mut it)?;
                out.only = Some(BenchOnly::parse(v).ok_or_else(|| {
                    usage(format!(
                        "--only takes happy-path, floor or round8, got `{v}`"
                    ))
                })?);
            }
            "--calls" => {
                out.calls = number(flag, value(flag, inline, &mut it)?)?;
                calls_given = true;
            }
            "--batches" => out.batches = number(flag, value(flag, inline, &mut it)?)?,
            "--rounds" => out.rounds = number(flag, value(flag, inline, &mut it)?)?,
            "--samples" => out.samples = number(flag, value(flag, inline, &mut it)?)?,
            "--recover-rows" => out.recover_rows = number(flag, value(flag, inline, &mut it)?)?,
            "--markers" if inline.is_none() => out.markers = true,
            "--no-strace" if inline.is_none() => out.no_strace = true,
            "--keep" if inline.is_none() => out.keep = true,
            other => return Err(usage(format!("bench: unknown argument `{other}`"))),
        }
    }
    if out.only.is_some() && !calls_given {
        out.calls = 200;
    }
    if out.calls == 0 || out.batches == 0 || out.rounds == 0 || out.samples == 0 {
        return Err(usage("bench: counts must be at least 1"));
    }
    Ok(Command::Bench(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("30d"),
            Some(Duration::from_secs(30 * 86_400))
        );
        assert_eq!(parse_duration("90m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("45"), Some(Duration::from_secs(45)));
        assert_eq!(parse_duration("d"), None);
        assert_eq!(parse_duration("3w"), None);
    }

    #[test]
    fn prune_needs_a_cutoff() {
        let a = argv(&["x.db"]);
        assert!(parse_prune(a.iter()).is_err());
        let a = argv(&["x.db", "--older-than=7d", "--no-tombstones", "--json"]);
        let Command::Prune(p) = parse_prune(a.iter()).unwrap() else {
            panic!()
        };
        assert_eq!(p.cutoff, Cutoff::OlderThan(Duration::from_secs(7 * 86_400)));
        assert!(!p.keep_tombstones && p.db.json && !p.db.show_args);
    }

    #[test]
    fn export_and_bench_flags() {
        let a = argv(&["x.db", "--out", "o.jsonl", "--show-args"]);
        let Command::Export(e) = parse_export(a.iter()).unwrap() else {
            panic!()
        };
        assert!(e.db.show_args);
        assert_eq!(e.out, Some(PathBuf::from("o.jsonl")));
        let a = argv(&["--only", "happy-path", "--markers"]);
        let Command::Bench(b) = parse_bench(a.iter()).unwrap() else {
            panic!()
        };
        assert_eq!(b.only, Some(BenchOnly::HappyPath));
        assert_eq!(b.calls, 200);
        assert!(parse_bench(argv(&["--only", "nope"]).iter()).is_err());
    }
}
