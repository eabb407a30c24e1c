//! The one public error of the bindings, [`LedgerError`], and the single
//! `match` that turns every core error into it.
//!
//! Only the cases an app acts on get their own variant: fix the input
//! (`InvalidInput`), look elsewhere (`NotFound`), refresh its view
//! (`InvalidTransition`, `DigestMismatch`, `AlreadyCommitted`,
//! `StaleAttempt`), stop (`OperationCancelled`), tell the user about the
//! device (`Storage`), register the tool (`UnknownTool`), call `resume()`
//! (`Suspended`) or report a bug (`Internal`). Messages come from
//! the core's `Display`, which never carries argument or result values.

use toolledger_core::executor;
use toolledger_core::ledger;
use toolledger_core::ledger::StorageError;
use toolledger_core::model::{IdError, JsonError};
use toolledger_core::provider::ProviderError;

use super::execution::ExecutionStatus;

/// Why a storage operation failed, as far as an app can act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum StorageKind {
    /// The disk is full; nothing was written. Free space and retry.
    DiskFull,
    /// Another connection held the database lock past the busy timeout. Retry later.
    Busy,
    /// SQLite found the file corrupt. The file is left untouched.
    Corrupt,
    /// The file is not a toolledger (SQLite) database. It is left untouched.
    NotADatabase,
    /// The file was written by a newer toolledger; this build cannot read it.
    IncompatibleVersion,
    /// The file or its directory is read-only.
    ReadOnly,
    /// The file could not be opened (missing directory, permissions).
    CannotOpen,
    /// The session lock files next to the database could not be used.
    SessionLock,
    /// Another database is at the ledger's path now (the file was replaced
    /// while the ledger was suspended). Nothing was written.
    DatabaseReplaced,
    /// Another SQLite library in this process opened and closed the ledger
    /// file; the last write may be lost (the connection was reopened). Never
    /// open the ledger file yourself: use the ledger's backup/export.
    ForeignConnection,
    /// The key does not open this encrypted ledger. Nothing was written.
    WrongKey,
    /// The ledger is encrypted and was opened without a key.
    KeyRequired,
    /// A key was given for a plain ledger that holds records: encrypt it
    /// first (`encrypt_ledger`).
    NotEncrypted,
    /// A stored value failed authentication: altered, moved from another
    /// row, or written under another key.
    Undecryptable,
    /// Another session has the ledger open (encrypting and re-keying need it
    /// alone). Nothing was written.
    InUse,
    /// A key that is not 32 bytes.
    InvalidKey,
    /// The disk reported an I/O error (a failed read, write or sync). A
    /// write that failed this way may be in the ledger without being known
    /// durable; before its next write the ledger writes its log again, and
    /// refuses writes with this kind while the disk keeps failing. Nothing
    /// is sent on the strength of an intent that is not durable.
    Io,
    /// Encrypting in place or re-keying committed: the ledger is now under
    /// the new key (keep it; the old one opens nothing). Only the scrub of
    /// earlier bytes from free pages and the log did not finish (a reader
    /// held a snapshot, for example): re-key again later with the new key
    /// as both old and new to scrub.
    NotScrubbed,
    /// The ledger is open in this process's parent, before `fork()`: its
    /// copy cannot be used here (a SQLite connection cannot cross a fork,
    /// and the session is the parent's), nor can the file be opened again
    /// here. Nothing was read or written. Start the worker with `exec` (a
    /// `spawn` start method) and open the ledger there.
    Forked,
    /// Any other storage failure (invalid stored data, a schema guard, SQLite).
    Other,
}

/// The error of every fallible exported function and method.
#[derive(Debug, thiserror::Error, uniffi::Error)]
pub enum LedgerError {
    /// Bad input from the app: JSON that is not strict JSON or exceeds the
    /// limits, an empty or malformed identifier, a malformed provider
    /// response, a tool registered twice. Nothing was recorded.
    #[error("invalid input: {message}")]
    InvalidInput {
        /// What was wrong (never the input's values).
        message: String,
    },
    /// No execution has this id.
    #[error("no execution {execution_id}")]
    NotFound {
        /// The id that was asked for.
        execution_id: String,
    },
    /// The execution's status does not allow this step (e.g. approving a call
    /// that already ran). Read it again with `get` to see where it stands.
    #[error("execution {execution_id}: {transition} is not allowed from {from_status:?}")]
    InvalidTransition {
        /// The execution.
        execution_id: String,
        /// Its current status.
        from_status: ExecutionStatus,
        /// The refused step (`approve`, `start`, `commit`, `compensate` …).
        transition: String,
    },
    /// An approval (or rejection) named other arguments than the recorded
    /// ones: the user did not see what would run. Nothing was unlocked.
    #[error("execution {execution_id}: digest {given} does not match the recorded {stored}")]
    DigestMismatch {
        /// The execution.
        execution_id: String,
        /// Digest of the recorded arguments.
        stored: String,
        /// Digest that was supplied.
        given: String,
    },
    /// A different result or external id was offered for an execution that
    /// already has one; the stored one stands.
    #[error("execution {execution_id} already committed with a different result")]
    AlreadyCommitted {
        /// The execution.
        execution_id: String,
    },
    /// The database could not be used. Nothing was written — except for
    /// `ForeignConnection`, where the last write may have been lost.
    #[error("storage ({kind:?}): {message}")]
    Storage {
        /// What kind of failure.
        kind: StorageKind,
        /// A description (no argument or result values).
        message: String,
    },
    /// No tool with this name is registered with the executor; nothing was
    /// recorded or run.
    #[error("no tool named {name} is registered")]
    UnknownTool {
        /// The tool name the call asked for.
        name: String,
    },
    /// The step named an attempt that another attempt has superseded (its
    /// owner was found gone and the call was taken over). Nothing of the
    /// execution changed; what the step carried is kept as evidence. Read
    /// the execution again with `get` to see where it stands.
    #[error("execution {execution_id}: attempt {attempt} is stale (now at attempt {current_attempt}, {status:?})")]
    StaleAttempt {
        /// The execution.
        execution_id: String,
        /// The attempt the step named.
        attempt: u32,
        /// The execution's current attempt.
        current_attempt: u32,
        /// Its current status.
        status: ExecutionStatus,
    },
    /// The execution's operation was cancelled: nothing starts in it.
    #[error("execution {execution_id}: its operation was cancelled")]
    OperationCancelled {
        /// The execution.
        execution_id: String,
    },
    /// The ledger is suspended (`suspend()`); call `resume()` first.
    #[error("the ledger is suspended; call resume() first")]
    Suspended,
    /// A bug or an internal failure (a poisoned lock, a failed task).
    #[error("internal error: {message}")]
    Internal {
        /// A description.
        message: String,
    },
}

impl LedgerError {
    fn invalid(message: impl std::fmt::Display) -> LedgerError {
        LedgerError::InvalidInput {
            message: message.to_string(),
        }
    }
}

impl From<StorageError> for LedgerError {
    fn from(e: StorageError) -> LedgerError {
        use StorageError as S;
        let kind = match &e {
            S::Suspended => return LedgerError::Suspended,
            S::LockPoisoned | S::TransactionEnded => {
                return LedgerError::Internal {
                    message: e.to_string(),
                }
            }
            S::DiskFull => StorageKind::DiskFull,
            S::Busy => StorageKind::Busy,
            S::Corrupt => StorageKind::Corrupt,
            S::NotADatabase => StorageKind::NotADatabase,
            S::IncompatibleVersion { .. } | S::OlderSchema { .. } => {
                StorageKind::IncompatibleVersion
            }
            S::ReadOnly => StorageKind::ReadOnly,
            S::CannotOpen | S::MultipleLinks { .. } => StorageKind::CannotOpen,
            S::DatabaseReplaced | S::ForeignWal => StorageKind::DatabaseReplaced,
            S::ForeignConnection => StorageKind::ForeignConnection,
            S::WrongKey => StorageKind::WrongKey,
            S::KeyRequired => StorageKind::KeyRequired,
            S::NotEncrypted => StorageKind::NotEncrypted,
            S::Undecryptable => StorageKind::Undecryptable,
            S::InUse => StorageKind::InUse,
            S::InvalidKey => StorageKind::InvalidKey,
            S::Io(_) | S::NotDurable(_) => StorageKind::Io,
            S::NotScrubbed(_) => StorageKind::NotScrubbed,
            S::Forked => StorageKind::Forked,
            // Every other storage failure (the core's enum may grow).
            _ => StorageKind::Other,
        };
        LedgerError::Storage {
            kind,
            message: e.to_string(),
        }
    }
}

impl From<ledger::Error> for LedgerError {
    fn from(e: ledger::Error) -> LedgerError {
        use ledger::Error as L;
        match e {
            L::Store(s) => s.into(),
            L::Json(_) | L::Id(_) | L::NoSuchAttempt { .. } => LedgerError::invalid(&e),
            L::NotFound(id) => LedgerError::NotFound {
                execution_id: id.to_string(),
            },
            L::InvalidTransition {
                execution_id,
                from,
                transition,
            } => LedgerError::InvalidTransition {
                execution_id: execution_id.to_string(),
                from_status: from.into(),
                transition: transition.as_str().to_owned(),
            },
            L::DigestMismatch {
                execution_id,
                stored,
                given,
            } => LedgerError::DigestMismatch {
                execution_id: execution_id.to_string(),
                stored: stored.to_string(),
                given: given.to_string(),
            },
            L::AlreadyCommitted(id) => LedgerError::AlreadyCommitted {
                execution_id: id.to_string(),
            },
            L::StaleAttempt {
                execution_id,
                attempt,
                current_attempt,
                status,
            } => LedgerError::StaleAttempt {
                execution_id: execution_id.to_string(),
                attempt,
                current_attempt,
                status: status.into(),
            },
            L::OperationCancelled(id) => LedgerError::OperationCancelled {
                execution_id: id.to_string(),
            },
            // A refusal of the caller's request that names no status the app
            // could act on differently: bad input.
            L::NothingToCompensate(_) | L::WebhookEventOfAnotherExecution { .. } => {
                LedgerError::invalid(&e)
            }
            L::Internal(message) => LedgerError::Internal {
                message: message.to_owned(),
            },
            L::Session(_) => LedgerError::Storage {
                kind: StorageKind::SessionLock,
                message: e.to_string(),
            },
            // A refusal added to the core later than this mapping.
            other => LedgerError::Internal {
                message: other.to_string(),
            },
        }
    }
}

impl From<executor::Error> for LedgerError {
    fn from(e: executor::Error) -> LedgerError {
        use executor::Error as X;
        match e {
            X::Ledger(l) => l.into(),
            X::UnknownTool(name) => LedgerError::UnknownTool { name },
            X::DuplicateTool(_) | X::BatchShape(_) | X::CallerDriven(_) => LedgerError::invalid(&e),
            X::Internal(message) => LedgerError::Internal { message },
            other => LedgerError::Internal {
                message: other.to_string(),
            },
        }
    }
}

impl From<IdError> for LedgerError {
    fn from(e: IdError) -> LedgerError {
        LedgerError::invalid(e)
    }
}

impl From<JsonError> for LedgerError {
    fn from(e: JsonError) -> LedgerError {
        LedgerError::invalid(e)
    }
}

impl From<ProviderError> for LedgerError {
    fn from(e: ProviderError) -> LedgerError {
        LedgerError::invalid(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolledger_core::model::ExecutionId;

    #[test]
    fn storage_errors_keep_their_kind() {
        let e: LedgerError = ledger::Error::Store(StorageError::NotADatabase).into();
        assert!(matches!(
            e,
            LedgerError::Storage {
                kind: StorageKind::NotADatabase,
                ..
            }
        ));
        let e: LedgerError = StorageError::Suspended.into();
        assert!(matches!(e, LedgerError::Suspended));
    }

    #[test]
    fn domain_errors_keep_their_fields() {
        let id = ExecutionId::parse("op:round_0:c:t:v1").unwrap();
        let e: LedgerError = executor::Error::Ledger(ledger::Error::InvalidTransition {
            execution_id: id,
            from: toolledger_core::model::ExecutionStatus::Committed,
            transition: toolledger_core::model::Transition::Approve,
        })
        .into();
        match e {
            LedgerError::InvalidTransition {
                execution_id,
                from_status,
                transition,
            } => {
                assert_eq!(execution_id, "op:round_0:c:t:v1");
                assert_eq!(from_status, ExecutionStatus::Committed);
                assert_eq!(transition, "approve");
            }
            other => panic!("{other:?}"),
        }
    }
}
