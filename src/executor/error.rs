//! Executor errors: failures of the machinery, not of tools (a tool's
//! failure is a [`super::CallOutcome`]).

use crate::ledger;

/// The executor could not apply the protocol to a call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The ledger failed (storage, bad input, invalid transition).
    #[error(transparent)]
    Ledger(#[from] ledger::Error),
    /// No tool is registered under this name; nothing was recorded.
    #[error("no tool named {0} is registered")]
    UnknownTool(String),
    /// A tool with this name is already registered.
    #[error("a tool named {0} is already registered")]
    DuplicateTool(String),
    /// An independent batch's arguments have no `items` array.
    #[error("tool {0}: an independent batch needs an \"items\" array in its arguments")]
    BatchShape(String),
    /// A caller-driven step ([`super::Executor::start`] …) that this tool
    /// does not offer (an independent batch), an attempt whose kind
    /// (read-only or not) is not its tool's, or an attempt reported under
    /// another tool's name; nothing was recorded.
    #[error("tool {0}: not available to caller-driven calls (independent batch), or not this tool's attempt")]
    CallerDriven(String),
    /// The executor's internals failed (a poisoned lock, a panicked task).
    #[error("executor internal error: {0}")]
    Internal(String),
    /// `execute` ran outside a tokio runtime with a timer (one built without
    /// `enable_time()` or `enable_all()`): the timeouts and backoffs of a
    /// call need one. Checked before anything is recorded.
    #[error("the executor needs a tokio runtime with its timer enabled (enable_time() or enable_all()); nothing was recorded")]
    NoTimer,
}

impl From<crate::model::JsonError> for Error {
    fn from(e: crate::model::JsonError) -> Error {
        Error::Ledger(ledger::Error::Json(e))
    }
}

impl From<crate::model::IdError> for Error {
    fn from(e: crate::model::IdError) -> Error {
        Error::Ledger(ledger::Error::Id(e))
    }
}

/// The executor's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
