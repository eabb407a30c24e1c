//! Session liveness: telling a dead owner from a live one.
//!
//! Each open ledger is a session. A session holds an exclusive advisory lock
//! on its own file `<db>-sessions/<session id>.lock` for as long as it is open.
//! The operating system drops that lock when the process dies (or when the
//! ledger is dropped), so another session can ask "is the owner of this
//! `executing` row still alive?" by trying to take the lock: if it can, the
//! owner is gone. A second live process (an app extension) keeps its lock and
//! is never mistaken for a dead one. `suspend()` releases the lock, because
//! iOS kills suspended apps that hold file locks in shared containers.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::model::SessionId;

/// Liveness registry of one ledger.
#[derive(Debug)]
pub(crate) struct Sessions {
    dir: Option<PathBuf>,
    own: SessionId,
    held: Mutex<Option<File>>,
}

/// The directory that holds the session lock files of database `db`.
pub(crate) fn sessions_dir(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-sessions");
    PathBuf::from(name)
}

impl Sessions {
    /// Registers `own` and takes its lock (none for in-memory stores).
    pub(crate) fn start(db: Option<&Path>, own: SessionId) -> std::io::Result<Sessions> {
        let sessions = Sessions {
            dir: db.map(sessions_dir),
            own,
            held: Mutex::new(None),
        };
        sessions.acquire()?;
        Ok(sessions)
    }

    /// This ledger's session id.
    pub(crate) fn own(&self) -> &SessionId {
        &self.own
    }

    /// (Re)takes this session's lock.
    pub(crate) fn acquire(&self) -> std::io::Result<()> {
        let Some(dir) = &self.dir else { return Ok(()) };
        // Already held (resume without suspend): taking it again through a
        // second handle would block forever, since flock locks conflict
        // across open file descriptions even within one process.
        if self.held.lock().map(|h| h.is_some()).unwrap_or(false) {
            return Ok(());
        }
        fs::create_dir_all(dir)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{}.lock", self.own)))?;
        file.lock()?;
        if let Ok(mut held) = self.held.lock() {
            *held = Some(file);
        }
        Ok(())
    }

    /// Releases this session's lock (before suspension).
    pub(crate) fn release(&self) {
        if let Ok(mut held) = self.held.lock() {
            if let Some(file) = held.take() {
                let _ = file.unlock();
            }
        }
    }

    /// True when `session` is this one or still holds its lock.
    pub(crate) fn is_alive(&self, session: &SessionId) -> bool {
        if session == &self.own {
            return true;
        }
        let Some(dir) = &self.dir else {
            // A private in-memory store has no other sessions.
            return false;
        };
        let path = dir.join(format!("{session}.lock"));
        let Ok(file) = OpenOptions::new().write(true).open(&path) else {
            // No lock file: the session ended and was cleaned up.
            return false;
        };
        match file.try_lock() {
            Ok(()) => {
                // Nobody holds it: the owner is dead. Tidy up its file.
                let _ = file.unlock();
                let _ = fs::remove_file(&path);
                false
            }
            Err(TryLockError::WouldBlock) => true,
            // Locking unsupported or failing: assume alive (the lease decides).
            Err(TryLockError::Error(_)) => true,
        }
    }
}

impl Drop for Sessions {
    fn drop(&mut self) {
        self.release();
        if let Some(dir) = &self.dir {
            let _ = fs::remove_file(dir.join(format!("{}.lock", self.own)));
        }
    }
}
