//! The background thread racing suspend(), resume(), drop and a second
//! ledger on the same file (bounded: 40 rounds, every wait capped).

use std::sync::mpsc;
use std::time::Duration;

use toolledger::ledger::{IdleCheckpoint, Ledger};
use toolledger_test_support::power_vfs::{Loss, Machine};

use super::{config, deferred_calls, lost_commits};

#[test]
fn the_background_thread_never_hangs_writes_while_suspended_or_loses_a_commit() {
    for round in 0..40u32 {
        let machine = Machine::new();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let mut cfg = config(&machine, true);
        cfg.deferred_commits.deadline = Duration::from_micros(u64::from(round % 5) * 300);
        cfg.idle_checkpoint = IdleCheckpoint {
            after: Duration::from_micros(u64::from(round % 3) * 500 + 1),
            writes: 1,
        };
        let (done, finished) = mpsc::channel();
        let m = machine.clone();
        let p = path.clone();
        std::thread::spawn(move || {
            let a = Ledger::open(&p, cfg.clone()).unwrap();
            let b = Ledger::open(&p, cfg).unwrap();
            let mut acked = deferred_calls(&a, 0, 3);
            acked.extend(deferred_calls(&b, 1, 2));
            a.suspend().unwrap();
            let ops = m.ops();
            std::thread::sleep(Duration::from_millis(3));
            // b may write; a must not. b's writes are counted apart: stop b.
            drop(b);
            let after_b = m.ops();
            std::thread::sleep(Duration::from_millis(3));
            assert_eq!(m.ops(), after_b, "round {round}: a write while suspended");
            let _ = ops;
            a.resume().unwrap();
            acked.extend(deferred_calls(&a, 2, 2));
            if round % 2 == 0 {
                drop(a);
            } else {
                a.suspend().unwrap();
                drop(a);
            }
            m.cut_now();
            m.restart(Loss::All, &mut |_| 0);
            let again = Ledger::open(&p, super::config(&m, true)).unwrap();
            let lost = lost_commits(&again, &acked);
            done.send(lost).unwrap();
        });
        let lost = finished
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("round {round}: hung or panicked: {e}"));
        assert_eq!(lost, Vec::<String>::new(), "round {round}");
    }
}
