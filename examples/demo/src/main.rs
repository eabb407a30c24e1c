//! `toolledger-demo`: a scripted, multi-round AI tool loop against a ledger
//! file and a simulated remote service. It can kill itself at any of the six
//! crash boundaries of docs/design.md (`--crash-at`); the next run recovers
//! and proves, from the remote's own records, that every logical call
//! produced exactly one side effect. See `demo.rs`.
//!
//! Exit codes: 0 every call completed exactly once; 1 a failure or a final
//! check that did not hold; 2 bad arguments.

/// Prints one line to stdout. A closed pipe is not an error worth a panic:
/// the line is dropped.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod crash;
mod demo;
mod remote;
mod script;
mod transcript;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use crash::Boundary;

/// Runs a scripted multi-round AI tool loop on a ledger file and a simulated
/// remote (<db>.outbox), recovering first from any earlier crash. Without
/// --db it uses a fresh temporary file and runs to completion. The last line
/// is `logical_calls=<n> side_effects=<n> duplicates=<n>`.
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "toolledger-demo", version, about)]
pub struct DemoArgs {
    /// The ledger file (kept between runs); a fresh temporary one when absent.
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Abort the process (no unwinding, no cleanup) the first time this
    /// boundary is reached for a side-effecting call; needs --db so the next
    /// run can recover the same file.
    #[arg(long, value_parser = parse_boundary, requires = "db")]
    pub crash_at: Option<Boundary>,
    /// Only abort for calls of this tool (send_email or pay).
    #[arg(long, requires = "crash_at")]
    pub crash_tool: Option<String>,
}

fn parse_boundary(name: &str) -> Result<Boundary, String> {
    crash::parse_boundary(name).ok_or_else(|| {
        format!(
            "unknown boundary `{name}`; valid boundaries: {}",
            crash::boundary_names()
        )
    })
}

/// Everything that can stop the demo.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The ledger refused or failed (typed message from the library).
    #[error("ledger: {0}")]
    Ledger(#[from] toolledger::ledger::Error),
    /// The simulated remote service (the demo's outbox) failed.
    #[error("simulated remote: {0}")]
    Remote(#[from] rusqlite::Error),
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

/// The demo's result type.
pub type CliResult<T> = Result<T, CliError>;

fn main() -> ExitCode {
    let args = DemoArgs::parse();
    match demo::run(&args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("toolledger-demo: {err}");
            ExitCode::from(1)
        }
    }
}
