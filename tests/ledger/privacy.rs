//! Privacy by construction: files readable by their owner only whatever the
//! umask, and a canary planted in arguments, results, previews, external ids
//! and a tool's exception text that shows up in no printed value, no error
//! message and no observer event (which still says why a call ended
//! unknown).

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use toolledger_test_support as support;

use support::{op, spec};
use toolledger::executor::{
    CallOutcome, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};
use toolledger::ledger::{
    Begin, Ledger, LedgerConfig, LedgerEvent, LedgerKey, LedgerObserver, ManualClock, ReasonKind,
};
use toolledger::model::{ExecutionStatus, Provider, ToolCall};

const CANARY: &str = "CANARY-91d2-5555-4444";

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn sidecar(db: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(suffix);
    name.into()
}

#[cfg(unix)]
#[test]
fn every_file_of_a_ledger_is_the_owners_only_whatever_the_umask() {
    // The usual desktop umask: files would be 0644, directories 0755.
    // SAFETY: umask only sets the process's file-creation mask.
    let previous = unsafe { libc::umask(0o022) };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    for key in [None, Some(LedgerKey::generate().unwrap())] {
        let _ = std::fs::remove_file(&db);
        let ledger = Ledger::open_with(
            &db,
            LedgerConfig::default(),
            Arc::new(ManualClock::new(1_000_000)),
            key.as_ref(),
        )
        .unwrap();
        let Begin::Execute(t) = ledger.begin(&op("op"), 0, &spec("c", "pay", "{}")).unwrap() else {
            panic!()
        };
        ledger.commit(&t.attempt_id(), "{}", None).unwrap();
        assert_eq!(mode(&db), 0o600, "database");
        assert_eq!(mode(&sidecar(&db, "-wal")), 0o600, "WAL");
        assert_eq!(mode(&sidecar(&db, "-shm")), 0o600, "shared-memory index");
        let sessions = sidecar(&db, "-sessions");
        assert_eq!(mode(&sessions), 0o700, "sessions directory");
        let locks: Vec<_> = std::fs::read_dir(&sessions)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!locks.is_empty());
        for lock in &locks {
            assert_eq!(mode(lock), 0o600, "lock file {lock:?}");
        }
        drop(ledger);
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(sidecar(&db, suffix));
        }
    }
    // A database an older build left world-readable is tightened at open.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    drop(Ledger::open(&db, LedgerConfig::default()));
    assert_eq!(mode(&db), 0o600);
    // Files written beside a ledger (the CLI's exports).
    let export = dir.path().join("export.jsonl");
    drop(toolledger::ledger::private_file(&export).unwrap());
    assert_eq!(mode(&export), 0o600);
    let nested = dir.path().join("a/b");
    toolledger::ledger::private_dir(&nested).unwrap();
    assert_eq!(mode(&nested), 0o700);
    unsafe { libc::umask(previous) };
}

/// A tool whose arguments, result, external id and exception text carry the
/// canary.
struct Tool {
    fail: bool,
}

#[async_trait]
impl ToolHandler for Tool {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::side_effect(if self.fail { "transfer" } else { "pay" }, 1)
    }

    async fn perform(&self, request: ToolRequest) -> Result<PerformOutcome, ToolError> {
        assert!(request.arguments_json.contains(CANARY));
        if self.fail {
            return Err(ToolError::new(format!("connection reset sending {CANARY}")));
        }
        Ok(PerformOutcome::Committed {
            result_json: format!(r#"{{"receipt":"{CANARY}"}}"#),
            external_id: Some(format!("ext-{CANARY}")),
        })
    }

    fn approval_preview(&self, _arguments_json: &str) -> Option<String> {
        Some(format!(r#"{{"to":"{CANARY}"}}"#))
    }
}

#[derive(Default)]
struct Recorder(Mutex<Vec<LedgerEvent>>);

impl LedgerObserver for Recorder {
    fn on_event(&self, event: &LedgerEvent) {
        self.0.lock().unwrap().push(event.clone());
    }
}

fn call(id: &str, tool: &str) -> ToolCall {
    ToolCall {
        provider: Provider::Custom,
        call_id: id.into(),
        call_id_derived: false,
        tool_name: tool.into(),
        arguments: format!(r#"{{"iban":"{CANARY}"}}"#),
        position: 0,
    }
}

#[tokio::test]
async fn the_canary_is_in_no_printed_value_error_or_event_and_the_hook_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let key = LedgerKey::generate().unwrap();
    let ledger = Arc::new(
        Ledger::open_with(
            &db,
            LedgerConfig::default(),
            Arc::new(ManualClock::new(1_000_000)),
            Some(&key),
        )
        .unwrap(),
    );
    let recorder = Arc::new(Recorder::default());
    ledger.set_observer(Some(recorder.clone())).unwrap();
    let executor = Executor::new(
        ledger.clone(),
        ExecutorConfig {
            max_attempts: 1,
            ..ExecutorConfig::default()
        },
    );
    executor.register(Arc::new(Tool { fail: false })).unwrap();
    executor.register(Arc::new(Tool { fail: true })).unwrap();

    let mut printed = Vec::new();
    let done = executor
        .execute(&op("op"), 0, call("c1", "pay"))
        .await
        .unwrap();
    let unknown = executor
        .execute(&op("op"), 0, call("c2", "transfer"))
        .await
        .unwrap();
    assert!(matches!(done, CallOutcome::Completed { .. }));
    let CallOutcome::Unknown { ref reason, .. } = unknown else {
        panic!("a throwing side-effecting tool is an unknown outcome: {unknown:?}")
    };
    // Reachable explicitly: the app may read what its tool said.
    assert!(reason.contains(CANARY));
    printed.push(format!("{done:?} {unknown:?}"));
    for rec in ledger.list(&op("op")).unwrap() {
        printed.push(format!("{rec:?}"));
        printed.push(format!(
            "{:?}",
            ledger.transitions(&rec.execution_id).unwrap()
        ));
    }
    printed.push(format!("{:?}", executor.metrics()));
    printed.push(format!("{key:?}"));
    // Errors: a conflict names digests and ids, never the arguments.
    let mut other = spec("c1", "pay", &format!(r#"{{"iban":"{CANARY}-2"}}"#));
    other.call.provider = Provider::Custom;
    printed.push(format!("{:?}", ledger.begin(&op("op"), 0, &other)));
    let wrong = Ledger::open_encrypted(
        &dir.path().join("l.db"),
        LedgerConfig::default(),
        &LedgerKey::generate().unwrap(),
    );
    printed.push(format!("{:?}", wrong.as_ref().map(|_| ()).unwrap_err()));
    printed.push(wrong.map(|_| ()).unwrap_err().to_string());

    let events = recorder.0.lock().unwrap().clone();
    for event in &events {
        printed.push(format!("{event} {event:?}"));
    }
    for text in &printed {
        assert!(!text.contains(CANARY), "printed: {text}");
    }
    // The hook tells why the call ended unknown, without its text.
    let why = events
        .iter()
        .find(|e| e.to == ExecutionStatus::OutcomeUnknown)
        .expect("an event for the unknown outcome");
    assert_eq!(why.tool_name, "transfer");
    assert_eq!(why.from, Some(ExecutionStatus::Executing));
    assert_eq!(why.attempt, 1);
    assert_eq!(why.reason_kind, Some(ReasonKind::ToolError));
    assert!(why.to_string().contains("reason_kind=tool_error"));
    // Every move of the committed call, creation to commit.
    let moves: Vec<_> = events
        .iter()
        .filter(|e| e.tool_name == "pay")
        .map(|e| (e.from, e.to))
        .collect();
    assert_eq!(
        moves,
        vec![
            (None, ExecutionStatus::Executing),
            (Some(ExecutionStatus::Executing), ExecutionStatus::Committed)
        ]
    );
    // Removing the observer stops the events.
    ledger.set_observer(None).unwrap();
    let before = recorder.0.lock().unwrap().len();
    executor
        .execute(&op("op"), 1, call("c3", "pay"))
        .await
        .unwrap();
    assert_eq!(recorder.0.lock().unwrap().len(), before);
}
