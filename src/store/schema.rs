//! Schema versions and the migration runner.
//!
//! Each version is a list of steps — SQL files in `migrations/`, and where
//! stored text must be written by the one Rust codec for it, a Rust step —
//! applied in order by one loop inside one IMMEDIATE transaction that sets
//! `PRAGMA user_version` once at the end. A file with a newer version than [`CURRENT_VERSION`] is refused with
//! [`Error::IncompatibleVersion`] and never modified.

use rusqlite::{Connection, TransactionBehavior};

use super::error::{Error, Result};
use super::history;

/// One step of a migration.
enum Step {
    /// A batch of SQL statements.
    Sql(&'static str),
    /// Rust code, for values whose encoding lives in Rust (the transition log).
    Rust(fn(&Connection) -> Result<()>),
}

/// Migration `n` (1-based) turns a version `n - 1` database into version `n`.
const MIGRATIONS: &[&[Step]] = &[
    &[Step::Sql(include_str!("migrations/001_initial.sql"))],
    &[Step::Sql(include_str!("migrations/002_retention.sql"))],
    &[
        Step::Sql(include_str!("migrations/003_hot_path.sql")),
        Step::Rust(history::fill_from_transitions),
        Step::Sql(include_str!("migrations/003_hot_path_swap.sql")),
    ],
    &[Step::Sql(include_str!("migrations/004_owners.sql"))],
    &[Step::Sql(include_str!("migrations/005_guard.sql"))],
];

/// The schema version this build writes.
pub const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// Refuses a database written by a newer build, without writing to it.
///
/// # Errors
/// [`Error::IncompatibleVersion`]; `NotADatabase` / `Corrupt` for bad files.
///
/// Also refuses, untouched, an SQLite database that is not a ledger (the
/// app's own database, a wrong path): a file at version 0 must hold nothing
/// (no table, view, index or trigger: a new ledger's migration writes its
/// schema and its version in one transaction), and one at a later version
/// the ledger's own tables with their key columns. Without
/// this the migration added the ledger's tables to the app's file, or failed
/// half-way with SQLite's own message, after the switch to WAL had already
/// rewritten the file's header.
pub fn refuse_newer(conn: &Connection) -> Result<()> {
    // One statement, so one snapshot: another process's migration may
    // commit the tables and the version between two reads.
    let (found, tables, ours): (i64, i64, i64) = conn.query_row(
        "SELECT (SELECT user_version FROM pragma_user_version),
                count(*),
                count(CASE WHEN type = 'table'
                            AND name IN ('operations', 'executions', 'approvals') THEN 1 END)
                + (SELECT count(*) FROM pragma_table_info('executions') WHERE name = 'execution_id')
                + (SELECT count(*) FROM pragma_table_info('operations') WHERE name = 'operation_id')
         FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    if found > CURRENT_VERSION {
        return Err(Error::IncompatibleVersion {
            found,
            supported: CURRENT_VERSION,
        });
    }
    let a_ledger = if found == 0 { tables == 0 } else { ours == 5 };
    if !a_ledger {
        return Err(Error::NotADatabase);
    }
    Ok(())
}

/// Brings the database up to [`CURRENT_VERSION`].
///
/// # Errors
/// [`Error::IncompatibleVersion`] for a newer file; storage errors otherwise
/// (the transaction rolls back, leaving the file at its old version).
pub fn migrate(conn: &mut Connection) -> Result<()> {
    let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > CURRENT_VERSION {
        return Err(Error::IncompatibleVersion {
            found,
            supported: CURRENT_VERSION,
        });
    }
    if found == CURRENT_VERSION {
        return Ok(());
    }
    // Table rebuilds (version 3) drop and recreate tables that others
    // reference: foreign keys are off while migrating (the pragma is a no-op
    // inside a transaction) and checked as a whole before the commit.
    conn.pragma_update(None, "foreign_keys", false)?;
    let migrated = migrate_in(conn);
    let restored = conn.pragma_update(None, "foreign_keys", true);
    migrated?;
    Ok(restored?)
}

fn migrate_in(conn: &mut Connection) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Re-read under the write lock: another process may have migrated meanwhile.
    let found: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > CURRENT_VERSION {
        return Err(Error::IncompatibleVersion {
            found,
            supported: CURRENT_VERSION,
        });
    }
    let start =
        usize::try_from(found).map_err(|_| Error::InvalidData("negative user_version".into()))?;
    for step in MIGRATIONS.iter().skip(start).flat_map(|steps| steps.iter()) {
        match step {
            Step::Sql(sql) => tx.execute_batch(sql)?,
            Step::Rust(run) => run(&tx)?,
        }
    }
    let violations: i64 =
        tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })?;
    if violations != 0 {
        return Err(Error::InvalidData(format!(
            "migration left {violations} foreign key violations"
        )));
    }
    tx.pragma_update(None, "user_version", CURRENT_VERSION)?;
    // A rebuild leaves the old tables' pages free: give them back (the file
    // shrinks at the next checkpoint). The pragma frees one page per step.
    {
        let mut vacuum = tx.prepare("PRAGMA incremental_vacuum")?;
        let mut rows = vacuum.query([])?;
        while rows.next()?.is_some() {}
    }
    tx.commit()?;
    Ok(())
}
