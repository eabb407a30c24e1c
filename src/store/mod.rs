//! SQLite storage: the only module that knows SQL.
//!
//! [`Store`] owns one connection behind a mutex (one writer per process; other
//! processes coordinate through SQLite's file locks and `busy_timeout`). Work
//! is scoped by closures: [`Store::read`] runs in a deferred transaction,
//! [`Store::write`] in an IMMEDIATE one that commits only when the closure
//! returns `Ok` and rolls back on every other path. No transaction or read
//! snapshot stays open between calls, which is what mobile suspension needs.
//!
//! Durability: the database runs in WAL mode with `synchronous=FULL`, so each
//! [`Durability::Full`] write costs exactly one fsync of the WAL at commit.
//! [`Durability::Lazy`] writes (delivery marks) switch to `synchronous=NORMAL`
//! for that one transaction: no fsync, made durable by the next full write or
//! checkpoint. Losing a lazy write only causes a harmless replay.

mod dao;
mod error;
pub mod schema;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

pub use dao::{
    Dao, DbSize, NewExecution, PruneCandidate, PrunedRows, StatusFields, StoreStats, Tombstone,
};
pub use error::{Error, Result};

/// How a write must reach the disk before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync before returning (commit boundaries: intent, commit).
    Full,
    /// No fsync; durable with the next full write or checkpoint.
    Lazy,
}

/// Options for opening a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long a writer waits for another connection's lock.
    pub busy_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// Where the database lives.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    File(PathBuf),
    ReadOnlyFile(PathBuf),
    Memory,
}

/// The SQLite store. `Send + Sync`; all access is serialised by its mutex.
#[derive(Debug)]
pub struct Store {
    conn: Mutex<Option<Connection>>,
    location: Location,
    options: StoreOptions,
}

impl Store {
    /// Opens (creating if missing) the database at `path`, sets the pragmas
    /// and migrates it to the current schema.
    ///
    /// # Errors
    /// [`Error::NotADatabase`] / [`Error::Corrupt`] for a bad file (never
    /// deleted), [`Error::IncompatibleVersion`] for a newer one,
    /// [`Error::CannotOpen`], [`Error::ReadOnly`], [`Error::Busy`].
    pub fn open(path: &Path, options: StoreOptions) -> Result<Store> {
        let location = Location::File(path.to_path_buf());
        let conn = connect(&location, &options).map_err(|e| refine_cannot_open(e, path))?;
        Ok(Store {
            conn: Mutex::new(Some(conn)),
            location,
            options,
        })
    }

    /// Opens an existing database for reading only: nothing is written to the
    /// file (no migration, no journal-mode change, no checkpoint), for tools
    /// that look at a database pulled from a device. Writes through it fail
    /// with [`Error::ReadOnly`].
    ///
    /// # Errors
    /// [`Error::OlderSchema`] for a file that needs a migration first,
    /// [`Error::IncompatibleVersion`] for a newer one, [`Error::NotADatabase`],
    /// [`Error::Corrupt`], [`Error::CannotOpen`] (also when SQLite cannot set up
    /// read-only WAL access, e.g. in a read-only directory without `-shm`).
    pub fn open_read_only(path: &Path, options: StoreOptions) -> Result<Store> {
        let location = Location::ReadOnlyFile(path.to_path_buf());
        let conn = connect(&location, &options)?;
        Ok(Store {
            conn: Mutex::new(Some(conn)),
            location,
            options,
        })
    }

    /// Opens a private in-memory database (tests, ephemeral harnesses).
    ///
    /// # Errors
    /// Storage errors from SQLite.
    pub fn open_in_memory() -> Result<Store> {
        let options = StoreOptions::default();
        let conn = connect(&Location::Memory, &options)?;
        Ok(Store {
            conn: Mutex::new(Some(conn)),
            location: Location::Memory,
            options,
        })
    }

    /// The database file's path, `None` for an in-memory store.
    pub fn path(&self) -> Option<&Path> {
        match &self.location {
            Location::File(p) | Location::ReadOnlyFile(p) => Some(p),
            Location::Memory => None,
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, Option<Connection>>> {
        self.conn.lock().map_err(|_| Error::LockPoisoned)
    }

    /// Runs `f` in a deferred (read) transaction that ends before returning.
    ///
    /// # Errors
    /// Whatever `f` returns, or storage errors.
    pub fn read<T, E: From<Error>>(
        &self,
        f: impl FnOnce(&Dao<'_>) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let guard = self.lock()?;
        let conn = guard.as_ref().ok_or(Error::Suspended)?;
        run_in_transaction(conn, "BEGIN DEFERRED", f)
    }

    /// Runs `f` in an IMMEDIATE transaction; commits with the requested
    /// durability when `f` returns `Ok`, rolls back otherwise.
    ///
    /// # Errors
    /// Whatever `f` returns, or storage errors (nothing is written then).
    pub fn write<T, E: From<Error>>(
        &self,
        durability: Durability,
        f: impl FnOnce(&Dao<'_>) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let mut guard = self.lock()?;
        let conn = guard.as_mut().ok_or(Error::Suspended)?;
        if durability == Durability::Lazy {
            conn.pragma_update(None, "synchronous", "NORMAL")
                .map_err(Error::from)?;
        }
        let result = run_in_transaction(conn, "BEGIN IMMEDIATE", f);
        if durability == Durability::Lazy {
            // Restore the boundary setting even when the write failed.
            let restored = conn.pragma_update(None, "synchronous", "FULL");
            if let (Ok(_), Err(e)) = (&result, restored) {
                return Err(Error::from(e).into());
            }
        }
        result
    }

    /// Copies the whole WAL into the main file and truncates the WAL (after
    /// a prune, this is when the file shrinks). Does nothing in memory.
    ///
    /// # Errors
    /// Storage errors; [`Error::Busy`] when another connection's reader or
    /// writer keeps the checkpoint from completing.
    pub fn checkpoint(&self) -> Result<()> {
        let guard = self.lock()?;
        let conn = guard.as_ref().ok_or(Error::Suspended)?;
        let (busy, _, _): (i64, i64, i64) =
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
        if busy != 0 && self.location != Location::Memory {
            return Err(Error::Busy);
        }
        Ok(())
    }

    /// Checkpoints the WAL into the main file and closes the connection, so
    /// that no file lock is held (call before iOS suspends the app).
    ///
    /// # Errors
    /// Storage errors from the checkpoint; the store stays open then.
    pub fn suspend(&self) -> Result<()> {
        let mut guard = self.lock()?;
        if let Some(conn) = guard.as_ref() {
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
        }
        if let Some(conn) = guard.take() {
            conn.close().map_err(|(_, e)| Error::from(e))?;
        }
        Ok(())
    }

    /// Reopens after [`Store::suspend`]; a no-op when open.
    ///
    /// # Errors
    /// The errors of [`Store::open`].
    pub fn resume(&self) -> Result<()> {
        let mut guard = self.lock()?;
        if guard.is_none() {
            *guard = Some(connect(&self.location, &self.options)?);
        }
        Ok(())
    }

    /// True between [`Store::suspend`] and [`Store::resume`].
    pub fn is_suspended(&self) -> bool {
        self.conn.lock().map(|g| g.is_none()).unwrap_or(false)
    }
}

/// SQLite says "cannot open" both for a missing directory and for an
/// existing database on a read-only file system (it cannot create `-shm`);
/// the second is reported as [`Error::ReadOnly`].
fn refine_cannot_open(err: Error, path: &Path) -> Error {
    if !matches!(err, Error::CannotOpen) || !path.exists() {
        return err;
    }
    match std::fs::OpenOptions::new().write(true).open(path) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            Error::ReadOnly
        }
        _ => err,
    }
}

/// Runs `f` between `begin` and `COMMIT`. The transaction statements are
/// prepared once and cached (parsing `BEGIN`/`COMMIT` on every call was a
/// measurable share of a tool call's CPU); a guard rolls back on every path
/// that does not commit, a panic included.
fn run_in_transaction<T, E: From<Error>>(
    conn: &Connection,
    begin: &str,
    f: impl FnOnce(&Dao<'_>) -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    conn.prepare_cached(begin)
        .and_then(|mut s| s.execute([]))
        .map_err(Error::from)?;
    let mut guard = RollbackGuard { conn, armed: true };
    let out = f(&Dao::new(conn))?;
    conn.prepare_cached("COMMIT")
        .and_then(|mut s| s.execute([]))
        .map_err(Error::from)?;
    guard.armed = false;
    Ok(out)
}

/// Rolls back the open transaction when dropped armed.
struct RollbackGuard<'c> {
    conn: &'c Connection,
    armed: bool,
}

impl Drop for RollbackGuard<'_> {
    fn drop(&mut self) {
        if self.armed && !self.conn.is_autocommit() {
            // Nothing to report to: the caller already has the first error.
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// Sets the busy timeout. rusqlite takes it as an i32 of milliseconds (and
/// panics past it): clamp, a lock held for 24 days is as good as forever.
fn set_busy_timeout(conn: &Connection, options: &StoreOptions) -> Result<()> {
    conn.busy_timeout(
        options
            .busy_timeout
            .min(Duration::from_millis(i32::MAX as u64)),
    )?;
    Ok(())
}

/// Opens a read-only connection: no pragma that writes, no migration.
fn connect_read_only(path: &Path, options: &StoreOptions) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)?;
    set_busy_timeout(&conn, options)?;
    schema::refuse_newer(&conn)?;
    let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found < schema::CURRENT_VERSION {
        return Err(Error::OlderSchema {
            found,
            current: schema::CURRENT_VERSION,
        });
    }
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

fn connect(location: &Location, options: &StoreOptions) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let mut conn = match location {
        Location::File(path) => Connection::open_with_flags(path, flags)?,
        Location::ReadOnlyFile(path) => return connect_read_only(path, options),
        Location::Memory => Connection::open_in_memory()?,
    };
    set_busy_timeout(&conn, options)?;
    // The first statement that reads the header reports NOTADB / CORRUPT.
    // A newer schema is refused before anything (even the journal mode) is
    // written to the file.
    schema::refuse_newer(&conn)?;
    // Only takes effect on a new, empty file; must precede the first table.
    conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL;")?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if location != &Location::Memory && !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::InvalidData(format!(
            "journal_mode is {mode}, not wal"
        )));
    }
    conn.execute_batch(
        "PRAGMA synchronous=FULL;
         PRAGMA foreign_keys=ON;",
    )?;
    conn.set_prepared_statement_cache_capacity(64);
    schema::migrate(&mut conn)?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        ArgsDigest, ExecutionId, ExecutionStatus, OperationId, Provider, SessionId, Transition,
    };

    fn seed(store: &Store) -> ExecutionId {
        let op = OperationId::new("op").unwrap();
        let id = ExecutionId::parse("op:round_0:c:t:v1").unwrap();
        let digest = ArgsDigest::parse("a".repeat(64)).unwrap();
        let session = SessionId::generate();
        store
            .write(Durability::Full, |dao| {
                dao.ensure_operation(&op, 1)?;
                dao.insert_execution(
                    &NewExecution {
                        execution_id: &id,
                        operation_id: &op,
                        round: 0,
                        position: 0,
                        provider: Provider::Custom,
                        provider_call_id: "c",
                        tool_name: "t",
                        tool_version: 1,
                        args_digest: &digest,
                        args_json: "{}",
                        downstream_key: &id.downstream_key(),
                        requires_approval: false,
                        status: ExecutionStatus::Executing,
                        attempt_count: 1,
                        owner_session: Some(&session),
                        lease_deadline_ms: Some(10),
                        compensates: None,
                        now_ms: 1,
                    },
                    &session,
                )?;
                dao.move_status(
                    &id,
                    ExecutionStatus::Executing,
                    Transition::Commit,
                    ExecutionStatus::Committed,
                    &StatusFields {
                        result_json: Some("{\"r\":1}"),
                        ..StatusFields::default()
                    },
                    &session,
                    2,
                )
            })
            .unwrap();
        id
    }

    #[test]
    fn the_schema_refuses_to_downgrade_a_committed_execution() {
        let store = Store::open_in_memory().unwrap();
        let id = seed(&store);
        let session = SessionId::generate();
        // Bypass the transition table on purpose: the trigger is the last guard.
        let err = store
            .write(Durability::Full, |dao| {
                dao.move_status(
                    &id,
                    ExecutionStatus::Committed,
                    Transition::FailBeforeCommit,
                    ExecutionStatus::FailedBeforeCommit,
                    &StatusFields::default(),
                    &session,
                    3,
                )
            })
            .unwrap_err();
        assert!(
            matches!(err, Error::Guard(ref m) if m.contains("cannot be downgraded")),
            "{err:?}"
        );
        let rec = store.read(|dao| dao.execution(&id)).unwrap().unwrap();
        assert_eq!(rec.status, ExecutionStatus::Committed);
        assert_eq!(rec.result_json.as_deref(), Some("{\"r\":1}"));
    }

    #[test]
    fn a_guarded_move_from_the_wrong_status_changes_nothing() {
        let store = Store::open_in_memory().unwrap();
        let id = seed(&store);
        let moved = store
            .write(Durability::Full, |dao| {
                dao.move_status(
                    &id,
                    ExecutionStatus::Executing,
                    Transition::MarkUnknown,
                    ExecutionStatus::OutcomeUnknown,
                    &StatusFields::default(),
                    &SessionId::generate(),
                    3,
                )
            })
            .unwrap();
        assert!(!moved);
        let log = store.read(|dao| dao.transitions_of(&id)).unwrap();
        assert_eq!(log.len(), 2, "no log entry for a move that did not happen");
    }

    #[test]
    fn a_failed_write_rolls_back_everything() {
        let store = Store::open_in_memory().unwrap();
        let op = OperationId::new("op2").unwrap();
        let r: Result<()> = store.write(Durability::Full, |dao| {
            dao.ensure_operation(&op, 1)?;
            Err(Error::InvalidData("abort".into()))
        });
        assert!(r.is_err());
        assert_eq!(store.read(|dao| dao.operation_status(&op)).unwrap(), None);
    }

    #[test]
    fn lazy_writes_restore_full_synchronous() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db"), StoreOptions::default()).unwrap();
        let op = OperationId::new("op").unwrap();
        store
            .write(Durability::Lazy, |dao| {
                dao.ensure_operation(&op, 1).map(|_| ())
            })
            .unwrap();
        let guard = store.lock().unwrap();
        let conn = guard.as_ref().unwrap();
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 2, "FULL");
        let fk: i64 = conn
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(fk, 1);
    }

    #[test]
    fn suspended_stores_refuse_work_until_resumed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        store.suspend().unwrap();
        assert!(store.is_suspended());
        // The WAL was checkpointed and truncated: the main file holds everything.
        let wal = std::fs::metadata(dir.path().join("s.db-wal"))
            .map(|m| m.len())
            .unwrap_or(0);
        assert_eq!(wal, 0);
        let op = OperationId::new("op").unwrap();
        assert!(matches!(
            store.read(|dao| dao.operation_status(&op)),
            Err(Error::Suspended)
        ));
        store.resume().unwrap();
        assert_eq!(store.read(|dao| dao.operation_status(&op)).unwrap(), None);
    }
}
