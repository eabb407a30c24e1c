//! Looking at a ledger file without writing to it: [`Inspector`].
//!
//! For tools that examine a database pulled from a device or left by a test
//! run (the `toolledger` CLI's `inspect`, `stats`, `export`). An inspector
//! never migrates, checkpoints or writes the file, takes no session, and —
//! when the file has no `-wal`, i.e. it was closed cleanly — leaves no
//! `-wal`/`-shm` beside it. It is also the supported way for an app to read
//! its ledger from a second connection: opening the file with another
//! SQLite library drops the ledger's locks (see docs/design.md). Each read
//! reports the file as it is then: on a file nobody has open, each read
//! after the first opens its connection again (see `Inspector::read`).

use std::path::Path;
use std::sync::Mutex;

use super::{Error, Result};
use crate::model::{ExecutionRecord, OperationId, OperationStatus};
use crate::store::{self, Dao, DbSize, Store, StoreOptions, StoreStats};

/// A read-only view of a ledger file. Not a [`super::Ledger`]: it cannot
/// begin, commit or recover anything.
#[derive(Debug)]
pub struct Inspector {
    /// Its connection (opened again for each read of a closed file, and
    /// when another connection came: see `read`).
    store: Mutex<Store>,
    /// The file's own schema version when a migrated copy is read.
    copied_from_schema: Option<i64>,
    /// The process the inspector was opened in: a forked child is refused
    /// before `store`'s mutex, which another thread of the parent may have
    /// held at the fork.
    opener: store::Opener,
}

/// Everything `stats` reports about a ledger file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Operations, executions per status, transitions.
    pub stats: StoreStats,
    /// Executions per tool name, most used first.
    pub by_tool: Vec<(String, u64)>,
    /// Tombstones left by pruning.
    pub tombstones: u64,
    /// Pages of the database file.
    pub size: DbSize,
    /// The oldest creation and newest update time of any execution (ms since
    /// the epoch), `None` for an empty ledger.
    pub time_range: Option<(i64, i64)>,
    /// The schema version of what was read (the migrated copy's, when a copy
    /// was read: see [`Inspector::copied_from_schema`]).
    pub schema_version: i64,
}

/// One operation and its executions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationView {
    /// Its id.
    pub id: OperationId,
    /// Open or cancelled.
    pub status: OperationStatus,
    /// Its executions, in execution-id order.
    pub executions: Vec<ExecutionRecord>,
}

/// Where [`Inspector::executions_page`] continues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageCursor(i64);

impl Inspector {
    /// Opens `path` for reading only.
    ///
    /// # Errors
    /// [`Error::Store`] with the store's typed reason: `OlderSchema` for a file
    /// written by an older version (read it with
    /// [`Inspector::open_migrated_copy`]), `IncompatibleVersion` for a newer
    /// one, `NotADatabase`, `Corrupt`, `CannotOpen` (also when SQLite cannot
    /// read a file in use from a read-only directory).
    pub fn open(path: &Path) -> Result<Inspector> {
        Inspector::open_keyed(path, None)
    }

    /// [`Inspector::open`] of a ledger that may be encrypted, with its key.
    ///
    /// # Errors
    /// As [`Inspector::open`]; `KeyRequired` / `WrongKey` for an encrypted
    /// ledger without its key.
    pub fn open_keyed(path: &Path, key: Option<&store::LedgerKey>) -> Result<Inspector> {
        if !path.is_file() {
            return Err(Error::Store(store::Error::CannotOpen));
        }
        Ok(Inspector {
            store: Mutex::new(Store::open_read_only(path, StoreOptions::default(), key)?),
            copied_from_schema: None,
            opener: store::Opener::here(),
        })
    }

    /// Copies `path` (and its `-wal`, if any) into `scratch`, an existing
    /// directory the caller owns and removes afterwards, migrates the copy to
    /// the current schema and reads that. The original is never written.
    ///
    /// # Errors
    /// I/O errors of the copy ([`Error::Session`] with the reason); the
    /// store's typed errors for the copy.
    pub fn open_migrated_copy(path: &Path, scratch: &Path) -> Result<Inspector> {
        Inspector::open_migrated_copy_keyed(path, scratch, None)
    }

    /// [`Inspector::open_migrated_copy`] of a ledger that may be encrypted.
    ///
    /// # Errors
    /// As [`Inspector::open_migrated_copy`].
    pub fn open_migrated_copy_keyed(
        path: &Path,
        scratch: &Path,
        key: Option<&store::LedgerKey>,
    ) -> Result<Inspector> {
        if !path.is_file() {
            return Err(Error::Store(store::Error::CannotOpen));
        }
        let io = |what: &str, e: std::io::Error| Error::Session(format!("{what}: {e}"));
        let copy = scratch.join("ledger.db");
        std::fs::copy(path, &copy).map_err(|e| io("copying the database", e))?;
        let mut wal = path.as_os_str().to_os_string();
        wal.push("-wal");
        if Path::new(&wal).is_file() {
            std::fs::copy(&wal, scratch.join("ledger.db-wal"))
                .map_err(|e| io("copying its -wal", e))?;
        }
        let found = {
            let original = Store::open_read_only(path, StoreOptions::default(), key);
            match original {
                Ok(store) => store.read(|dao: &Dao<'_>| dao.schema_version())?,
                Err(store::Error::OlderSchema { found, .. }) => found,
                // Unreadable in place (e.g. read-only directory): ask the copy.
                Err(_) => read_user_version(&copy)?,
            }
        };
        let store = match Store::open(&copy, StoreOptions::default(), key) {
            // A key given for a plain ledger: read it as it is.
            Err(store::Error::NotEncrypted) => Store::open(&copy, StoreOptions::default(), None)?,
            other => other?,
        };
        Ok(Inspector {
            store: Mutex::new(store),
            copied_from_schema: Some(found),
            opener: store::Opener::here(),
        })
    }

    /// The file's own schema version when what is read is a migrated copy.
    pub fn copied_from_schema(&self) -> Option<i64> {
        self.copied_from_schema
    }

    /// Counts and sizes (`toolledger stats`).
    ///
    /// # Errors
    /// Storage errors.
    pub fn summary(&self) -> Result<Summary> {
        self.read(|dao| {
            Ok(Summary {
                stats: dao.stats()?,
                by_tool: dao.executions_by_tool()?,
                tombstones: dao.tombstone_count()?,
                size: dao.size()?,
                time_range: dao.execution_time_range()?,
                schema_version: dao.schema_version()?,
            })
        })
    }

    /// Operation, execution and transition counts.
    ///
    /// # Errors
    /// Storage errors.
    pub fn stats(&self) -> Result<StoreStats> {
        self.read(|dao| dao.stats())
    }

    /// The newest `limit` operations with their executions
    /// (`toolledger inspect`).
    ///
    /// # Errors
    /// Storage errors.
    pub fn operations(&self, limit: u32) -> Result<Vec<OperationView>> {
        self.read(|dao| {
            dao.operations(limit)?
                .into_iter()
                .map(|(id, status)| {
                    let executions = dao.executions_of(&id)?;
                    Ok(OperationView {
                        id,
                        status,
                        executions,
                    })
                })
                .collect()
        })
    }

    /// Number of executions.
    ///
    /// # Errors
    /// Storage errors.
    pub fn execution_count(&self) -> Result<u64> {
        self.read(|dao| dao.execution_count())
    }

    /// Up to `limit` executions after `after` (from the start with the
    /// default cursor), in storage order, and the cursor of the last one.
    /// An empty page is the end.
    ///
    /// # Errors
    /// Storage errors.
    pub fn executions_page(
        &self,
        after: PageCursor,
        limit: u32,
    ) -> Result<(Vec<ExecutionRecord>, PageCursor)> {
        let rows = self.read(|dao| dao.executions_page(after.0, limit))?;
        let next = rows.last().map_or(after, |(rowid, _)| PageCursor(*rowid));
        Ok((rows.into_iter().map(|(_, rec)| rec).collect(), next))
    }

    /// Runs `f` in a read transaction and reports the file as it is now.
    ///
    /// A connection opened on a closed file (immutable: no locks) sees only
    /// what the file held when it opened, so each read after the first opens
    /// it again (as [`Inspector::open`] would now: immutable, or through
    /// SQLite's shared locking if the file has a `-wal`; its keys checked
    /// again). A read on an immutable connection is then checked for a
    /// writer that came meanwhile: a `-wal` now means `f` runs again through
    /// the shared locking; a file whose identity, length or times changed
    /// during the read means it runs again on a new immutable connection (up
    /// to three times; a file whose times keep changing without a `-wal`,
    /// touched but not written, answers the last read). Nothing is created
    /// beside a file that has no `-wal`.
    fn read<T>(&self, f: impl Fn(&Dao<'_>) -> store::Result<T>) -> Result<T> {
        if self.opener.forked_since() {
            return Err(Error::Store(store::Error::Forked));
        }
        let mut current = self
            .store
            .lock()
            .map_err(|_| Error::Store(store::Error::LockPoisoned))?;
        for tries in 1..=3 {
            if current.is_immutable() && !current.take_fresh() {
                // Kept as it was when this fails: the next read tries again.
                current.reopen_read_only()?;
            }
            let read = current.read(|dao: &Dao<'_>| f(dao));
            if !current.came_into_use() || tries == 3 && !current.has_wal() {
                return Ok(read?);
            }
            if current.has_wal() {
                // A writer came: through the shared locking from now on.
                current.reopen_read_only()?;
                break;
            }
        }
        Ok(current.read(|dao: &Dao<'_>| f(dao))?)
    }
}

/// `PRAGMA user_version` of a database file, read with a private connection.
fn read_user_version(path: &Path) -> Result<i64> {
    let store = Store::open_read_only(path, StoreOptions::default(), None);
    match store {
        Ok(store) => Ok(store.read(|dao: &Dao<'_>| dao.schema_version())?),
        Err(store::Error::OlderSchema { found, .. }) => Ok(found),
        Err(e) => Err(e.into()),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::Inspector;
    use crate::ledger::Error;
    use crate::store::{self, fork_tests, Store, StoreOptions};

    /// The process half of `a_forked_childs_inspector_is_refused_without_waiting`.
    #[test]
    fn forked_inspector_scenario() {
        let Ok(db) = std::env::var("TOOLLEDGER_FORKED_INSPECTOR") else {
            return;
        };
        drop(Store::open(Path::new(&db), StoreOptions::default(), None).unwrap());
        let inspector = std::sync::Arc::new(Inspector::open(Path::new(&db)).unwrap());
        assert!(inspector.summary().is_ok());
        // Another thread of the parent is in the middle of a read at the
        // fork: it holds the inspector's mutex.
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = {
            let inspector = inspector.clone();
            std::thread::spawn(move || {
                let guard = inspector.store.lock().unwrap();
                held_tx.send(()).unwrap();
                let _ = release_rx.recv_timeout(Duration::from_secs(30));
                drop(guard);
            })
        };
        held_rx.recv().unwrap();
        let child = fork_tests::in_child(|| match inspector.summary() {
            Err(Error::Store(store::Error::Forked)) => 0,
            Ok(_) => 20,
            Err(_) => 21,
        });
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        // The parent's inspector still reads.
        let parent = inspector.summary().is_ok();
        println!("SCENARIO child={child} parent_ok={parent}");
        assert_eq!(
            (child, parent),
            (0, true),
            "142: the child waited forever for the mutex a parent thread held"
        );
    }

    /// An inspector used in a child forked while another thread of the
    /// parent was reading through it answers `Forked` at once instead of
    /// waiting forever for the mutex that thread held.
    #[test]
    fn a_forked_childs_inspector_is_refused_without_waiting() {
        fork_tests::run_alone(
            "ledger::inspect::tests::forked_inspector_scenario",
            "TOOLLEDGER_FORKED_INSPECTOR",
        );
    }

    /// A file that came into use while an inspector read it, and could not
    /// be reopened through SQLite's shared locking (here: its `-wal` cannot
    /// be opened), answers that error and keeps the inspector: once the
    /// cause is gone it reads again (it answered `Suspended` for its life).
    #[test]
    fn a_failed_switch_to_shared_reading_keeps_the_inspector() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        drop(Store::open(&db, StoreOptions::default(), None).unwrap());
        let inspector = Inspector::open(&db).unwrap();
        let before = inspector.summary().unwrap();
        // The file seems to come into use (a `-wal` appears), and SQLite
        // cannot open that `-wal` (a directory stands there).
        let wal = dir.path().join("l.db-wal");
        std::fs::create_dir(&wal).unwrap();
        let failed = inspector.summary();
        assert!(
            matches!(&failed, Err(Error::Store(e)) if !matches!(e, store::Error::Suspended)),
            "{failed:?}"
        );
        std::fs::remove_dir(&wal).unwrap();
        assert_eq!(inspector.summary().unwrap(), before);
    }
}
