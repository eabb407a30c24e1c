//! A failed sync the store learns of only through its own WAL hook:
//! SQLite's checkpoint inside a commit (see `failed_sync.rs` for the rest).

use toolledger::ledger::{Begin, CallSpec, Downstream, Ledger};
use toolledger::model::{OperationId, ToolCall};
use toolledger_test_support::power_vfs::Machine;

use super::failed_sync::{neither_call, WAL};
use super::{config, cut_and_reopen};

/// SQLite's automatic checkpoint runs inside the commit that takes the WAL
/// past 1,000 pages, and syncs the WAL before it copies. SQLite's default
/// WAL hook ignores that checkpoint's result, so when that sync fails the
/// commit still returns OK and no error is ever classified: the store
/// never sets `sync_failed`. The failed sync dropped the deferred commit's
/// frames (a hole); the next intent's sync "succeeds" and a neither-call is
/// acknowledged durable behind the hole; a power cut loses it.
#[test]
fn a_failed_sync_in_sqlites_own_autocheckpoint_is_repaired() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = Ledger::open(&path, config(&machine, true)).unwrap();
    let op = OperationId::new("op").unwrap();
    let mut hit = None;
    // Another connection (an inspector, another process) reads meanwhile:
    // its snapshot keeps a checkpoint from copying frames after it, so no
    // later checkpoint copies (and so heals) what follows the hole.
    let mut reader = None;
    for i in 0..3000 {
        if i == 100 {
            let r = rusqlite::Connection::open_with_flags_and_vfs(
                &path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                machine.vfs_name(),
            )
            .unwrap();
            r.execute_batch("BEGIN").unwrap();
            let _: i64 = r
                .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
                .unwrap();
            reader = Some(r);
        }
        machine.fail_syncs_of(WAL, 0);
        let call = ToolCall::custom(format!("d{i}"), "pay", format!(r#"{{"n":{i}}}"#));
        let spec = CallSpec::new(call, 1).with_downstream(Downstream::lookup());
        let Begin::Execute(t) = ledger.begin(&op, 1, &spec).unwrap() else {
            panic!("not executed");
        };
        // A deferred commit syncs nothing of its own: a sync of the WAL
        // in it is SQLite's autocheckpoint's.
        machine.fail_syncs_of(WAL, 1);
        let committed = ledger.commit(&t.attempt_id(), r#"{"paid":1}"#, None);
        if machine.failing_syncs_left() == 0 {
            hit = Some((i, committed.is_ok()));
            break;
        }
    }
    machine.fail_syncs_of(WAL, 0);
    let (i, ok) = hit.expect("no autocheckpoint within 3000 calls");
    eprintln!("the autocheckpoint's WAL sync failed in commit {i}; commit ok: {ok}");
    let acked = neither_call(&ledger, "c_next").expect("a healthy disk again");
    drop(reader);
    let again = cut_and_reopen(&machine, ledger, &path);
    let rec = again.get(&acked.0).unwrap();
    assert!(
        rec.as_ref().is_some_and(
            |r| r.status.is_committed() && r.result_json.as_deref() == Some(acked.1.as_str())
        ),
        "the neither-call acknowledged durable after the failed autocheckpoint sync \
         is lost to the cut: {:?}",
        rec.map(|r| r.status)
    );
}
