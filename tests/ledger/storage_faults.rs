//! Storage faults: full disk, busy locks, read-only files, a WAL deleted under us.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use support::*;
use toolledger::executor::{
    CallOutcome, Error as ExecError, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor,
    ToolError, ToolHandler, ToolRequest,
};
use toolledger::ledger::{Error as LedgerError, Ledger, LedgerConfig, StorageError as StoreError};
use toolledger::model::{ExecutionId, ExecutionStatus, ToolCall};
use toolledger_test_support as support;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A side-effecting tool that counts its performs and dedupes by key (like
/// a downstream with idempotency keys), optionally running a hook first.
struct Counting {
    performs: AtomicUsize,
    keys: Mutex<Vec<String>>,
    hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Counting {
    fn new() -> Arc<Counting> {
        Arc::new(Counting {
            performs: AtomicUsize::new(0),
            keys: Mutex::new(Vec::new()),
            hook: Mutex::new(None),
        })
    }

    fn performs(&self) -> usize {
        self.performs.load(Ordering::SeqCst)
    }

    fn effects(&self) -> usize {
        self.keys.lock().unwrap().len()
    }
}

#[async_trait]
impl ToolHandler for Counting {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            idempotency_key: true,
            ..ToolDescriptor::side_effect("send_email", 1)
        }
    }

    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.performs.fetch_add(1, Ordering::SeqCst);
        let key = req.downstream_key.as_str().to_owned();
        let n = {
            let mut keys = self.keys.lock().unwrap();
            if !keys.contains(&key) {
                keys.push(key.clone());
            }
            keys.iter().position(|k| *k == key).unwrap() + 1
        };
        if let Some(hook) = self.hook.lock().unwrap().take() {
            hook();
        }
        Ok(PerformOutcome::Committed {
            result_json: format!(r#"{{"message_id":"msg_{n}"}}"#),
            external_id: Some(format!("msg_{n}")),
        })
    }
}

fn config(busy: Duration) -> LedgerConfig {
    LedgerConfig {
        busy_timeout: busy,
        ..LedgerConfig::default()
    }
}

fn executor(ledger: Ledger, tool: &Arc<Counting>) -> Executor {
    let exec = Executor::new(
        Arc::new(ledger),
        ExecutorConfig {
            backoff_base: Duration::from_millis(1),
            backoff_max: Duration::from_millis(2),
            ..ExecutorConfig::default()
        },
    );
    exec.register(tool.clone()).unwrap();
    exec
}

fn call(n: u32) -> ToolCall {
    ToolCall::custom(
        format!("call_{n}"),
        "send_email",
        format!(r#"{{"to":"user{n}@example.com"}}"#),
    )
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn execute(exec: &Executor, n: u32) -> Result<CallOutcome, ExecError> {
    run(exec.execute(&op("op_faults"), n, call(n)))
}

fn completed(out: &CallOutcome) -> &str {
    match out {
        CallOutcome::Completed { result_json, .. } => result_json,
        other => panic!("expected a result, got {other:?}"),
    }
}

fn store_error(err: &ExecError) -> Option<&StoreError> {
    match err {
        ExecError::Ledger(LedgerError::Store(e)) => Some(e),
        _ => None,
    }
}

/// The committed executions of the test operation: (id, result).
fn committed(ledger: &Ledger) -> Vec<(String, String)> {
    ledger
        .list(&op("op_faults"))
        .unwrap()
        .into_iter()
        .filter(|r| r.status.is_committed())
        .map(|r| {
            (
                r.execution_id.to_string(),
                r.result_json.unwrap_or_default(),
            )
        })
        .collect()
}

/// A mount that is undone on drop.
/// A mounted file system, unmounted (lazily) on drop.
pub(super) struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn sh(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Mounts a tmpfs of `size` on `dir` (root only; `None`, saying so, otherwise).
pub(super) fn mount_tmpfs(dir: &Path, size: &str) -> Option<Mount> {
    let target = dir.to_str()?;
    match sh(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size}"),
            "tmpfs",
            target,
        ],
    ) {
        Ok(()) => Some(Mount(dir.to_path_buf())),
        Err(e) => {
            println!("SKIPPED: cannot mount a tmpfs ({e})");
            None
        }
    }
}

/// Fills the filesystem holding `dir` with one file until ENOSPC.
pub(super) fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xA5u8; 4096];
    for _ in 0..100_000 {
        if f.write_all(&chunk).is_err() {
            break;
        }
    }
    let _ = f.write_all(&[0u8; 1]);
    path
}

fn sha(path: &Path) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    Sha256::digest(std::fs::read(path).unwrap()).to_vec()
}

// ---------------------------------------------------------------------------
// Disk full
// ---------------------------------------------------------------------------

#[test]
fn a_full_disk_refuses_begin_before_the_tool_runs_and_keeps_committed_records() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(mount) = mount_tmpfs(tmp.path(), "2m") else {
        return;
    };
    let path = mount.0.join("ledger.db");
    let tool = Counting::new();
    let exec = executor(
        Ledger::open(&path, config(Duration::from_secs(1))).unwrap(),
        &tool,
    );
    let first = completed(&execute(&exec, 0).unwrap()).to_owned();
    assert_eq!(tool.performs(), 1);
    // Checkpoint and truncate the WAL, so that the next write must grow a file.
    exec.ledger().suspend().unwrap();
    exec.ledger().resume().unwrap();
    let before = committed(exec.ledger());

    let filler = fill(&mount.0);
    let err = execute(&exec, 1).unwrap_err();
    assert!(
        matches!(store_error(&err), Some(StoreError::DiskFull)),
        "{err:?}"
    );
    assert_eq!(
        tool.performs(),
        1,
        "no side effect without its durable intent"
    );
    // Reads still work; nothing committed was lost; the refused call left no record.
    assert_eq!(committed(exec.ledger()), before);
    assert_eq!(exec.ledger().list(&op("op_faults")).unwrap().len(), 1);
    // The replay of a committed call writes nothing and still works.
    let again = execute(&exec, 0).unwrap();
    assert_eq!(completed(&again), first);
    assert_eq!(tool.performs(), 1);

    // Space comes back: the refused call runs, once.
    std::fs::remove_file(filler).unwrap();
    completed(&execute(&exec, 1).unwrap());
    assert_eq!(tool.performs(), 2);
    assert_eq!(committed(exec.ledger()).len(), 2);
}

#[test]
fn a_disk_that_fills_during_the_side_effect_keeps_the_intent_and_recovery_finishes_once() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(mount) = mount_tmpfs(tmp.path(), "2m") else {
        return;
    };
    let dir = mount.0.clone();
    let path = dir.join("ledger.db");
    let tool = Counting::new();
    {
        let exec = executor(
            Ledger::open(&path, config(Duration::from_secs(1))).unwrap(),
            &tool,
        );
        completed(&execute(&exec, 0).unwrap());
        exec.ledger().suspend().unwrap();
        exec.ledger().resume().unwrap();
        // The downstream commits; then the disk fills before the local commit.
        let fill_dir = dir.clone();
        *tool.hook.lock().unwrap() = Some(Box::new(move || {
            fill(&fill_dir);
        }));
        let err = execute(&exec, 1).unwrap_err();
        assert!(
            matches!(store_error(&err), Some(StoreError::DiskFull)),
            "{err:?}"
        );
        assert_eq!(tool.performs(), 2);
        // The durable intent survived the failed commit.
        let rec = exec.ledger().list(&op("op_faults")).unwrap().pop().unwrap();
        assert_eq!(rec.status, ExecutionStatus::Executing);
    }
    std::fs::remove_file(dir.join("filler")).unwrap();
    // Restart: the unknown outcome is reconciled under the same key.
    let exec = executor(
        Ledger::open(&path, config(Duration::from_secs(1))).unwrap(),
        &tool,
    );
    let recovered = run(exec.recover()).unwrap().outcomes;
    // Call 0's undelivered result comes back as a replay; call 1 is reconciled.
    assert_eq!(recovered.len(), 2);
    for out in &recovered {
        completed(out);
    }
    assert_eq!(tool.effects(), 2, "one effect per call");
    assert_eq!(committed(exec.ledger()).len(), 2);
}

// ---------------------------------------------------------------------------
// Busy
// ---------------------------------------------------------------------------

#[test]
fn a_write_lock_held_past_busy_timeout_is_a_typed_busy_error_and_the_tool_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let tool = Counting::new();
    let exec = executor(
        Ledger::open(&path, config(Duration::from_millis(200))).unwrap(),
        &tool,
    );
    let first = completed(&execute(&exec, 0).unwrap()).to_owned();
    let before = committed(exec.ledger());

    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let err = execute(&exec, 1).unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(store_error(&err), Some(StoreError::Busy)),
        "{err:?}"
    );
    assert!(waited >= Duration::from_millis(150), "waited {waited:?}");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    assert_eq!(
        tool.performs(),
        1,
        "no side effect without its durable intent"
    );
    // Readers are not blocked by a writer (WAL): the committed record is there.
    assert_eq!(committed(exec.ledger()), before);
    assert_eq!(completed(&execute(&exec, 0).unwrap()), first);

    holder.execute_batch("ROLLBACK").unwrap();
    drop(holder);
    completed(&execute(&exec, 1).unwrap());
    assert_eq!(tool.performs(), 2);
}

// ---------------------------------------------------------------------------
// Read-only
// ---------------------------------------------------------------------------

/// Creates a ledger in `dir` with call 0 committed; returns its result.
fn seed(dir: &Path, tool: &Arc<Counting>) -> String {
    let exec = executor(
        Ledger::open(&dir.join("ledger.db"), config(Duration::from_secs(1))).unwrap(),
        tool,
    );
    completed(&execute(&exec, 0).unwrap()).to_owned()
}

#[test]
fn a_database_on_a_read_only_mount_is_refused_at_open_and_left_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let rw = tmp.path().join("rw");
    let ro = tmp.path().join("ro");
    std::fs::create_dir_all(&rw).unwrap();
    std::fs::create_dir_all(&ro).unwrap();
    let tool = Counting::new();
    seed(&rw, &tool);
    if let Err(e) = sh(
        "mount",
        &["--bind", rw.to_str().unwrap(), ro.to_str().unwrap()],
    ) {
        println!("SKIPPED: cannot bind-mount ({e})");
        return;
    }
    let _mount = Mount(ro.clone());
    if let Err(e) = sh("mount", &["-o", "remount,ro,bind", ro.to_str().unwrap()]) {
        println!("SKIPPED: cannot remount read-only ({e})");
        return;
    }
    let db = ro.join("ledger.db");
    let digest = sha(&db);
    // A cleanly closed WAL database has no -shm/-wal; on a read-only mount
    // SQLite cannot create them and refuses to open (SQLITE_CANTOPEN); the
    // store tells that apart from a missing directory and says ReadOnly.
    let err = Ledger::open(&db, config(Duration::from_secs(1))).unwrap_err();
    assert!(
        matches!(err, LedgerError::Store(StoreError::ReadOnly)),
        "{err:?}"
    );
    assert_eq!(tool.performs(), 1);
    assert_eq!(sha(&db), digest, "the file is untouched");
    let names: Vec<_> = std::fs::read_dir(&ro)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(!names.iter().any(|n| n == "ledger.db-wal"), "{names:?}");
}

/// `chattr +i`, undone on drop.
struct Immutable(PathBuf);

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = sh("chattr", &["-i", self.0.to_str().unwrap_or("")]);
    }
}

#[test]
fn a_read_only_database_file_serves_replays_and_refuses_new_calls_with_a_typed_error() {
    let tmp = tempfile::tempdir().unwrap();
    let tool = Counting::new();
    let first = seed(tmp.path(), &tool);
    let db = tmp.path().join("ledger.db");
    // We are root, so permission bits do not stop writes: make the file
    // immutable instead (the directory stays writable for -wal and -shm).
    if let Err(e) = sh("chattr", &["+i", db.to_str().unwrap()]) {
        println!("SKIPPED: cannot make the file immutable ({e})");
        return;
    }
    let _immutable = Immutable(db.clone());
    let digest = sha(&db);
    match Ledger::open(&db, config(Duration::from_secs(1))) {
        // Opening writes (pragmas, the WAL header): refused, typed.
        Err(e) => assert!(
            matches!(e, LedgerError::Store(StoreError::ReadOnly)),
            "{e:?}"
        ),
        Ok(ledger) => {
            let exec = executor(ledger, &tool);
            // What it has, it reports and replays.
            assert_eq!(committed(exec.ledger()).len(), 1);
            assert_eq!(completed(&execute(&exec, 0).unwrap()), first);
            // What it cannot write, it refuses, before any side effect.
            let err = execute(&exec, 1).unwrap_err();
            assert!(
                matches!(store_error(&err), Some(StoreError::ReadOnly)),
                "{err:?}"
            );
        }
    }
    assert_eq!(
        tool.performs(),
        1,
        "no side effect without its durable intent"
    );
    assert_eq!(sha(&db), digest, "the file is untouched");
    // Writable again: every committed record is there, and the call runs once.
    drop(_immutable);
    let exec = executor(
        Ledger::open(&db, config(Duration::from_secs(1))).unwrap(),
        &tool,
    );
    assert_eq!(completed(&execute(&exec, 0).unwrap()), first);
    completed(&execute(&exec, 1).unwrap());
    assert_eq!(tool.performs(), 2);
}

// ---------------------------------------------------------------------------
// The WAL deleted or truncated between runs
// ---------------------------------------------------------------------------

/// Child side of the WAL tests: commits call 0 and checkpoints it into the
/// main file, commits calls 1 and 2 (in the WAL only), and dies.
#[test]
fn child_commits_into_the_wal_and_dies() {
    let Ok(db) = std::env::var("TOOLLEDGER_WAL_CHILD_DB") else {
        return;
    };
    let tool = Counting::new();
    let exec = executor(
        Ledger::open(Path::new(&db), config(Duration::from_secs(1))).unwrap(),
        &tool,
    );
    completed(&execute(&exec, 0).unwrap());
    exec.ledger().suspend().unwrap();
    exec.ledger().resume().unwrap();
    completed(&execute(&exec, 1).unwrap());
    completed(&execute(&exec, 2).unwrap());
    std::process::abort();
}

/// A ledger left by a process that died with calls 1 and 2 only in the WAL.
fn crashed_with_wal(dir: &Path) -> PathBuf {
    let db = dir.join("ledger.db");
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "storage_faults::child_commits_into_the_wal_and_dies",
            "--test-threads=1",
        ])
        .env("TOOLLEDGER_WAL_CHILD_DB", &db)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child dies");
    let wal = std::fs::metadata(dir.join("ledger.db-wal")).unwrap().len();
    assert!(wal > 0, "calls 1 and 2 are in the WAL");
    db
}

fn copy_ledger(from: &Path, to_dir: &Path) -> PathBuf {
    for suffix in ["", "-wal", "-shm"] {
        let src = PathBuf::from(format!("{}{suffix}", from.display()));
        if src.exists() {
            std::fs::copy(&src, to_dir.join(format!("ledger.db{suffix}"))).unwrap();
        }
    }
    to_dir.join("ledger.db")
}

/// Opens `db` and checks it is consistent: SQLite's integrity check passes,
/// call 0 (checkpointed) is intact, and every execution it reports is whole:
/// its status is where its transition log ends, a committed one has its
/// result, an executing one its owner. Returns `call:status` per execution.
fn reopen_and_check(db: &Path, first: &str) -> Vec<String> {
    let ledger = Ledger::open(db, config(Duration::from_secs(1))).unwrap();
    let mut seen = Vec::new();
    for rec in ledger.list(&op("op_faults")).unwrap() {
        let log = ledger.transitions(&rec.execution_id).unwrap();
        assert_eq!(log.last().map(|t| t.to), Some(rec.status), "{rec:?}");
        match rec.status {
            ExecutionStatus::Committed => assert!(rec.result_json.is_some()),
            ExecutionStatus::Executing => assert!(rec.owner_session.is_some()),
            other => panic!("unexpected status {other}"),
        }
        seen.push(format!("{}:{}", rec.provider_call_id, rec.status));
    }
    let zero = ledger
        .list(&op("op_faults"))
        .unwrap()
        .into_iter()
        .find(|r| r.provider_call_id == "call_0")
        .expect("the checkpointed record survives");
    assert_eq!(zero.result_json.as_deref(), Some(first));
    drop(ledger);
    let raw = rusqlite::Connection::open(db).unwrap();
    let check: String = raw
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    seen
}

/// What a prefix of the child's transactions can leave: call 0 committed,
/// then call 1's intent, its commit, call 2's intent, its commit.
fn is_prefix_state(seen: &[String]) -> bool {
    let states: [&[&str]; 5] = [
        &["call_0:committed"],
        &["call_0:committed", "call_1:executing"],
        &["call_0:committed", "call_1:committed"],
        &["call_0:committed", "call_1:committed", "call_2:executing"],
        &["call_0:committed", "call_1:committed", "call_2:committed"],
    ];
    states.iter().any(|s| *s == seen)
}

#[test]
fn a_deleted_or_truncated_wal_leaves_a_consistent_ledger_with_the_checkpointed_records() {
    let tmp = tempfile::tempdir().unwrap();
    let origin = tmp.path().join("origin");
    std::fs::create_dir_all(&origin).unwrap();
    let crashed = crashed_with_wal(&origin);
    let first = r#"{"message_id":"msg_1"}"#;
    // The intact WAL: everything committed is there (recovery replays it).
    {
        let dir = tmp.path().join("intact");
        std::fs::create_dir_all(&dir).unwrap();
        let seen = reopen_and_check(&copy_ledger(&crashed, &dir), first);
        assert_eq!(
            seen,
            ["call_0:committed", "call_1:committed", "call_2:committed"]
        );
    }
    // WAL deleted: what only it held is gone (outside the model: a committed
    // record is durable once fsynced into the WAL; deleting that file from
    // outside the library deletes records). The ledger opens and is whole.
    {
        let dir = tmp.path().join("deleted");
        std::fs::create_dir_all(&dir).unwrap();
        let db = copy_ledger(&crashed, &dir);
        std::fs::remove_file(dir.join("ledger.db-wal")).unwrap();
        let seen = reopen_and_check(&db, first);
        assert_eq!(seen, ["call_0:committed"]);
    }
    // WAL truncated at several lengths, or with a garbage tail: a prefix of
    // the committed transactions survives, each one whole, never half.
    let wal_len = std::fs::metadata(origin.join("ledger.db-wal"))
        .unwrap()
        .len();
    for (n, cut) in [1, wal_len / 3, wal_len / 2, wal_len - 1000, wal_len - 1]
        .into_iter()
        .enumerate()
    {
        let dir = tmp.path().join(format!("truncated_{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let db = copy_ledger(&crashed, &dir);
        let wal = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("ledger.db-wal"))
            .unwrap();
        wal.set_len(cut).unwrap();
        drop(wal);
        let seen = reopen_and_check(&db, first);
        assert!(is_prefix_state(&seen), "cut at {cut}: {seen:?}");
        println!("WAL cut at {cut} of {wal_len} bytes: {seen:?}");
    }
    {
        let dir = tmp.path().join("garbage");
        std::fs::create_dir_all(&dir).unwrap();
        let db = copy_ledger(&crashed, &dir);
        let mut bytes = std::fs::read(dir.join("ledger.db-wal")).unwrap();
        let mid = bytes.len() / 2;
        for b in &mut bytes[mid..] {
            *b = b.wrapping_mul(31).wrapping_add(7);
        }
        std::fs::write(dir.join("ledger.db-wal"), bytes).unwrap();
        let seen = reopen_and_check(&db, first);
        assert!(is_prefix_state(&seen), "garbage tail: {seen:?}");
        println!("WAL with a garbage tail: {seen:?}");
    }
}

// ---------------------------------------------------------------------------
// Corrupt files
// ---------------------------------------------------------------------------

fn garbage(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_file_that_is_not_a_database_is_a_typed_error_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    for (n, bytes) in [
        garbage(64 * 1024, 0x9e37_79b9),
        b"SQLite format 3\0 but not really".to_vec(),
        vec![0u8; 4096],
    ]
    .into_iter()
    .enumerate()
    {
        std::fs::write(&path, &bytes).unwrap();
        let err = Ledger::open(&path, config(Duration::from_secs(1))).unwrap_err();
        assert!(
            matches!(
                err,
                LedgerError::Store(StoreError::NotADatabase | StoreError::Corrupt)
            ),
            "case {n}: {err:?}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "case {n}: untouched");
        assert!(!dir.path().join("ledger.db-wal").exists(), "case {n}");
    }
}

#[test]
fn a_database_corrupted_inside_gives_typed_errors_and_never_runs_a_tool() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let tool = Counting::new();
    {
        let exec = executor(
            Ledger::open(&path, config(Duration::from_secs(1))).unwrap(),
            &tool,
        );
        for n in 0..20 {
            completed(&execute(&exec, n).unwrap());
        }
    }
    let clean = std::fs::read(&path).unwrap();
    assert!(clean.len() >= 3 * 4096, "a few pages");
    // Keep the header page; scramble every other page.
    let mut corrupt = clean.clone();
    let noise = garbage(corrupt.len(), 0x51ed_270b);
    corrupt[4096..].copy_from_slice(&noise[4096..]);
    std::fs::write(&path, &corrupt).unwrap();
    let performs = tool.performs();

    match Ledger::open(&path, config(Duration::from_secs(1))) {
        Err(e) => assert!(
            matches!(
                e,
                LedgerError::Store(StoreError::Corrupt | StoreError::NotADatabase)
            ),
            "{e:?}"
        ),
        Ok(ledger) => {
            let exec = executor(ledger, &tool);
            for n in [0, 25] {
                match execute(&exec, n) {
                    Ok(out) => panic!("a corrupt ledger answered {out:?}"),
                    Err(e) => assert!(
                        matches!(
                            store_error(&e),
                            Some(StoreError::Corrupt | StoreError::NotADatabase)
                        ),
                        "{e:?}"
                    ),
                }
            }
            assert!(matches!(
                exec.ledger().list(&op("op_faults")),
                Err(LedgerError::Store(StoreError::Corrupt))
            ));
        }
    }
    assert_eq!(tool.performs(), performs, "no tool ran on a corrupt ledger");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        corrupt,
        "the file is untouched"
    );
}

// ---------------------------------------------------------------------------
// Suspension on a full disk
// ---------------------------------------------------------------------------

/// The inodes this process holds a file lock on (POSIX or flock), from
/// /proc/locks.
/// The files this process holds a POSIX lock on, as `/proc/locks` names
/// them: "major:minor:inode" (the device too: other tests' ledgers on their
/// own tmpfs mounts have files with the same small inode numbers).
fn locked_inodes() -> Vec<String> {
    let me = std::process::id().to_string();
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // "1: POSIX ADVISORY WRITE <pid> <maj:min:inode> <start> <end>"
            let pid = fields.get(4)?;
            (*pid == me).then_some(())?;
            fields.get(5).map(|f| (*f).to_owned())
        })
        .collect()
}

/// `path`'s file as `/proc/locks` names it (see [`locked_inodes`]).
fn inode(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let dev = m.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    Some(format!("{major:02x}:{minor:02x}:{}", m.ino()))
}

#[test]
fn suspend_on_a_full_disk_still_releases_every_file_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(mount) = mount_tmpfs(tmp.path(), "2m") else {
        return;
    };
    let dir = mount.0.clone();
    let path = dir.join("ledger.db");
    let tool = Counting::new();
    let exec = executor(
        Ledger::open(&path, config(Duration::from_secs(1))).unwrap(),
        &tool,
    );
    // Enough committed calls that the checkpoint must grow the main file.
    for n in 0..40 {
        completed(&execute(&exec, n).unwrap());
    }
    let ledger = exec.ledger().clone();
    let files: Vec<String> = [
        path.clone(),
        dir.join("ledger.db-wal"),
        dir.join("ledger.db-shm"),
    ]
    .iter()
    .filter_map(|p| inode(p))
    .chain(
        std::fs::read_dir(dir.join("ledger.db-sessions"))
            .unwrap()
            .filter_map(|e| inode(&e.unwrap().path())),
    )
    .collect();
    assert!(
        locked_inodes().iter().any(|i| files.contains(i)),
        "an open ledger holds locks"
    );
    let filler = fill(&dir);
    let suspended = ledger.suspend();
    assert!(
        matches!(suspended, Err(LedgerError::Store(StoreError::DiskFull))),
        "{suspended:?}"
    );
    // However the checkpoint went, not one lock is left on any of the
    // ledger's files (iOS would kill a suspended app holding one).
    let held: Vec<String> = locked_inodes()
        .into_iter()
        .filter(|i| files.contains(i))
        .collect();
    assert!(
        held.is_empty(),
        "locks left after suspend ({suspended:?}): {held:?}"
    );
    assert!(matches!(
        ledger.get(&ExecutionId::parse("x").unwrap()),
        Err(LedgerError::Store(StoreError::Suspended))
    ));
    // Space back: resume, and every committed record is there.
    std::fs::remove_file(filler).unwrap();
    ledger.resume().unwrap();
    assert_eq!(committed(&ledger).len(), 40);
}

/// The idle checkpoint on a full disk: copying the WAL into the database
/// file needs new pages there and fails, in the ledger's own thread, while
/// nothing is lost (every committed result reads back, from the WAL) and
/// calls go on once space is back; the next idle checkpoint then copies
/// the WAL (the database file grows).
#[test]
fn a_full_disk_fails_the_idle_checkpoint_and_loses_nothing() {
    use toolledger::ledger::IdleCheckpoint;
    let tmp = tempfile::tempdir().unwrap();
    let Some(mount) = mount_tmpfs(tmp.path(), "2m") else {
        return;
    };
    let path = mount.0.join("ledger.db");
    let idle = IdleCheckpoint {
        after: Duration::from_millis(30),
        writes: 16,
    };
    let tool = Counting::new();
    let exec = executor(
        Ledger::open(
            &path,
            LedgerConfig {
                idle_checkpoint: idle,
                ..config(Duration::from_secs(1))
            },
        )
        .unwrap(),
        &tool,
    );
    // Start from an empty WAL, then 12 calls' frames in it (24 writes).
    exec.ledger().checkpoint().unwrap();
    let size = || std::fs::metadata(&path).unwrap().len();
    let mut results = Vec::new();
    for n in 0..12 {
        results.push(completed(&execute(&exec, n).unwrap()).to_owned());
    }
    let filler = fill(&mount.0);
    let full_size = size();
    std::thread::sleep(Duration::from_millis(300));
    // Whatever the thread managed (the disk was full), every result reads
    // back as committed.
    let stored: Vec<String> = committed(exec.ledger())
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    assert_eq!(stored, results);
    std::fs::remove_file(filler).unwrap();
    for n in 12..24 {
        results.push(completed(&execute(&exec, n).unwrap()).to_owned());
    }
    let started = Instant::now();
    while size() <= full_size {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no idle checkpoint once space was back"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(tool.performs(), 24);
    let stored: Vec<String> = committed(exec.ledger())
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    assert_eq!(stored, results);
    drop(exec);
    let again = Ledger::open(&path, config(Duration::from_secs(1))).unwrap();
    assert_eq!(committed(&again).len(), 24);
}
