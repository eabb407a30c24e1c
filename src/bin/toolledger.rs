//! `toolledger`: the command-line face of the ledger.
//!
//! Every command is built on the core API directly (no FFI):
//!
//! - `toolledger demo` runs a scripted, multi-round "AI tool loop" against a
//!   ledger file and a simulated remote service, can kill itself at any of the
//!   six crash boundaries of docs/design.md (`--crash-at`), and on the next run
//!   recovers and proves, from the remote's own records, that every logical
//!   call produced exactly one side effect. See `demo.rs`.
//! - `toolledger inspect <db>` lists operations and executions: ids, tools,
//!   statuses, counts and times, never argument or result values. See
//!   `inspect.rs`.
//! - `toolledger stats|recover|prune <db>` (`maintenance.rs`) and
//!   `toolledger export <db>` (`export.rs`) inspect and maintain a database
//!   pulled from a device; `toolledger bench` (`bench.rs`) measures the ledger
//!   against the raw-SQLite floor.
//!
//! The submodules live in `src/bin/toolledger/` (named with `#[path]`, since
//! a bin crate root looks for its modules next to itself).
//!
//! Exit codes: 0 success; 1 a runtime failure (a file that is not a ledger,
//! storage errors, a demo whose final check failed); 2 bad arguments.

/// Prints one line to stdout. A closed pipe (`toolledger inspect db | head`)
/// is not an error worth a panic: the line is dropped.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

#[path = "toolledger/args.rs"]
mod args;
#[path = "toolledger/bench.rs"]
mod bench;
#[path = "toolledger/bench_figures.rs"]
mod bench_figures;
#[path = "toolledger/bench_readonly.rs"]
mod bench_readonly;
#[path = "toolledger/bench_support.rs"]
mod bench_support;
#[path = "toolledger/crash.rs"]
mod crash;
#[path = "toolledger/demo.rs"]
mod demo;
#[path = "toolledger/export.rs"]
mod export;
#[path = "toolledger/inspect.rs"]
mod inspect;
#[path = "toolledger/maintenance.rs"]
mod maintenance;
#[path = "toolledger/progress.rs"]
mod progress;
#[path = "toolledger/remote.rs"]
mod remote;
#[path = "toolledger/script.rs"]
mod script;
#[path = "toolledger/tool_args.rs"]
mod tool_args;
#[path = "toolledger/transcript.rs"]
mod transcript;

use std::fmt;
use std::process::ExitCode;

use args::Command;

/// Everything that can stop the binary, each with its exit code.
#[derive(Debug)]
pub enum CliError {
    /// The command line is wrong: usage is printed, exit code 2.
    Usage(String),
    /// The ledger refused or failed (typed message from the library).
    Ledger(toolledger::ledger::Error),
    /// The simulated remote service (the demo's outbox) failed.
    Remote(rusqlite::Error),
    /// A file (transcript, temp directory) could not be used.
    Io(std::io::Error),
    /// Anything else, already phrased for a person (no argument values).
    Other(String),
}

impl CliError {
    /// The process exit code for this error.
    fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            _ => 1,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(msg) => f.write_str(msg),
            CliError::Ledger(e) => write!(f, "ledger: {e}"),
            CliError::Remote(e) => write!(f, "simulated remote: {e}"),
            CliError::Io(e) => write!(f, "i/o: {e}"),
            CliError::Other(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for CliError {}

impl From<toolledger::ledger::Error> for CliError {
    fn from(e: toolledger::ledger::Error) -> Self {
        CliError::Ledger(e)
    }
}

impl From<toolledger::model::IdError> for CliError {
    fn from(e: toolledger::model::IdError) -> Self {
        CliError::Ledger(e.into())
    }
}

impl From<rusqlite::Error> for CliError {
    fn from(e: rusqlite::Error) -> Self {
        CliError::Remote(e)
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        CliError::Io(e)
    }
}

/// The binary's result type.
pub type CliResult<T> = Result<T, CliError>;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let outcome = args::parse(&argv).and_then(|command| match command {
        Command::Help => {
            say!("{}", args::USAGE.trim_end());
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo(demo_args) => demo::run(&demo_args),
        Command::Inspect(inspect_args) => inspect::run(&inspect_args).map(|()| ExitCode::SUCCESS),
        Command::Stats(a) => maintenance::stats(&a).map(|()| ExitCode::SUCCESS),
        Command::Recover(a) => maintenance::recover(&a).map(|()| ExitCode::SUCCESS),
        Command::Prune(a) => maintenance::prune(&a).map(|()| ExitCode::SUCCESS),
        Command::Export(a) => export::run(&a).map(|()| ExitCode::SUCCESS),
        Command::Bench(a) => bench::run(&a).map(|()| ExitCode::SUCCESS),
    });
    match outcome {
        Ok(code) => code,
        Err(err) => {
            eprintln!("toolledger: {err}");
            if matches!(err, CliError::Usage(_)) {
                eprint!("\n{}", args::USAGE);
            }
            ExitCode::from(err.exit_code())
        }
    }
}
