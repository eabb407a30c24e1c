//! The power VFS's own fault injection, checked on its own: a loss model
//! that quietly kept every write would let every power-cut test pass
//! without testing anything. Each model is driven with a fixed `draw` so
//! that what the disk must hold after the restart is known exactly.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};
use toolledger_test_support::power_vfs::{Loss, Machine};

/// A database whose WAL holds about 20 kB written and never synced
/// (`synchronous=OFF`), then the power goes: returns the WAL's path.
fn unsynced_wal(machine: &Machine, dir: &Path) -> PathBuf {
    let path = dir.join("t.db");
    let conn = Connection::open_with_flags_and_vfs(
        &path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        machine.vfs_name(),
    )
    .unwrap();
    conn.execute_batch(
        "PRAGMA synchronous=OFF; PRAGMA journal_mode=WAL;
         CREATE TABLE t(x); INSERT INTO t VALUES (randomblob(20000));",
    )
    .unwrap();
    assert!(machine.unsynced_writes() > 0, "nothing was left unsynced");
    machine.cut_now();
    drop(conn);
    let mut wal = path.into_os_string();
    wal.push("-wal");
    PathBuf::from(wal)
}

fn wal_after(loss: Loss, draw: &mut dyn FnMut(u64) -> u64) -> Vec<u8> {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let wal = unsynced_wal(&machine, dir.path());
    machine.restart(loss, draw);
    machine
        .durable_file(&wal.to_string_lossy())
        .expect("the WAL file exists")
}

/// SQLite's WAL magic (big-endian 0x377f0682 or 0x377f0683).
fn has_wal_header(bytes: &[u8]) -> bool {
    bytes.len() >= 32 && bytes[..3] == [0x37, 0x7f, 0x06] && matches!(bytes[3], 0x82 | 0x83)
}

#[test]
fn each_loss_model_loses_what_it_says_and_keeps_what_it_says() {
    // All: not one unsynced byte of the WAL reaches the disk.
    let all = wal_after(Loss::All, &mut |_| 0);
    assert!(
        all.is_empty(),
        "Loss::All kept {} bytes of the WAL",
        all.len()
    );

    // Subset, every write drawn as kept: the whole WAL is there.
    let kept = wal_after(Loss::Subset, &mut |_| 0);
    assert!(
        has_wal_header(&kept),
        "Subset (all kept) lost the WAL header"
    );
    assert!(
        kept.len() > 20_000,
        "Subset (all kept) kept {} bytes",
        kept.len()
    );

    // Prefix, k drawn as 0: nothing.
    let none = wal_after(Loss::Prefix, &mut |_| 0);
    assert!(none.is_empty(), "Prefix(0) kept {} bytes", none.len());

    // Torn, every write torn, no garbage, every sector drawn as old: the
    // file reaches as far as the writes did, but holds none of their bytes.
    let torn = wal_after(Loss::Torn, &mut |n| n - 1);
    assert!(
        torn.len() > 20_000,
        "a torn write did not extend the file ({} bytes)",
        torn.len()
    );
    assert!(
        torn.iter().all(|b| *b == 0),
        "a write torn with every sector old reached the disk whole (WAL header {})",
        has_wal_header(&torn)
    );

    // Torn, sectors alternating new and old: some of the WAL's bytes are
    // there, and some sectors of it are not.
    let mut n = 0u64;
    let mut alternate = |m: u64| {
        n += 1;
        match m {
            3 => 2,     // tear every write
            2 => n % 2, // garbage never on odd calls; sectors alternate
            _ => 0,
        }
    };
    let half = wal_after(Loss::Torn, &mut alternate);
    let sectors: Vec<&[u8]> = half.chunks(512).collect();
    let zero = sectors.iter().filter(|s| s.iter().all(|b| *b == 0)).count();
    assert!(
        zero > 0 && zero < sectors.len(),
        "torn writes kept all or none of their sectors ({zero} of {} zero)",
        sectors.len()
    );
}

/// The seeded cuts lose what they should: over a few seeds, some results
/// handed to the model were not committed on reopening (a deferred commit
/// lost with the unsynced WAL) and reconciliation committed them again.
/// Without losses the seeded runs would pass without testing recovery
/// (they print `commits_reconciled`, but nothing asserts it).
#[test]
fn the_seeded_cuts_lose_deferred_commits_that_reconciliation_repairs() {
    let mut reconciled = 0;
    let mut cuts_inside = 0;
    for seed in super::BASE_SEED..super::BASE_SEED + 40 {
        let t = super::run_seed(seed, super::CUTS_PER_SEED, true, false, false)
            .unwrap_or_else(|e| panic!("seed={seed}: {e}"));
        reconciled += t.reconciled;
        cuts_inside += t.cuts_inside;
    }
    assert!(cuts_inside > 0, "no cut fell inside a workload");
    assert!(
        reconciled > 0,
        "no cut lost a deferred commit: the fault injection lost nothing"
    );
}
