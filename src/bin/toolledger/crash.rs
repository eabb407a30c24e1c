//! Crash injection: the six boundaries of DESIGN.md, and the abort.
//!
//! The demo calls [`CrashPlan::reached`] at every boundary of every
//! side-effecting call. When the plan names that boundary (and, optionally,
//! that tool) the process dies on the spot with [`std::process::abort`]: no
//! unwinding, no destructors, no flushing of anything the program did not
//! already hand to the operating system — as close to SIGKILL as std gets. So
//! the first time the boundary is reached is the only time.

use std::fmt;
use std::io::Write;

/// A point in the life of one side-effecting call where the process can die.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// The call is recorded (`prepared`, waiting for approval) and not yet
    /// `executing`.
    AfterPrepared,
    /// `executing` is durable; the request has not left.
    BeforeRequest,
    /// The request reached the remote, whose transaction is open but not
    /// committed.
    InFlight,
    /// The remote committed the effect; the ledger has not.
    AfterRemoteCommit,
    /// The ledger committed the result; the model has not seen it.
    AfterLocalCommit,
    /// The model was given the result; delivery is not recorded.
    AfterModelResult,
}

impl Boundary {
    /// Every boundary, in the order a call passes them.
    pub const ALL: [Boundary; 6] = [
        Boundary::AfterPrepared,
        Boundary::BeforeRequest,
        Boundary::InFlight,
        Boundary::AfterRemoteCommit,
        Boundary::AfterLocalCommit,
        Boundary::AfterModelResult,
    ];

    /// The command-line name (`after-prepared` …).
    pub fn name(self) -> &'static str {
        match self {
            Boundary::AfterPrepared => "after-prepared",
            Boundary::BeforeRequest => "before-request",
            Boundary::InFlight => "in-flight",
            Boundary::AfterRemoteCommit => "after-remote-commit",
            Boundary::AfterLocalCommit => "after-local-commit",
            Boundary::AfterModelResult => "after-model-result",
        }
    }

    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<Boundary> {
        Boundary::ALL.into_iter().find(|b| b.name() == name)
    }

    /// All names, comma separated (for error messages).
    pub fn names() -> String {
        Boundary::ALL.map(Boundary::name).join(", ")
    }
}

impl fmt::Display for Boundary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where (if anywhere) this run must die.
#[derive(Debug, Clone, Default)]
pub struct CrashPlan {
    at: Option<Boundary>,
    tool: Option<String>,
}

impl CrashPlan {
    /// A plan that dies at `at`, for any tool or only for `tool`.
    pub fn new(at: Option<Boundary>, tool: Option<String>) -> CrashPlan {
        CrashPlan { at, tool }
    }

    /// True when the plan would die somewhere.
    pub fn is_armed(&self) -> bool {
        self.at.is_some()
    }

    /// Marks that a call of `tool` reached `boundary`; aborts the process if
    /// the plan says so.
    pub fn reached(&self, boundary: Boundary, tool: &str) {
        let tool_matches = self.tool.as_deref().is_none_or(|t| t == tool);
        if self.at == Some(boundary) && tool_matches {
            // Everything printed so far is already out (stdout is line
            // buffered); this line makes the death visible in the log.
            say!("CRASH at {boundary} ({tool}): aborting the process, no cleanup");
            let _ = std::io::stdout().flush();
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for b in Boundary::ALL {
            assert_eq!(Boundary::parse(b.name()), Some(b));
        }
        assert_eq!(Boundary::parse("after_prepared"), None);
    }

    #[test]
    fn unarmed_or_other_tool_does_not_abort() {
        CrashPlan::default().reached(Boundary::InFlight, "pay");
        CrashPlan::new(Some(Boundary::InFlight), Some("send_email".into()))
            .reached(Boundary::InFlight, "pay");
        CrashPlan::new(Some(Boundary::InFlight), None).reached(Boundary::BeforeRequest, "pay");
    }
}
