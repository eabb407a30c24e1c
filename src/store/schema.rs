//! Schema versions and the migration runner.
//!
//! Each version is one SQL file in `migrations/`, applied in order by one loop
//! inside one IMMEDIATE transaction that sets `PRAGMA user_version` once at the
//! end. A file with a newer version than [`CURRENT_VERSION`] is refused with
//! [`Error::IncompatibleVersion`] and never modified.

use rusqlite::{Connection, TransactionBehavior};

use super::error::{Error, Result};

/// Migration `n` (1-based) turns a version `n - 1` database into version `n`.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/001_initial.sql"),
    include_str!("migrations/002_retention.sql"),
];

/// The schema version this build writes.
pub const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// Refuses a database written by a newer build, without writing to it.
///
/// # Errors
/// [`Error::IncompatibleVersion`]; `NotADatabase` / `Corrupt` for bad files.
pub fn refuse_newer(conn: &Connection) -> Result<()> {
    let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > CURRENT_VERSION {
        return Err(Error::IncompatibleVersion {
            found,
            supported: CURRENT_VERSION,
        });
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
    for sql in MIGRATIONS.iter().skip(start) {
        tx.execute_batch(sql)?;
    }
    tx.pragma_update(None, "user_version", CURRENT_VERSION)?;
    tx.commit()?;
    Ok(())
}
