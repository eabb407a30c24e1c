//! `toolledger-bench`: measures toolledger against the raw-SQLite floor and
//! prints a table ending in `name=value` lines (fsync counts need strace; see
//! scripts/bench.sh and docs/performance.md).

/// Prints one line to stdout; a closed pipe drops it.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod bench;
mod bench_figures;
mod bench_readonly;
mod bench_support;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};

/// Which figure `--only` measures (for running under strace or valgrind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchOnly {
    /// N side-effecting calls through the Ledger API (a tool of `--class`).
    HappyPath,
    /// N side-effecting calls through the Executor (a tool of `--class`).
    Executor,
    /// N raw-SQLite floor calls (two FULL commits each).
    Floor,
    /// N raw-SQLite calls of ONE FULL commit each.
    Floor1,
    /// N begins of a round of 8 calls.
    Round8,
    /// N replays of one committed call through `Ledger::begin` (for
    /// tracing and profiling the replay figure).
    Replay,
}

/// What the benchmarked tool's downstream offers (the durability policy
/// decides by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Class {
    /// Dedupes by an idempotency key that never expires: commit deferred.
    Key,
    /// Effects can be looked up: commit deferred.
    Lookup,
    /// Neither: the commit is durable at once (two syncs per call).
    Neither,
}

/// Measures the ledger against the raw-SQLite floor (every figure on its own
/// file in one fresh directory) and ends with one `name=value` line per
/// figure.
#[derive(Debug, Clone, Parser)]
#[command(name = "toolledger-bench", version, about)]
pub struct BenchArgs {
    /// Where the benchmark files go (a fresh directory inside it).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Only one figure, for running under `strace`.
    #[arg(long, value_enum)]
    pub only: Option<BenchOnly>,
    /// Happy-path calls per batch (with `--only`: calls in total; default 200 then).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub calls: Option<u64>,
    /// Interleaved batches of floor / Ledger / Executor calls.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub batches: u64,
    /// Rounds of 8 for the round figure.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: u64,
    /// Replays (and read-only calls) measured.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub samples: u64,
    /// Bursts of the paced figure (calls in bursts with a pause after
    /// each, the idle checkpoint on and off), and calls per burst.
    #[arg(long, default_value_t = 10)]
    pub paced_bursts: u64,
    /// Calls per burst of the paced figure.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub paced_calls: u64,
    /// Historical executions in the recover database.
    #[arg(long, default_value_t = 1_000_000)]
    pub recover_rows: u64,
    /// Emit strace markers (a `getppid` call) around every measured call.
    #[arg(long)]
    pub markers: bool,
    /// The tool class of `--only happy-path|executor`.
    #[arg(long, value_enum, default_value_t = Class::Key)]
    pub class: Class,
    /// Do not run the strace child processes.
    #[arg(long)]
    pub no_strace: bool,
    /// Do not count instructions under valgrind's callgrind.
    #[arg(long)]
    pub no_callgrind: bool,
    /// Keep the benchmark directory.
    #[arg(long)]
    pub keep: bool,
}

impl BenchArgs {
    /// Calls per batch (or in total with `--only`).
    pub fn calls(&self) -> u64 {
        self.calls
            .unwrap_or(if self.only.is_some() { 200 } else { 50 })
    }
}

/// Everything that can stop the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The ledger refused or failed.
    #[error("ledger: {0}")]
    Ledger(#[from] toolledger::ledger::Error),
    /// Raw SQLite (the floor) failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A file could not be used.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl From<toolledger::model::IdError> for CliError {
    fn from(e: toolledger::model::IdError) -> Self {
        CliError::Ledger(e.into())
    }
}

impl From<toolledger::executor::Error> for CliError {
    fn from(e: toolledger::executor::Error) -> Self {
        CliError::Other(e.to_string())
    }
}

/// The benchmark's result type.
pub type CliResult<T> = Result<T, CliError>;

fn main() -> ExitCode {
    let args = BenchArgs::parse();
    match bench::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("toolledger-bench: {err}");
            ExitCode::from(1)
        }
    }
}
