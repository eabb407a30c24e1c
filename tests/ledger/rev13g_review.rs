//! Seventh review of the liveness rule (36257d5): probes. Two `defect_*`
//! tests pass since the fix after it (RELIABILITY.md, row 75); the third is
//! kept ignored (Known limits).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use toolledger::ledger::{Begin, Ledger, LedgerConfig, ManualClock};
use toolledger_test_support::*;

fn lock_of(db: &Path, session: &str) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-sessions");
    Path::new(&name).join(format!("{session}.lock"))
}

fn variant(b: &Begin) -> String {
    let shown = format!("{b:?}");
    shown.split(['(', ' ', '{']).next().unwrap().to_owned()
}

fn replace_by_copy(file: &Path) {
    let bytes = std::fs::read(file).unwrap();
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, &bytes).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// Child: another process, an hour past the parent's clock, begins c1.
#[test]
fn rev13g_child_begins_past_the_lease() {
    let Ok(db) = std::env::var("TOOLLEDGER_REV13G_DB") else {
        return;
    };
    let clock = Arc::new(ManualClock::new(1_000_000 + 3_600_000));
    let other = Ledger::open_with_clock(Path::new(&db), LedgerConfig::default(), clock).unwrap();
    let answer = other.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap();
    println!("CHILD-ANSWER {}", variant(&answer));
}

fn child_answer(db: &Path) -> String {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "rev13g_review::rev13g_child_begins_past_the_lease",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TOOLLEDGER_REV13G_DB", db)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child never finished");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    stdout
        .lines()
        .find_map(|l| {
            l.split_once("CHILD-ANSWER ")
                .map(|(_, a)| a.trim().to_owned())
        })
        .unwrap_or_else(|| {
            panic!(
                "no answer: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// A suspended ledger whose lock file was deleted meanwhile (the case the
/// design names: "someone deleted its lock file") is dropped while its
/// process runs on. Drop writes `closed` only into a file at the path:
/// there is none, so nothing says the session closed; its row keeps its
/// mark, and past the lease another process asks the (running) process:
/// the dropped session's call stays `InFlight` for as long as the app
/// process lives.
#[test]
fn defect_a_suspended_ledger_dropped_after_its_lock_file_was_deleted_keeps_its_call_in_flight() {
    let mut answers = Vec::new();
    for deleted in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let (app, _clock) = open_at(&path);
        let lock = lock_of(&path, app.session_id().as_str());
        let _t = ticket(app.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap());
        app.suspend().unwrap();
        if deleted {
            std::fs::remove_file(&lock).unwrap();
        }
        drop(app);
        answers.push((deleted, lock.exists(), child_answer(&path)));
    }
    assert!(
        answers.iter().all(|(_, _, a)| a != "InFlight"),
        "(deleted, file after drop, answer): {answers:?}"
    );
}

/// A running ledger is dropped with a call executing (a caller-driven call
/// whose commit never came, the app closing the ledger) while another
/// process holds the write lock, so its row cannot be deleted: Drop marks
/// `closed` into the file it holds. If its lock file was replaced by a
/// copy (or deleted) while it ran, that write goes to the unlinked inode,
/// the path says nothing of the close, and the row (no mark) leaves the
/// process check: `InFlight` while the app process lives. (Row 74 fixed
/// only the suspended drop.)
#[test]
fn defect_a_running_ledger_dropped_with_its_row_kept_after_its_lock_file_was_replaced_keeps_its_call_in_flight(
) {
    let mut answers = Vec::new();
    for how in ["control", "copy", "deleted"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let config = LedgerConfig {
            busy_timeout: Duration::from_millis(50),
            ..LedgerConfig::default()
        };
        let clock = Arc::new(ManualClock::new(1_000_000));
        let app = Ledger::open_with_clock(&path, config, clock).unwrap();
        let lock = lock_of(&path, app.session_id().as_str());
        let _t = ticket(app.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap());
        match how {
            "copy" => replace_by_copy(&lock),
            "deleted" => std::fs::remove_file(&lock).unwrap(),
            _ => {}
        }
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        drop(app); // its row delete is refused (busy)
        holder.execute_batch("COMMIT").unwrap();
        drop(holder);
        let says = std::fs::read_to_string(&lock).unwrap_or_default();
        let closed = says.lines().any(|l| l == "closed");
        answers.push((how, closed, child_answer(&path)));
    }
    assert!(
        answers.iter().all(|(_, _, a)| a != "InFlight"),
        "(how, path says closed, answer): {answers:?}"
    );
}

/// A small file system of its own (tmpfs, root only), unmounted on drop.
struct Mounted(tempfile::TempDir);

impl Mounted {
    fn tmpfs(size: &str) -> Option<Mounted> {
        let dir = tempfile::tempdir().ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .ok()?
            .success();
        ok.then_some(Mounted(dir))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let filler = dir.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    for _ in 0..1_000_000 {
        match f.write(&chunk) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let _ = f.sync_all();
    filler
}

/// rev13f's full-disk session (empty lock file, mark refused), then
/// dropped while suspended with the disk still full: `closed` cannot be
/// written into the empty file either. On cb4d6fa the empty file counted
/// as not `suspended` (dead); since 36257d5 it asks the process, which
/// runs on: the closed session's call stays `InFlight` while the app
/// process lives.
#[test]
#[ignore = "open: found by the thirteenth session's review, not fixed (RELIABILITY.md, Known limits): \
            an empty lock file cannot tell a frozen live owner from a closed session"]
fn defect_a_full_disk_session_dropped_while_suspended_keeps_its_call_in_flight() {
    let Some(fs) = Mounted::tmpfs("4m") else {
        eprintln!("no tmpfs (not root): skipped");
        return;
    };
    let path = fs.0.path().join("l.db");
    let (extension, clock) = open_at(&path);
    for i in 0..40 {
        let s = spec(&format!("w{i}"), "warm", "{}");
        if let Begin::Execute(t) = extension.begin(&op("warm"), 0, &s).unwrap() {
            extension
                .commit(&t.attempt_id(), r#"{"r":1}"#, None)
                .unwrap();
        }
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER full_u BEFORE UPDATE ON sessions WHEN NEW.suspended_ms IS NOT NULL
         BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;",
    )
    .unwrap();
    conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    let filler = fill(fs.0.path());
    let app = open_with(&path, &clock);
    let lock = lock_of(&path, app.session_id().as_str());
    std::fs::remove_file(&filler).unwrap();
    let _t = ticket(app.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap());
    let filler = fill(fs.0.path());
    let suspended = app.suspend();
    drop(app); // closed: nothing can send for this session now
    let len = std::fs::metadata(&lock).map(|m| m.len());
    std::fs::remove_file(&filler).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("DROP TRIGGER full_u").unwrap();
    drop(conn);
    drop(extension);
    let answer = child_answer(&path);
    assert!(
        answer != "InFlight",
        "a dropped session's call answers {answer} while its process runs (suspend: \
         {suspended:?}; lock file {len:?} bytes)"
    );
}
