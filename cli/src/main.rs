//! `toolledger`: the command-line face of the ledger, for a database pulled
//! from a device.
//!
//! - `toolledger inspect <db>` lists operations and executions: ids, tools,
//!   statuses, counts and times, never argument or result values
//!   (`inspect.rs`).
//! - `toolledger stats|recover|prune <db>` (`maintenance.rs`) and
//!   `toolledger export <db>` (`export.rs`) inspect and maintain it.
//! - `toolledger completions <shell>` prints a completion script.
//!
//! The demo lives in `examples/demo`, the benchmark in `tools/bench`: nothing
//! of them is in this binary or in the phone's library.
//!
//! Exit codes: 0 success; 1 a runtime failure (a file that is not a ledger,
//! storage errors); 2 bad arguments; 3 `recover --exit-code` found
//! executions that need attention.

/// Prints one line to stdout. A closed pipe (`toolledger inspect db | head`)
/// is not an error worth a panic: the line is dropped.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod args;
mod export;
mod inspect;
mod maintenance;
mod progress;

use std::process::ExitCode;

use args::{Cli, Command};
use clap::{CommandFactory, Parser};

/// The version of every JSON document the commands print (a field
/// `format_version` in each); it changes when a field changes meaning.
pub const FORMAT_VERSION: u32 = 1;

/// Everything that can stop the binary, each with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The ledger refused or failed (typed message from the library).
    #[error("ledger: {0}")]
    Ledger(#[from] toolledger::ledger::Error),
    /// A file could not be used.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Anything else, already phrased for a person (no argument values).
    #[error("{0}")]
    Other(String),
}

impl From<toolledger::model::IdError> for CliError {
    fn from(e: toolledger::model::IdError) -> Self {
        CliError::Ledger(e.into())
    }
}

/// The binary's result type.
pub type CliResult<T> = Result<T, CliError>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Inspect(a) => inspect::run(&a).map(|()| ExitCode::SUCCESS),
        Command::Stats(a) => maintenance::stats(&a).map(|()| ExitCode::SUCCESS),
        Command::Recover(a) => maintenance::recover(&a),
        Command::Prune(a) => maintenance::prune(&a).map(|()| ExitCode::SUCCESS),
        Command::Export(a) => export::run(&a).map(|()| ExitCode::SUCCESS),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "toolledger",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
    };
    match outcome {
        Ok(code) => code,
        Err(err) => {
            eprintln!("toolledger: {err}");
            ExitCode::from(1)
        }
    }
}
