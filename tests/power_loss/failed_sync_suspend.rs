//! No checkpoint copies a WAL whose repair failed (`suspend()`'s, or
//! SQLite's when the ledger's connection closes): a copy cut by the power
//! would leave half-written pages in the database file that no whole WAL
//! covers.

use toolledger::ledger::{CallSpec, Downstream, Ledger};
use toolledger::model::{ExecutionId, OperationId, ToolCall};
use toolledger_test_support::power_vfs::{Loss, Machine};

use super::failed_sync::{neither_call, WAL};
use super::{config, deferred_calls};

/// Builds the state: many executions in the database file, an empty WAL
/// restarted by one acknowledged neither-call, then a round whose intent
/// sync failed (its frames are a hole on the disk), then the disk fails the
/// next two syncs: `suspend()`'s mark and its own repair both fail. Returns
/// the ledger, the acknowledged call, the ops `suspend()` made (dry run).
fn scenario(
    machine: &Machine,
    path: &std::path::Path,
    cut: Option<u64>,
    close: bool,
) -> (Option<Ledger>, (ExecutionId, String), u64) {
    let ledger = Ledger::open(path, config(machine, true)).unwrap();
    deferred_calls(&ledger, 0, 150);
    ledger.sync().unwrap();
    ledger.checkpoint().unwrap();
    let first = neither_call(&ledger, "c_first").expect("a healthy disk");
    machine.fail_syncs_of(WAL, 1);
    let op = OperationId::new("op").unwrap();
    let calls: Vec<CallSpec> = (0..60)
        .map(|i| {
            CallSpec::new(
                ToolCall::custom(format!("r{i}"), "pay", format!(r#"{{"n":{i}}}"#)),
                1,
            )
            .with_downstream(Downstream::lookup())
        })
        .collect();
    assert!(
        ledger.begin_round(&op, 9, &calls).is_err(),
        "the intent's sync failed"
    );
    // The disk fails again: the repair of the suspension mark's write and
    // the repair in `Store::suspend` both fail.
    machine.fail_syncs_of(WAL, 2);
    if let Some(n) = cut {
        machine.cut_at(n);
    }
    let before = machine.ops();
    if close {
        // Dropped: its last sync fails too, and the close must not copy.
        drop(ledger);
        return (None, first, machine.ops() - before);
    }
    let suspended = ledger.suspend();
    assert!(cut.is_some() || suspended.is_err(), "the repair failed");
    (Some(ledger), first, machine.ops() - before)
}

/// `suspend()` runs its TRUNCATE checkpoint (and the close runs SQLite's)
/// even when the repair before it failed: the checkpoint's own WAL sync
/// "succeeds" (nothing pending: the failed syncs dropped it), so SQLite
/// takes the WAL as durable and overwrites database pages with frames that
/// are a hole on the disk. A power cut before the database file's sync
/// leaves pages of the lost round in the database file with no WAL to
/// replay over them.
#[test]
fn suspend_does_not_checkpoint_a_wal_whose_repair_failed() {
    cuts_keep_the_database_whole(false);
}

/// The same when the ledger is dropped (closed) instead of suspended.
#[test]
fn closing_does_not_checkpoint_a_wal_whose_repair_failed() {
    cuts_keep_the_database_whole(true);
}

/// Cuts the power at each disk operation of `suspend()` (or the close),
/// two seeds each: the database stays whole and the acknowledged call is
/// there.
fn cuts_keep_the_database_whole(close: bool) {
    let probe_dir = tempfile::tempdir().unwrap();
    let probe = Machine::new();
    let (l, _, ops) = scenario(&probe, &probe_dir.path().join("l.db"), None, close);
    drop(l);
    let mut bad = Vec::new();
    for n in 1..=ops.clamp(1, 400) {
        for seed in 0..2u64 {
            let machine = Machine::new();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("l.db");
            let (ledger, first, _) = scenario(&machine, &path, Some(n), close);
            if let Some(ledger) = ledger {
                ledger.abandon();
            }
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (n * 31 + seed);
            machine.restart(Loss::Subset, &mut |m| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % m.max(1)
            });
            let conn = rusqlite::Connection::open_with_flags_and_vfs(
                &path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE,
                machine.vfs_name(),
            )
            .unwrap();
            let check: String = conn
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .unwrap_or_else(|e| format!("{e}"));
            drop(conn);
            if check != "ok" {
                bad.push(format!("cut {n} seed {seed}: integrity_check: {check}"));
                continue;
            }
            match Ledger::open(&path, config(&machine, true)) {
                Ok(again) => {
                    let rec = again.get(&first.0).ok().flatten();
                    if !rec.is_some_and(|r| r.status.is_committed()) {
                        bad.push(format!("cut {n} seed {seed}: c_first lost"));
                    }
                }
                Err(e) => bad.push(format!("cut {n} seed {seed}: reopen: {e}")),
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} bad cuts, first: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}
