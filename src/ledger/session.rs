//! Session lock files: how one ledger tells another "I am alive".
//!
//! Each open ledger is a session. It holds an exclusive advisory lock (`flock`)
//! on its own file `<db>-sessions/<session id>.lock` for as long as it is open
//! and not suspended; the operating system drops the lock when the process
//! dies. The file's path is registered in the database (`sessions`), so a
//! ledger opened through a symlink, a hard link or another spelling of the
//! path is still found. Another session asks "is the owner alive?" with
//! [`Sessions::probe`]:
//!
//! - **held**: alive, whatever else is true;
//! - **free** or **absent**: not holding its lock: alive while a suspension
//!   mark covers it, or while its process may still run it (decided in
//!   `owners`, which reads the mark, the lock file's record and asks
//!   `process`);
//! - any **other error** (too many open files, permission denied …): alive.
//!   Only a lock that is provably not held may count as death.
//!
//! Nobody deletes another session's lock file except through
//! [`Sessions::clean`], which first takes the lock itself (so the owner
//! cannot hold it) and deletes while holding it. An owner that (re)takes its
//! lock checks, once it holds it, that the file it locked is still the one at
//! the path, and starts again if a cleaner deleted it meanwhile: the
//! unlink-while-relocking race cannot leave a live owner invisible.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::process;
use crate::model::SessionId;
use crate::store::ParentOnlyFd;

/// The answer of a lock probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Someone holds the lock: the owner is alive.
    Held,
    /// The file exists and nobody holds its lock.
    Free,
    /// No lock file.
    Absent,
    /// The probe itself failed: the owner counts as alive.
    Failed,
}

/// The lock-file side of one ledger's session.
#[derive(Debug)]
pub(crate) struct Sessions {
    dir: Option<PathBuf>,
    own: SessionId,
    held: Mutex<Option<Held>>,
    /// The process that took the lock. A child made by `fork()` shares the
    /// parent's open file description, and with it the lock: unlocking it or
    /// deleting the file there would end the parent's ownership while the
    /// parent runs (see [`Sessions::forked`]).
    pid: u32,
    /// Set by [`Sessions::abandon`]: the session ended as a killed process's
    /// does, and dropping it touches nothing.
    abandoned: std::sync::atomic::AtomicBool,
    /// Set by [`Sessions::row_deleted`].
    row_deleted: std::sync::atomic::AtomicBool,
    /// How many records this session has written to its lock file.
    written: std::sync::atomic::AtomicU64,
    /// The identity of the lock file this session last locked (see
    /// `file_id_text`).
    locked_id: Mutex<Option<String>>,
}

/// A held session lock file. A child made by `fork()` does not keep the
/// parent's lock alive (see `ParentOnlyFd`).
#[derive(Debug)]
struct Held {
    /// Declared first: out of the list before the descriptor is closed.
    _parent_only: ParentOnlyFd,
    file: File,
}

/// The directory that holds the session lock files of database `db` (a
/// resolved path).
pub(crate) fn sessions_dir(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-sessions");
    PathBuf::from(name)
}

/// Attempts to take a lock file whose path keeps being cleaned away before
/// giving up (each round is a cleaner deleting the file between our open and
/// our lock: a handful at most in practice).
const ACQUIRE_ROUNDS: usize = 64;

impl Sessions {
    /// Registers `own` and takes its lock (none for in-memory stores).
    pub(crate) fn start(db: Option<&Path>, own: SessionId) -> io::Result<Sessions> {
        let sessions = Sessions {
            dir: db.map(sessions_dir),
            own,
            held: Mutex::new(None),
            pid: std::process::id(),
            abandoned: std::sync::atomic::AtomicBool::new(false),
            row_deleted: std::sync::atomic::AtomicBool::new(false),
            written: std::sync::atomic::AtomicU64::new(0),
            locked_id: Mutex::new(None),
        };
        sessions.acquire()?;
        process::note_open(&sessions.own);
        Ok(sessions)
    }

    /// The sequence number of the next record this session writes.
    fn next_seq(&self) -> u64 {
        self.written
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .saturating_add(1)
    }

    /// This ledger's session id.
    pub(crate) fn own(&self) -> &SessionId {
        &self.own
    }

    /// The lock file of `session` in this database's sessions directory
    /// (where every session of this build puts its own).
    pub(crate) fn default_lock_path(&self, session: &SessionId) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|dir| dir.join(format!("{session}.lock")))
    }

    /// This session's lock file.
    pub(crate) fn own_lock_path(&self) -> Option<PathBuf> {
        self.default_lock_path(&self.own)
    }

    /// True while this session holds its lock (not suspended).
    pub(crate) fn holds_lock(&self) -> bool {
        self.held.lock().map(|h| h.is_some()).unwrap_or(false)
    }

    /// (Re)takes this session's lock. Waits while another session's probe
    /// or clean holds it for its instant, at most [`LOCK_PATIENCE`] (a
    /// frozen prober): an error after that.
    pub(crate) fn acquire(&self) -> io::Result<()> {
        let Some(path) = self.own_lock_path() else {
            return Ok(());
        };
        let mut held = self
            .held
            .lock()
            .map_err(|_| io::Error::other("session lock state poisoned"))?;
        // Already held (resume without suspend): taking it again through a
        // second handle would block forever, since flock locks conflict
        // across open file descriptions even within one process.
        if held.is_some() {
            return Ok(());
        }
        if let Some(dir) = &self.dir {
            create_private_dir(dir)?;
        }
        for _ in 0..ACQUIRE_ROUNDS {
            // Noted as it is opened, before the lock: a child forked from
            // here on never keeps it.
            let (file, parent_only) = match ParentOnlyFd::open(|| open_private(&path)) {
                Ok(opened) => opened,
                Err(e) if is_not_a_plain_file(&e) => {
                    // A symlink (or something else) put at this session's
                    // own path: the name is removed (never what it points
                    // at), and the file made anew.
                    let _ = fs::remove_file(&path);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !own_file(&file) {
                // Another name for some other file (a hard link) or not a
                // regular file: this session's records must not go there.
                drop(parent_only);
                drop(file);
                let _ = fs::remove_file(&path);
                continue;
            }
            lock_bounded(&file)?;
            if same_file(&file, &path) {
                if let Ok(mut id) = self.locked_id.lock() {
                    *id = file.metadata().ok().as_ref().and_then(file_id_text);
                }
                record_process(&file, self.pid, self.next_seq());
                *held = Some(Held {
                    _parent_only: parent_only,
                    file,
                });
                return Ok(());
            }
            // A cleaner deleted the file between our open and our lock: the
            // lock we hold is on a file nobody can find. Start again.
        }
        Err(io::Error::other("session lock file keeps disappearing"))
    }

    /// True in a child made by `fork()` of the process that opened this
    /// session. The child's copy of the lock file's descriptor names the
    /// parent's open file description: `flock` locks belong to it, so an
    /// unlock through the copy releases the parent's lock, and the file at
    /// the path is the parent's. The child must touch neither.
    pub(crate) fn forked(&self) -> bool {
        std::process::id() != self.pid
    }

    /// Releases this session's lock for a suspension: the lock file first
    /// says so (`suspended`), so that a suspension whose mark the database
    /// refused (a full disk) is still told apart from a process that let
    /// go of the lock otherwise (an `exec()`, which closes it). The file
    /// stays. Nothing in a forked child.
    pub(crate) fn release_suspended(&self) {
        if self.forked() {
            return;
        }
        if let Ok(held) = self.held.lock() {
            if let Some(held) = held.as_ref() {
                write_record(
                    &held.file,
                    &process_record(&held.file, self.pid, self.next_seq(), true),
                );
            }
        }
        self.release();
    }

    /// Releases this session's lock. The file stays. Nothing in a forked
    /// child (the lock is the parent's).
    pub(crate) fn release(&self) {
        if self.forked() {
            return;
        }
        if let Ok(mut held) = self.held.lock() {
            if let Some(held) = held.take() {
                let _ = held.file.unlock();
            }
        }
    }

    /// Ends this session as a killed process's ends: its lock is released,
    /// its file and row stay, and this process no longer counts as running
    /// it (`process`). Nothing in a forked child.
    pub(crate) fn abandon(&self) {
        if self.forked() {
            return;
        }
        self.abandoned
            .store(true, std::sync::atomic::Ordering::Relaxed);
        process::note_closed(&self.own);
        self.release();
    }

    /// What the lock file at `path` says of its session: the start time of
    /// the process that took it, and whether the session was closed (see
    /// [`LockRecord`]). No file: an empty record; a file that cannot be
    /// read: one marked `unreadable`.
    pub(crate) fn record_at(path: &Path) -> LockRecord {
        use std::io::Read;
        let unreadable = LockRecord {
            unreadable: true,
            ..LockRecord::default()
        };
        let mut options = OpenOptions::new();
        options.read(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW);
        }
        let file = match options.open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return LockRecord::default(),
            Err(_) => return unreadable,
        };
        let Ok(meta) = file.metadata() else {
            return unreadable;
        };
        if !meta.is_file() {
            return unreadable;
        }
        let mut text = String::new();
        if file.take(RECORD_MAX).read_to_string(&mut text).is_err() {
            return unreadable;
        }
        let field = |name: &str| -> Option<u64> {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|value| value.trim().parse().ok())
        };
        let written_to = text
            .lines()
            .find_map(|line| line.strip_prefix("file "))
            .map(str::trim);
        LockRecord {
            closed: text.lines().any(|line| line == CLOSED),
            suspended: text.lines().any(|line| line == SUSPENDED),
            pid: field("pid").and_then(|pid| i64::try_from(pid).ok()),
            start: field("start"),
            seq: field("seq"),
            unreadable: false,
            replaced: written_to.is_some_and(|id| Some(id) != file_id_text(&meta).as_deref()),
            written_to: written_to.map(str::to_owned),
        }
    }

    /// Probes the lock at `path` and reads its record around the probe:
    /// once before, once after. A session that let go of its lock to
    /// suspend says so before it lets go, and rewrites its record (without
    /// `suspended`) only once it holds the lock again, so a free lock seen
    /// between two reads of one unchanged record is told right; a record
    /// that changed between them counts as saying `suspended` (errs
    /// towards alive).
    pub(crate) fn observe(path: &Path) -> (Probe, LockRecord) {
        Sessions::observe_around(path, || {}, || {})
    }

    /// [`Sessions::observe`], running `first` after the first read and
    /// `then` after the probe (a test puts the owner's moves there).
    fn observe_around(
        path: &Path,
        first: impl FnOnce(),
        then: impl FnOnce(),
    ) -> (Probe, LockRecord) {
        let before = Sessions::record_at(path);
        first();
        let probe = Sessions::probe(path);
        then();
        if probe != Probe::Free {
            return (probe, before);
        }

        let after = Sessions::record_at(path);
        if before.replaced || after.replaced {
            // Not the file its owner locked (a copy put in its place, before
            // or during the probe): its lock says nothing, as if the file
            // were gone.
            let record = if before.replaced { before } else { after };
            return (Probe::Absent, record);
        }
        let changed = before.seq != after.seq;
        (
            probe,
            LockRecord {
                suspended: before.suspended || after.suspended || changed,
                ..after
            },
        )
    }

    /// Notes that the ledger deleted this session's row as it closed: the
    /// lock file can go too. Without it (the write failed, or the ledger
    /// was suspended), the file is kept, marked closed, so that the row
    /// left behind is not taken for a session its process still runs.
    pub(crate) fn row_deleted(&self) {
        self.row_deleted
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Marks `closed` what stands at this session's lock path as it closes
    /// with its row kept: the very file it locked, or a copy of it put in
    /// its place (a restore, a sync tool: its record names the file this
    /// session locked, a regular file with no other name), or, where the
    /// file is gone (someone deleted it), a new one. Not under its lock:
    /// another session's probe may hold that for an instant, and only this
    /// session writes its file (a cleaner only deletes it). Anything else
    /// at the path is left alone.
    fn close_at_path(&self, path: &Path) {
        let locked = self.locked_id.lock().ok().and_then(|id| id.clone());
        if locked.is_none() {
            return;
        }
        match open_lock_file(path) {
            Ok(file) => {
                let here = file.metadata().ok().as_ref().and_then(file_id_text);
                let copy_of_ours =
                    own_file(&file) && Sessions::record_at(path).names_file(locked.as_deref());
                if locked == here || copy_of_ours {
                    mark_closed(&file);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(dir) = &self.dir {
                    let _ = create_private_dir(dir);
                }
                if let Ok(file) = open_private(path) {
                    if own_file(&file) {
                        mark_closed(&file);
                    }
                }
            }
            Err(_) => {}
        }
    }

    /// Is the lock at `path` held? Never deletes anything.
    pub(crate) fn probe(path: &Path) -> Probe {
        let file = match open_lock_file(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Probe::Absent,
            Err(_) => return Probe::Failed,
        };
        match file.try_lock() {
            Ok(()) => {
                let _ = file.unlock();
                Probe::Free
            }
            Err(TryLockError::WouldBlock) => Probe::Held,
            Err(TryLockError::Error(_)) => Probe::Failed,
        }
    }

    /// Deletes the lock file at `path` of a session found dead, if nobody
    /// holds it: the lock is taken first and the file deleted while it is
    /// held, so an owner coming back either still holds it (nothing is
    /// deleted) or notices the deletion when it locks (see `acquire`).
    /// Returns true when no file is left.
    pub(crate) fn clean(path: &Path) -> bool {
        let file = match open_lock_file(path) {
            Ok(file) => file,
            Err(e) => return e.kind() == io::ErrorKind::NotFound,
        };
        if file.try_lock().is_err() {
            return false;
        }
        let removed = !same_file(&file, path) || fs::remove_file(path).is_ok();
        let _ = file.unlock();
        removed
    }

    /// The lock files in this database's sessions directory, by session.
    pub(crate) fn lock_files(&self) -> Vec<(SessionId, PathBuf)> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let Ok(entries) = fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name();
                let id = name.to_str()?.strip_suffix(".lock")?;
                let id = SessionId::parse(id).ok()?;
                Some((id, e.path()))
            })
            .collect()
    }
}

impl Drop for Sessions {
    fn drop(&mut self) {
        // A forked child's copy: the lock and the file are the parent's.
        // (The child's descriptor was pointed at `/dev/null` at the fork,
        // see `ParentOnlyFd`; it is closed with the rest.)
        if self.forked() || self.abandoned.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        process::note_closed(&self.own);
        if let Some(path) = self.own_lock_path() {
            let row_deleted = self.row_deleted.load(std::sync::atomic::Ordering::Relaxed);
            let held = self.holds_lock();
            if row_deleted && held {
                // The owner deletes its own file while it still holds the
                // lock, with its row.
                let _ = fs::remove_file(&path);
            } else if !row_deleted {
                // Its row stays (a failed write, or a suspended ledger):
                // the session is marked closed so that no one takes this
                // process, which may run on, for an owner that may come
                // back. Into the file it holds, and into whatever stands
                // at the path for it (see `close_at_path`).
                if let Ok(held) = self.held.lock() {
                    if let Some(held) = held.as_ref() {
                        mark_closed(&held.file);
                    }
                }
                self.close_at_path(&path);
            }
        }
        self.release();
    }
}

/// What a lock file records of its session ([`Sessions::record_at`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LockRecord {
    /// The session was closed (its ledger dropped): no process runs it.
    pub(crate) closed: bool,
    /// The session let go of its lock to suspend (not by closing it, nor
    /// by an `exec()` or a death of its process).
    pub(crate) suspended: bool,
    /// The process that took the lock (absent from an older build's file).
    pub(crate) pid: Option<i64>,
    /// The start time of that process (`process`).
    pub(crate) start: Option<u64>,
    /// How many records this session had written when it wrote this one.
    pub(crate) seq: Option<u64>,
    /// The file could not be read (counts as saying `suspended`: what
    /// cannot be read errs towards alive).
    pub(crate) unreadable: bool,
    /// The record names another file than the one it was read from (the
    /// lock file was replaced by a copy): its lock tells nothing.
    pub(crate) replaced: bool,
    /// The file the record says it was written to (`file_id_text`).
    pub(crate) written_to: Option<String>,
}

impl LockRecord {
    /// True for a file that says nothing (empty, or no line of a record).
    pub(crate) fn is_blank(&self) -> bool {
        !self.closed
            && !self.suspended
            && !self.unreadable
            && self.pid.is_none()
            && self.start.is_none()
            && self.seq.is_none()
    }

    /// True when the record says it was written to the file `id`.
    pub(crate) fn names_file(&self, id: Option<&str>) -> bool {
        id.is_some() && self.written_to.as_deref() == id
    }
}

/// The most of a lock file [`Sessions::record_at`] reads.
const RECORD_MAX: u64 = 512;

/// The line of a closed session's lock file.
const CLOSED: &str = "closed";

/// The line of a suspended session's lock file.
const SUSPENDED: &str = "suspended";

/// Every record is written at this length (padded), over the one before:
/// a rewrite needs no new block of the disk, so once the first record is
/// written a full disk does not stop the next, and the file never shrinks
/// to nothing in between. (The first needs a block: on a full disk the file
/// may stay empty, and its session is then judged by the process id in its
/// row.)
const RECORD_LEN: usize = 256;

/// Rewrites a lock file as its session closes: closed, whatever process
/// still runs (best effort: without it, the file says which process held
/// it, and that process is asked).
fn mark_closed(file: &File) {
    write_record(file, &format!("toolledger session lock\n{CLOSED}\n"));
}

/// Writes into the lock file just taken which process holds it: its id and
/// start time (`process`), read by another session judging a suspended
/// owner past its lease. Best effort: a lock file without them only loses
/// the check against a reused process id.
fn record_process(file: &File, pid: u32, seq: u64) {
    write_record(file, &process_record(file, pid, seq, false));
}

/// The identity (device, inode) of a file as a record writes it.
#[cfg(unix)]
fn file_id_text(meta: &fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    Some(format!("{}:{}", meta.dev(), meta.ino()))
}

#[cfg(not(unix))]
fn file_id_text(_meta: &fs::Metadata) -> Option<String> {
    None
}

/// The record of a session held (or released to suspend) by process `pid`,
/// the `seq`th this session writes.
fn process_record(file: &File, pid: u32, seq: u64, suspended: bool) -> String {
    let mut record = format!("toolledger session lock\npid {pid}\nseq {seq}\n");
    if let Some(id) = file.metadata().ok().as_ref().and_then(file_id_text) {
        record.push_str(&format!("file {id}\n"));
    }
    if let Some(start) = process::own_start() {
        record.push_str(&format!("start {start}\n"));
    }
    if suspended {
        record.push_str(SUSPENDED);
        record.push('\n');
    }
    record
}

/// Replaces the content of a lock file with `record`, padded to
/// [`RECORD_LEN`] (best effort: a lock file that says less only asks the
/// process by its id, or counts a let-go lock as death, as before).
fn write_record(file: &File, record: &str) {
    let mut bytes = record.as_bytes().to_vec();
    if bytes.len() < RECORD_LEN {
        bytes.resize(RECORD_LEN - 1, b' ');
        bytes.push(b'\n');
    }
    // Always into this session's own lock file: `acquire` made sure it is
    // a regular file with no other name when it locked it (a name linked
    // to it since only names this same file).
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        let _ = file.write_all_at(&bytes, 0);
    }
    #[cfg(not(unix))]
    let _ = (file, bytes);
}

/// How long `acquire` waits for its own lock file's lock: another
/// session's probe or clean holds it for an instant, but a prober frozen in
/// that instant (a stopped process) would hold it for as long as it stays
/// frozen.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes the lock of `file`, waiting at most [`LOCK_PATIENCE`] for another
/// holder (an error then: the caller's open or resume fails, and can be
/// asked again).
fn lock_bounded(file: &File) -> io::Result<()> {
    let deadline = std::time::Instant::now() + LOCK_PATIENCE;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "the session lock file is held by another process",
                ))
            }
            Err(TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// True when `file` is the file now at `path`.
#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.exists()
}

/// Opens another session's lock file to probe or clean it: never blocks
/// (`O_NONBLOCK`: a FIFO put there would hang the open, inside a write
/// transaction), never follows a symlink, and refuses anything that is not
/// a regular file (an error, which a probe counts as alive and a clean
/// leaves in place).
fn open_lock_file(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW);
    }
    let file = options.open(path)?;
    if file.metadata()?.is_file() {
        Ok(file)
    } else {
        Err(io::Error::other("not a regular file"))
    }
}

/// Opens (creating) a lock file readable by the owner only, never through
/// a symlink, never blocking (a FIFO at the path).
fn open_private(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).truncate(false).write(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    options.open(path)
}

/// True for the error of opening a symlink with `O_NOFOLLOW` (`ELOOP`).
fn is_not_a_plain_file(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        e.raw_os_error() == Some(libc::ELOOP)
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// True when `file` is a regular file with no other name.
fn own_file(file: &File) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        file.metadata().is_ok_and(|m| m.is_file() && m.nlink() == 1)
    }
    #[cfg(not(unix))]
    {
        file.metadata().is_ok_and(|m| m.is_file())
    }
}

/// Creates a directory (and its parents) accessible by the owner only.
fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_tells_held_free_absent_and_never_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let a = Sessions::start(Some(&db), SessionId::generate()).unwrap();
        let path = a.own_lock_path().unwrap();
        assert_eq!(Sessions::probe(&path), Probe::Held);
        a.release();
        assert_eq!(Sessions::probe(&path), Probe::Free);
        assert!(path.exists(), "a probe never deletes");
        assert_eq!(
            Sessions::probe(&dir.path().join("l.db-sessions/none.lock")),
            Probe::Absent
        );
        a.acquire().unwrap();
        assert_eq!(Sessions::probe(&path), Probe::Held);
        assert!(!Sessions::clean(&path), "a held lock file is never cleaned");
        assert!(path.exists());
        a.row_deleted();
        drop(a);
        assert!(
            !path.exists(),
            "the owner deletes its own file with its row"
        );
    }

    #[test]
    fn an_owner_moving_between_the_probe_and_the_second_read_is_seen_suspended() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let a = Sessions::start(Some(&db), SessionId::generate()).unwrap();
        let path = a.own_lock_path().unwrap();
        // Suspended when probed, resumed before the record is read again
        // (its record rewritten without `suspended`): still seen suspended.
        a.release_suspended();
        let (probe, record) = Sessions::observe_around(&path, || {}, || a.acquire().unwrap());
        assert_eq!(probe, Probe::Free);
        assert!(record.suspended);
        // Running at the first read; it suspends before the probe and
        // resumes after it, so neither read says `suspended`: the record
        // changed between them, so it counts as saying so.
        let (probe, record) =
            Sessions::observe_around(&path, || a.release_suspended(), || a.acquire().unwrap());
        assert_eq!((probe, record.suspended), (Probe::Free, true));
        assert!(!Sessions::record_at(&path).suspended);
        // Running throughout: held.
        assert_eq!(Sessions::observe(&path).0, Probe::Held);
        // Suspended throughout: free, suspended, its process named.
        a.release_suspended();
        let (probe, record) = Sessions::observe(&path);
        assert_eq!((probe, record.suspended), (Probe::Free, true));
        assert_eq!(record.pid, Some(i64::from(std::process::id())));
        // Let go otherwise (an `exec()` closes it): free, not suspended.
        a.acquire().unwrap();
        a.release();
        let (probe, record) = Sessions::observe(&path);
        assert_eq!((probe, record.suspended), (Probe::Free, false));
    }

    #[test]
    fn a_session_closed_without_its_row_deleted_leaves_its_file_marked_closed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        for suspended in [false, true] {
            let a = Sessions::start(Some(&db), SessionId::generate()).unwrap();
            let path = a.own_lock_path().unwrap();
            let record = Sessions::record_at(&path);
            assert!(!record.closed);
            assert_eq!(record.start, process::own_start());
            if suspended {
                a.release();
            }
            drop(a);
            // Its row stays (a failed write, or a suspended ledger), so its
            // file says the session is over, free for a cleaner.
            assert_eq!(Sessions::probe(&path), Probe::Free, "{suspended}");
            assert!(Sessions::record_at(&path).closed, "{suspended}");
        }
        // Abandoned (a killed process): the file stays as it was.
        let a = Sessions::start(Some(&db), SessionId::generate()).unwrap();
        let path = a.own_lock_path().unwrap();
        a.abandon();
        drop(a);
        assert_eq!(Sessions::probe(&path), Probe::Free);
        assert!(!Sessions::record_at(&path).closed);
    }

    #[test]
    fn an_owner_relocking_after_a_clean_is_never_invisible() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let a = Sessions::start(Some(&db), SessionId::generate()).unwrap();
        let path = a.own_lock_path().unwrap();
        for _ in 0..50 {
            a.release();
            // A cleaner removes the free file; the owner then takes its lock
            // again: it must be held at the registered path afterwards.
            assert!(Sessions::clean(&path));
            a.acquire().unwrap();
            assert_eq!(Sessions::probe(&path), Probe::Held);
        }
    }

    /// A running owner's lock file replaced by a copy of itself (a restore,
    /// a sync tool) between the first read of the record and the probe:
    /// the probe finds the copy free, and the second read, which names
    /// another file, makes it a missing lock file, so the owner is judged by
    /// its process (found by the fifth review: only the first read was
    /// checked, and the live owner was judged dead).
    #[cfg(unix)]
    #[test]
    fn a_lock_file_replaced_between_the_first_read_and_the_probe_reads_as_missing() {
        use crate::ledger::owners::{judge, Liveness};
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let a = Sessions::start(Some(&db), SessionId::generate()).unwrap();
        let path = a.own_lock_path().unwrap();
        assert_eq!(Sessions::probe(&path), Probe::Held);
        let (probe, record) = Sessions::observe_around(
            &path,
            || {
                let bytes = fs::read(&path).unwrap();
                let tmp = path.with_extension("tmp");
                fs::write(&tmp, &bytes).unwrap();
                fs::rename(&tmp, &path).unwrap(); // atomic replace, as sync tools do
            },
            || {},
        );
        let row = crate::store::SessionRow {
            session_id: a.own().clone(),
            lock_path: path.to_string_lossy().into_owned(),
            boot_id: String::new(),
            suspended_ms: None,
            suspend_lease_ms: None,
            opened_ms: 0,
            pid: i64::from(std::process::id()),
        };
        let now = crate::model::Monotonic::new("", 10);
        let liveness = judge(probe, Some(&row), &now, |needs| {
            crate::ledger::owners::runs_still(a.own(), Some(&row), &record, needs)
        });
        assert!(
            !matches!(liveness, Liveness::Dead(_)),
            "a running owner (its lock held on the original inode) judged {liveness:?}: probe {probe:?}, record {record:?}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn lock_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let a = Sessions::start(Some(&db), SessionId::generate()).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&a.own_lock_path().unwrap()), 0o600);
        assert_eq!(mode(&sessions_dir(&db)), 0o700);
    }
}
