//! Ledger errors: the domain refusals plus the storage and input failures
//! below them. No message carries argument or result values.

use crate::model::{
    ArgsDigest, ExecutionId, ExecutionStatus, IdError, InvalidTransition, JsonError, Transition,
};
use crate::store;

/// A ledger operation failed; nothing it would have written was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Storage failed (disk full, locked, corrupt, newer schema …).
    #[error(transparent)]
    Store(#[from] store::Error),
    /// The arguments or a result are not acceptable JSON.
    #[error("invalid JSON: {0}")]
    Json(#[from] JsonError),
    /// An identifier is empty, too long or malformed.
    #[error("invalid identifier: {0}")]
    Id(#[from] IdError),
    /// No execution has this id.
    #[error("no execution {0}")]
    NotFound(ExecutionId),
    /// The execution is not in a status that allows this move.
    #[error("execution {execution_id}: {transition:?} is not allowed from {from}")]
    InvalidTransition {
        /// The execution.
        execution_id: ExecutionId,
        /// Its current status.
        from: ExecutionStatus,
        /// The refused move.
        transition: Transition,
    },
    /// An approval (or other digest-bound step) named different arguments
    /// than the ones recorded.
    #[error("execution {execution_id}: digest {given} does not match the recorded {stored}")]
    DigestMismatch {
        /// The execution.
        execution_id: ExecutionId,
        /// Digest of the recorded arguments.
        stored: ArgsDigest,
        /// Digest that was supplied.
        given: ArgsDigest,
    },
    /// A different result or external id was offered for an execution that
    /// already committed; the stored one stands.
    #[error("execution {0} already committed with a different result")]
    AlreadyCommitted(ExecutionId),
    /// A step named an attempt that is no longer the execution's current one
    /// (another attempt started after it, or it belongs to another session).
    /// Nothing of the execution changed; what the step carried (a result, an
    /// external id, a reason) is kept as evidence.
    #[error("execution {execution_id}: attempt {attempt} is stale (the execution is at attempt {current_attempt}, {status})")]
    StaleAttempt {
        /// The execution.
        execution_id: ExecutionId,
        /// The attempt the step named.
        attempt: u32,
        /// The execution's current attempt.
        current_attempt: u32,
        /// The execution's current status.
        status: ExecutionStatus,
    },
    /// A step named an attempt the execution never had (0, or beyond its
    /// current attempt): not a token the ledger handed out. Nothing changed.
    #[error("execution {execution_id} has no attempt {attempt} (its current attempt is {current_attempt})")]
    NoSuchAttempt {
        /// The execution.
        execution_id: ExecutionId,
        /// The attempt the step named.
        attempt: u32,
        /// The execution's current attempt.
        current_attempt: u32,
    },
    /// The execution's operation was cancelled: no attempt starts in it.
    #[error("execution {0}: its operation was cancelled; nothing starts in it")]
    OperationCancelled(ExecutionId),
    /// A compensation was asked for an execution that never committed.
    #[error("execution {0} has not committed: there is nothing to compensate")]
    NothingToCompensate(ExecutionId),
    /// A webhook event (`source`, event id) already processed for another
    /// execution was named for this one: not a repeat to ignore (that would
    /// drop this execution's update). Nothing was recorded.
    #[error("execution {execution_id}: this webhook event was processed for execution {event_execution_id}")]
    WebhookEventOfAnotherExecution {
        /// The execution the event was named for.
        execution_id: ExecutionId,
        /// The execution it was processed for.
        event_execution_id: ExecutionId,
    },
    /// An internal invariant did not hold (a bug, reported instead of a panic).
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// The session lock directory could not be used.
    #[error("session lock: {0}")]
    Session(String),
}

impl Error {
    pub(crate) fn transition(id: &ExecutionId, refused: InvalidTransition) -> Error {
        Error::InvalidTransition {
            execution_id: id.clone(),
            from: refused.from,
            transition: refused.transition,
        }
    }
}

/// The ledger's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
