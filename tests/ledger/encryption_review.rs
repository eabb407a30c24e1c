//! Adversarial review of encryption at rest (src/store/crypt.rs,
//! src/store/reseal.rs, src/ledger/privacy.rs): a rotation or an
//! encryption in place killed part-way, on a full disk, raced by a second
//! session; replays across a rotation against a real downstream; moved
//! ciphertexts; keys of another ledger.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use toolledger_test_support as support;

use support::downstream::{process, Behaviour, CrashPoint, Downstream, HttpTool, Kind};
use support::{op, spec};
use toolledger::executor::{CallOutcome, Executor, ToolDescriptor};
use toolledger::ledger::{
    Begin, Error, Ledger, LedgerConfig, LedgerKey, ManualClock, StorageError,
};
use toolledger::model::{ExecutionStatus, ToolCall};

const CANARY: &str = "CANARY-REVIEW-5151";

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(1_000_000))
}

fn try_open(path: &Path, key: Option<&LedgerKey>) -> Result<Ledger, Error> {
    Ledger::open_with(path, LedgerConfig::default(), clock(), key)
}

fn open(path: &Path, key: Option<&LedgerKey>) -> Ledger {
    try_open(path, key).unwrap()
}

fn store_err<T>(r: Result<T, Error>) -> StorageError {
    match r {
        Err(Error::Store(e)) => e,
        Err(other) => panic!("expected a storage error, got {other:?}"),
        Ok(_) => panic!("expected a storage error, got Ok"),
    }
}

fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

fn result_of(i: usize) -> String {
    format!(
        r#"{{"receipt":"{CANARY}-{i}","pad":"{}"}}"#,
        "x".repeat(200)
    )
}

/// `n` committed calls in operation `op_bulk` (call ids `c{i}`).
fn fill_ledger(ledger: &Ledger, n: usize) {
    for i in 0..n {
        let s = spec(&format!("c{i}"), "pay", &format!(r#"{{"i":{i}}}"#));
        let Begin::Execute(t) = ledger.begin(&op("op_bulk"), 0, &s).unwrap() else {
            panic!("execute")
        };
        ledger.commit(&t.attempt_id(), &result_of(i), None).unwrap();
    }
}

/// Every one of the `n` calls replays with its own result under `ledger`.
fn all_replay(ledger: &Ledger, n: usize) -> Result<(), String> {
    for i in 0..n {
        let s = spec(&format!("c{i}"), "pay", &format!(r#"{{"i":{i}}}"#));
        match ledger.begin(&op("op_bulk"), 0, &s) {
            Ok(Begin::Replay(r)) if r.result_json == result_of(i) => {}
            other => return Err(format!("c{i}: {other:?}")),
        }
    }
    let listed = ledger.list(&op("op_bulk")).map_err(|e| format!("{e:?}"))?;
    if listed.len() != n {
        return Err(format!("{} listed, {n} expected", listed.len()));
    }
    Ok(())
}

fn copy_ledger(from: &Path, to_dir: &Path) -> PathBuf {
    for suffix in ["", "-wal"] {
        let src = sidecar(from, suffix);
        if src.exists() {
            std::fs::copy(&src, to_dir.join(format!("l.db{suffix}"))).unwrap();
        }
    }
    to_dir.join("l.db")
}

// ---------------------------------------------------------------------------
// A second session that opens while a rotation / encryption runs
// ---------------------------------------------------------------------------

/// Waits (bounded, 10 s) until some connection has held SQLite's write lock
/// for 120 ms in a row: the reseal's IMMEDIATE transaction (a session's own
/// short writes never last that long). Returns false on timeout.
/// The ledger sizes a race against a long re-seal transaction tries, in
/// turn, until that transaction is caught holding the write lock.
const SIZES: [usize; 3] = [600, 1_500, 4_000];

const NEVER_CAUGHT: &str =
    "the re-seal transaction never held the write lock for 120 ms, even over 4,000 calls";

fn wait_for_long_write(db: &Path) -> bool {
    let probe = rusqlite::Connection::open(db).unwrap();
    probe.busy_timeout(Duration::ZERO).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut busy_since: Option<Instant> = None;
    while Instant::now() < deadline {
        match probe.execute_batch("BEGIN IMMEDIATE") {
            Ok(()) => {
                probe.execute_batch("ROLLBACK").unwrap();
                busy_since = None;
            }
            Err(_) => {
                let since = *busy_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_millis(120) {
                    return true;
                }
            }
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    false
}

/// Schedule: a ledger of 600 calls under `old`; thread R calls
/// `rotate_key(old, new)` (its InUse check passes: no other session); once
/// its IMMEDIATE transaction has held the write lock for 120 ms, the test
/// opens session B with `old`: B reads the old `meta.wrapped_keys` (the
/// rotation has not committed), creates its lock file after R's check, and
/// registers once R commits. B then holds the old data key in a ledger
/// re-keyed to `new` and writes a new call sealed under it.
#[test]
fn a_session_opened_during_a_rotation_never_writes_under_the_old_key() {
    let old = LedgerKey::generate().unwrap();
    let new = LedgerKey::generate().unwrap();
    // A bigger ledger when the rotation was too quick to be caught.
    let mut sizes = SIZES.into_iter();
    let (_dir, db, n, rot) = loop {
        let n = sizes.next().expect(NEVER_CAUGHT);
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        fill_ledger(&open(&db, Some(&old)), n);
        let rot = {
            let (db, old, new) = (db.clone(), old.clone(), new.clone());
            std::thread::spawn(move || Ledger::rotate_key(&db, LedgerConfig::default(), &old, &new))
        };
        if wait_for_long_write(&db) {
            break (dir, db, n, rot);
        }
        let _ = rot.join();
    };
    let second = Ledger::open_encrypted(&db, LedgerConfig::default(), &old);
    let rotated = rot.join().unwrap();
    eprintln!(
        "rotation: {rotated:?}; second open: {:?}",
        second.as_ref().map(|_| ())
    );
    assert!(rotated.is_ok(), "{rotated:?}");
    if let Ok(b) = second {
        // The second session writes a new call (an effect the app will
        // perform and record).
        let s = spec("late", "pay", r#"{"to":"B"}"#);
        match b.begin(&op("op_late"), 0, &s) {
            Ok(Begin::Execute(t)) => {
                let committed = b.commit(&t.attempt_id(), r#"{"paid":"B"}"#, None);
                eprintln!("second session's commit: {committed:?}");
            }
            other => eprintln!("second session's begin: {other:?}"),
        }
        drop(b);
    }
    // Whatever the second session did, every record must open under the
    // one key the rotation answered with.
    let ledger = open(&db, Some(&new));
    all_replay(&ledger, n).unwrap();
    let late = ledger.list(&op("op_late"));
    eprintln!(
        "under the new key: list(op_late) = {:?}; recover() = {:?}; repeat of the late call = {:?}; \
         old key opens: {:?}",
        late.as_ref().map(|v| v.len()),
        ledger.recover().map(|v| v.len()),
        ledger.begin(&op("op_late"), 0, &spec("late", "pay", r#"{"to":"B"}"#)),
        try_open(&db, Some(&old)).map(|_| ())
    );
    assert!(
        late.is_ok(),
        "a record the second session wrote is unreadable under the new key: {late:?}"
    );
    if let Some(rec) = late.unwrap().first() {
        assert_eq!(rec.status, ExecutionStatus::Committed);
        assert!(matches!(
            ledger.begin(&op("op_late"), 0, &spec("late", "pay", r#"{"to":"B"}"#)),
            Ok(Begin::Replay(_))
        ));
    }
}

/// The same schedule for `encrypt_in_place`: session B opens without a key
/// while the ledger is being encrypted. Its writes must be refused (the
/// guards), and its answers about existing calls must not lie (a replay of
/// a committed call answered as a conflict, or run again).
#[test]
fn a_plain_session_opened_during_encryption_does_not_lie_or_write_clear_values() {
    let key = LedgerKey::generate().unwrap();
    // A bigger ledger when the encryption was too quick to be caught.
    let mut sizes = SIZES.into_iter();
    let (_dir, db, n, enc) = loop {
        let n = sizes.next().expect(NEVER_CAUGHT);
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        fill_ledger(&open(&db, None), n);
        let enc = {
            let (db, key) = (db.clone(), key.clone());
            std::thread::spawn(move || Ledger::encrypt_in_place(&db, LedgerConfig::default(), &key))
        };
        if wait_for_long_write(&db) {
            break (dir, db, n, enc);
        }
        let _ = enc.join();
    };
    let second = try_open(&db, None);
    let encrypted = enc.join().unwrap();
    eprintln!(
        "encryption: {encrypted:?}; second open: {:?}",
        second.as_ref().map(|_| ())
    );
    let mut lies = Vec::new();
    if let Ok(b) = &second {
        // A repeat of a committed call: a replay, or a typed error; never
        // "execute" or "conflict".
        let s = spec("c0", "pay", r#"{"i":0}"#);
        match b.begin(&op("op_bulk"), 0, &s) {
            Ok(Begin::Replay(r)) if r.result_json == result_of(0) => {}
            Err(Error::Store(_)) => {}
            other => lies.push(format!("repeat of c0: {other:?}")),
        }
        let fresh = spec("fresh", "pay", r#"{"to":"C"}"#);
        match b.begin(&op("op_fresh"), 0, &fresh) {
            Err(Error::Store(_)) => {}
            other => lies.push(format!("new call in the clear: {other:?}")),
        }
    }
    drop(second);
    let ledger = open(&db, Some(&key));
    assert!(encrypted.is_ok(), "{encrypted:?}");
    all_replay(&ledger, n).unwrap();
    assert!(ledger.list(&op("op_fresh")).unwrap().is_empty());
    assert!(lies.is_empty(), "{lies:?}");
}

/// A second live session in the same process makes rotation and
/// encryption `InUse`; nothing changes.
#[test]
fn a_live_second_session_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let old = LedgerKey::generate().unwrap();
    let new = LedgerKey::generate().unwrap();
    let a = open(&db, Some(&old));
    fill_ledger(&a, 2);
    assert!(matches!(
        store_err(Ledger::rotate_key(&db, LedgerConfig::default(), &old, &new)),
        StorageError::InUse
    ));
    all_replay(&a, 2).unwrap();
    let pdb = dir.path().join("p.db");
    let p = open(&pdb, None);
    fill_ledger(&p, 2);
    assert!(matches!(
        store_err(Ledger::encrypt_in_place(
            &pdb,
            LedgerConfig::default(),
            &new
        )),
        StorageError::InUse
    ));
    all_replay(&p, 2).unwrap();
}

/// docs/design.md ("Encrypt in place, rotate"): "Both need the ledger
/// alone: a live or suspended other session is `InUse`." Schedule: session
/// A (old key) begins a call (its request is in flight) and suspends (the
/// app goes to the background); `rotate_key(old, new)` runs; A resumes.
#[test]
fn a_suspended_second_session_makes_a_rotation_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let old = LedgerKey::generate().unwrap();
    let new = LedgerKey::generate().unwrap();
    // The system clock, as rotate_key's own session uses.
    let a = Ledger::open_encrypted(&db, LedgerConfig::default(), &old).unwrap();
    fill_ledger(&a, 2);
    let s = spec("inflight", "pay", r#"{"to":"S"}"#);
    let Begin::Execute(t) = a.begin(&op("op_s"), 0, &s).unwrap() else {
        panic!()
    };
    a.suspend().unwrap();
    let r = Ledger::rotate_key(&db, LedgerConfig::default(), &old, &new);
    let resumed = a.resume().map(|v| v.len());
    let committed = a
        .commit(&t.attempt_id(), r#"{"paid":"S"}"#, None)
        .map(|_| ());
    eprintln!("rotation: {r:?}; resume: {resumed:?}; commit of the in-flight call: {committed:?}");
    assert!(
        matches!(r, Err(Error::Store(StorageError::InUse))),
        "rotation with a suspended second session: {r:?}; its resume: {resumed:?}; \
         the in-flight call's commit: {committed:?}"
    );
    assert!(resumed.is_ok());
    assert!(committed.is_ok());
}

/// The same for `encrypt_in_place` with a suspended plain session.
#[test]
fn a_suspended_second_session_makes_an_encryption_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let key = LedgerKey::generate().unwrap();
    // The system clock, as encrypt_in_place's own session uses.
    let p = Ledger::open(&db, LedgerConfig::default()).unwrap();
    fill_ledger(&p, 2);
    p.suspend().unwrap();
    let r = Ledger::encrypt_in_place(&db, LedgerConfig::default(), &key);
    let resumed = p.resume().map(|v| v.len());
    let repeat = p.begin(&op("op_bulk"), 0, &spec("c0", "pay", r#"{"i":0}"#));
    eprintln!("encryption: {r:?}; resume: {resumed:?}; repeat of c0: {repeat:?}");
    assert!(
        matches!(r, Err(Error::Store(StorageError::InUse))),
        "encryption with a suspended second session: {r:?}; its resume: {resumed:?}; \
         repeat of a committed call: {repeat:?}"
    );
}

// ---------------------------------------------------------------------------
// SIGKILL during a rotation / an encryption in place
// ---------------------------------------------------------------------------

/// Child side: rotates (or encrypts) the ledger named by the environment,
/// then aborts; the parent kills it at a chosen moment before that.
#[test]
fn child_reseals_and_dies() {
    let Ok(db) = std::env::var("TOOLLEDGER_REVIEW_RESEAL_DB") else {
        return;
    };
    let hex = |name: &str| -> Option<LedgerKey> {
        let text = std::env::var(name).ok()?;
        let bytes: Vec<u8> = (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect();
        Some(LedgerKey::from_bytes(&bytes).unwrap())
    };
    let new = hex("TOOLLEDGER_REVIEW_NEW").unwrap();
    {
        use std::io::Write;
        println!("RESEAL-START");
        std::io::stdout().flush().unwrap();
    }
    let t0 = Instant::now();
    let r = match hex("TOOLLEDGER_REVIEW_OLD") {
        Some(old) => Ledger::rotate_key(Path::new(&db), LedgerConfig::default(), &old, &new),
        None => Ledger::encrypt_in_place(Path::new(&db), LedgerConfig::default(), &new),
    };
    println!("RESEAL-DONE {r:?} in {:?}", t0.elapsed());
    std::process::abort();
}

fn to_hex(key: &LedgerKey) -> String {
    key.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs the child on `db` and SIGKILLs it `delay` after it started (or it
/// dies by itself after the reseal). Returns true when it finished the
/// reseal before the kill.
fn reseal_in_child(db: &Path, old: Option<&LedgerKey>, new: &LedgerKey, delay: Duration) -> bool {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "encryption_review::child_reseals_and_dies",
        "--test-threads=1",
        "--nocapture",
    ])
    .env("TOOLLEDGER_REVIEW_RESEAL_DB", db)
    .env("TOOLLEDGER_REVIEW_NEW", to_hex(new))
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    if let Some(old) = old {
        cmd.env("TOOLLEDGER_REVIEW_OLD", to_hex(old));
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Wait (bounded) for the child to be about to reseal.
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => {
                let start = line.contains("RESEAL-START");
                lines.push(line);
                if start {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() >= delay || Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let _ = child.wait();
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    let done = lines.iter().find(|l| l.contains("RESEAL-DONE"));
    if let Some(done) = done {
        eprintln!("child: {done}");
    }
    done.is_some_and(|l| l.contains("RESEAL-DONE Ok"))
}

/// Which key a ledger opens under, checking that exactly one does and that
/// every record reads under it.
fn exactly_one_key_opens(
    db: &Path,
    old: Option<&LedgerKey>,
    new: &LedgerKey,
    n: usize,
) -> Result<&'static str, String> {
    let with_new = try_open(db, Some(new));
    let with_old = try_open(db, old);
    let under = match (&with_new, &with_old) {
        (Ok(_), Err(Error::Store(StorageError::WrongKey))) if old.is_some() => "new",
        (Ok(_), Err(Error::Store(StorageError::KeyRequired))) if old.is_none() => "new",
        (Err(Error::Store(StorageError::WrongKey)), Ok(_)) if old.is_some() => "old",
        (Err(Error::Store(StorageError::NotEncrypted)), Ok(_)) if old.is_none() => "old",
        (a, b) => {
            return Err(format!(
                "new key: {:?}, old key: {:?}",
                a.as_ref().map(|_| ()),
                b.as_ref().map(|_| ())
            ))
        }
    };
    let ledger = if under == "new" {
        with_new.unwrap()
    } else {
        with_old.unwrap()
    };
    all_replay(&ledger, n)?;
    let integrity: String = rusqlite::Connection::open(db)
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    if integrity != "ok" {
        return Err(format!("integrity: {integrity}"));
    }
    Ok(under)
}

fn kill_schedule(rotate: bool) {
    let base = tempfile::tempdir().unwrap();
    let seed = base.path().join("l.db");
    let old = LedgerKey::generate().unwrap();
    let new = LedgerKey::generate().unwrap();
    const N: usize = 600;
    {
        let l = open(&seed, if rotate { Some(&old) } else { None });
        fill_ledger(&l, N);
        l.checkpoint().unwrap();
    }
    let old_opt = if rotate { Some(&old) } else { None };
    // How long a whole reseal takes in a child, to spread the kills.
    let probe = tempfile::tempdir().unwrap();
    let pdb = copy_ledger(&seed, probe.path());
    let t0 = Instant::now();
    assert!(reseal_in_child(
        &pdb,
        old_opt,
        &new,
        Duration::from_secs(20)
    ));
    let whole = t0.elapsed();
    assert_eq!(exactly_one_key_opens(&pdb, old_opt, &new, N), Ok("new"));
    let mut seen = Vec::new();
    for step in 0..14u32 {
        let dir = tempfile::tempdir().unwrap();
        let db = copy_ledger(&seed, dir.path());
        let delay = whole.mul_f64(f64::from(step) / 12.0);
        let finished = reseal_in_child(&db, old_opt, &new, delay);
        let under = exactly_one_key_opens(&db, old_opt, &new, N)
            .unwrap_or_else(|e| panic!("killed at {delay:?} (of {whole:?}): {e}"));
        if finished {
            assert_eq!(under, "new", "answered Ok, so under the new key");
        }
        // Resumable: the operation can be run again from where it is.
        if under == "old" {
            assert!(reseal_in_child(&db, old_opt, &new, Duration::from_secs(20)));
            assert_eq!(exactly_one_key_opens(&db, old_opt, &new, N), Ok("new"));
        }
        seen.push((delay.as_millis(), under, finished));
    }
    eprintln!("whole reseal {whole:?}; kills: {seen:?}");
}

#[test]
fn a_rotation_killed_anywhere_leaves_every_record_under_exactly_one_key() {
    kill_schedule(true);
}

#[test]
fn an_encryption_killed_anywhere_leaves_every_record_plain_or_sealed() {
    kill_schedule(false);
}

// ---------------------------------------------------------------------------
// A full disk during a rotation
// ---------------------------------------------------------------------------

struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn mount_tmpfs(dir: &Path, size: &str) -> Option<Mount> {
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir)
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        Some(Mount(dir.to_path_buf()))
    } else {
        println!("SKIPPED: cannot mount a tmpfs");
        None
    }
}

/// Fills the file system, then frees `free` bytes.
fn fill_leaving(dir: &Path, free: u64) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xA5u8; 4096];
    for _ in 0..10_000 {
        if f.write_all(&chunk).is_err() {
            break;
        }
    }
    let _ = f.flush();
    let len = std::fs::metadata(&path).unwrap().len();
    f.set_len(len.saturating_sub(free)).unwrap();
    path
}

/// Schedule: a 6 MiB tmpfs holding an encrypted ledger of 300 calls; the
/// disk is filled and then `free` bytes are freed (0 to 2 MiB: the rewrite
/// or only the VACUUM cannot complete); `rotate_key`. The answer says which
/// key the ledger is under (`Ok`/`NotScrubbed`: new; any other error: old),
/// every record reads under it, and after space is freed a rotation again
/// (or a re-key new→new to scrub) succeeds.
#[test]
fn a_rotation_on_a_full_disk_answers_which_key_holds_and_loses_nothing() {
    const N: usize = 300;
    let seed_dir = tempfile::tempdir().unwrap();
    let seed = seed_dir.path().join("l.db");
    let old = LedgerKey::generate().unwrap();
    {
        let l = open(&seed, Some(&old));
        fill_ledger(&l, N);
        l.checkpoint().unwrap();
    }
    let mut answers = Vec::new();
    for free in [0u64, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20] {
        let mnt = tempfile::tempdir().unwrap();
        let Some(_mount) = mount_tmpfs(mnt.path(), "6m") else {
            return;
        };
        let db = copy_ledger(&seed, mnt.path());
        let filler = fill_leaving(mnt.path(), free);
        let new = LedgerKey::generate().unwrap();
        let r = Ledger::rotate_key(&db, LedgerConfig::default(), &old, &new);
        let under_new = matches!(r, Ok(()) | Err(Error::Store(StorageError::NotScrubbed(_))));
        answers.push(format!("free {free}: {r:?}"));
        std::fs::remove_file(&filler).unwrap();
        let key = if under_new { &new } else { &old };
        let other = if under_new { &old } else { &new };
        let ledger = try_open(&db, Some(key)).unwrap_or_else(|e| {
            panic!("free {free}: rotate answered {r:?}, but that key does not open: {e:?}")
        });
        all_replay(&ledger, N).unwrap_or_else(|e| panic!("free {free}: {e}"));
        drop(ledger);
        assert!(
            matches!(
                store_err(try_open(&db, Some(other))),
                StorageError::WrongKey
            ),
            "free {free}: the other key opens too"
        );
        // Resumable with space back.
        let newer = LedgerKey::generate().unwrap();
        Ledger::rotate_key(&db, LedgerConfig::default(), key, &newer)
            .unwrap_or_else(|e| panic!("free {free}: rotation after space came back: {e:?}"));
        all_replay(&open(&db, Some(&newer)), N).unwrap();
    }
    eprintln!("{answers:#?}");
}

// ---------------------------------------------------------------------------
// Replays across a rotation / an encryption, against a real downstream
// ---------------------------------------------------------------------------

fn desc() -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: true,
        lookup: true,
        landing_window: Duration::ZERO,
        ..ToolDescriptor::side_effect("create_event", 1)
    }
}

fn the_call() -> ToolCall {
    ToolCall::custom("call_1", "create_event", r#"{"title":"standup"}"#)
}

fn executor(path: &Path, key: Option<&LedgerKey>) -> Executor {
    let ledger = Ledger::open_with(
        path,
        LedgerConfig::default(),
        Arc::new(toolledger::ledger::SystemClock),
        key,
    )
    .unwrap();
    Executor::new(Arc::new(ledger), support::downstream::fast_config())
}

/// Process 1 dies after the downstream applied the effect, before the
/// executor heard of it.
fn die_after_effect(path: &Path, service: &Downstream, key: Option<&LedgerKey>) {
    let dead: Weak<Ledger> = process(async {
        let exec = executor(path, key);
        let tool = HttpTool::new(desc(), Kind::Effect, service);
        let mut crash = tool.crash_at(None, CrashPoint::AfterResponse);
        exec.register(Arc::new(tool)).unwrap();
        let run = exec.clone();
        tokio::spawn(async move { run.execute(&op("op_crash"), 0, the_call()).await });
        crash.reached().await;
        Arc::downgrade(exec.ledger())
    });
    assert!(dead.upgrade().is_none());
}

fn run_again(path: &Path, service: &Downstream, key: &LedgerKey) -> (CallOutcome, CallOutcome) {
    process(async {
        let exec = executor(path, Some(key));
        exec.register(Arc::new(HttpTool::new(desc(), Kind::Effect, service)))
            .unwrap();
        let first = exec.execute(&op("op_crash"), 0, the_call()).await.unwrap();
        let second = exec.execute(&op("op_crash"), 0, the_call()).await.unwrap();
        (first, second)
    })
}

/// Schedule: encrypted under `old`; process 1 runs a call, the downstream
/// applies it, process 1 dies before recording it; the key is rotated;
/// process 2 (new key) repeats the call twice. One effect in all; the
/// repeat is reconciled (found by lookup) and then replayed.
#[test]
fn a_call_killed_in_flight_before_a_rotation_is_reconciled_not_run_again() {
    for rotate in [true, false] {
        let service = Downstream::start(Behaviour {
            idempotency: true,
            ..Default::default()
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let old = LedgerKey::generate().unwrap();
        let new = LedgerKey::generate().unwrap();
        die_after_effect(&path, &service, if rotate { Some(&old) } else { None });
        assert_eq!(service.effects().len(), 1);
        if rotate {
            Ledger::rotate_key(&path, LedgerConfig::default(), &old, &new).unwrap();
        } else {
            Ledger::encrypt_in_place(&path, LedgerConfig::default(), &new).unwrap();
        }
        let (first, second) = run_again(&path, &service, &new);
        assert!(
            matches!(first, CallOutcome::Completed { .. }),
            "rotate={rotate}: {first:?}"
        );
        assert!(
            matches!(second, CallOutcome::Completed { replayed: true, .. }),
            "rotate={rotate}: {second:?}"
        );
        assert_eq!(
            service.effects().len(),
            1,
            "rotate={rotate}: a second effect"
        );
        let ledger = open(&path, Some(&new));
        let recs = ledger.list(&op("op_crash")).unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].status, ExecutionStatus::Committed);
    }
}

// ---------------------------------------------------------------------------
// Tombstones, evidence, approvals, batch items and jobs across a rotation
// ---------------------------------------------------------------------------

#[test]
fn evidence_tombstones_and_approvals_survive_two_rotations() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let c = clock();
    let k1 = LedgerKey::generate().unwrap();
    let ledger = Ledger::open_with(&db, LedgerConfig::default(), c.clone(), Some(&k1)).unwrap();
    // Evidence: attempt 1 goes unknown, attempt 2 commits, attempt 1's late
    // answer is evidence.
    let s = spec("ev", "pay", r#"{"to":"E"}"#);
    let Begin::Execute(t1) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    ledger
        .mark_outcome_unknown(&t1.attempt_id(), &format!("timed out {CANARY}"))
        .unwrap();
    let toolledger::ledger::Resolved::Retry(t2) = ledger
        .resolve_unknown(
            &t1.attempt_id(),
            toolledger::ledger::Resolution::NotFoundRetry,
        )
        .unwrap()
    else {
        panic!()
    };
    ledger.commit(&t2.attempt_id(), r#"{"n":2}"#, None).unwrap();
    assert!(ledger
        .commit(
            &t1.attempt_id(),
            &format!(r#"{{"late":"{CANARY}"}}"#),
            Some("ext-late")
        )
        .is_err());
    // Approval pending with a preview.
    let mut a = spec("ap", "pay", r#"{"to":"A"}"#);
    a.requires_approval = true;
    let Begin::NeedsApproval(req) = ledger.begin(&op("op"), 0, &a).unwrap() else {
        panic!()
    };
    // A tombstone.
    let p = spec("pr", "pay", r#"{"to":"P"}"#);
    let Begin::Execute(tp) = ledger.begin(&op("op_p"), 0, &p).unwrap() else {
        panic!()
    };
    ledger.commit(&tp.attempt_id(), "{}", None).unwrap();
    ledger
        .mark_delivered(std::slice::from_ref(&tp.execution_id))
        .unwrap();
    c.advance(3_600_000);
    ledger.prune(Duration::from_secs(60), true).unwrap();
    drop(ledger);

    let k2 = LedgerKey::generate().unwrap();
    let k3 = LedgerKey::generate().unwrap();
    Ledger::rotate_key(&db, LedgerConfig::default(), &k1, &k2).unwrap();
    Ledger::rotate_key(&db, LedgerConfig::default(), &k2, &k3).unwrap();
    let ledger = Ledger::open_with(&db, LedgerConfig::default(), c.clone(), Some(&k3)).unwrap();
    let ev = ledger.evidence(&t1.execution_id).unwrap();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        ev[0].result_json.as_deref(),
        Some(&*format!(r#"{{"late":"{CANARY}"}}"#))
    );
    assert!(matches!(
        ledger.begin(&op("op"), 0, &s).unwrap(),
        Begin::Replay(r) if r.result_json == r#"{"n":2}"#
    ));
    let log = ledger.transitions(&t1.execution_id).unwrap();
    assert!(log
        .iter()
        .any(|e| e.reason.as_deref() == Some(&*format!("timed out {CANARY}"))));
    // The approval still binds to the same (keyed) digest.
    assert!(matches!(
        ledger.begin(&op("op"), 0, &a).unwrap(),
        Begin::NeedsApproval(r) if r.args_digest == req.args_digest
    ));
    ledger
        .approve(&req.execution_id, &req.args_digest, Some(r#"{"shown":1}"#))
        .unwrap();
    // The tombstone: same args never run, other args conflict.
    assert!(matches!(
        ledger.begin(&op("op_p"), 0, &p).unwrap(),
        Begin::Failed { .. }
    ));
    assert!(matches!(
        ledger
            .begin(&op("op_p"), 0, &spec("pr", "pay", r#"{"to":"Q"}"#))
            .unwrap(),
        Begin::Conflict { .. }
    ));
}

// ---------------------------------------------------------------------------
// Moved ciphertexts, foreign keys
// ---------------------------------------------------------------------------

/// Schedule: two executions of one ledger; their sealed arguments (and, in
/// a second file, their evidence between attempts) are swapped on disk. A
/// read of either is `Undecryptable`; nothing reads the other row's value.
#[test]
fn swapped_arguments_and_history_fail_typed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let key = LedgerKey::generate().unwrap();
    {
        let l = open(&db, Some(&key));
        fill_ledger(&l, 2);
    }
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let names: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_schema WHERE type='trigger' AND tbl_name='executions'",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for n in names {
            conn.execute_batch(&format!("DROP TRIGGER \"{n}\""))
                .unwrap();
        }
        let n = conn
            .execute(
                "UPDATE executions SET args_json = CASE
                    WHEN execution_id LIKE '%c0%' THEN
                      (SELECT args_json FROM executions WHERE execution_id LIKE '%c1%')
                    ELSE (SELECT args_json FROM executions WHERE execution_id LIKE '%c0%') END
                 WHERE execution_id LIKE '%c0%' OR execution_id LIKE '%c1%'",
                [],
            )
            .unwrap();
        assert_eq!(n, 2);
    }
    let l = open(&db, Some(&key));
    let listed = l.list(&op("op_bulk"));
    assert!(
        matches!(listed, Err(Error::Store(StorageError::Undecryptable))),
        "{:?}",
        listed.map(|v| v.len())
    );
    // A rotation refuses to re-seal a moved value (it would launder it
    // under the new key): a typed error, the ledger stays under the key.
    drop(l);
    let new = LedgerKey::generate().unwrap();
    let r = Ledger::rotate_key(&db, LedgerConfig::default(), &key, &new);
    assert!(
        matches!(r, Err(Error::Store(StorageError::Undecryptable))),
        "{r:?}"
    );
    assert!(try_open(&db, Some(&key)).is_ok());
}

/// Schedule: ledgers A and B encrypted under the same app key; B's
/// `meta.wrapped_keys` is replaced by A's. B must refuse to open
/// (`WrongKey`: the wrap is bound to the ledger id), and a row copied from
/// A into B (same execution id) must not open under B's key.
#[test]
fn keys_and_rows_of_another_ledger_do_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.db");
    let b = dir.path().join("b.db");
    let key = LedgerKey::generate().unwrap();
    fill_ledger(&open(&a, Some(&key)), 1);
    {
        let l = open(&b, Some(&key));
        fill_ledger(&l, 1);
        l.checkpoint().unwrap();
    }
    let b_copy_dir = tempfile::tempdir().unwrap();
    let b2 = copy_ledger(&b, b_copy_dir.path());
    {
        let conn = rusqlite::Connection::open(&b).unwrap();
        conn.execute(&format!("ATTACH '{}' AS a", a.display()), [])
            .unwrap();
        conn.execute(
            "UPDATE main.meta SET value = (SELECT value FROM a.meta WHERE key = 'wrapped_keys')
             WHERE key = 'wrapped_keys'",
            [],
        )
        .unwrap();
    }
    assert!(matches!(
        store_err(try_open(&b, Some(&key))),
        StorageError::WrongKey
    ));
    // A's sealed result copied into B's row of the same id.
    {
        let conn = rusqlite::Connection::open(&b2).unwrap();
        conn.execute_batch("DROP TRIGGER IF EXISTS executions_guard")
            .unwrap();
        conn.execute(&format!("ATTACH '{}' AS a", a.display()), [])
            .unwrap();
        let n = conn
            .execute(
                "UPDATE main.executions SET result_json =
                   (SELECT result_json FROM a.executions WHERE a.executions.execution_id =
                      main.executions.execution_id)",
                [],
            )
            .unwrap();
        assert_eq!(n, 1);
    }
    let l = open(&b2, Some(&key));
    assert!(matches!(
        l.begin(&op("op_bulk"), 0, &spec("c0", "pay", r#"{"i":0}"#)),
        Err(Error::Store(StorageError::Undecryptable))
    ));
}

/// A truncated or over-long key is `InvalidKey`; a read-only open with the
/// wrong key or none is typed; a plain ledger opened read-only with a key
/// reads plainly.
#[test]
fn bad_keys_and_read_only_opens_are_typed() {
    for len in [0usize, 1, 31, 33, 64] {
        assert!(matches!(
            LedgerKey::from_bytes(&vec![7u8; len]),
            Err(StorageError::InvalidKey)
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let key = LedgerKey::generate().unwrap();
    fill_ledger(&open(&db, Some(&key)), 1);
    let wrong = LedgerKey::generate().unwrap();
    use toolledger::ledger::Inspector;
    assert!(matches!(
        Inspector::open_keyed(&db, Some(&wrong)).map(|_| ()),
        Err(Error::Store(StorageError::WrongKey))
    ));
    assert!(matches!(
        Inspector::open_keyed(&db, None).map(|_| ()),
        Err(Error::Store(StorageError::KeyRequired))
    ));
}
