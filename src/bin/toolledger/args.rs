//! A small hand-written argument parser (std only).
//!
//! Accepts `--flag value` and `--flag=value`. Every mistake is a
//! [`CliError::Usage`], which `main` turns into the usage text and exit code 2.

use std::path::PathBuf;

use crate::crash::{self, Boundary};
use crate::tool_args::{self, BenchArgs, DbArgs, ExportArgs, PruneArgs};
use crate::{CliError, CliResult};

/// The usage text, printed by `--help` and after every argument error.
pub const USAGE: &str = "\
usage:
  toolledger demo [--db <file>] [--crash-at <boundary>] [--crash-tool <tool>]
  toolledger inspect <db> [--json] [--limit <n>]
  toolledger stats <db> [--json]
  toolledger recover <db> [--json]
  toolledger prune <db> (--older-than <age> | --before <ms>) [--no-tombstones] [--batch <n>] [--json]
  toolledger export <db> [--out <file>] [--show-args]
  toolledger bench [--dir <dir>] [--calls <n>] [--batches <n>] [--rounds <n>] [--samples <n>]
                   [--recover-rows <n>] [--no-strace] [--keep] [--only happy-path|floor|round8 [--markers]]
  toolledger --help

demo      runs a scripted multi-round AI tool loop on a ledger file and a simulated
          remote (<db>.outbox), recovering first from any earlier crash. Without
          --db it uses a fresh temporary file and runs to completion.
          --crash-at aborts the process (no unwinding, no cleanup) the first time
          the boundary is reached for a side-effecting call; it needs --db so the
          next run can recover the same file. --crash-tool limits that to one tool
          (send_email or pay). Boundaries:
            after-prepared, before-request, in-flight,
            after-remote-commit, after-local-commit, after-model-result
          The last line is `logical_calls=<n> side_effects=<n> duplicates=<n>`;
          exit 0 when every call completed exactly once.
inspect   lists operations and executions (ids, tools, statuses, attempts, whether a
          result and an external id exist, update times), never argument or result
          values. --json for scripts; --limit caps the operations listed (100).
stats     counts per status and per tool, tombstones, transitions and file size.
recover   runs Ledger::recover (executing rows of dead sessions become outcome_unknown)
          and lists every execution that needs attention, with what to do next.
prune     deletes finished executions (delivered, rejected, cancelled, non-retryable
          failures) last updated before the cutoff, with their logs, leaving a tombstone
          each (unless --no-tombstones) so a late retry is refused; then vacuums.
          <age> is like 30d, 12h, 90m, 45s or 1500ms.
export    writes one JSON line per execution (stdout, or --out <file>); argument and
          result values (and external ids) only with --show-args.
bench     measures toolledger against the raw-SQLite floor and prints a table ending in
          name=value lines (fsync counts need strace; see scripts/bench.sh).
          No command prints argument or result values unless --show-args is given;
          prune and export show a progress bar on stderr when it is a terminal.

exit codes: 0 ok, 1 failure (bad database file, storage error, demo check failed),
            2 bad arguments
";

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Print the usage text.
    Help,
    /// Run the demo.
    Demo(DemoArgs),
    /// Inspect a ledger file.
    Inspect(InspectArgs),
    /// Counts and sizes of a ledger file.
    Stats(DbArgs),
    /// Run recovery and list what needs attention.
    Recover(DbArgs),
    /// Prune old finished executions.
    Prune(PruneArgs),
    /// Export executions as JSON lines.
    Export(ExportArgs),
    /// Run the benchmark.
    Bench(BenchArgs),
}

/// Options of `toolledger demo`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DemoArgs {
    /// The ledger file; `None` for a fresh temporary one.
    pub db: Option<PathBuf>,
    /// Where to abort, if anywhere.
    pub crash_at: Option<Boundary>,
    /// Only abort for calls of this tool.
    pub crash_tool: Option<String>,
}

/// Options of `toolledger inspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectArgs {
    /// The ledger file (must exist).
    pub db: PathBuf,
    /// Machine-readable output.
    pub json: bool,
    /// At most this many operations.
    pub limit: u32,
}

pub(crate) fn usage(msg: impl Into<String>) -> CliError {
    CliError::Usage(msg.into())
}

/// Splits `--flag=value` into `("--flag", Some("value"))`.
pub(crate) fn split_flag(arg: &str) -> (&str, Option<&str>) {
    match arg.split_once('=') {
        Some((flag, value)) if flag.starts_with("--") => (flag, Some(value)),
        _ => (arg, None),
    }
}

/// Takes the value of `flag`: inline (`--flag=v`) or the next argument.
pub(crate) fn value<'a>(
    flag: &str,
    inline: Option<&'a str>,
    rest: &mut (impl Iterator<Item = &'a String> + ?Sized),
) -> CliResult<&'a str> {
    match inline {
        Some(v) if !v.is_empty() => Ok(v),
        Some(_) => Err(usage(format!("{flag} needs a value"))),
        None => rest
            .next()
            .map(String::as_str)
            .filter(|v| !v.starts_with("--"))
            .ok_or_else(|| usage(format!("{flag} needs a value"))),
    }
}

/// Parses the arguments after the program name.
///
/// # Errors
/// [`CliError::Usage`] for anything it does not understand.
pub fn parse(argv: &[String]) -> CliResult<Command> {
    let mut it = argv.iter();
    let Some(command) = it.next() else {
        return Err(usage("no command given"));
    };
    match command.as_str() {
        "-h" | "--help" | "help" => Ok(Command::Help),
        "demo" => parse_demo(it),
        "inspect" => parse_inspect(it),
        "stats" => tool_args::parse_stats(it),
        "recover" => tool_args::parse_recover(it),
        "prune" => tool_args::parse_prune(it),
        "export" => tool_args::parse_export(it),
        "bench" => tool_args::parse_bench(it),
        other => Err(usage(format!("unknown command `{other}`"))),
    }
}

fn parse_demo<'a>(mut it: impl Iterator<Item = &'a String>) -> CliResult<Command> {
    let mut out = DemoArgs::default();
    while let Some(arg) = it.next() {
        let (flag, inline) = split_flag(arg);
        match flag {
            "-h" | "--help" => return Ok(Command::Help),
            "--db" => out.db = Some(PathBuf::from(value(flag, inline, &mut it)?)),
            "--crash-at" => {
                let name = value(flag, inline, &mut it)?;
                out.crash_at = Some(crash::parse_boundary(name).ok_or_else(|| {
                    usage(format!(
                        "unknown boundary `{name}`; valid boundaries: {}",
                        crash::boundary_names()
                    ))
                })?);
            }
            "--crash-tool" => out.crash_tool = Some(value(flag, inline, &mut it)?.to_owned()),
            other => return Err(usage(format!("demo: unknown argument `{other}`"))),
        }
    }
    if out.crash_at.is_some() && out.db.is_none() {
        return Err(usage(
            "--crash-at needs --db <file>: the next run must recover the same file",
        ));
    }
    if out.crash_tool.is_some() && out.crash_at.is_none() {
        return Err(usage("--crash-tool only makes sense with --crash-at"));
    }
    Ok(Command::Demo(out))
}

fn parse_inspect<'a>(mut it: impl Iterator<Item = &'a String>) -> CliResult<Command> {
    let mut db = None;
    let mut json = false;
    let mut limit = 100;
    while let Some(arg) = it.next() {
        let (flag, inline) = split_flag(arg);
        match flag {
            "-h" | "--help" => return Ok(Command::Help),
            "--json" if inline.is_none() => json = true,
            "--limit" => {
                let v = value(flag, inline, &mut it)?;
                limit = v
                    .parse()
                    .map_err(|_| usage(format!("--limit needs a number, got `{v}`")))?;
            }
            f if f.starts_with('-') => {
                return Err(usage(format!("inspect: unknown argument `{f}`")))
            }
            path if db.is_none() => db = Some(PathBuf::from(path)),
            _ => return Err(usage("inspect takes exactly one database path")),
        }
    }
    let db = db.ok_or_else(|| usage("inspect needs a database path"))?;
    Ok(Command::Inspect(InspectArgs { db, json, limit }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn demo_flags_both_forms() {
        let a = parse(&argv(&["demo", "--db", "x.db", "--crash-at=in-flight"])).unwrap();
        assert_eq!(
            a,
            Command::Demo(DemoArgs {
                db: Some(PathBuf::from("x.db")),
                crash_at: Some(Boundary::InFlight),
                crash_tool: None,
            })
        );
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        for bad in [
            vec![],
            vec!["frobnicate"],
            vec!["demo", "--db"],
            vec!["demo", "--crash-at", "nowhere", "--db", "x"],
            vec!["demo", "--crash-at", "in-flight"],
            vec!["inspect"],
            vec!["inspect", "a", "b"],
            vec!["inspect", "a", "--limit", "many"],
        ] {
            assert!(
                matches!(parse(&argv(&bad)), Err(CliError::Usage(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn unknown_boundary_lists_the_valid_ones() {
        let Err(CliError::Usage(msg)) = parse(&argv(&["demo", "--db", "x", "--crash-at", "oops"]))
        else {
            panic!("expected a usage error");
        };
        for b in crash::BOUNDARIES {
            assert!(msg.contains(b.name()), "{msg}");
        }
    }
}
