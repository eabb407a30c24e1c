//! Encryption at rest and the value-free observer, as the bindings see
//! them: `Ledger.open(path, config, key)`, [`encrypt_ledger`],
//! [`rotate_ledger_key`], [`generate_ledger_key`], and the foreign-implementable
//! [`LedgerObserver`] with its [`LedgerEvent`].
//!
//! A key crosses as 32 bytes (`bytes` / `ByteArray` / `Data`). Where apps
//! keep it (Keychain, Android Keystore) is in docs/design.md.

use std::path::Path;
use std::sync::{Arc, Mutex};

use toolledger_core::ledger as core;
use toolledger_core::model::ExecutionId;

use super::error::LedgerError;
use super::execution::ExecutionStatus;
use super::records::LedgerConfig;

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// The key bytes as a core key.
pub(crate) fn key_of(bytes: &[u8]) -> Result<core::LedgerKey> {
    Ok(core::LedgerKey::from_bytes(bytes)?)
}

/// A new random 32-byte key from the operating system's generator (store
/// it in the Keychain / Keystore before opening a ledger with it).
///
/// # Errors
/// `Storage(InvalidKey)` when the system has no random source.
#[uniffi::export]
pub fn generate_ledger_key() -> Result<Vec<u8>> {
    let key = core::LedgerKey::generate()?;
    Ok(key.as_bytes().to_vec())
}

/// Encrypts the plain ledger at `path` under `key`, in place (every value
/// sealed, every digest keyed, no earlier byte of a value left in the file
/// or its WAL). Call it once, before opening the ledger with the key, while
/// no other process has it open.
///
/// # Errors
/// `Storage(InUse)` while another session has it open, `Storage(KeyRequired)`
/// when it is already encrypted, `Storage(InvalidKey)`, storage errors (the
/// ledger is left as it was).
#[uniffi::export]
pub fn encrypt_ledger(path: String, config: LedgerConfig, key: Vec<u8>) -> Result<()> {
    let key = key_of(&key)?;
    Ok(core::Ledger::encrypt_in_place(
        Path::new(&path),
        config.into(),
        &key,
    )?)
}

/// Re-keys the encrypted ledger at `path` from `old_key` to `new_key`: every
/// value is sealed again under a fresh data key, so the old key opens
/// nothing afterwards. Needs the ledger alone, like [`encrypt_ledger`].
///
/// # Errors
/// `Storage(WrongKey)` for a wrong `old_key`, `Storage(InUse)`, storage
/// errors (the ledger stays under the old key).
#[uniffi::export]
pub fn rotate_ledger_key(
    path: String,
    config: LedgerConfig,
    old_key: Vec<u8>,
    new_key: Vec<u8>,
) -> Result<()> {
    let (old, new) = (key_of(&old_key)?, key_of(&new_key)?);
    Ok(core::Ledger::rotate_key(
        Path::new(&path),
        config.into(),
        &old,
        &new,
    )?)
}

/// Why a call failed or ended unknown, as far as the ledger can tell
/// without reading what the tool said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum ReasonKind {
    /// The downstream did not answer in time.
    Timeout,
    /// The tool threw (transport error, a crash in its code).
    ToolError,
    /// The session running the call died.
    OwnerDied,
    /// The session running the call stayed suspended past its lease, and
    /// its process is gone.
    SuspensionLapsed,
    /// The device rebooted while the call ran.
    Rebooted,
    /// A same-key resend was refused while the first request may still land.
    ResendRefused,
    /// A lookup did not find the effect (yet).
    NotFoundDownstream,
    /// A lookup failed.
    LookupFailed,
    /// A human rejected the call.
    Rejected,
    /// A reason the tool or the app gave (read it from `Execution.last_reason`
    /// if you may).
    Reported,
}

impl From<core::ReasonKind> for ReasonKind {
    fn from(k: core::ReasonKind) -> ReasonKind {
        match k {
            core::ReasonKind::Timeout => ReasonKind::Timeout,
            core::ReasonKind::ToolError => ReasonKind::ToolError,
            core::ReasonKind::OwnerDied => ReasonKind::OwnerDied,
            core::ReasonKind::SuspensionLapsed => ReasonKind::SuspensionLapsed,
            core::ReasonKind::Rebooted => ReasonKind::Rebooted,
            core::ReasonKind::ResendRefused => ReasonKind::ResendRefused,
            core::ReasonKind::NotFoundDownstream => ReasonKind::NotFoundDownstream,
            core::ReasonKind::LookupFailed => ReasonKind::LookupFailed,
            core::ReasonKind::Rejected => ReasonKind::Rejected,
            _ => ReasonKind::Reported,
        }
    }
}

/// One committed status move: ids, tool, statuses, attempt, elapsed time
/// and the reason's kind. Never an argument, a result or a reason's text,
/// so it can go to any log.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
// `Display` is the one-line form the ready adapters log.
#[uniffi::export(Display)]
pub struct LedgerEvent {
    /// The execution.
    pub execution_id: ExecutionId,
    /// Its tool.
    pub tool_name: String,
    /// The status before (`None`: the execution was created).
    pub from_status: Option<ExecutionStatus>,
    /// The status after.
    pub to_status: ExecutionStatus,
    /// The attempt number.
    pub attempt: u32,
    /// Milliseconds since the execution was created.
    pub elapsed_ms: u64,
    /// Why, for failures, unknown outcomes and rejections.
    pub reason_kind: Option<ReasonKind>,
    /// The same event as one log line (`<id> tool=… from->to attempt=…
    /// elapsed_ms=… [reason_kind=…]`).
    pub line: String,
}

impl std::fmt::Display for LedgerEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line)
    }
}

impl From<&core::LedgerEvent> for LedgerEvent {
    fn from(e: &core::LedgerEvent) -> LedgerEvent {
        LedgerEvent {
            execution_id: e.execution_id.clone(),
            tool_name: e.tool_name.clone(),
            from_status: e.from.map(Into::into),
            to_status: e.to.into(),
            attempt: e.attempt,
            elapsed_ms: e.elapsed_ms,
            reason_kind: e.reason_kind.map(Into::into),
            line: e.to_string(),
        }
    }
}

/// What an observer that throws produces: nothing of its text (an
/// exception's message may hold anything) crosses into the library.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum ObserverError {
    /// The observer threw; what it threw is not kept.
    #[error("the observer threw")]
    Failed,
}

impl From<uniffi::UnexpectedUniFFICallbackError> for ObserverError {
    fn from(_: uniffi::UnexpectedUniFFICallbackError) -> ObserverError {
        // Without an error type on the method, UniFFI would panic with the
        // foreign exception's text (printed to stderr by the panic hook).
        ObserverError::Failed
    }
}

/// Implemented by the app (or one of the ready adapters: `os.Logger`,
/// `android.util.Log`, `java.util.logging`, Python's `logging`) to hear of
/// every committed status move of a ledger. Called on the thread that made
/// the move, after its commit: keep it short. An exception it throws is
/// ignored (and its text goes nowhere).
#[uniffi::export(with_foreign)]
pub trait LedgerObserver: Send + Sync {
    /// One committed move.
    ///
    /// # Errors
    /// Whatever it throws is dropped: the move is committed regardless.
    fn on_event(&self, event: LedgerEvent) -> Result<(), ObserverError>;
}

/// Every observer of one exported [`Ledger`](super::ledger::Ledger): the one
/// `set_observer` names (slot 0) and those `add_observer` added (slots from
/// 1), so a logging adapter and any number of event streams hear the same
/// moves. Registered with the core only while it has an observer, so a
/// ledger nobody observes collects no events.
#[derive(Default)]
pub(crate) struct Observers {
    state: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    next: u64,
    list: Vec<(u64, Arc<dyn LedgerObserver>)>,
}

impl std::fmt::Debug for Observers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.state.lock().map(|s| s.list.len()).unwrap_or(0);
        f.debug_struct("Observers").field("count", &count).finish()
    }
}

impl Observers {
    fn snapshot(&self) -> Vec<Arc<dyn LedgerObserver>> {
        self.state
            .lock()
            .map(|s| s.list.iter().map(|(_, o)| o.clone()).collect())
            .unwrap_or_default()
    }
}

fn poisoned() -> LedgerError {
    LedgerError::Internal {
        message: "the observer list's lock is poisoned".into(),
    }
}

/// The core's one observer, fanning out to [`Observers`].
struct Fanout(Arc<Observers>);

impl core::LedgerObserver for Fanout {
    fn on_event(&self, event: &core::LedgerEvent) {
        // The list is copied first: an observer may add or remove observers.
        let observers = self.0.snapshot();
        if observers.is_empty() {
            return;
        }
        let event = LedgerEvent::from(event);
        for observer in observers {
            // A foreign observer that throws must not take the ledger's
            // caller (or the other observers) down with it: the move is
            // committed whatever it does.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _ = observer.on_event(event.clone());
            }));
        }
    }
}

/// Puts `observer` in `slot` (a new slot for `None`), or empties the slot
/// for no observer, and registers the fan-out with the core while any
/// observer is left (unregisters it otherwise). Returns the slot.
///
/// The core is told under the list's lock, so two concurrent calls cannot
/// leave observers listed with the fan-out unregistered. (The fan-out takes
/// the same lock only while the core delivers events, which it does
/// outside its own locks.)
pub(crate) fn put_observer(
    ledger: &core::Ledger,
    observers: &Arc<Observers>,
    slot: Option<u64>,
    observer: Option<Arc<dyn LedgerObserver>>,
) -> Result<u64> {
    let mut state = observers.state.lock().map_err(|_| poisoned())?;
    let slot = match slot {
        Some(slot) => slot,
        None => {
            state.next += 1;
            state.next
        }
    };
    state.list.retain(|(s, _)| *s != slot);
    if let Some(o) = observer {
        state.list.push((slot, o));
    }
    let sink = (!state.list.is_empty())
        .then(|| Arc::new(Fanout(observers.clone())) as Arc<dyn core::LedgerObserver>);
    ledger.set_observer(sink)?;
    Ok(slot)
}

/// The slot of the observer `set_observer` names (`add_observer` never
/// hands it out).
pub(crate) const PRIMARY_SLOT: u64 = 0;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Ledger;
    use crate::records::{Begin, CallSpec, Provider, ToolCall};

    /// Keeps the statuses it hears, as names.
    #[derive(Default)]
    struct Heard(Mutex<Vec<String>>);

    impl LedgerObserver for Heard {
        fn on_event(&self, event: LedgerEvent) -> Result<(), ObserverError> {
            let mut heard = self.0.lock().map_err(|_| ObserverError::Failed)?;
            heard.push(format!("{:?}", event.to_status));
            Ok(())
        }
    }

    impl Heard {
        fn count(&self) -> usize {
            self.0.lock().unwrap().len()
        }
    }

    struct Throws;

    impl LedgerObserver for Throws {
        fn on_event(&self, _: LedgerEvent) -> Result<(), ObserverError> {
            Err(ObserverError::Failed)
        }
    }

    fn run_one(ledger: &Ledger, call_id: &str) {
        let spec = CallSpec {
            call: ToolCall {
                provider: Provider::Custom,
                call_id: call_id.into(),
                tool_name: "send".into(),
                arguments: "{}".into(),
                position: 0,
                call_id_derived: false,
            },
            tool_version: 1,
            requires_approval: false,
            idempotency_key: false,
            lookup: false,
            key_lifetime_ms: None,
        };
        match ledger
            .begin(
                toolledger_core::model::OperationId::new("op").unwrap(),
                0,
                spec,
            )
            .unwrap()
        {
            Begin::Execute { ticket } => {
                ledger.commit(ticket, "{}".into(), None).unwrap();
            }
            other => panic!("expected Execute, got {other:?}"),
        }
    }

    #[test]
    fn every_observer_hears_every_move_until_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db").to_string_lossy().into_owned();
        let config = LedgerConfig::for_tests();
        let ledger = Ledger::open(path, config, None).unwrap();
        let (primary, first, second) = (
            Arc::new(Heard::default()),
            Arc::new(Heard::default()),
            Arc::new(Heard::default()),
        );
        ledger.set_observer(Some(primary.clone())).unwrap();
        // A throwing observer keeps nobody else from hearing.
        ledger.add_observer(Arc::new(Throws)).unwrap();
        let t1 = ledger.add_observer(first.clone()).unwrap();
        let t2 = ledger.add_observer(second.clone()).unwrap();
        assert_ne!(t1, t2);
        assert_ne!(t1, PRIMARY_SLOT);

        run_one(&ledger, "c1");
        // Created `executing`, then `committed`.
        let expected = vec!["Executing".to_string(), "Committed".to_string()];
        assert_eq!(*primary.0.lock().unwrap(), expected);
        assert_eq!(*first.0.lock().unwrap(), expected);
        assert_eq!(*second.0.lock().unwrap(), expected);

        ledger.remove_observer(t1).unwrap();
        // Slot 0 is not a token: removing it leaves set_observer's in place.
        ledger.remove_observer(PRIMARY_SLOT).unwrap();
        run_one(&ledger, "c2");
        assert_eq!(first.count(), 2, "a removed observer hears nothing more");
        assert_eq!(second.count(), 4);
        assert_eq!(primary.count(), 4);

        // Replacing set_observer's observer leaves the added ones.
        ledger.set_observer(None).unwrap();
        run_one(&ledger, "c3");
        assert_eq!(primary.count(), 4);
        assert_eq!(second.count(), 6);
    }
}
