//! Adversarial review of three fixes: `compensate` re-reading its original
//! in the insert's transaction, the immutable `Inspector`'s file stamp and
//! rereads (`Store::came_into_use`, `reopen_read_only`, `reopen_shared`),
//! and the keys check on every write of an encrypted ledger.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::retention_review::delivered;
use support::*;
use toolledger::ledger::{
    Begin, Error, Inspector, Ledger, LedgerConfig, LedgerKey, ManualClock, StorageError,
    PRUNED_EXECUTED_REASON,
};
use toolledger_test_support as support;

const DAY_MS: i64 = 86_400_000;

fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// A closed ledger of `n` delivered calls at `path` (no `-wal` left).
fn closed_ledger(path: &Path, n: usize) {
    let (ledger, _c) = open_at(path);
    for i in 0..n {
        delivered(&ledger, "o", &format!("c{i}"), "{}");
    }
    drop(ledger);
    assert!(!sidecar(path, "-wal").exists(), "closed cleanly");
    assert!(!sidecar(path, "-shm").exists(), "closed cleanly");
}

/// A thread that sets the file's modification time (a content-free change
/// of its times: what `touch`, a backup or sync tool, `chmod`… do) in a loop
/// until the flag is set.
fn toucher(path: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let started = Arc::new(AtomicBool::new(false));
    let handle = {
        let started = started.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                f.set_modified(SystemTime::now()).unwrap();
                n += 1;
                started.store(true, Ordering::Relaxed);
            }
            n
        })
    };
    while !started.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    handle
}

/// Reads `summary()` for half a second (at least 50 reads): the errors.
fn read_for_a_while(inspector: &Inspector, n: u64) -> Vec<String> {
    let mut errors = Vec::new();
    let until = std::time::Instant::now() + Duration::from_millis(500);
    let mut reads = 0;
    while reads < 50 || std::time::Instant::now() < until {
        reads += 1;
        match inspector.summary() {
            Ok(s) => assert_eq!(s.by_tool.iter().map(|(_, c)| *c).sum::<u64>(), n),
            Err(e) => errors.push(format!("{e:?}")),
        }
    }
    errors
}

struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn run(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------
// Inspector: times that keep changing push it onto shared locking
// ---------------------------------------------------------------------------

/// Schedule: a ledger closed cleanly (no `-wal`, no `-shm`); an inspector
/// opened on it (immutable); a thread keeps setting the file's mtime (no
/// content changes, no writer, no `-wal` ever) while the inspector answers
/// 50 reads. Every read's stamp differs, so after three immutable tries the
/// read goes through `reopen_shared` — SQLite's shared WAL locking on a
/// file with no `-wal`. The module promises an inspector of a closed file
/// leaves no `-wal`/`-shm` beside it.
#[test]
fn an_inspector_whose_files_times_keep_changing_leaves_no_sidecars() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    closed_ledger(&path, 20);
    let inspector = Inspector::open(&path).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = toucher(path.clone(), stop.clone());
    let errors = read_for_a_while(&inspector, 20);
    stop.store(true, Ordering::Relaxed);
    let touches = t.join().unwrap();
    let during = (
        sidecar(&path, "-wal").exists(),
        sidecar(&path, "-shm").exists(),
    );
    drop(inspector);
    let after = (
        sidecar(&path, "-wal").exists(),
        sidecar(&path, "-shm").exists(),
    );
    eprintln!(
        "touches {touches}; errors {errors:?}; (-wal, -shm) while open {during:?}, after close {after:?}"
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(after, (false, false), "sidecars left beside a closed file");
    assert_eq!(during, (false, false), "sidecars made beside a closed file");
}

/// Schedule: the same ledger, read by an inspector through a read-only
/// bind mount of its directory (a pulled device image, a read-only
/// volume), while the file's times keep changing through the writable
/// path. Before this fix every read answered (immutable, no locks);
/// now the fourth try goes through `reopen_shared`, which cannot create
/// `-shm` on a read-only mount: a good read becomes an error.
#[test]
fn an_inspector_on_a_read_only_mount_keeps_answering_while_the_files_times_change() {
    let dir = tempfile::tempdir().unwrap();
    let rw = dir.path().join("rw");
    let ro = dir.path().join("ro");
    std::fs::create_dir(&rw).unwrap();
    std::fs::create_dir(&ro).unwrap();
    let path = rw.join("l.db");
    closed_ledger(&path, 20);
    if !run(Command::new("mount").arg("--bind").arg(&rw).arg(&ro)) {
        println!("SKIPPED: cannot bind-mount");
        return;
    }
    let _m = Mount(ro.clone());
    if !run(Command::new("mount")
        .args(["-o", "remount,bind,ro"])
        .arg(&ro))
    {
        println!("SKIPPED: cannot remount read-only");
        return;
    }
    let ro_path = ro.join("l.db");
    assert!(std::fs::OpenOptions::new()
        .write(true)
        .open(&ro_path)
        .is_err());
    // Some rounds SQLite's shared open succeeds; six rounds, each with a
    // new inspector, show the failure on most runs.
    let mut failed_rounds = Vec::new();
    for round in 0..6 {
        let inspector = Inspector::open(&ro_path).unwrap();
        assert_eq!(inspector.execution_count().unwrap(), 20);
        let stop = Arc::new(AtomicBool::new(false));
        let t = toucher(path.clone(), stop.clone());
        let errors = read_for_a_while(&inspector, 20);
        stop.store(true, Ordering::Relaxed);
        let touches = t.join().unwrap();
        eprintln!(
            "round {round}: touches {touches}; {} errors, first {:?}",
            errors.len(),
            errors.first()
        );
        if !errors.is_empty() {
            failed_rounds.push((round, errors.len(), errors[0].clone()));
        }
    }
    assert!(
        failed_rounds.is_empty(),
        "good reads turned into errors: {failed_rounds:?}"
    );
}

// ---------------------------------------------------------------------------
// Inspector: a file system whose times have whole-second resolution
// ---------------------------------------------------------------------------

/// Schedule (on ext2 with 128-byte inodes: timestamps in whole seconds, as
/// on FAT/exFAT SD cards, HFS+, many network file systems): a closed
/// ledger; at the start of a second an inspector opens and reads; within
/// that same second an app opens the file, begins and commits a call, and
/// closes it (its WAL checkpointed into the file and removed). When the
/// file's length did not change, the stamp (length, mtime, inode, ctime) is
/// equal and the inspector's next read answers from its stale page cache.
#[test]
fn an_inspector_on_a_coarse_time_file_system_sees_a_write_in_the_same_second() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(32 << 20).unwrap();
    drop(f);
    if !run(Command::new("mkfs.ext2")
        .args(["-q", "-F", "-I", "128"])
        .arg(&img))
    {
        println!("SKIPPED: no mkfs.ext2");
        return;
    }
    if !run(Command::new("mount")
        .args(["-o", "loop"])
        .arg(&img)
        .arg(&mnt))
    {
        println!("SKIPPED: cannot loop-mount");
        return;
    }
    let _m = Mount(mnt.clone());
    let path = mnt.join("l.db");
    closed_ledger(&path, 5);
    let mut stale = Vec::new();
    let mut tried = 0;
    for round in 0..20 {
        // Start near the beginning of a second.
        loop {
            let ns = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
            if ns < 20_000_000 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let sec = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let len_before = std::fs::metadata(&path).unwrap().len();
        let inspector = Inspector::open(&path).unwrap();
        let before = inspector.execution_count().unwrap();
        {
            let ledger = Ledger::open_with(
                &path,
                LedgerConfig::default(),
                Arc::new(ManualClock::new(1_000_000)),
                None,
            )
            .unwrap();
            delivered(&ledger, "w", &format!("w{round}"), "{}");
        }
        let same_second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            == sec;
        let len_after = std::fs::metadata(&path).unwrap().len();
        if !same_second || len_before != len_after || sidecar(&path, "-wal").exists() {
            continue;
        }
        tried += 1;
        let seen = inspector.execution_count().unwrap();
        let truth = Inspector::open(&path).unwrap().execution_count().unwrap();
        if seen != truth {
            stale.push(format!(
                "round {round}: before {before}, inspector {seen}, file {truth}"
            ));
        }
    }
    eprintln!("{tried} schedules in one second with the length unchanged; stale: {stale:?}");
    assert!(tried > 0, "no schedule wrote within the inspector's second");
    assert!(stale.is_empty(), "stale reads reported: {stale:?}");
}

// ---------------------------------------------------------------------------
// Inspector: an encrypted ledger re-keyed while an inspector is open
// ---------------------------------------------------------------------------

/// Schedule: an encrypted ledger under `old`, closed; an inspector opened
/// with `old` reads it; `rotate_key(old, new)` runs and closes (the file
/// changed: the inspector rereads on a new connection, keeping the data key
/// it unwrapped at open). `old` opens nothing now: a fresh
/// `Inspector::open_keyed(old)` answers `WrongKey`. The long-lived one must
/// answer the same typed `WrongKey`, not claim the stored values were
/// altered (`Undecryptable`).
#[test]
fn a_keyed_inspector_after_a_rotation_answers_wrong_key_not_undecryptable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let old = LedgerKey::generate().unwrap();
    let new = LedgerKey::generate().unwrap();
    {
        let ledger = Ledger::open_with(
            &path,
            LedgerConfig::default(),
            Arc::new(ManualClock::new(1_000_000)),
            Some(&old),
        )
        .unwrap();
        for i in 0..5 {
            delivered(&ledger, "o", &format!("c{i}"), r#"{"secret":1}"#);
        }
    }
    assert!(!sidecar(&path, "-wal").exists());
    let inspector = Inspector::open_keyed(&path, Some(&old)).unwrap();
    assert_eq!(inspector.operations(10).unwrap().len(), 1);
    Ledger::rotate_key(&path, LedgerConfig::default(), &old, &new).unwrap();
    let fresh_old = Inspector::open_keyed(&path, Some(&old)).map(|_| ());
    let fresh_new = Inspector::open_keyed(&path, Some(&new))
        .unwrap()
        .operations(10)
        .map(|v| v.len());
    let long_lived = inspector.operations(10).map(|v| v.len());
    let page = inspector
        .executions_page(Default::default(), 10)
        .map(|(v, _)| v.len());
    eprintln!(
        "fresh with old: {fresh_old:?}; fresh with new: {fresh_new:?}; long-lived (old): {long_lived:?}, page {page:?}"
    );
    assert!(matches!(
        fresh_old,
        Err(Error::Store(StorageError::WrongKey))
    ));
    assert!(
        matches!(long_lived, Err(Error::Store(StorageError::WrongKey))),
        "{long_lived:?}"
    );
}

// ---------------------------------------------------------------------------
// compensate after its original (and the compensation) were pruned
// ---------------------------------------------------------------------------

/// Schedule: call `pay` committed and delivered; its compensation `refund`
/// committed and delivered; a repeat of the compensation replays (passes).
/// Then ten days pass and a prune with tombstones removes both (the
/// compensation first, then its original). A repeat of the same
/// `compensate` must answer from the compensation's tombstone, as `begin`
/// of a pruned call does (`Failed` with the pruned reason: it ran, its
/// result is gone), not `NotFound` for the original (which claims there
/// is nothing it compensated).
#[test]
fn a_repeated_compensate_after_both_were_pruned_answers_from_the_tombstone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (ledger, clock) = open_at(&path);
    let original = delivered(&ledger, "o", "pay", r#"{"amount":5}"#);
    let refund = spec("refund", "refund", r#"{"amount":5}"#);
    let t = ticket(ledger.compensate(&original, &op("o"), 0, &refund).unwrap());
    ledger
        .commit(&t.attempt_id(), r#"{"refunded":true}"#, None)
        .unwrap();
    ledger
        .mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap();
    assert!(matches!(
        ledger.compensate(&original, &op("o"), 0, &refund),
        Ok(Begin::Replay(_))
    ));
    clock.advance(10 * DAY_MS);
    let report = ledger.prune(Duration::from_secs(86_400), true).unwrap();
    eprintln!("prune: {report:?}");
    assert_eq!(report.executions, 2);
    let again = ledger.compensate(&original, &op("o"), 0, &refund);
    eprintln!("repeat of the compensation after the prune: {again:?}");
    assert!(!matches!(again, Ok(Begin::Execute(_))), "ran again");
    match again {
        Ok(Begin::Failed { reason, .. }) => assert_eq!(reason, PRUNED_EXECUTED_REASON),
        other => panic!("expected the tombstone's answer, got {other:?}"),
    }
}
