//! An adversarial review of retention: prune racing live work, tombstones
//! kept or not, the attention watermark after a prune, prune on a suspended
//! ledger and on a full disk, and a long-lived inspector beside an app.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::downstream::{fast_config, process, Behaviour, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{CallOutcome, Executor, ToolDescriptor};
use toolledger::ledger::{
    Begin, Error, Inspector, Ledger, LedgerConfig, PruneCutoff, StorageError,
    PRUNED_EXECUTED_REASON,
};
use toolledger::model::{ExecutionId, ExecutionStatus};
use toolledger_test_support as support;

const DAY_MS: i64 = 86_400_000;

/// A call begun, committed and marked delivered (prunable once the mark is
/// written).
pub(crate) fn delivered(ledger: &Ledger, op_name: &str, call_id: &str, args: &str) -> ExecutionId {
    let t = ticket(
        ledger
            .begin(&op(op_name), 0, &spec(call_id, "send", args))
            .unwrap(),
    );
    ledger
        .commit(&t.attempt_id(), r#"{"sent":true}"#, None)
        .unwrap();
    ledger
        .mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap();
    t.execution_id
}

fn pay_executor(ledger: Arc<Ledger>, service: &Downstream) -> Executor {
    let exec = Executor::new(ledger, fast_config());
    exec.register(Arc::new(HttpTool::new(
        ToolDescriptor::side_effect("pay", 1),
        Kind::Effect,
        service,
    )))
    .unwrap();
    exec
}

/// `keep_tombstones = false` is documented (PruneOptions) as "a very late
/// retry of a pruned call would run again". Checked as documented: the
/// same call id runs a second effect at the downstream. With `true` it
/// does not.
#[test]
fn without_tombstones_a_late_retry_runs_again_as_documented_and_with_them_never() {
    let dir = tempfile::tempdir().unwrap();
    let service = Downstream::start(Behaviour::default());
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    let ledger = Arc::new(ledger);
    let exec = pay_executor(ledger.clone(), &service);
    let kept = call("c_kept", "pay", r#"{"amount":1}"#);
    let dropped = call("c_dropped", "pay", r#"{"amount":2}"#);
    for c in [&kept, &dropped] {
        let out = process(exec.execute(&op("o"), 0, c.clone())).unwrap();
        ledger
            .mark_delivered(&[out.execution_id().clone()])
            .unwrap();
    }
    assert_eq!(service.effects().len(), 2);
    clock.advance(10 * DAY_MS);
    // Prune with tombstones, then re-run a second prune without them after
    // another cutoff: the first call's tombstone is older than the cutoff.
    let r1 = ledger.prune(Duration::from_secs(86_400), true).unwrap();
    assert_eq!(r1.tombstones_written, 2);
    let late = process(exec.execute(&op("o"), 0, kept.clone())).unwrap();
    assert!(
        matches!(&late, CallOutcome::Failed { reason, .. } if reason == PRUNED_EXECUTED_REASON),
        "{late:?}"
    );
    assert_eq!(service.effects().len(), 2, "a tombstone never runs again");
    clock.advance(10 * DAY_MS);
    let r2 = ledger.prune(Duration::from_secs(86_400), false).unwrap();
    assert_eq!(r2.tombstones_removed, 2, "{r2:?}");
    assert_eq!(ledger.tombstone_count().unwrap(), 0);
    // As documented: forgotten, so it runs again.
    let again = process(exec.execute(&op("o"), 0, dropped)).unwrap();
    assert!(matches!(again, CallOutcome::Completed { .. }), "{again:?}");
    assert_eq!(service.effects().len(), 3);
}

/// Prune on a suspended ledger: a typed `Suspended` error, nothing pruned,
/// and after resume the prune works and the tombstone answers.
#[test]
fn prune_while_suspended_is_typed_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (ledger, clock) = open_at(&path);
    let id = delivered(&ledger, "o", "c1", "{}");
    clock.advance(10 * DAY_MS);
    ledger.suspend().unwrap();
    let err = ledger.prune(Duration::from_secs(86_400), true).unwrap_err();
    assert!(
        matches!(err, Error::Store(StorageError::Suspended)),
        "{err:?}"
    );
    // Another session sees it untouched.
    let other = open_with(&path, &clock);
    assert_eq!(
        other.get(&id).unwrap().unwrap().status,
        ExecutionStatus::ResultDelivered
    );
    assert!(other.tombstone(&id).unwrap().is_none());
    drop(other);
    ledger.resume().unwrap();
    let r = ledger.prune(Duration::from_secs(86_400), true).unwrap();
    assert_eq!(r.executions, 1);
    assert!(matches!(
        ledger.begin(&op("o"), 0, &spec("c1", "send", "{}")).unwrap(),
        Begin::Failed { reason, .. } if reason == PRUNED_EXECUTED_REASON
    ));
}

/// Two sessions on one file: one keeps beginning, committing and delivering
/// new calls (and re-asking old ones), the other prunes everything finished
/// as fast as it can. Every id is at every moment a record or a tombstone;
/// no re-ask ever gets `Execute`; recover() in the end finds every call
/// left non-final.
#[test]
fn prune_racing_live_begin_and_commit_in_another_session_loses_nothing_and_runs_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let pruner = open_with(&path, &clock);
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (begun, pending) = std::thread::scope(|s| {
        let p = s.spawn(|| {
            let mut pruned = 0;
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                match pruner.prune(PruneCutoff::BeforeMs(i64::MAX), true) {
                    Ok(r) => pruned += r.executions,
                    Err(Error::Store(StorageError::Busy)) => {}
                    Err(e) => panic!("prune: {e:?}"),
                }
            }
            pruned
        });
        let mut begun = Vec::new();
        let mut pending = Vec::new();
        for i in 0..300u32 {
            let o = op(&format!("op_{}", i % 7));
            let s1 = spec(&format!("c{i}"), "send", "{}");
            let t = ticket(app.begin(&o, i, &s1).unwrap());
            match i % 4 {
                0 => {
                    // Left executing (live owner): must never be pruned.
                    pending.push(t.execution_id.clone());
                }
                1 => {
                    app.commit(&t.attempt_id(), "{}", None).unwrap();
                    // committed, not delivered: never pruned.
                    pending.push(t.execution_id.clone());
                }
                _ => {
                    app.commit(&t.attempt_id(), "{}", None).unwrap();
                    app.mark_delivered(std::slice::from_ref(&t.execution_id))
                        .unwrap();
                }
            }
            begun.push((o, i, s1, t.execution_id));
            clock.advance(1);
            // Re-ask an older call: never Execute.
            if i >= 5 {
                let (o, round, s, id) = &begun[(i as usize * 7) % begun.len()];
                let again = app.begin(o, *round, s);
                match again {
                    Ok(Begin::Execute(t)) => panic!("re-ask of {id} ran again: {t:?}"),
                    Ok(_) => {}
                    Err(e) => panic!("re-ask of {id}: {e:?}"),
                }
            }
        }
        stop.store(true, Ordering::SeqCst);
        let pruned = p.join().unwrap();
        eprintln!("pruned {pruned} executions while beginning");
        (begun, pending)
    });
    // A final prune, then every id is a record or a tombstone.
    app.prune(PruneCutoff::BeforeMs(i64::MAX), true).unwrap();
    for (_, _, _, id) in &begun {
        let rec = app.get(id).unwrap();
        let tomb = app.tombstone(id).unwrap();
        assert!(
            rec.is_some() ^ tomb.is_some(),
            "{id}: record {rec:?} tombstone {tomb:?}"
        );
    }
    // recover() from a third session lists exactly the pending ones (the
    // executing ones are alive under `app`).
    let third = open_with(&path, &clock);
    let mut listed: Vec<ExecutionId> = third
        .recover()
        .unwrap()
        .into_iter()
        .map(|r| r.execution_id)
        .collect();
    listed.sort();
    let mut want = pending.clone();
    want.sort();
    assert_eq!(listed, want);
    for id in &pending {
        let st = app.get(id).unwrap().unwrap().status;
        assert!(
            st == ExecutionStatus::Executing || st == ExecutionStatus::Committed,
            "{id}: {st:?}"
        );
    }
}

/// The watermark across sessions: session A sweeps (recover), session B
/// prunes the newest rows (the max rowid goes), session A begins a call
/// that takes a reused rowid, then a third session's recover must find it
/// and the stopped-owner rows too.
#[test]
fn a_reused_rowid_after_another_session_pruned_the_max_is_still_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (a, clock) = open_at(&path);
    // A non-final row at the bottom, owned by a session that then dies.
    {
        let dead = open_with(&path, &clock);
        ticket(
            dead.begin(&op("dead"), 0, &spec("d", "send", "{}"))
                .unwrap(),
        );
    }
    for i in 0..20 {
        delivered(&a, "o", &format!("c{i}"), "{}");
    }
    // Sweep: W = max rowid.
    assert_eq!(a.recover().unwrap().len(), 1);
    clock.advance(DAY_MS);
    let b = open_with(&path, &clock);
    let r = b.prune(Duration::from_secs(3600), true).unwrap();
    assert_eq!(r.executions, 20);
    drop(b);
    // New calls reuse rowids 2.. ; one approval, one executing.
    let Begin::NeedsApproval(appr) = a
        .begin(&op("n"), 0, &spec("n1", "send", "{}").with_approval())
        .unwrap()
    else {
        panic!()
    };
    let t = ticket(a.begin(&op("n"), 0, &spec("n2", "send", "{}")).unwrap());
    let c = open_with(&path, &clock);
    let mut ids: Vec<String> = c
        .recover()
        .unwrap()
        .into_iter()
        .map(|r| r.execution_id.to_string())
        .collect();
    ids.sort();
    let mut want = vec![
        appr.execution_id.to_string(),
        t.execution_id.to_string(),
        "dead:round_0:d:send:v1".to_owned(),
    ];
    want.sort();
    assert_eq!(ids, want);
}

/// `compensate` reads the original, then writes the compensation in a
/// second transaction. A prune in another session between the two deletes
/// the original (delivered, no compensation yet). The compensation must
/// then either refuse with a typed error (`NotFound`) or keep the
/// original: never a raw storage error, never a compensation pointing to
/// nothing.
#[test]
fn compensate_racing_a_prune_of_its_original_is_typed_and_keeps_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let pruner = open_with(&path, &clock);
    clock.advance(DAY_MS);
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut odd: Vec<String> = Vec::new();
    let mut not_found = 0;
    let mut ok = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                let _ = pruner.prune(PruneCutoff::BeforeMs(i64::MAX), true);
                // A pause: back-to-back write transactions can starve the
                // app's own writes past their busy timeout (SQLite's lock is
                // not fair), which is not what this test is about.
                std::thread::sleep(Duration::from_micros(500));
            }
        });
        for i in 0..400 {
            if Instant::now() > deadline {
                break;
            }
            let original = delivered(&app, "o", &format!("pay{i}"), "{}");
            // The delivery mark is queued: write it so the original is prunable.
            app.checkpoint().ok();
            match app.compensate(
                &original,
                &op("refunds"),
                0,
                &spec(&format!("refund{i}"), "refund", "{}"),
            ) {
                Ok(Begin::Execute(t)) => {
                    ok += 1;
                    let rec = app.get(&t.execution_id).unwrap().unwrap();
                    let orig = app.get(&original).unwrap();
                    if orig.is_none() {
                        odd.push(format!(
                            "{}: compensation {} points to a pruned original ({:?})",
                            i, t.execution_id, rec.compensates
                        ));
                    }
                    app.commit(&t.attempt_id(), "{}", None).unwrap();
                }
                Ok(other) => odd.push(format!("{i}: {other:?}")),
                Err(Error::NotFound(_)) => not_found += 1,
                Err(e) => odd.push(format!("{i}: untyped {e:?}")),
            }
        }
        stop.store(true, Ordering::SeqCst);
    });
    eprintln!(
        "ok {ok}, not found {not_found}, odd {}: {odd:#?}",
        odd.len()
    );
    assert!(odd.is_empty(), "{odd:#?}");
}

/// An `Inspector` opened on a cleanly closed file (immutable) and kept
/// open, as the docs allow ("the supported way for an app to read its
/// ledger from a second connection"). An app then opens the file, begins
/// and prunes, and closes it (its WAL removed). The inspector's next read
/// must see the app's writes, not its page cache of before.
#[test]
fn a_long_lived_inspector_sees_what_an_app_wrote_and_pruned_after_it_opened() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    {
        let (ledger, _c) = open_at(&path);
        for i in 0..5 {
            delivered(&ledger, "o", &format!("c{i}"), "{}");
        }
    }
    assert!(!dir.path().join("l.db-wal").exists(), "closed cleanly");
    let inspector = Inspector::open(&path).unwrap();
    assert_eq!(inspector.execution_count().unwrap(), 5);
    assert_eq!(inspector.summary().unwrap().tombstones, 0);
    {
        let (ledger, clock) = open_at(&path);
        clock.advance(10 * DAY_MS);
        let r = ledger.prune(Duration::from_secs(86_400), true).unwrap();
        assert_eq!(r.executions, 5);
        for i in 0..3 {
            ticket(
                ledger
                    .begin(&op("p"), 0, &spec(&format!("n{i}"), "send", "{}"))
                    .unwrap(),
            );
        }
    }
    let wal_after = dir.path().join("l.db-wal").exists();
    let count = inspector.execution_count().unwrap();
    let tombs = inspector.summary().map(|s| s.tombstones);
    eprintln!("wal after close: {wal_after}; inspector count {count}, tombstones {tombs:?}");
    assert_eq!(count, 3, "the inspector reports the file as it is now");
    assert_eq!(tombs.unwrap(), 5);
    // A fresh inspector agrees.
    let fresh = Inspector::open(&path).unwrap();
    assert_eq!(fresh.execution_count().unwrap(), 3);
}

/// Prune on a full disk: a typed `DiskFull` (or nothing to do), every
/// record or tombstone kept, the pruned ones answer from tombstones, and
/// once space is back the prune finishes.
#[test]
fn prune_on_a_full_disk_is_typed_and_loses_nothing() {
    use std::process::Command;
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().to_str().unwrap().to_owned();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs", &target])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        println!("SKIPPED: cannot mount a tmpfs");
        return;
    }
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .args(["-l", &self.0])
                .status();
        }
    }
    let _guard = Unmount(target.clone());
    let path = tmp.path().join("l.db");
    let (ledger, clock) = open_at(&path);
    let pad = "x".repeat(1500);
    let mut ids = Vec::new();
    for i in 0..300 {
        ids.push(delivered(
            &ledger,
            &format!("op_{}", i / 10),
            &format!("c{i}"),
            &format!(r#"{{"p":"{pad}","n":{i}}}"#),
        ));
    }
    let live = ticket(
        ledger
            .begin(&op("live"), 0, &spec("x", "send", "{}"))
            .unwrap(),
    );
    ledger.suspend().unwrap();
    ledger.resume().unwrap();
    // Fill the disk.
    let filler = tmp.path().join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0x5Au8; 4096];
        for _ in 0..10_000 {
            if f.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = f.sync_all();
    }
    clock.advance(10 * DAY_MS);
    let res = ledger.prune_with(
        &toolledger::ledger::PruneOptions {
            batch_size: 20,
            ..toolledger::ledger::PruneOptions::new(Duration::from_secs(86_400))
        },
        &mut |_| {},
    );
    eprintln!("prune on a full disk: {res:?}");
    match &res {
        Ok(_) => {}
        Err(Error::Store(StorageError::DiskFull)) => {}
        Err(e) => panic!("untyped: {e:?}"),
    }
    // Nothing lost: each id a record or a tombstone; the live call executing.
    for id in &ids {
        let rec = ledger.get(id).unwrap();
        let tomb = ledger.tombstone(id).unwrap();
        assert!(rec.is_some() ^ tomb.is_some(), "{id}: {rec:?} {tomb:?}");
        if let Some(rec) = rec {
            assert_eq!(rec.status, ExecutionStatus::ResultDelivered);
        }
    }
    assert_eq!(
        ledger.get(&live.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Executing
    );
    std::fs::remove_file(&filler).unwrap();
    ledger.prune(Duration::from_secs(86_400), true).unwrap();
    for id in &ids {
        assert!(ledger.get(id).unwrap().is_none());
        assert!(ledger.tombstone(id).unwrap().is_some(), "{id}");
    }
    ledger.commit(&live.attempt_id(), "{}", None).unwrap();
}

/// A pruned call asked through `next_step` / `run_existing`-like paths
/// (here: `begin_round` with the pruned id and a new one under a live
/// executing call of another session) answers from the tombstone; the
/// other session's executing call is untouched by a prune of its
/// operation's finished calls.
#[test]
fn pruning_an_operation_with_a_live_call_of_another_session_keeps_the_operation_and_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let done = delivered(&app, "o", "c1", "{}");
    let live = ticket(app.begin(&op("o"), 1, &spec("c2", "send", "{}")).unwrap());
    clock.advance(10 * DAY_MS);
    let cli = open_with(&path, &clock);
    let r = cli.prune(Duration::from_secs(86_400), true).unwrap();
    assert_eq!(r.executions, 1);
    assert_eq!(r.operations, 0, "the operation still has a call");
    // The other session still sees the live call in flight.
    assert!(matches!(
        cli.begin(&op("o"), 1, &spec("c2", "send", "{}")).unwrap(),
        Begin::InFlight { .. }
    ));
    assert!(cli
        .recover()
        .unwrap()
        .iter()
        .any(|r| r.execution_id == live.execution_id));
    drop(cli);
    app.commit(&live.attempt_id(), "{}", None).unwrap();
    assert!(app.get(&done).unwrap().is_none());
    assert!(matches!(
        app.begin(&op("o"), 0, &spec("c1", "send", "{}")).unwrap(),
        Begin::Failed { reason, .. } if reason == PRUNED_EXECUTED_REASON
    ));
    let _ = LedgerConfig::default();
}
