//! SQLite storage: the only module that knows SQL.
//!
//! [`Store`] owns one connection behind a mutex (one writer per process; other
//! processes coordinate through SQLite's file locks and `busy_timeout`). Work
//! is scoped by closures: [`Store::read`] runs in a deferred transaction,
//! [`Store::write`] in an IMMEDIATE one that commits only when the closure
//! returns `Ok` and rolls back on every other path. No transaction or read
//! snapshot stays open between calls, which is what mobile suspension needs.
//!
//! Durability: the database runs in WAL mode. A [`Durability::Full`] write
//! commits under `synchronous=FULL`, so it costs exactly one fsync of the WAL
//! at commit. [`Durability::Lazy`] and [`Durability::Deferred`] writes commit
//! under `synchronous=NORMAL`: their frames reach the OS at commit (a killed
//! process loses nothing) but are synced only by the next full write, a
//! checkpoint or [`Store::sync`] (a power cut may lose them, never tear the
//! database). Losing a lazy write only causes a harmless replay; a deferred
//! one is a commit the ledger makes durable within a deadline
//! ([`Store::sync_deferred`]). The setting is switched only when the next
//! write needs the other one, by cached statements.
//!
//! Identity: the path is resolved once at open (absolute, symlinks resolved);
//! every reconnect uses that path, never creates a file and checks that it
//! found the same ledger (`meta.ledger_id`). Another SQLite library in the same
//! process that opens and closes the file drops this connection's POSIX locks
//! and deletes the WAL it still writes to (the WAL is checkpointed first, so
//! nothing committed is lost at that moment, but every later commit would
//! go to a deleted file). Each write checks, before and after, that the WAL on
//! disk is the one this connection opened; when it is not, the connection is
//! reopened (before) or the write is reported as possibly lost (after).

mod approvals;
mod attention;
mod codec;
mod crypt;
mod dao;
mod diagnostics;
mod error;
mod events;
mod executions;
mod forks;
mod history;
mod hot;
mod jobs;
mod modes;
mod now;
mod operations;
mod reseal;
mod retention;
pub mod schema;
mod sessions;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

pub use sessions::{Evidence, EvidenceKind, SessionRow};

pub use crypt::LedgerKey;
pub use dao::Dao;
pub use diagnostics::{DbSize, StoreStats};
pub use error::{Error, Result};
pub use events::MoveEvent;
pub use executions::{Fence, NewExecution, StatusFields, StoredAnswer};
/// Forking helpers for the tests of other modules.
#[cfg(all(test, unix))]
pub(crate) use forks::tests as fork_tests;
pub(crate) use forks::{
    note_session_closed, note_session_open, session_open_here, Opener, ParentOnlyFd,
};
pub use modes::{private_dir, private_file};
pub use retention::{PruneCandidate, PrunedRows, Tombstone};

/// How a write must reach the disk before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync before returning (the intent; commits that must not be lost).
    Full,
    /// No fsync; durable with the next full write or checkpoint, with no
    /// deadline (delivery marks, recovery marks: losing them is harmless).
    Lazy,
    /// No fsync now; the caller makes it durable within a deadline
    /// ([`Store::sync_deferred`]) unless a full write, a checkpoint or
    /// [`Store::sync`] does first (commits whose loss reconciliation repairs).
    Deferred,
    /// Durable before returning, like [`Durability::Full`], but committed
    /// under `synchronous=NORMAL` and then synced (one sync of the WAL): other
    /// connections may see the write a moment before it is durable. For
    /// writes whose early sight hands nobody a result (the intent: another
    /// session seeing an `executing` row answers `InFlight`), it spares the
    /// switch of `synchronous` that a call would otherwise pay twice.
    Synced,
}

/// What [`Store::sync_deferred_due`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeferredDue {
    /// Every commit was durable already.
    Nothing,
    /// The oldest deferred commit not durable yet falls due then.
    At(Instant),
    /// It was due: the WAL was synced.
    Synced,
}

/// What [`Store::checkpoint_idle`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleCheckpointRun {
    /// A write began since the ledger went idle: not run.
    NotIdle,
    /// Checkpointed, or nothing to do (the store suspended or in memory, its
    /// `-wal` replaced).
    Done,
}

/// Options for opening a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long a writer waits for another connection's lock.
    pub busy_timeout: Duration,
    /// The registered SQLite VFS to open files through (`None`: the
    /// default one).
    pub vfs: Option<String>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            busy_timeout: Duration::from_secs(5),
            vfs: None,
        }
    }
}

/// Where the database lives.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    File(PathBuf),
    /// Read only. `immutable`: opened with SQLite's `immutable=1` because no
    /// `-wal` existed (the file was closed cleanly and nobody had it open),
    /// so SQLite creates no `-wal`/`-shm` beside it and takes no lock.
    ReadOnlyFile {
        path: PathBuf,
        immutable: bool,
    },
    Memory,
}

/// Where committed status moves go (the ledger's observer).
pub trait EventSink: Send + Sync {
    /// Called after the commit of a write that moved executions, outside
    /// every lock of the store.
    fn moved(&self, events: Vec<MoveEvent>);
}

/// The SQLite store. `Send + Sync`; all access is serialised by its mutex.
pub struct Store {
    conn: Mutex<Option<Open>>,
    location: Location,
    options: StoreOptions,
    /// `meta.ledger_id` of the database opened first (files only).
    ledger_id: Option<String>,
    /// The ledger's keys when it is encrypted (see `crypt`).
    keys: RwLock<Option<Arc<crypt::Keys>>>,
    /// Who hears of committed status moves.
    sink: RwLock<Option<Arc<dyn EventSink>>>,
    /// The `-wal` file of a writable file (built once: every write looks at
    /// it).
    wal_file: Option<PathBuf>,
    /// A failed sync not repaired yet (see `Open::sync_failed`); kept here
    /// so that a new connection (after `suspend()`) still repairs first.
    sync_failed: Arc<AtomicBool>,
    /// The process that opened the store: a child made by `fork()` is
    /// refused every use (see `forks`).
    opener: forks::Opener,
    /// The database file in this process's list of open files (a forked
    /// child may not open it again: see `forks`).
    _file: Option<forks::OpenFile>,
    /// An immutable read-only store: the file as it was just before the
    /// connection opened (see [`Store::came_into_use`]).
    stamp: Option<FileStamp>,
    /// An immutable read-only store's connection has not been read through
    /// yet (see [`Store::take_fresh`]).
    fresh: bool,
}

/// What changes when anything writes to a file: its identity, length and
/// times. Different stamps of a path taken apart mean something touched it
/// in between; equal ones mean nothing wrote to it only to the times'
/// resolution (a whole second on some file systems), so a stamp only flags
/// a write during a read, it never proves there was none.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    #[cfg(unix)]
    identity: (u64, u64, i64, i64),
}

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        let meta = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        let identity = {
            use std::os::unix::fs::MetadataExt;
            (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec())
        };
        Some(FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            #[cfg(unix)]
            identity,
        })
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("location", &self.location)
            .field("encrypted", &self.is_encrypted())
            .finish_non_exhaustive()
    }
}

/// An open connection and the identity of the WAL file it writes to.
#[derive(Debug)]
struct Open {
    /// The hot path's held statements. Declared before `conn`: dropped (and
    /// so finalized) first (see `hot`).
    hot: hot::Hot,
    /// Boxed: the held statements point at it, so it must not move.
    conn: Box<Connection>,
    wal: Option<FileId>,
    /// The `synchronous` setting in force on `conn` (FULL when opened).
    normal: bool,
    /// When the oldest deferred write not durable yet was committed (this
    /// process's monotonic time); `None` when every commit is durable.
    unsynced_since: Option<Instant>,
    /// `PRAGMA fullfsync`, read at the first explicit sync.
    fullfsync: Option<bool>,
    /// Set when a sync of the WAL failed, or a write or checkpoint met an
    /// I/O error: the OS may have dropped WAL pages it could not write
    /// (Linux marks them clean and reports the error once), so no later sync
    /// proves anything about the frames before it until the WAL was written
    /// again ([`Open::repair`]). Shared with the [`Store`], so that it
    /// outlives this connection (`suspend()`, a reconnect).
    sync_failed: Arc<AtomicBool>,
}

impl Open {
    fn new(conn: Connection, wal: Option<FileId>, sync_failed: Arc<AtomicBool>) -> Open {
        let open = Open {
            hot: hot::Hot::new(),
            conn: Box::new(conn),
            wal,
            normal: false,
            unsynced_since: None,
            fullfsync: None,
            sync_failed,
        };
        if open.sync_failed() {
            // Reopened (after `suspend()`) with a repair still pending.
            open.checkpoint_on_close(false);
        }
        open
    }

    /// True while a failed sync (or an I/O error) is not repaired.
    fn sync_failed(&self) -> bool {
        self.sync_failed.load(Ordering::Acquire)
    }

    /// Makes everything written so far durable when something may not be:
    /// the repair after a failed sync, or one sync of the WAL for deferred
    /// writes. True when it synced.
    fn make_durable(&mut self) -> Result<bool> {
        if self.sync_failed() {
            self.repair()?;
            return Ok(true);
        }
        self.sync_unsynced()
    }

    /// After a failed sync: writes the whole WAL again, as the OS shows it,
    /// and syncs it, so the frames the failed sync may have dropped reach
    /// the disk after all. Inside a write transaction that writes nothing
    /// (the write lock keeps every other connection from appending to or
    /// restarting the WAL meanwhile). The mark is cleared only once that
    /// sync succeeded; otherwise the error is returned and the next write or
    /// sync tries again.
    fn repair(&mut self) -> Result<()> {
        self.hot
            .with(&self.conn, hot::HotSql::BeginImmediate, |s| s.execute([]))?;
        let full = self.fullfsync();
        let rewritten = full.and_then(|full| rewrite_wal(&self.conn, full));
        // Nothing was written in the transaction: ending it changes nothing.
        let ended = self
            .hot
            .with(&self.conn, hot::HotSql::Commit, |s| s.execute([]));
        if ended.is_err() && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        rewritten?;
        ended?;
        self.sync_failed.store(false, Ordering::Release);
        self.checkpoint_on_close(true);
        self.unsynced_since = None;
        Ok(())
    }

    /// Notes a failed sync (or an I/O error): repaired before anything is
    /// taken as durable again.
    fn mark_sync_failed(&self) {
        self.sync_failed.store(true, Ordering::Release);
        self.checkpoint_on_close(false);
    }

    /// Whether closing this connection may checkpoint (SQLite copies the WAL
    /// into the database file when its last connection closes). Not while a
    /// repair is pending: a WAL with a hole on the disk is never copied, as
    /// a copy cut by the power would leave half-written pages in the
    /// database file that no whole WAL covers.
    fn checkpoint_on_close(&self, allowed: bool) {
        let _ = self.conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            !allowed,
        );
    }

    /// `PRAGMA fullfsync`, read once.
    fn fullfsync(&mut self) -> Result<bool> {
        if let Some(full) = self.fullfsync {
            return Ok(full);
        }
        let full: i64 = self.conn.query_row("PRAGMA fullfsync", [], |r| r.get(0))?;
        self.fullfsync = Some(full != 0);
        Ok(full != 0)
    }

    /// Switches `synchronous` between FULL and NORMAL when the next write
    /// needs the other one (outside a transaction: SQLite refuses inside).
    fn set_normal(&mut self, normal: bool) -> Result<()> {
        if self.normal != normal {
            let sql = if normal {
                "PRAGMA synchronous=NORMAL"
            } else {
                "PRAGMA synchronous=FULL"
            };
            self.conn.prepare_cached(sql)?.execute([])?;
            self.normal = normal;
        }
        Ok(())
    }

    /// Syncs the WAL when a deferred write is not durable yet.
    fn sync_unsynced(&mut self) -> Result<bool> {
        if self.unsynced_since.is_none() {
            return Ok(false);
        }
        self.sync_wal()?;
        Ok(true)
    }

    /// Syncs the WAL now (see [`sync_wal`]); after a failed sync, repairs
    /// instead (a plain sync would prove nothing).
    fn sync_wal(&mut self) -> Result<()> {
        if self.sync_failed() {
            return self.repair();
        }
        let full = self.fullfsync()?;
        if let Err(e) = sync_wal(&self.conn, full) {
            self.mark_sync_failed();
            return Err(e);
        }
        self.unsynced_since = None;
        Ok(())
    }
}

/// The WAL's file as SQLite holds it open for `conn` (`None`: no WAL open).
fn wal_handle(conn: &Connection) -> Result<Option<*mut rusqlite::ffi::sqlite3_file>> {
    use rusqlite::ffi;
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: `conn` is open and used only under the store's mutex (this
    // call holds it), so the handle and the file it owns stay valid for the
    // duration; SQLITE_FCNTL_JOURNAL_POINTER writes one `sqlite3_file*`
    // into `file`, which is a correctly typed out-pointer.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_JOURNAL_POINTER,
            (&mut file as *mut *mut ffi::sqlite3_file).cast(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None).into());
    }
    // SAFETY: a non-null file returned by SQLite is open (its methods are
    // set) or not (methods null) and stays so while we hold the connection.
    let open = unsafe { file.as_ref().is_some_and(|f| !f.pMethods.is_null()) };
    Ok(open.then_some(file))
}

/// The error of a failed VFS call.
fn vfs_error(rc: std::os::raw::c_int) -> Error {
    rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rc), None).into()
}

/// Writes every byte of `conn`'s WAL file again, as read back from it now
/// (the OS's copy), then syncs it (see [`Open::repair`]). Through SQLite's
/// own file handle, so a VFS sees it. `conn` must hold the write lock.
fn rewrite_wal(conn: &Connection, full: bool) -> Result<()> {
    use rusqlite::ffi;
    const CHUNK: usize = 64 * 1024;
    let Some(file) = wal_handle(conn)? else {
        return Ok(());
    };
    // SAFETY: `file` is SQLite's open WAL file of `conn` (see `wal_handle`),
    // valid while the store's mutex is held; each method is called with
    // that file and a buffer of at least the length passed.
    unsafe {
        let Some(methods) = (*file).pMethods.as_ref() else {
            return Ok(());
        };
        let (Some(size_of), Some(read), Some(write)) =
            (methods.xFileSize, methods.xRead, methods.xWrite)
        else {
            return Err(vfs_error(ffi::SQLITE_IOERR));
        };
        let mut size: ffi::sqlite3_int64 = 0;
        let rc = size_of(file, &mut size);
        if rc != ffi::SQLITE_OK {
            return Err(vfs_error(rc));
        }
        let mut buf = vec![0u8; CHUNK];
        let mut offset: ffi::sqlite3_int64 = 0;
        while offset < size {
            let n = usize::try_from(size - offset).map_or(CHUNK, |left| left.min(CHUNK));
            // `n` is at most CHUNK, which fits a c_int.
            let len = n as std::os::raw::c_int;
            let rc = read(file, buf.as_mut_ptr().cast(), len, offset);
            if rc != ffi::SQLITE_OK {
                return Err(vfs_error(rc));
            }
            let rc = write(file, buf.as_ptr().cast(), len, offset);
            if rc != ffi::SQLITE_OK {
                return Err(vfs_error(rc));
            }
            offset += n as ffi::sqlite3_int64;
        }
    }
    sync_wal(conn, full)
}

/// Syncs the connection's WAL file through SQLite's own file handle (so a
/// VFS sees it), with `F_FULLFSYNC` on Apple when `full` (`PRAGMA
/// fullfsync`), exactly as SQLite syncs a commit. Every frame written to the
/// WAL before it, by any connection, is durable after it. A connection with
/// no WAL open has nothing to sync.
fn sync_wal(conn: &Connection, full: bool) -> Result<()> {
    use rusqlite::ffi;
    let flags = if full {
        ffi::SQLITE_SYNC_FULL
    } else {
        ffi::SQLITE_SYNC_NORMAL
    };
    let Some(file) = wal_handle(conn)? else {
        return Ok(());
    };
    // SAFETY: `file` is SQLite's open WAL file of `conn` (see `wal_handle`),
    // valid while the store's mutex is held.
    let rc = unsafe {
        match (*file).pMethods.as_ref().and_then(|m| m.xSync) {
            Some(x_sync) => x_sync(file, flags),
            None => ffi::SQLITE_OK,
        }
    };
    if rc != ffi::SQLITE_OK {
        return Err(vfs_error(rc));
    }
    Ok(())
}

/// Device and inode of a file (unix), to notice a file replaced under us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

#[cfg(unix)]
fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| FileId {
        dev: m.dev(),
        ino: m.ino(),
    })
}

#[cfg(not(unix))]
fn file_id(_path: &Path) -> Option<FileId> {
    None
}

/// The database's `-wal` file.
fn wal_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-wal");
    PathBuf::from(name)
}

/// Refuses a database file with more than one hard link (see
/// [`Error::MultipleLinks`]). A missing file is fine (it is created).
#[cfg(unix)]
fn refuse_hard_links(path: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        // A directory has two or more links of its own: it is no database
        // file at all, and SQLite cannot open it.
        Ok(m) if m.is_dir() => Err(Error::CannotOpen),
        Ok(m) if m.nlink() > 1 => Err(Error::MultipleLinks { links: m.nlink() }),
        _ => Ok(()),
    }
}

#[cfg(not(unix))]
fn refuse_hard_links(_path: &Path) -> Result<()> {
    Ok(())
}

/// Follows `path` while it is a symlink (to a target that does not exist
/// yet), at most 40 times (the kernel's own limit); a longer chain is a loop.
fn follow_dangling(mut path: PathBuf) -> Result<PathBuf> {
    for _ in 0..40 {
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&path).map_err(|_| Error::CannotOpen)?;
                path = if target.is_absolute() {
                    target
                } else {
                    path.parent().ok_or(Error::CannotOpen)?.join(target)
                };
            }
            _ => return Ok(path),
        }
    }
    Err(Error::CannotOpen)
}

/// Resolves a database path once: absolute, symlinks resolved (of the file
/// when it exists, else of its directory), so every later use — the
/// sessions directory, a reconnect after `chdir` — names the same file.
///
/// # Errors
/// [`Error::CannotOpen`] when the directory does not exist.
pub fn resolve_path(path: &Path) -> Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|_| Error::CannotOpen)?
            .join(path)
    };
    match std::fs::canonicalize(&abs) {
        Ok(resolved) => Ok(resolved),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // A file that does not exist yet: SQLite creates it where the
            // path leads, through a dangling symlink too (its target), so
            // the ledger must name that file (and its `-wal`), not the link.
            let at = follow_dangling(abs)?;
            let (Some(parent), Some(name)) = (at.parent(), at.file_name()) else {
                return Err(Error::CannotOpen);
            };
            let parent = std::fs::canonicalize(parent).map_err(|_| Error::CannotOpen)?;
            Ok(parent.join(name))
        }
        Err(_) => Err(Error::CannotOpen),
    }
}

impl Store {
    /// Opens (creating if missing) the database at `path`, sets the pragmas
    /// and migrates it to the current schema.
    ///
    /// # Errors
    /// [`Error::NotADatabase`] / [`Error::Corrupt`] for a bad file (never
    /// deleted), [`Error::IncompatibleVersion`] for a newer one,
    /// [`Error::CannotOpen`], [`Error::ReadOnly`], [`Error::Busy`].
    ///
    /// With `key`, the ledger is encrypted (see `crypt`): a new (empty)
    /// ledger is encrypted under it, an encrypted one must open with it.
    /// Without, an encrypted ledger is refused. The database file is
    /// created readable by its owner only (0600 whatever the umask), and so
    /// are its `-wal` and `-shm`.
    ///
    /// # Errors
    /// As above; [`Error::WrongKey`], [`Error::KeyRequired`],
    /// [`Error::NotEncrypted`] (nothing written in each case).
    pub fn open(path: &Path, options: StoreOptions, key: Option<&LedgerKey>) -> Result<Store> {
        let resolved = resolve_path(path)?;
        refuse_hard_links(&resolved)?;
        if forks::inherited(&resolved) {
            // Open in the parent at the fork: SQLite's lock state for the
            // file is the parent's copy here (see `forks`).
            return Err(Error::Forked);
        }
        modes::prepare_private_db(&resolved);
        // In the list before SQLite opens the file: a child forked while
        // this thread is inside the open must find it there (SQLite's lock
        // state for the file exists from the connection's first open on).
        // Removed again if the open fails.
        let opener = forks::Opener::here();
        let file = forks::OpenFile::note(&resolved, opener);
        refuse_foreign_wal(&resolved)?;
        let location = Location::File(resolved.clone());
        let conn = connect_retrying_busy(&location, &options)
            .map_err(|e| refine_cannot_open(e, &resolved))?;
        #[cfg(test)]
        forks::after_connect();
        // A file that could not be identified before (not created yet).
        let file = file.or_else(|| forks::OpenFile::note(&resolved, opener));
        modes::tighten_db_files(&resolved);
        let ledger_id = dao::Dao::new(&conn).ledger_id()?;
        let keys = reseal::load_keys(&conn, ledger_id.as_deref(), key, true)?;
        let wal_file = wal_path(&resolved);
        let wal = file_id(&wal_file);
        let sync_failed = Arc::new(AtomicBool::new(false));
        Ok(Store {
            conn: Mutex::new(Some(Open::new(conn, wal, sync_failed.clone()))),
            location,
            options,
            ledger_id,
            keys: RwLock::new(keys.map(Arc::new)),
            sink: RwLock::new(None),
            wal_file: Some(wal_file),
            sync_failed,
            opener,
            _file: file,
            stamp: None,
            fresh: false,
        })
    }

    /// Opens an existing database for reading only: nothing is written to the
    /// file (no migration, no journal-mode change, no checkpoint), for tools
    /// that look at a database pulled from a device. Writes through it fail
    /// with [`Error::ReadOnly`].
    ///
    /// Nothing is created beside the file either when it has no `-wal`: it
    /// is then opened as immutable. A file with a `-wal` is in use (or its
    /// last writer died) and is read through SQLite's shared-memory index,
    /// which already exists or is recreated beside it. A writer that starts
    /// while an immutable read runs is noticed by
    /// [`Store::came_into_use`]: read again after [`Store::reopen_read_only`].
    ///
    /// # Errors
    /// [`Error::OlderSchema`] for a file that needs a migration first,
    /// [`Error::IncompatibleVersion`] for a newer one, [`Error::NotADatabase`],
    /// [`Error::Corrupt`], [`Error::CannotOpen`] (also when SQLite cannot set up
    /// read-only WAL access, e.g. in a read-only directory without `-shm`).
    ///
    /// An encrypted ledger needs its `key` ([`Error::KeyRequired`]); a key
    /// given for a plain ledger is not used.
    pub fn open_read_only(
        path: &Path,
        options: StoreOptions,
        key: Option<&LedgerKey>,
    ) -> Result<Store> {
        let path = resolve_path(path)?;
        if forks::inherited(&path) {
            return Err(Error::Forked);
        }
        let immutable = !wal_path(&path).exists();
        // Taken before the connection opens: a write after it changes it.
        let stamp = if immutable {
            FileStamp::of(&path)
        } else {
            None
        };
        let opener = forks::Opener::here();
        let file = forks::OpenFile::note(&path, opener);
        let location = Location::ReadOnlyFile { path, immutable };
        let conn = connect(&location, &options, false)?;
        let ledger_id = dao::Dao::new(&conn).ledger_id()?;
        let keys = reseal::load_keys(&conn, ledger_id.as_deref(), key, false)?;
        let sync_failed = Arc::new(AtomicBool::new(false));
        Ok(Store {
            conn: Mutex::new(Some(Open::new(conn, None, sync_failed.clone()))),
            location,
            options,
            ledger_id: None,
            keys: RwLock::new(keys.map(Arc::new)),
            sink: RwLock::new(None),
            wal_file: None,
            sync_failed,
            opener,
            _file: file,
            fresh: stamp.is_some(),
            stamp,
        })
    }

    /// Opens a private in-memory database (tests, ephemeral harnesses).
    ///
    /// # Errors
    /// Storage errors from SQLite.
    pub fn open_in_memory() -> Result<Store> {
        let options = StoreOptions::default();
        let conn = connect(&Location::Memory, &options, true)?;
        let sync_failed = Arc::new(AtomicBool::new(false));
        Ok(Store {
            conn: Mutex::new(Some(Open::new(conn, None, sync_failed.clone()))),
            location: Location::Memory,
            options,
            ledger_id: None,
            keys: RwLock::new(None),
            sink: RwLock::new(None),
            wal_file: None,
            sync_failed,
            opener: forks::Opener::here(),
            _file: None,
            stamp: None,
            fresh: false,
        })
    }

    /// True when the file is encrypted now, whatever this store opened it
    /// as: a plain session whose file another session encrypted since reads
    /// sealed values it cannot open (`KeyRequired` is the truth then, not
    /// tampering).
    pub fn encrypted_on_disk(&self) -> bool {
        let Ok(guard) = self.lock() else {
            return false;
        };
        guard.as_ref().is_some_and(|open| {
            reseal::meta_value(&open.conn, "wrapped_keys").is_ok_and(|v| v.is_some())
        })
    }

    /// True when the ledger is encrypted (values sealed, digests keyed).
    pub fn is_encrypted(&self) -> bool {
        self.keys.read().map(|k| k.is_some()).unwrap_or(false)
    }

    /// The ledger's keys. Refuses a forked child first ([`Error::Forked`]):
    /// a thread of the parent re-keying at the fork held them, and the
    /// child would wait for them forever.
    fn current_keys(&self) -> Result<Option<Arc<crypt::Keys>>> {
        self.refuse_forked()?;
        Ok(self.keys.read().map_err(|_| Error::LockPoisoned)?.clone())
    }

    /// [`Error::Forked`] in a child made by `fork()` of the process that
    /// opened this store (see `forks`): checked before any lock is taken.
    fn refuse_forked(&self) -> Result<()> {
        if self.opener.forked_since() {
            Err(Error::Forked)
        } else {
            Ok(())
        }
    }

    /// The digest stored for `plain` (a plain SHA-256 argument digest): the
    /// same in a plain ledger, keyed (HMAC) in an encrypted one.
    ///
    /// # Errors
    /// [`Error::LockPoisoned`].
    pub fn stored_digest(
        &self,
        plain: crate::model::ArgsDigest,
    ) -> Result<crate::model::ArgsDigest> {
        Ok(match self.current_keys()? {
            Some(keys) => keys.keyed_digest(&plain),
            None => plain,
        })
    }

    /// Sets (or clears) who hears of committed status moves.
    ///
    /// # Errors
    /// [`Error::LockPoisoned`].
    pub fn set_sink(&self, sink: Option<Arc<dyn EventSink>>) -> Result<()> {
        *self.sink.write().map_err(|_| Error::LockPoisoned)? = sink;
        Ok(())
    }

    /// Encrypts a plain ledger under `key`, or re-keys an encrypted one
    /// (fresh data key, same digest key), in place: every sealed column of
    /// every row is rewritten in one IMMEDIATE transaction with
    /// `secure_delete` on, then the WAL is checkpointed and truncated and
    /// free pages are returned, so no earlier bytes of a value stay in the
    /// files. The caller makes sure no other session uses the ledger.
    ///
    /// # Errors
    /// Storage errors (the transaction rolls back: the ledger stays as it
    /// was); [`Error::Busy`] from the final checkpoint (the ledger is
    /// re-keyed, older bytes stay in the WAL until the next checkpoint).
    pub fn reseal(&self, key: &LedgerKey) -> Result<()> {
        self.refuse_forked()?;
        let mut keys = self.keys.write().map_err(|_| Error::LockPoisoned)?;
        let mut guard = self.lock()?;
        let open = guard.as_mut().ok_or(Error::Suspended)?;
        // After a failed sync: the WAL is whole on the disk before this
        // writes, and before its checkpoint copies it.
        open.make_durable()?;
        error::take_io_error();
        let ledger_id = self.ledger_id.clone().unwrap_or_default();
        let fresh = crypt::NewKeys::make(key, &ledger_id, keys.as_deref())?;
        let resealed = reseal::reseal_all(&open.conn, keys.as_deref(), &fresh);
        if resealed.is_ok() {
            *keys = Some(Arc::new(fresh.keys));
        }
        drop(keys);
        // Once the reseal committed the ledger is under the new key whatever
        // the scrub does: its failure must not read as "nothing changed".
        let scrubbed = resealed.and_then(|()| {
            reseal::scrub(&open.conn, self.location == Location::Memory)
                .map_err(|e| Error::NotScrubbed(Box::new(e)))
        });
        if error::take_io_error() {
            open.mark_sync_failed();
        }
        scrubbed
    }

    /// The database file's resolved path (absolute, symlinks resolved),
    /// `None` for an in-memory store.
    pub fn path(&self) -> Option<&Path> {
        match &self.location {
            Location::File(p) | Location::ReadOnlyFile { path: p, .. } => Some(p),
            Location::Memory => None,
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, Option<Open>>> {
        // Before the mutex: a child forked while another thread held it
        // would wait for it forever.
        self.refuse_forked()?;
        self.conn.lock().map_err(|_| Error::LockPoisoned)
    }

    /// Runs `f` in a deferred (read) transaction that ends before returning.
    /// A read takes no write lock: it answers while another connection
    /// writes, on a full disk and on a read-only file.
    ///
    /// # Errors
    /// Whatever `f` returns, or storage errors.
    pub fn read<T, E: From<Error>>(
        &self,
        f: impl FnOnce(&Dao<'_>) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let keys = self.current_keys()?;
        let guard = self.lock()?;
        let open = guard.as_ref().ok_or(Error::Suspended)?;
        run_in_transaction(&open.conn, "BEGIN DEFERRED", keys.as_deref(), false, f)
            .map(|(out, _)| out)
    }

    /// Runs `f` in an IMMEDIATE transaction; commits with the requested
    /// durability when `f` returns `Ok`, rolls back otherwise.
    ///
    /// # Errors
    /// Whatever `f` returns, or storage errors (nothing is written then).
    /// [`Error::ForeignConnection`] when the WAL was deleted under this
    /// connection while it committed (another SQLite in the process closed
    /// the file): the write may not have reached the database file.
    pub fn write<T, E: From<Error>>(
        &self,
        durability: Durability,
        f: impl FnOnce(&Dao<'_>) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        self.write_observed(durability, true, |dao| f(dao).map(|t| (t, true)))?
            .ok_or_else(|| Error::Busy.into())
    }

    /// [`Store::write`] only if the write lock is free at once: `Ok(None)`
    /// when another connection holds it or the file cannot be written (the
    /// caller then takes a path that needs no write lock). `f` also says
    /// whether it wrote anything; a transaction that wrote nothing commits
    /// with no sync of any kind (it only answered from what is stored).
    ///
    /// # Errors
    /// As [`Store::write`].
    pub fn write_now<T, E: From<Error>>(
        &self,
        durability: Durability,
        f: impl FnOnce(&Dao<'_>) -> std::result::Result<(T, bool), E>,
    ) -> std::result::Result<Option<T>, E> {
        self.write_observed(durability, false, f)
    }

    /// One write under the ledger's keys; the status moves it committed go
    /// to the sink after the store's lock is released (an observer may call
    /// the ledger). A deferred commit is reported when it commits, not when
    /// it becomes durable.
    fn write_observed<T, E: From<Error>>(
        &self,
        durability: Durability,
        wait: bool,
        f: impl FnOnce(&Dao<'_>) -> std::result::Result<(T, bool), E>,
    ) -> std::result::Result<Option<T>, E> {
        let keys = self.current_keys()?;
        let sink = self.sink.read().map_err(|_| Error::LockPoisoned)?.clone();
        let done = {
            let mut guard = self.lock()?;
            if self.wal_replaced(guard.as_ref().ok_or(Error::Suspended)?) {
                // Nothing of ours is lost yet (the WAL was checkpointed before
                // it was deleted): start again on a fresh connection.
                let fresh = self.reconnect()?;
                *guard = Some(fresh);
            }
            self.write_in(
                &mut guard,
                durability,
                wait,
                keys.as_deref(),
                sink.is_some(),
                f,
            )?
        };
        Ok(done.map(|(out, events)| {
            if let (Some(sink), false) = (sink, events.is_empty()) {
                sink.moved(events);
            }
            out
        }))
    }

    /// One write transaction on the open connection. With `wait` false the
    /// write lock is only taken if free at once (`Ok(None)` otherwise).
    fn write_in<T, E: From<Error>>(
        &self,
        guard: &mut MutexGuard<'_, Option<Open>>,
        durability: Durability,
        wait: bool,
        keys: Option<&crypt::Keys>,
        observe: bool,
        f: impl FnOnce(&Dao<'_>) -> std::result::Result<(T, bool), E>,
    ) -> std::result::Result<Option<(T, Vec<MoveEvent>)>, E> {
        let open = guard.as_mut().ok_or(Error::Suspended)?;
        if open.sync_failed() {
            // Nothing is taken as durable behind a failed sync: the WAL is
            // written again first (which waits for the lock and the disk:
            // not on the no-wait path).
            if !wait {
                return Ok(None);
            }
            open.repair()?;
        }
        open.set_normal(durability != Durability::Full)?;
        error::take_io_error();
        if !wait {
            open.conn
                .busy_timeout(Duration::ZERO)
                .map_err(Error::from)?;
        }
        let begun = open
            .hot
            .with(&open.conn, hot::HotSql::BeginImmediate, |s| s.execute([]));
        if !wait {
            if let Err(e) = set_busy_timeout(&open.conn, &self.options) {
                // Leave no transaction open behind an error.
                if begun.is_ok() {
                    let _ = open.conn.execute_batch("ROLLBACK");
                }
                return Err(e.into());
            }
        }
        match begun {
            Err(Error::Busy | Error::ReadOnly | Error::CannotOpen) if !wait => return Ok(None),
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let result = run_begun(&open.conn, Some(&open.hot), keys, true, observe, f);
        if error::take_io_error() {
            // A failed write, read or sync inside the transaction (SQLite's
            // own sync of a FULL commit among them): repaired before the
            // next write. A commit that returned an error was not taken.
            open.mark_sync_failed();
        }
        if let Ok(((_, true), _)) = &result {
            match durability {
                // Its sync covered every frame written before it.
                Durability::Full if open.sync_failed() => {}
                Durability::Full => open.unsynced_since = None,
                Durability::Synced => {
                    // Pending until the sync succeeds: after a failed one
                    // the next durable write, `sync_deferred` (suspend, the
                    // deadline thread when armed) syncs it again.
                    open.unsynced_since.get_or_insert_with(Instant::now);
                    if let Err(e) = open.sync_wal() {
                        return Err(Error::NotDurable(Box::new(e)).into());
                    }
                }
                Durability::Deferred => {
                    open.unsynced_since.get_or_insert_with(Instant::now);
                }
                Durability::Lazy => {}
            }
        }
        // A transaction that wrote nothing committed nothing that could be
        // lost (a replay): the check before the next write is enough.
        if matches!(&result, Ok(((_, true), _))) && self.wal_replaced(open) {
            // The commit went to a deleted WAL. Reopen (keeping the broken
            // connection only if reopening fails) and say so.
            if let Ok(fresh) = self.reconnect() {
                **guard = Some(fresh);
            }
            return Err(Error::ForeignConnection.into());
        }
        result.map(|((t, _), events)| Some((t, events)))
    }

    /// Makes every write committed so far durable now: one sync of the WAL
    /// (also when nothing is pending: this is the explicit request).
    ///
    /// # Errors
    /// Storage errors of the sync; [`Error::Suspended`].
    pub fn sync(&self) -> Result<()> {
        let mut guard = self.lock()?;
        guard.as_mut().ok_or(Error::Suspended)?.sync_wal()
    }

    /// Makes the deferred writes durable if one is still not (one sync of
    /// the WAL then, none otherwise). True when it synced.
    ///
    /// # Errors
    /// Storage errors of the sync; [`Error::Suspended`] (a suspended store
    /// synced when it was suspended).
    pub fn sync_deferred(&self) -> Result<bool> {
        let mut guard = self.lock()?;
        let open = guard.as_mut().ok_or(Error::Suspended)?;
        open.make_durable()
    }

    /// True while a deferred write is not durable yet.
    /// False in a forked child (nothing of the parent's is looked at).
    pub fn has_unsynced(&self) -> bool {
        self.lock()
            .map(|g| {
                g.as_ref()
                    .is_some_and(|o| o.unsynced_since.is_some() || o.sync_failed())
            })
            .unwrap_or(false)
    }

    /// Makes the deferred writes durable if the oldest one not durable yet
    /// was committed `deadline` ago or more (one sync of the WAL then).
    /// A durable write since may have made them durable already; then this
    /// says when the oldest one committed after it falls due, or that none
    /// is pending.
    ///
    /// # Errors
    /// As [`Store::sync_deferred`].
    pub fn sync_deferred_due(&self, deadline: Duration) -> Result<DeferredDue> {
        let mut guard = self.lock()?;
        let open = guard.as_mut().ok_or(Error::Suspended)?;
        if open.sync_failed() {
            return open.repair().map(|()| DeferredDue::Synced);
        }
        let Some(since) = open.unsynced_since else {
            return Ok(DeferredDue::Nothing);
        };
        match since.checked_add(deadline) {
            Some(due) if due > Instant::now() => Ok(DeferredDue::At(due)),
            _ => open.sync_wal().map(|()| DeferredDue::Synced),
        }
    }

    /// True when the `-wal` file on disk is not the one `open` writes to.
    fn wal_replaced(&self, open: &Open) -> bool {
        match (&self.wal_file, open.wal) {
            (Some(wal), Some(known)) => file_id(wal) != Some(known),
            _ => false,
        }
    }

    /// A new connection to the same file: never creates it, and checks that
    /// it is still the ledger opened first.
    fn reconnect(&self) -> Result<Open> {
        if let Location::File(path) = &self.location {
            refuse_hard_links(path)?;
        }
        let conn = connect(&self.location, &self.options, false)?;
        let wal = match &self.location {
            Location::File(path) => {
                if dao::Dao::new(&conn).ledger_id()? != self.ledger_id {
                    return Err(Error::DatabaseReplaced);
                }
                reseal::check_keys(&conn, self.current_keys()?.as_deref())?;
                file_id(&wal_path(path))
            }
            _ => None,
        };
        Ok(Open::new(conn, wal, self.sync_failed.clone()))
    }

    /// Copies the whole WAL into the main file and truncates the WAL (after
    /// a prune, this is when the file shrinks). Does nothing in memory.
    ///
    /// # Errors
    /// Storage errors; [`Error::Busy`] when another connection's reader or
    /// writer keeps the checkpoint from completing.
    pub fn checkpoint(&self) -> Result<()> {
        let mut guard = self.lock()?;
        let open = guard.as_mut().ok_or(Error::Suspended)?;
        // The checkpoint syncs the WAL only when it can copy frames; a
        // deferred write must be durable whatever other connections hold
        // (and after a failed sync the WAL is whole on the disk before a
        // checkpoint copies it and starts it over).
        open.make_durable()?;
        error::take_io_error();
        let copied = open
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            });
        if error::take_io_error() {
            open.mark_sync_failed();
        }
        let (busy, _, _) = copied?;
        if busy != 0 && self.location != Location::Memory {
            return Err(Error::Busy);
        }
        Ok(())
    }

    /// The background checkpoint of an idle ledger: copies what it can of
    /// the WAL into the main file without waiting for any lock (SQLite's
    /// PASSIVE mode), so that the next write starts the WAL over. Runs only
    /// if `still_idle()`, asked under the store's lock (a write that began
    /// meanwhile skips it).
    ///
    /// Deferred writes not durable yet are synced first: SQLite's
    /// checkpoint syncs the WAL only when it copies frames itself, and
    /// frames another connection copied (with its own sync settings, or
    /// none) would otherwise be durable by nobody's sync. So an idle ledger
    /// leaves nothing for the deferred commits' deadline either.
    ///
    /// # Errors
    /// Storage errors of the sync or the checkpoint (a full disk); nothing
    /// written is lost by one.
    pub fn checkpoint_idle(&self, still_idle: impl FnOnce() -> bool) -> Result<IdleCheckpointRun> {
        if self.location == Location::Memory {
            return Ok(IdleCheckpointRun::Done);
        }
        let mut guard = self.lock()?;
        let Some(open) = guard.as_mut() else {
            return Ok(IdleCheckpointRun::Done);
        };
        if !still_idle() {
            return Ok(IdleCheckpointRun::NotIdle);
        }
        // A `-wal` put in place of ours (another library closed the file):
        // the next write reconnects; a checkpoint now would work on a stale
        // index.
        if self.wal_replaced(open) {
            return Ok(IdleCheckpointRun::Done);
        }
        open.make_durable()?;
        error::take_io_error();
        // What it copied is not looked at: nothing here counts on it.
        let copied = open.conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE);");
        if error::take_io_error() {
            open.mark_sync_failed();
        }
        copied?;
        Ok(IdleCheckpointRun::Done)
    }

    /// Checkpoints the WAL into the main file and closes the connection, so
    /// that no file lock is held (call before iOS suspends the app). The
    /// connection is closed whatever happens: a failed checkpoint (a full
    /// disk) is reported, but no lock is kept.
    ///
    /// # Errors
    /// Storage errors from the checkpoint or the close; the store is
    /// suspended all the same.
    pub fn suspend(&self) -> Result<()> {
        let mut guard = self.lock()?;
        let Some(mut open) = guard.take() else {
            return Ok(());
        };
        // Deferred writes are durable before the app may be frozen, even
        // when the checkpoint cannot copy every frame.
        // After a failed sync, the WAL is written again first: a checkpoint
        // that starts the WAL over must not leave a WAL with a hole on the
        // disk behind a database file that holds what came after it.
        let synced = open.make_durable().map(|_| ());
        error::take_io_error();
        // A WAL still not repaired is not copied at all: a copy cut by the
        // power would leave half-written pages in the database file that no
        // whole WAL covers (its close skips SQLite's checkpoint too: see
        // `Open`'s drop). The next write after `resume()` repairs.
        let checkpoint = if open.sync_failed() {
            Ok(())
        } else {
            open.conn
                .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
                .map_err(Error::from)
        };
        if error::take_io_error() {
            open.mark_sync_failed();
        }

        // A failed close hands the connection back; dropping it closes it
        // (rusqlite's drop closes and ignores the error) so no lock survives.
        // The held statements go first: a connection with statements left
        // does not close.
        open.hot.clear();
        let closed = (*open.conn).close().map_err(|(conn, e)| {
            drop(conn);
            Error::from(e)
        });
        synced.and(checkpoint).and(closed)
    }

    /// Closes the connection at once, with no checkpoint, as a killed
    /// process would (crash simulations). Later calls fail with
    /// [`Error::Suspended`].
    #[doc(hidden)]
    pub fn kill(&self) {
        if let Ok(mut guard) = self.lock() {
            drop(guard.take());
        }
    }

    /// Reopens after [`Store::suspend`]; a no-op when open. Never creates
    /// the file, and refuses a different database found at the path.
    ///
    /// # Errors
    /// The errors of [`Store::open`]; [`Error::CannotOpen`] when the file is
    /// gone; [`Error::DatabaseReplaced`] when another database is there.
    pub fn resume(&self) -> Result<()> {
        let mut guard = self.lock()?;
        if guard.is_none() {
            *guard = Some(self.reconnect()?);
        }
        Ok(())
    }

    /// True between [`Store::suspend`] and [`Store::resume`].
    pub fn is_suspended(&self) -> bool {
        self.lock().map(|g| g.is_none()).unwrap_or(false)
    }

    /// True when this store was opened as immutable (no `-wal` existed) and
    /// another connection has used the file since: a `-wal` exists now, or
    /// the file is not as it was when the connection opened (a writer that
    /// opened, wrote and closed leaves no `-wal`). What was read may then
    /// predate (or tear across) its writes.
    pub fn came_into_use(&self) -> bool {
        match &self.location {
            Location::ReadOnlyFile {
                path,
                immutable: true,
            } => wal_path(path).exists() || FileStamp::of(path) != self.stamp,
            _ => false,
        }
    }

    /// True (once) when this is an immutable read-only store whose
    /// connection was opened and not read through since; false for every
    /// other store.
    pub fn take_fresh(&mut self) -> bool {
        std::mem::take(&mut self.fresh)
    }

    /// True when a `-wal` exists beside this store's file.
    pub fn has_wal(&self) -> bool {
        self.path().is_some_and(|p| wal_path(p).exists())
    }

    /// True for a read-only store opened as immutable (no locks: it sees
    /// only what the file held when its connection opened).
    pub fn is_immutable(&self) -> bool {
        matches!(
            self.location,
            Location::ReadOnlyFile {
                immutable: true,
                ..
            }
        )
    }

    /// Opens a read-only store's connection again, as [`Store::open_read_only`]
    /// would now: immutable (with a new stamp) when no `-wal` exists, through
    /// SQLite's shared locking otherwise; its keys still the file's. A store
    /// that is not a read-only file's is left as it is. The new connection
    /// is not fresh: the caller reads through it next.
    ///
    /// # Errors
    /// As [`Store::open_read_only`], the store left as it was (still
    /// usable): [`Error::WrongKey`] when the file's keys changed (a rotation
    /// since), [`Error::KeyRequired`] when it was encrypted since;
    /// [`Error::Forked`] in a forked child.
    pub fn reopen_read_only(&mut self) -> Result<()> {
        self.refuse_forked()?;
        let Location::ReadOnlyFile { path, .. } = &self.location else {
            return Ok(());
        };
        let immutable = !wal_path(path).exists();
        let stamp = if immutable { FileStamp::of(path) } else { None };
        let location = Location::ReadOnlyFile {
            path: path.clone(),
            immutable,
        };
        let conn = connect(&location, &self.options, false)?;
        reseal::check_keys(&conn, self.current_keys()?.as_deref())?;
        self.conn = Mutex::new(Some(Open::new(conn, None, self.sync_failed.clone())));
        self.location = location;
        self.stamp = stamp;
        Ok(())
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
    keys: Option<&crypt::Keys>,
    observe: bool,
    f: impl FnOnce(&Dao<'_>) -> std::result::Result<T, E>,
) -> std::result::Result<(T, Vec<MoveEvent>), E> {
    conn.prepare_cached(begin)
        .and_then(|mut s| s.execute([]))
        .map_err(Error::from)?;
    run_begun(conn, None, keys, false, observe, f)
}

/// Runs `f` in the transaction just begun and commits it; the guard rolls
/// back on every other path. Returns the status moves it made when `observe`.
/// A `write` under keys first checks, inside the transaction, that they are
/// still the ledger's: another session may have rotated them since this one
/// loaded them (a session that opened while a rotation ran read the old
/// ones), and a value sealed under retired keys could never be opened again.
fn run_begun<T, E: From<Error>>(
    conn: &Connection,
    held: Option<&hot::Hot>,
    keys: Option<&crypt::Keys>,
    write: bool,
    observe: bool,
    f: impl FnOnce(&Dao<'_>) -> std::result::Result<T, E>,
) -> std::result::Result<(T, Vec<MoveEvent>), E> {
    let mut guard = RollbackGuard { conn, armed: true };
    if let (true, Some(keys)) = (write, keys) {
        reseal::keys_current(conn, keys)?;
    }
    let dao = Dao::with_keys(conn, held, keys, observe);
    let out = f(&dao)?;
    // SQLite ends a transaction on its own after some errors (the guard's
    // `RAISE(ROLLBACK)`, a full disk, an I/O error). Every write returns its
    // first error, so this cannot be reached today; if a write ever went on
    // after one, its later statements would have committed one by one:
    // refuse to call that a commit.
    if conn.is_autocommit() {
        return Err(Error::TransactionEnded.into());
    }
    hot::run(held, conn, hot::HotSql::Commit, |s| s.execute([]))?;
    guard.armed = false;
    let events = dao.events.map(|e| e.into_inner()).unwrap_or_default();
    Ok((out, events))
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
/// `immutable`: through a `file:` URI with `immutable=1` (no locks, no
/// `-wal`/`-shm` created).
fn connect_read_only(path: &Path, immutable: bool, options: &StoreOptions) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = if immutable {
        Connection::open_with_flags(
            immutable_uri(path).ok_or(Error::CannotOpen)?,
            flags | OpenFlags::SQLITE_OPEN_URI,
        )?
    } else {
        Connection::open_with_flags(path, flags)?
    };
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

/// Refuses a `-wal` that belongs to another ledger before anything opens the
/// file for writing: SQLite applies any WAL whose frames fit the page size,
/// and the first writer's checkpoint would copy the other ledger's pages
/// into this file. The ledger id read from the database file alone
/// (`immutable=1`: the WAL ignored) must be the one read through the WAL
/// (a read-only connection, which never checkpoints). A file without a
/// ledger id yet (created and killed before its first checkpoint), or one
/// either read cannot open, is left to the open's own checks.
fn refuse_foreign_wal(db: &Path) -> Result<()> {
    if !wal_path(db).exists() || !db.exists() {
        return Ok(());
    }
    let read_id = |immutable: bool| -> Option<String> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = if immutable {
            Connection::open_with_flags(immutable_uri(db)?, flags | OpenFlags::SQLITE_OPEN_URI)
        } else {
            Connection::open_with_flags(db, flags)
        }
        .ok()?;
        conn.busy_timeout(std::time::Duration::from_millis(200))
            .ok()?;
        conn.query_row("SELECT value FROM meta WHERE key = 'ledger_id'", [], |r| {
            r.get::<_, String>(0)
        })
        .ok()
    };
    let Some(alone) = read_id(true) else {
        return Ok(());
    };
    match read_id(false) {
        Some(through) if through != alone => Err(Error::ForeignWal),
        _ => Ok(()),
    }
}

/// `file:<path>?immutable=1`, every byte outside the URI's unreserved set
/// percent-encoded (so `?`, `#`, `%` and spaces in a path stay the path).
/// `None` for a path that is not valid UTF-8 on a platform without bytes.
fn immutable_uri(path: &Path) -> Option<String> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes()
    };
    #[cfg(not(unix))]
    let bytes = path.to_str()?.as_bytes();
    let mut uri = String::from("file:");
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    Some(uri)
}

/// [`connect`] (creating the file if missing), tried again while SQLite
/// answers busy, for up to the busy timeout. Opening a file that another
/// process is creating at the same moment switches it from SQLite's
/// rollback journal to WAL and migrates it: there SQLite refuses one of two
/// connections that both want to write at once, without calling the busy
/// handler (waiting could deadlock them), and the other one finishes in a
/// few milliseconds. A connection refused so is dropped and a new one made.
/// Each attempt waits in SQLite's busy handler only for what is left of the
/// timeout (one whole timeout per attempt could add up to twice it), and
/// the connection that opens gets the whole timeout back.
fn connect_retrying_busy(location: &Location, options: &StoreOptions) -> Result<Connection> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        let attempt = StoreOptions {
            busy_timeout: options.busy_timeout.saturating_sub(started.elapsed()),
            ..options.clone()
        };
        match connect(location, &attempt, true) {
            Ok(conn) => {
                set_busy_timeout(&conn, options)?;
                return Ok(conn);
            }
            Err(Error::Busy) if started.elapsed() + pause < options.busy_timeout => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
}

fn connect(location: &Location, options: &StoreOptions, create: bool) -> Result<Connection> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let mut conn = match location {
        Location::File(path) => match &options.vfs {
            Some(vfs) => Connection::open_with_flags_and_vfs(path, flags, vfs.as_str())?,
            None => Connection::open_with_flags(path, flags)?,
        },
        Location::ReadOnlyFile { path, immutable } => {
            return connect_read_only(path, *immutable, options)
        }
        Location::Memory => Connection::open_in_memory()?,
    };
    set_busy_timeout(&conn, options)?;
    // The first statement that reads the header reports NOTADB / CORRUPT.
    // A newer schema is refused before anything (even the journal mode) is
    // written to the file.
    schema::refuse_newer(&conn)?;
    // Only takes effect on a new, empty file; must precede the first table.
    // Set only then: on an existing file SQLite writes the setting again (a
    // write transaction on every open), and opening must write nothing
    // (a wrong key, a refused file).
    let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    if pages == 0 {
        conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL;")?;
    }
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
    // Apple storage acknowledges fsync() before the data is on stable media;
    // F_FULLFSYNC (commits and checkpoints) makes a durable commit durable
    // against power loss there.
    #[cfg(target_vendor = "apple")]
    conn.execute_batch(
        "PRAGMA fullfsync=ON;
         PRAGMA checkpoint_fullfsync=ON;",
    )?;
    conn.set_prepared_statement_cache_capacity(64);
    if location != &Location::Memory {
        install_checkpoint_hook(&conn);
    }
    schema::migrate(&mut conn)?;
    Ok(conn)
}

/// SQLite's own checkpoint in a commit: once the WAL holds this many frames
/// (SQLite's default `wal_autocheckpoint`).
const AUTOCHECKPOINT_FRAMES: std::os::raw::c_int = 1000;

/// Replaces SQLite's default WAL hook with one that does the same (a
/// PASSIVE checkpoint once the WAL holds [`AUTOCHECKPOINT_FRAMES`] frames,
/// run inside the commit) and notes an I/O error of that checkpoint for the
/// store: the default hook drops the checkpoint's result, and a failed sync
/// of the WAL there leaves a hole that must be repaired (`Open::repair`).
/// The commit itself is not failed by it (it did commit).
fn install_checkpoint_hook(conn: &Connection) {
    use rusqlite::ffi;
    unsafe extern "C" fn hook(
        _: *mut std::os::raw::c_void,
        db: *mut ffi::sqlite3,
        name: *const std::os::raw::c_char,
        frames: std::os::raw::c_int,
    ) -> std::os::raw::c_int {
        if frames >= AUTOCHECKPOINT_FRAMES {
            // SAFETY: SQLite calls the hook with its open connection and
            // the name of the database just committed, after the commit and
            // outside any lock this call could conflict with (as its own
            // default hook, which makes this very call).
            let rc = unsafe {
                ffi::sqlite3_wal_checkpoint_v2(
                    db,
                    name,
                    ffi::SQLITE_CHECKPOINT_PASSIVE,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            if rc & 0xff == ffi::SQLITE_IOERR {
                error::note_io_error();
            }
        }
        ffi::SQLITE_OK
    }
    // SAFETY: `conn` is open; the hook keeps no pointer (its argument is
    // null) and is a plain function, valid for the life of the connection.
    unsafe {
        ffi::sqlite3_wal_hook(conn.handle(), Some(hook), std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_fsync_exactly_on_apple() {
        let conn = connect(&Location::Memory, &StoreOptions::default(), true).unwrap();
        let flag = |name: &str| -> i64 {
            conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                .unwrap()
        };
        let expected = i64::from(cfg!(target_vendor = "apple"));
        assert_eq!(flag("fullfsync"), expected);
        assert_eq!(flag("checkpoint_fullfsync"), expected);
    }
    use crate::model::{
        ArgsDigest, ExecutionId, ExecutionStatus, Move, OperationId, Provider, SessionId,
        Transition,
    };

    fn mv(from: ExecutionStatus, t: Transition) -> Move {
        Move::check(from, t).unwrap()
    }

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
                        compensates: None,
                        now_ms: 1,
                    },
                    &session,
                )?;
                dao.move_status(
                    &id,
                    mv(ExecutionStatus::Executing, Transition::Commit),
                    None,
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
        // No `Move` leads out of `committed` but to delivery, so this takes
        // raw SQL: the trigger is the last guard.
        let err = store
            .write(Durability::Full, |dao| {
                dao.tx
                    .execute(
                        "UPDATE executions SET status = 'failed_before_commit'
                         WHERE execution_id = ?1",
                        [id.as_str()],
                    )
                    .map_err(Error::from)
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
                    mv(ExecutionStatus::Executing, Transition::MarkUnknown),
                    None,
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
    fn a_fenced_move_of_a_stale_attempt_changes_nothing() {
        let store = Store::open_in_memory().unwrap();
        let op = OperationId::new("op").unwrap();
        let id = ExecutionId::parse("op:round_0:c:t:v1").unwrap();
        let digest = ArgsDigest::parse("a".repeat(64)).unwrap();
        let owner = SessionId::generate();
        let other = SessionId::generate();
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
                        attempt_count: 2,
                        owner_session: Some(&owner),
                        compensates: None,
                        now_ms: 1,
                    },
                    &owner,
                )
            })
            .unwrap();
        let commit = |attempt, session: &SessionId| {
            store
                .write(Durability::Full, |dao| {
                    dao.move_status(
                        &id,
                        mv(ExecutionStatus::Executing, Transition::Commit),
                        Some(Fence {
                            attempt,
                            session: Some(session),
                        }),
                        &StatusFields {
                            result_json: Some("1"),
                            ..StatusFields::default()
                        },
                        session,
                        2,
                    )
                })
                .unwrap()
        };
        assert!(!commit(1, &owner), "an older attempt");
        assert!(!commit(2, &other), "another session");
        let rec = store.read(|dao| dao.execution(&id)).unwrap().unwrap();
        assert_eq!(rec.status, ExecutionStatus::Executing);
        assert!(commit(2, &owner));
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

    /// A write that went on after SQLite ended its transaction (as the
    /// guard's `RAISE(ROLLBACK)` or a full disk does; here a plain
    /// `ROLLBACK` stands in for it) is reported as failed, not committed.
    #[test]
    fn a_write_whose_transaction_ended_inside_it_is_not_a_commit() {
        let store = Store::open_in_memory().unwrap();
        let op = OperationId::new("op3").unwrap();
        let r: Result<()> = store.write(Durability::Full, |dao| {
            dao.ensure_operation(&op, 1)?;
            dao.tx.execute_batch("ROLLBACK")?;
            Ok(())
        });
        assert!(matches!(r, Err(Error::TransactionEnded)), "{r:?}");
        // What the transaction held before it ended is gone.
        assert_eq!(store.read(|dao| dao.operation_status(&op)).unwrap(), None);
        // The store goes on: the next write commits.
        store
            .write(Durability::Full, |dao| dao.ensure_operation(&op, 1))
            .unwrap();
        assert!(store
            .read(|dao| dao.operation_status(&op))
            .unwrap()
            .is_some());
    }

    #[test]
    fn each_write_commits_under_the_synchronous_setting_it_asks_for() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db"), StoreOptions::default(), None).unwrap();
        let op = OperationId::new("op").unwrap();
        let setting = |durability| {
            store
                .write(durability, |dao| {
                    dao.ensure_operation(&op, 1)?;
                    dao.tx
                        .query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0))
                        .map_err(Error::from)
                })
                .unwrap()
        };
        // NORMAL (1) for lazy and deferred writes, FULL (2) for full ones,
        // whatever came before.
        assert_eq!(setting(Durability::Lazy), 1);
        assert_eq!(setting(Durability::Full), 2);
        assert_eq!(setting(Durability::Deferred), 1);
        assert!(store.has_unsynced());
        assert_eq!(setting(Durability::Synced), 1);
        assert!(
            !store.has_unsynced(),
            "a synced write syncs what came before"
        );
        assert_eq!(setting(Durability::Deferred), 1);
        assert_eq!(setting(Durability::Lazy), 1);
        assert!(store.has_unsynced(), "a lazy write does not sync");
        assert_eq!(setting(Durability::Full), 2);
        assert!(!store.has_unsynced(), "a full write syncs what came before");
        let guard = store.lock().unwrap();
        let conn = &guard.as_ref().unwrap().conn;
        let fk: i64 = conn
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(fk, 1);
    }

    #[test]
    fn a_deferred_write_is_synced_once_by_sync_deferred_and_by_suspend() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db"), StoreOptions::default(), None).unwrap();
        let op = OperationId::new("op").unwrap();
        let deferred = || {
            store
                .write(Durability::Deferred, |dao| {
                    dao.ensure_operation(&op, 1).map(|_| ())
                })
                .unwrap()
        };
        assert!(!store.sync_deferred().unwrap(), "nothing pending");
        deferred();
        assert!(store.sync_deferred().unwrap());
        assert!(!store.sync_deferred().unwrap(), "synced once");
        deferred();
        store.suspend().unwrap();
        store.resume().unwrap();
        assert!(!store.has_unsynced());
        store.sync().unwrap();
    }

    /// The repair through the real file system (the power-loss tests run it
    /// on the simulated disk): it writes the WAL again byte for byte, under
    /// the write lock, and the store goes on writing; a new connection (a
    /// reopen after `suspend()`) still repairs first.
    #[test]
    fn the_repair_rewrites_the_wal_as_it_was_and_writes_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let wal = dir.path().join("s.db-wal");
        let store = Store::open(&path, StoreOptions::default(), None).unwrap();
        // Enough writes for a WAL of several 64 KiB chunks.
        for i in 0..40 {
            let op = OperationId::new(format!("op{i}")).unwrap();
            store
                .write(Durability::Deferred, |dao| {
                    dao.ensure_operation(&op, 1).map(|_| ())
                })
                .unwrap();
        }
        let before = std::fs::read(&wal).unwrap();
        assert!(before.len() > 64 * 1024, "{} bytes", before.len());
        let mark = |store: &Store| {
            let guard = store.lock().unwrap();
            guard.as_ref().unwrap().mark_sync_failed();
        };
        mark(&store);
        assert!(
            store.has_unsynced(),
            "nothing is durable by the store's word"
        );
        assert!(store.sync_deferred().unwrap(), "the repair synced");
        assert!(!store.has_unsynced());
        assert_eq!(std::fs::read(&wal).unwrap(), before, "the same bytes");
        // Marked again, the next write repairs first and goes on.
        mark(&store);
        let op = OperationId::new("after").unwrap();
        store
            .write(Durability::Full, |dao| {
                dao.ensure_operation(&op, 1).map(|_| ())
            })
            .unwrap();
        assert!(!store.has_unsynced());
        // Marked while suspended: the reopened connection repairs first.
        store.suspend().unwrap();
        store.sync_failed.store(true, Ordering::Release);
        store.resume().unwrap();
        assert!(store.has_unsynced());
        store.sync().unwrap();
        assert!(!store.has_unsynced());
        let check: String = {
            let guard = store.lock().unwrap();
            guard
                .as_ref()
                .unwrap()
                .conn
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(check, "ok");
        assert_eq!(
            store.read(|dao| dao.operation_status(&op)).unwrap(),
            Some(crate::model::OperationStatus::Open)
        );
    }

    #[test]
    fn suspended_stores_refuse_work_until_resumed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = Store::open(&path, StoreOptions::default(), None).unwrap();
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

    #[test]
    fn resume_never_creates_or_swaps_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = Store::open(&path, StoreOptions::default(), None).unwrap();
        store.suspend().unwrap();
        // Gone: resume refuses instead of creating an empty ledger.
        std::fs::rename(&path, dir.path().join("moved.db")).unwrap();
        assert!(matches!(store.resume(), Err(Error::CannotOpen)));
        assert!(!path.exists());
        // Another ledger put in its place: refused, untouched.
        drop(Store::open(&path, StoreOptions::default(), None).unwrap());
        assert!(matches!(store.resume(), Err(Error::DatabaseReplaced)));
        // The original back: resumes.
        std::fs::rename(dir.path().join("moved.db"), &path).unwrap();
        std::fs::remove_file(dir.path().join("s.db-wal")).ok();
        std::fs::remove_file(dir.path().join("s.db-shm")).ok();
        store.resume().unwrap();
    }

    #[test]
    fn a_relative_path_is_resolved_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("a"), dir.path().join("link")).unwrap();
        let store =
            Store::open(&dir.path().join("link/x.db"), StoreOptions::default(), None).unwrap();
        let resolved = std::fs::canonicalize(dir.path().join("a/x.db")).unwrap();
        assert_eq!(store.path(), Some(resolved.as_path()));
    }

    /// The WAL deleted while a transaction runs (what another SQLite in the
    /// process does when it closes the file, after a full checkpoint): a
    /// transaction that wrote nothing (a replay) answers and the next write
    /// starts on a fresh connection and lasts; a commit that wrote to the
    /// deleted WAL is reported (`ForeignConnection`: it may not have reached
    /// the file).
    #[test]
    fn a_commit_to_a_deleted_wal_is_reported_and_one_that_wrote_nothing_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let wal = dir.path().join("s.db-wal");
        let store = Store::open(&path, StoreOptions::default(), None).unwrap();
        let write = |name: &str| {
            let op = OperationId::new(name).unwrap();
            store.write(Durability::Full, |dao| {
                dao.ensure_operation(&op, 1).map(|_| ())
            })
        };
        write("first").unwrap();

        store.checkpoint().unwrap();
        let first = OperationId::new("first").unwrap();
        let read = store.write_now(Durability::Full, |dao| {
            std::fs::remove_file(&wal).unwrap();
            Ok::<_, Error>((dao.operation_status(&first)?, false))
        });
        assert!(matches!(read, Ok(Some(Some(_)))), "{read:?}");
        write("after").unwrap();

        store.checkpoint().unwrap();
        let lost = OperationId::new("lost").unwrap();
        let wrote = store.write_now(Durability::Full, |dao| {
            std::fs::remove_file(&wal).unwrap();
            dao.ensure_operation(&lost, 1)?;
            Ok::<_, Error>(((), true))
        });
        assert!(matches!(wrote, Err(Error::ForeignConnection)), "{wrote:?}");
        drop(store);
        let again = Store::open(&path, StoreOptions::default(), None).unwrap();
        let after = OperationId::new("after").unwrap();
        assert!(again
            .read(|dao| dao.operation_status(&after))
            .unwrap()
            .is_some());
    }

    #[test]
    fn a_wal_deleted_under_the_connection_is_noticed_before_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = Store::open(&path, StoreOptions::default(), None).unwrap();
        let op = OperationId::new("before").unwrap();
        store
            .write(Durability::Full, |dao| {
                dao.ensure_operation(&op, 1).map(|_| ())
            })
            .unwrap();
        // What another SQLite in the process does when it closes the file:
        // checkpoint everything, then delete the WAL.
        store.checkpoint().unwrap();
        std::fs::remove_file(dir.path().join("s.db-wal")).unwrap();
        let op2 = OperationId::new("after").unwrap();
        store
            .write(Durability::Full, |dao| {
                dao.ensure_operation(&op2, 1).map(|_| ())
            })
            .unwrap();
        drop(store);
        // Both writes are in the file (the second went to a fresh WAL).
        let again = Store::open(&path, StoreOptions::default(), None).unwrap();
        for op in [&op, &op2] {
            assert!(again
                .read(|dao| dao.operation_status(op))
                .unwrap()
                .is_some());
        }
    }
}
