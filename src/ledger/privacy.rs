//! What the ledger lets out, and what it keeps in: encryption at rest with
//! an app-held key, and an observer that hears of every status move without
//! ever seeing a value.
//!
//! # Encryption
//!
//! [`Ledger::open_with`] with a [`LedgerKey`] opens (or creates) an
//! encrypted ledger: arguments, results, previews, external ids, reasons and
//! job ids are sealed value by value (XChaCha20-Poly1305, bound to their row
//! and column), and argument digests are keyed (HMAC-SHA-256). A wrong key
//! is [`StorageError::WrongKey`] before anything is written.
//! [`Ledger::encrypt_in_place`] encrypts a plain ledger; [`Ledger::rotate_key`]
//! re-keys an encrypted one. Both need the ledger alone (no other live
//! session: [`StorageError::InUse`]). docs/design.md says why values and not
//! pages.
//!
//! # Observing
//!
//! [`Ledger::set_observer`] registers a [`LedgerObserver`]; it hears of each
//! committed move as a [`LedgerEvent`]: ids, tool, statuses, attempt,
//! elapsed time and a [`ReasonKind`] (why a call failed or ended unknown),
//! never an argument, a result or a reason's text.

use std::path::Path;
use std::sync::Arc;

use super::{Error, Ledger, LedgerConfig, Result};
use crate::model::{ExecutionId, ExecutionStatus};
use crate::store::{self, EventSink, MoveEvent};

pub use crate::store::LedgerKey;

/// Why a call moved to a failure or an unknown outcome, as far as the
/// ledger can tell without reading what the tool said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReasonKind {
    /// The downstream did not answer in time.
    Timeout,
    /// The tool threw (transport error, a crash in its code).
    ToolError,
    /// The session running the call died (its lock was released).
    OwnerDied,
    /// The session running the call was suspended past its lease, and its
    /// process is gone.
    SuspensionLapsed,
    /// The machine rebooted while the call ran.
    Rebooted,
    /// A same-key resend was refused while the first request may still land.
    ResendRefused,
    /// A lookup did not find the effect (yet).
    NotFoundDownstream,
    /// A lookup failed.
    LookupFailed,
    /// A human rejected the call.
    Rejected,
    /// The reason the tool (or the app) gave, not classified here.
    Reported,
}

impl ReasonKind {
    /// Classifies a reason text (the ledger's and the executor's own
    /// phrases; anything else is what a tool or app reported).
    pub fn of(reason: &str, to: ExecutionStatus) -> ReasonKind {
        let r = reason;
        if r.starts_with("timed out") {
            ReasonKind::Timeout
        } else if r.starts_with("tool error") {
            ReasonKind::ToolError
        } else if r == super::owners::DEAD_LOCK_RELEASED {
            ReasonKind::OwnerDied
        } else if r == super::owners::DEAD_SUSPENSION_LAPSED {
            ReasonKind::SuspensionLapsed
        } else if r == super::owners::DEAD_REBOOTED {
            ReasonKind::Rebooted
        } else if r.contains("resend refused") {
            ReasonKind::ResendRefused
        } else if r.starts_with("not found downstream") {
            ReasonKind::NotFoundDownstream
        } else if r.starts_with("lookup failed") {
            ReasonKind::LookupFailed
        } else if to == ExecutionStatus::Rejected {
            ReasonKind::Rejected
        } else {
            ReasonKind::Reported
        }
    }

    /// A stable snake_case name (for log lines).
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonKind::Timeout => "timeout",
            ReasonKind::ToolError => "tool_error",
            ReasonKind::OwnerDied => "owner_died",
            ReasonKind::SuspensionLapsed => "suspension_lapsed",
            ReasonKind::Rebooted => "rebooted",
            ReasonKind::ResendRefused => "resend_refused",
            ReasonKind::NotFoundDownstream => "not_found_downstream",
            ReasonKind::LookupFailed => "lookup_failed",
            ReasonKind::Rejected => "rejected",
            ReasonKind::Reported => "reported",
        }
    }
}

/// One committed status move, as an observer sees it: never a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEvent {
    /// The execution.
    pub execution_id: ExecutionId,
    /// Its tool.
    pub tool_name: String,
    /// The status before (`None`: the execution was created).
    pub from: Option<ExecutionStatus>,
    /// The status after.
    pub to: ExecutionStatus,
    /// The attempt number.
    pub attempt: u32,
    /// Milliseconds (wall clock) since the execution was created.
    pub elapsed_ms: u64,
    /// Why, for a move with a reason (failures, unknown outcomes,
    /// rejections).
    pub reason_kind: Option<ReasonKind>,
}

impl std::fmt::Display for LedgerEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} tool={} {}->{} attempt={} elapsed_ms={}",
            self.execution_id,
            self.tool_name,
            self.from.map_or("none", ExecutionStatus::as_str),
            self.to.as_str(),
            self.attempt,
            self.elapsed_ms
        )?;
        if let Some(kind) = self.reason_kind {
            write!(f, " reason_kind={}", kind.as_str())?;
        }
        Ok(())
    }
}

impl From<MoveEvent> for LedgerEvent {
    fn from(e: MoveEvent) -> LedgerEvent {
        let reason_kind = e.reason.as_deref().map(|r| ReasonKind::of(r, e.to));
        LedgerEvent {
            execution_id: e.execution_id,
            tool_name: e.tool_name,
            from: e.from,
            to: e.to,
            attempt: e.attempt,
            elapsed_ms: u64::try_from(e.elapsed_ms).unwrap_or(0),
            reason_kind,
        }
    }
}

/// Hears of every committed status move of a ledger (after the commit,
/// outside the ledger's locks: it may call the ledger). Must not block for
/// long: it runs on the thread that made the move. A panic in `on_event` is
/// caught and ignored (the move stands and the caller gets its answer).
pub trait LedgerObserver: Send + Sync {
    /// One committed move.
    fn on_event(&self, event: &LedgerEvent);
}

struct Sink(Arc<dyn LedgerObserver>);

impl EventSink for Sink {
    fn moved(&self, events: Vec<MoveEvent>) {
        for event in events {
            let event = LedgerEvent::from(event);
            // The write has committed; the caller must get its answer (an
            // attempt it does not hear of is run by nobody). A panicking
            // observer is ignored, as a throwing one is: it hears the next
            // event all the same.
            let observer = &self.0;
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                observer.on_event(&event);
            }));
        }
    }
}

impl Ledger {
    /// Opens the ledger at `path` with an injected clock and, for an
    /// encrypted ledger, its key. A new (empty) ledger opened with a key is
    /// encrypted under it.
    ///
    /// # Errors
    /// As [`Ledger::open`]; [`StorageError::WrongKey`],
    /// [`StorageError::KeyRequired`] (an encrypted ledger without key),
    /// [`StorageError::NotEncrypted`] (a key for a plain ledger with records:
    /// use [`Ledger::encrypt_in_place`]); nothing is written then.
    pub fn open_with(
        path: &Path,
        config: LedgerConfig,
        clock: Arc<dyn super::Clock>,
        key: Option<&LedgerKey>,
    ) -> Result<Ledger> {
        let store = store::Store::open(
            path,
            store::StoreOptions {
                busy_timeout: config.busy_timeout,
                vfs: config.sqlite_vfs.clone(),
            },
            key,
        )?;
        Ledger::with_store(store, config, clock)
    }

    /// [`Ledger::open_with`] with the system clock.
    ///
    /// # Errors
    /// As [`Ledger::open_with`].
    pub fn open_encrypted(path: &Path, config: LedgerConfig, key: &LedgerKey) -> Result<Ledger> {
        Ledger::open_with(path, config, Arc::new(super::SystemClock), Some(key))
    }

    /// True when the ledger is encrypted.
    pub fn is_encrypted(&self) -> bool {
        self.store.is_encrypted()
    }

    /// Encrypts the plain ledger at `path` under `key`, in place: every
    /// value is sealed and every digest keyed in one transaction, and no
    /// earlier byte of a value stays in the database or its WAL.
    ///
    /// # Errors
    /// [`StorageError::InUse`] while another session has it open;
    /// [`StorageError::KeyRequired`] when it is already encrypted; storage
    /// errors (the ledger stays as it was), except
    /// [`StorageError::NotScrubbed`]: it is encrypted under `key` and only
    /// the scrub of earlier bytes did not finish.
    pub fn encrypt_in_place(path: &Path, config: LedgerConfig, key: &LedgerKey) -> Result<()> {
        let ledger = Ledger::open_with(path, config, Arc::new(super::SystemClock), None)?;
        ledger.reseal_alone(key)
    }

    /// Re-keys the encrypted ledger at `path` from `old` to `new`: the keys
    /// are wrapped under `new` and every value is sealed again under a fresh
    /// data key (the old key opens nothing afterwards). Argument digests keep
    /// their key, so replays and tombstones still match.
    ///
    /// # Errors
    /// [`StorageError::WrongKey`] for a wrong `old`; [`StorageError::InUse`];
    /// storage errors (the ledger stays under `old`), except
    /// [`StorageError::NotScrubbed`]: the re-key committed (the ledger is
    /// under `new`) and only the scrub of earlier bytes did not finish.
    pub fn rotate_key(
        path: &Path,
        config: LedgerConfig,
        old: &LedgerKey,
        new: &LedgerKey,
    ) -> Result<()> {
        let ledger = Ledger::open_with(path, config, Arc::new(super::SystemClock), Some(old))?;
        ledger.reseal_alone(new)
    }

    fn reseal_alone(&self, key: &LedgerKey) -> Result<()> {
        let mono = self.clock.monotonic();
        let others_alive = self.read(|dao| Ok(self.others_alive(dao, &mono)?))?;
        if others_alive {
            return Err(Error::Store(store::Error::InUse));
        }
        self.settle_deliveries()?;
        Ok(self.store.reseal(key)?)
    }

    /// Registers (or with `None`, removes) the observer of status moves.
    ///
    /// # Errors
    /// [`StorageError::LockPoisoned`].
    pub fn set_observer(&self, observer: Option<Arc<dyn LedgerObserver>>) -> Result<()> {
        let sink = observer.map(|o| Arc::new(Sink(o)) as Arc<dyn EventSink>);
        Ok(self.store.set_sink(sink)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_classified_without_their_text() {
        use ExecutionStatus::{FailedBeforeCommit, OutcomeUnknown, Rejected};
        let cases = [
            (
                "timed out waiting for the downstream",
                OutcomeUnknown,
                ReasonKind::Timeout,
            ),
            (
                "tool error: boom 4111-1111",
                OutcomeUnknown,
                ReasonKind::ToolError,
            ),
            (
                super::super::owners::DEAD_LOCK_RELEASED,
                OutcomeUnknown,
                ReasonKind::OwnerDied,
            ),
            (
                "resend refused (busy); the earlier request may still land",
                OutcomeUnknown,
                ReasonKind::ResendRefused,
            ),
            ("card declined", FailedBeforeCommit, ReasonKind::Reported),
            ("no", Rejected, ReasonKind::Rejected),
        ];
        for (reason, to, kind) in cases {
            assert_eq!(ReasonKind::of(reason, to), kind, "{reason}");
        }
    }
}
