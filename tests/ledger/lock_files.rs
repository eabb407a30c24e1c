//! What the reviews of the liveness rule (`rev13*_review`) share: where a
//! session's lock file is, its row, a short name for an answer, a copy put
//! in a lock file's place, a small file system to fill, and another process
//! asking for a call an hour past the lease.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use toolledger::ledger::{Begin, Ledger, LedgerConfig, ManualClock};
use toolledger_test_support::*;

pub(super) use super::storage_faults::fill;

/// A ledger config with a 300 ms suspension lease.
pub(super) fn short_lease() -> LedgerConfig {
    LedgerConfig {
        lease: Duration::from_millis(300),
        ..LedgerConfig::default()
    }
}

/// The lock file of `session` of the ledger file `db`.
pub(super) fn lock_of(db: &Path, session: &str) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-sessions");
    Path::new(&name).join(format!("{session}.lock"))
}

/// How many rows `session` has in `db`'s `sessions` table.
pub(super) fn rows_of(db: &Path, session: &str) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM sessions WHERE session_id = ?1",
            [session],
            |r| r.get(0),
        )
        .unwrap()
}

/// The variant of an answer, by name (`Execute`, `InFlight`, …).
pub(super) fn variant(b: &Begin) -> String {
    let shown = format!("{b:?}");
    shown.split(['(', ' ', '{']).next().unwrap().to_owned()
}

/// Replaces `file` by a copy of itself (atomic rename, as a sync tool or a
/// restore does).
pub(super) fn replace_by_copy(file: &Path) {
    let bytes = std::fs::read(file).unwrap();
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, &bytes).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// A small file system of its own (tmpfs, root only), unmounted on drop.
pub(super) struct Mounted {
    // Declared first: unmounted before its directory goes.
    _mount: super::storage_faults::Mount,
    dir: tempfile::TempDir,
}

impl Mounted {
    /// A tmpfs of `size` on a fresh directory; `None` where it cannot be
    /// mounted (not root).
    pub(super) fn tmpfs(size: &str) -> Option<Mounted> {
        let dir = tempfile::tempdir().ok()?;
        let mount = super::storage_faults::mount_tmpfs(dir.path(), size)?;
        Some(Mounted { _mount: mount, dir })
    }

    /// Where it is mounted.
    pub(super) fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Child: opens the ledger at `$TOOLLEDGER_LOCK_FILES_DB` with a manual
/// clock an hour past the parent's (past any lease), begins call c1 of
/// operation o and prints the answer.
#[test]
fn child_begins_past_the_lease() {
    let Ok(db) = std::env::var("TOOLLEDGER_LOCK_FILES_DB") else {
        return;
    };
    let clock = Arc::new(ManualClock::new(1_000_000 + 3_600_000));
    let other = Ledger::open_with_clock(Path::new(&db), LedgerConfig::default(), clock).unwrap();
    let answer = other.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap();
    println!("CHILD-ANSWER {}", variant(&answer));
}

/// Runs `child_begins_past_the_lease` on `db` in a process of its own
/// (bounded: 60 s) and returns its answer.
pub(super) fn child_answer(db: &Path) -> String {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lock_files::child_begins_past_the_lease",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TOOLLEDGER_LOCK_FILES_DB", db)
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
