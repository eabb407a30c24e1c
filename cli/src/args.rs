//! The command line, declared with clap: every command has its own `--help`,
//! mistakes get suggestions and exit code 2, `--version` prints the version.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Looks after a toolledger database pulled from a device: what is in it,
/// what needs attention, pruning and export. Argument and result values are
/// never printed unless `--show-args` is given.
#[derive(Debug, Parser)]
#[command(
    name = "toolledger",
    version,
    about,
    after_help = "Exit codes: 0 ok; 1 failure (not a ledger file, storage error, bad file); \
2 bad arguments; 3 `recover --exit-code` found executions that need attention."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Lists operations and executions (ids, tools, statuses, attempts,
    /// whether a result and an external id exist, update times), never
    /// argument or result values. The file is not written.
    Inspect(InspectArgs),
    /// Counts per status and per tool, tombstones, transitions and file size.
    /// The file is not written.
    Stats(DbArgs),
    /// Runs recovery as the app does at start-up (executing rows of dead
    /// sessions become outcome_unknown) and lists every execution that needs
    /// attention, with what to do next. Writes to the file.
    Recover(RecoverArgs),
    /// Deletes finished executions (delivered, rejected, cancelled,
    /// non-retryable failures) last updated before the cutoff, with their
    /// logs, leaving a tombstone each so a late retry is refused; then
    /// vacuums. Writes to the file.
    Prune(PruneArgs),
    /// Writes one JSON line per execution (stdout, or --out <file>); argument
    /// and result values (and external ids) only with --show-args. The file
    /// is not written.
    Export(ExportArgs),
    /// Prints a shell completion script for `toolledger`.
    Completions {
        /// The shell (bash, zsh, fish, elvish, powershell).
        shell: clap_complete::Shell,
    },
}

/// Options of `inspect`.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// The ledger file (must exist).
    pub db: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// At most this many operations.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
}

/// Options shared by the inspector tools.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// The ledger file (must exist).
    pub db: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Print argument and result values (off by default: they may be
    /// personal data).
    #[arg(long)]
    pub show_args: bool,
}

/// Options of `recover`.
#[derive(Debug, Clone, Args)]
pub struct RecoverArgs {
    /// The database and output options.
    #[command(flatten)]
    pub db: DbArgs,
    /// Exit with code 3 when something needs attention (for scripts).
    #[arg(long)]
    pub exit_code: bool,
}

/// When `prune` cuts off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cutoff {
    /// `--older-than 30d`.
    OlderThan(Duration),
    /// `--before <ms since the epoch>`.
    BeforeMs(i64),
}

/// Options of `prune`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("cutoff").required(true).args(["older_than", "before"])))]
pub struct PruneArgs {
    /// The database and output options.
    #[command(flatten)]
    pub db: DbArgs,
    /// Prune what was last updated longer ago than this: 30d, 12h, 90m, 45s,
    /// 1500ms (a bare number is seconds).
    #[arg(long, value_parser = parse_duration)]
    pub older_than: Option<Duration>,
    /// Prune what was last updated before this time, ms since the Unix epoch.
    #[arg(long)]
    pub before: Option<i64>,
    /// Leave no tombstones (and delete old ones): a very late retry of a
    /// pruned call would then run again.
    #[arg(long)]
    pub no_tombstones: bool,
    /// Executions per transaction.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
}

impl PruneArgs {
    /// The cutoff given.
    pub fn cutoff(&self) -> Cutoff {
        match (self.older_than, self.before) {
            (Some(age), _) => Cutoff::OlderThan(age),
            (None, Some(ms)) => Cutoff::BeforeMs(ms),
            // The argument group makes one of them required.
            (None, None) => Cutoff::OlderThan(Duration::MAX),
        }
    }

    /// Leave tombstones (the default).
    pub fn keep_tombstones(&self) -> bool {
        !self.no_tombstones
    }
}

/// Options of `export`.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The database and output options.
    #[command(flatten)]
    pub db: DbArgs,
    /// Where to write the JSON lines (stdout when absent); created readable
    /// by the owner only.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Parses `30d`, `12h`, `90m`, `45s`, `1500ms` (a bare number is seconds).
///
/// # Errors
/// A message naming the accepted forms.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let bad = || format!("an age like 30d, 12h, 90m, 45s or 1500ms, not `{v}`");
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let ms = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => None,
    }
    .ok_or_else(bad)?;
    Ok(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("toolledger").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("3w").is_err());
    }

    #[test]
    fn prune_needs_exactly_one_cutoff() {
        assert!(parse(&["prune", "x.db"]).is_err());
        assert!(parse(&["prune", "x.db", "--older-than", "1d", "--before", "5"]).is_err());
        let cli = parse(&[
            "prune",
            "x.db",
            "--older-than=7d",
            "--no-tombstones",
            "--json",
        ])
        .unwrap();
        let Command::Prune(p) = cli.command else {
            panic!()
        };
        assert_eq!(
            p.cutoff(),
            Cutoff::OlderThan(Duration::from_secs(7 * 86_400))
        );
        assert!(!p.keep_tombstones() && p.db.json && !p.db.show_args);
        assert!(parse(&["prune", "x.db", "--before", "5", "--batch", "0"]).is_err());
    }

    #[test]
    fn bad_arguments_are_refused() {
        for bad in [
            &[][..],
            &["frobnicate"][..],
            &["inspect"][..],
            &["inspect", "a", "b"][..],
            &["inspect", "a", "--limit", "many"][..],
            &["export", "a", "--out"][..],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let e = parse(&["inspekt", "a"]).unwrap_err();
        assert!(e.to_string().contains("inspect"), "a suggestion: {e}");
    }
}
