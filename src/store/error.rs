//! Storage errors: what can go wrong below the ledger, classified so callers
//! can act (retry later, free space, restore a backup) without reading SQLite
//! codes.

use rusqlite::ErrorCode;

/// A storage failure. Messages never contain argument or result values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file exists but is not an SQLite database, or is an SQLite
    /// database that is not a toolledger ledger (another program's tables).
    /// It is left untouched.
    #[error("the file is not a toolledger database (it is left untouched)")]
    NotADatabase,
    /// SQLite found the database corrupt. The file is left untouched.
    #[error("the database file is corrupt (it is left untouched)")]
    Corrupt,
    /// The database was written by a newer toolledger.
    #[error("the database has schema version {found}; this build supports up to {supported}")]
    IncompatibleVersion {
        /// The file's `user_version`.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// A read-only open found a database written by an older toolledger: it
    /// must be migrated (opened read-write) before it can be read. Version
    /// 0 is a file with no ledger in it yet (empty, or being created by
    /// another process at this moment).
    #[error("{}", older_schema(*found, *current))]
    OlderSchema {
        /// The file's `user_version`.
        found: i64,
        /// The version this build reads and writes.
        current: i64,
    },
    /// Another connection held the lock longer than `busy_timeout`.
    #[error("the database is locked by another connection (busy timeout elapsed)")]
    Busy,
    /// The disk (or the database's size limit) is full.
    #[error("the disk is full; nothing was written")]
    DiskFull,
    /// The file or its directory is read-only.
    #[error("the database is read-only")]
    ReadOnly,
    /// The file could not be opened (missing directory, permissions).
    #[error("cannot open the database file")]
    CannotOpen,
    /// A stored value could not be read back as the type it should hold.
    #[error("stored data is invalid: {0}")]
    InvalidData(String),
    /// A write was refused by one of the schema's guards (e.g. a committed
    /// execution cannot be downgraded).
    #[error("write refused by the ledger's schema guard: {0}")]
    Guard(String),
    /// SQLite ended a write's transaction inside it (after an error the
    /// write went on from instead of returning it). The write is reported
    /// failed, never committed; no write of the ledger goes on after an
    /// error, so this names a defect, not a condition to handle.
    #[error("the write's transaction ended before its commit")]
    TransactionEnded,
    /// The store's connection lock was poisoned by a panic in another thread.
    #[error("the store's lock was poisoned by a panic elsewhere")]
    LockPoisoned,
    /// The store was closed by `suspend()` and not reopened.
    #[error("the store is suspended; call resume() first")]
    Suspended,
    /// A store of this process's parent (which `fork()` made this one) had
    /// the ledger open: its copy here cannot be used (a SQLite connection
    /// cannot cross a fork, and the session — its lock, the attempts it
    /// handed out — is the parent's), and the file cannot be opened again
    /// here either (SQLite's lock state for it is the parent's copy).
    /// Nothing was read or written. Use the ledger from the parent, or
    /// start the worker with `exec` (a `spawn` start method) and open it
    /// there.
    #[error("the ledger is open in this process's parent (before fork()): use it there, or start this process with exec (spawn) and open it here")]
    Forked,
    /// The database file has more than one hard link. SQLite names the WAL
    /// after the path, so two names of one file would each get a WAL of
    /// their own and lose each other's commits: the file is not opened.
    #[error("the database file has {links} hard links; open it by one name only")]
    MultipleLinks {
        /// The file's link count.
        links: u64,
    },
    /// Reopening found a different database at the ledger's path (the file
    /// was replaced while the ledger was suspended). Nothing was written.
    #[error("the file at the ledger's path is no longer the database this ledger opened")]
    DatabaseReplaced,
    /// At open, the `-wal` beside the database belongs to another ledger
    /// (copied or restored in the wrong place): applied, it would replace
    /// this ledger's records with the other's. Nothing was written; move
    /// the `-wal` away (or put the right one back) to open the file.
    #[error("the -wal beside the database belongs to another ledger (nothing was written)")]
    ForeignWal,
    /// The WAL this connection wrote to was deleted under it while it
    /// committed: another SQLite library in this process opened and closed
    /// the ledger file. The last write may be lost; the connection was
    /// reopened. Never open the ledger file with another SQLite (use the
    /// ledger's backup and export instead).
    #[error("another SQLite connection in this process closed the ledger file; the last write may be lost")]
    ForeignConnection,
    /// A key that is not 32 bytes (or no random source to make one).
    #[error("an encryption key must be 32 bytes")]
    InvalidKey,
    /// The key does not open this ledger's keys. Nothing was written.
    #[error("the key does not open this ledger (nothing was written)")]
    WrongKey,
    /// The ledger is encrypted and was opened without its key. Nothing was
    /// written.
    #[error("the ledger is encrypted: open it with its key")]
    KeyRequired,
    /// A key was given for a ledger that holds unencrypted records: encrypt
    /// it in place first (`encrypt_in_place`). Nothing was written.
    #[error("the ledger is not encrypted: encrypt it in place first")]
    NotEncrypted,
    /// A sealed value did not open: it was altered, moved from another row
    /// or column, or written under another key.
    #[error("a sealed value failed authentication (altered, moved or under another key)")]
    Undecryptable,
    /// Another live session has the ledger open: encrypting or re-keying
    /// needs it alone. Nothing was written.
    #[error("another session has the ledger open")]
    InUse,
    /// The disk reported an I/O error (a failed read, write or sync). What
    /// was written since the last good sync may not be on the disk: before
    /// its next write or sync the ledger writes its log again and syncs it,
    /// and takes nothing as durable until that succeeded (each later write
    /// tries again, and fails with this error while the disk keeps failing).
    #[error("the disk reported an I/O error ({0}); the ledger writes its log again before it writes anything new")]
    Io(rusqlite::Error),
    /// The write committed, but the sync that makes it durable failed (or
    /// writing the log again after an earlier failed sync did): it is in
    /// the ledger, not known to be on the disk. Later writes make it
    /// durable once the disk works (see [`Error::Io`]).
    #[error("the write committed but could not be made durable: {0}")]
    NotDurable(Box<Error>),
    /// An encryption in place or a re-key committed: the ledger is now
    /// under the new key (the old one opens nothing). Only its last step
    /// failed, scrubbing earlier bytes of values from free pages and the WAL
    /// (`VACUUM` and a truncating checkpoint; e.g. a reader held a
    /// snapshot), with the error inside. Keep the new key; to scrub, re-key
    /// again later with the new key as both old and new.
    #[error("the ledger is now under the new key (keep it), but earlier bytes could not be scrubbed yet: {0}")]
    NotScrubbed(Box<Error>),
    /// Any other SQLite error.
    #[error("sqlite error: {0}")]
    Sqlite(rusqlite::Error),
}

thread_local! {
    /// Set when an I/O error was classified on this thread (see
    /// [`take_io_error`]).
    static IO_ERROR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True when an I/O error was classified on this thread since the last
/// call (which clears it). The store asks around each write, which runs on
/// the calling thread under its lock: an error inside the write reaches
/// its caller as the caller's own error type, and this is how the store
/// still learns that the disk failed under it.
pub(super) fn take_io_error() -> bool {
    IO_ERROR.with(|seen| seen.replace(false))
}

/// Notes an I/O error that reached no `rusqlite::Error` (SQLite's checkpoint
/// in a commit, whose result the commit does not report).
pub(super) fn note_io_error() {
    IO_ERROR.with(|seen| seen.set(true));
}

/// A sealed value that failed to open inside a row mapping (rusqlite wants
/// its own error type there); turned back into [`Error::Undecryptable`].
#[derive(Debug, thiserror::Error)]
#[error("a sealed value failed authentication")]
pub(super) struct SealBroken;

/// SQLite's extended code for a `-shm` file that could not be grown.
const SQLITE_IOERR_SHMSIZE: i32 = 10 | (19 << 8);

impl From<rusqlite::Error> for Error {
    fn from(err: rusqlite::Error) -> Error {
        if let rusqlite::Error::FromSqlConversionFailure(_, _, inner) = &err {
            if inner.is::<SealBroken>() {
                return Error::Undecryptable;
            }
            // A stored value this code could not have written (a status no
            // build knows, bytes where text belongs): a damaged file (a
            // truncated page read as zeros), not a SQLite failure.
            return Error::Corrupt;
        }
        if let rusqlite::Error::InvalidColumnType(..) = &err {
            return Error::Corrupt;
        }
        if let rusqlite::Error::SqliteFailure(ffi, msg) = &err {
            return match ffi.code {
                ErrorCode::NotADatabase => Error::NotADatabase,
                ErrorCode::DatabaseCorrupt => Error::Corrupt,
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => Error::Busy,
                ErrorCode::DiskFull => Error::DiskFull,
                ErrorCode::ReadOnly => Error::ReadOnly,
                ErrorCode::CannotOpen => Error::CannotOpen,
                // The `-shm` could not be made larger: no room on the disk
                // (SQLITE_IOERR_SHMSIZE, from a failed fallocate/ftruncate).
                ErrorCode::SystemIoFailure if ffi.extended_code == SQLITE_IOERR_SHMSIZE => {
                    Error::DiskFull
                }
                ErrorCode::SystemIoFailure => {
                    note_io_error();
                    Error::Io(err)
                }
                ErrorCode::ConstraintViolation
                    if msg.as_deref().is_some_and(|m| m.starts_with("toolledger:")) =>
                {
                    Error::Guard(msg.clone().unwrap_or_default())
                }
                _ => Error::Sqlite(err),
            };
        }
        Error::Sqlite(err)
    }
}

/// The store's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// [`Error::OlderSchema`]'s text.
fn older_schema(found: i64, current: i64) -> String {
    if found == 0 {
        format!(
            "the database holds no ledger yet (schema version 0: empty, or being created \
             right now); open it read-write to create one (version {current})"
        )
    } else {
        format!("the database has schema version {found}; open it read-write to migrate it to {current}")
    }
}
