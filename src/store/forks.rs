//! Which process a store was opened in. SQLite forbids carrying an open
//! connection across `fork()` (the child's copy shares the parent's file
//! descriptors and in-memory lock state, but not its POSIX locks), and the
//! ledger's session — its id, its lock, the attempts it handed out — is the
//! parent's. So a store refuses every use in a child made by `fork()` of
//! the process that opened it ([`Error::Forked`](super::Error::Forked)).
//!
//! Nor may the child open the same file again: SQLite's unix VFS keeps one
//! lock state per file and process, shared by every connection of the
//! process, and the child inherits the parent's (a write lock the parent's
//! thread held at the fork, which nothing in the child will release; read
//! locks the child believes it holds and does not). A child's own
//! connection to the file was refused the write lock forever, or worse. So
//! opening a file that a store of an ancestor process had open at the fork
//! is refused too (the registry of open files below); a worker that needs
//! the ledger is started with `exec` (a `spawn` start method), or forked
//! before the ledger is opened.
//!
//! The check is on every access to the connection, so it must cost nothing
//! measurable: a fork handler (`pthread_atfork`, registered at the first
//! open) counts the forks of this process's lineage in the child, and a
//! store compares the count it was opened under with the current one (one
//! atomic load). Where the handler cannot be registered, the process id is
//! compared instead (a system call per access: ~200 ns measured here).
//!
//! A handler must not outlive the code it points at. glibc and Bionic
//! register it under the calling object's `__dso_handle` and drop it when
//! that object is unloaded (`dlclose`); on Apple platforms the library is
//! linked statically into the app (the XCFramework), never unloaded.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once, TryLockError};

/// Forks since the handler was registered, counted in each child.
static FORKS: AtomicU64 = AtomicU64::new(0);
/// True once the fork handler is in place.
static WATCHED: AtomicBool = AtomicBool::new(false);
static WATCH: Once = Once::new();

#[cfg(unix)]
extern "C" fn in_child() {
    // Runs in the child right after `fork()`: only async-signal-safe work
    // (a lock-free atomic).
    FORKS.fetch_add(1, Ordering::Relaxed);
}

fn watch() {
    WATCH.call_once(|| {
        #[cfg(unix)]
        {
            // SAFETY: `in_child` is a plain function that only touches an
            // atomic; no prepare or parent handler is installed.
            let registered = unsafe { libc::pthread_atfork(None, None, Some(in_child)) } == 0;
            WATCHED.store(registered, Ordering::Relaxed);
        }
    });
}

/// The process a store was opened in.
#[derive(Debug, Clone, Copy)]
pub(super) struct Opener {
    forks: u64,
    pid: u32,
}

impl Opener {
    /// This process, now.
    pub(super) fn here() -> Opener {
        watch();
        Opener {
            forks: FORKS.load(Ordering::Relaxed),
            pid: std::process::id(),
        }
    }

    /// True in a child made by `fork()` of the process this was taken in
    /// (or of one of its descendants).
    pub(super) fn forked_since(&self) -> bool {
        if WATCHED.load(Ordering::Relaxed) {
            FORKS.load(Ordering::Relaxed) != self.forks
        } else {
            std::process::id() != self.pid
        }
    }
}

/// A database file (device, inode) a store of this process opened, with
/// the fork count it was opened under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileKey {
    dev: u64,
    ino: u64,
    forks: u64,
}

/// The database files this process's stores have open (several stores may
/// have one file open). A child made by `fork()` inherits the list.
static OPEN_FILES: Mutex<Vec<FileKey>> = Mutex::new(Vec::new());

#[cfg(unix)]
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(_path: &Path) -> Option<(u64, u64)> {
    None
}

/// True when the database file at `path` was open in a store of an
/// ancestor process when this one was forked from it (so SQLite's lock
/// state for it here is inherited), or when that cannot be told (a thread
/// of the parent was changing the list at the fork). Never true in a
/// process that was not forked since the library was first used.
pub(super) fn inherited(path: &Path) -> bool {
    watch();
    let now = FORKS.load(Ordering::Relaxed);
    if now == 0 {
        return false;
    }
    let Some((dev, ino)) = identity(path) else {
        return false;
    };
    // In a child, the list's lock may have been held by a parent thread
    // at the fork: it is never waited for there.
    let files = match OPEN_FILES.try_lock() {
        Ok(files) => files,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => return true,
    };
    files
        .iter()
        .any(|f| f.dev == dev && f.ino == ino && f.forks < now)
}

/// A store's entry in the list of open files, removed when it is dropped
/// in the process that opened it (a forked child's copy leaves it: the
/// SQLite state it stands for is still there).
#[derive(Debug)]
pub(super) struct OpenFile {
    key: FileKey,
    opener: Opener,
}

impl OpenFile {
    /// Notes that a store of this process opened the database at `path`
    /// (`None` when the file cannot be identified: nothing to note).
    pub(super) fn note(path: &Path, opener: Opener) -> Option<OpenFile> {
        let (dev, ino) = identity(path)?;
        let key = FileKey {
            dev,
            ino,
            forks: opener.forks,
        };
        OPEN_FILES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(key);
        Some(OpenFile { key, opener })
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if self.opener.forked_since() {
            return;
        }
        let mut files = OPEN_FILES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = files.iter().position(|f| *f == self.key) {
            files.swap_remove(i);
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::time::{Duration, Instant};

    use crate::store::{Error, Store, StoreOptions};

    extern "C" {
        fn fork() -> i32;
        fn _exit(code: i32) -> !;
        fn alarm(seconds: u32) -> u32;
        fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    }

    /// Runs `f` in a child made by `fork()` (killed by an alarm after 5 s:
    /// a use that waits forever) and returns its exit code, or 128 + the
    /// signal that ended it.
    fn in_child(f: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child only runs `f` and exits.
        let pid = unsafe { fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            unsafe { alarm(5) };
            let code = f();
            unsafe { _exit(code) };
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut status = 0;
            if unsafe { waitpid(pid, &mut status, 1) } == pid {
                return if status & 0x7f == 0 {
                    (status >> 8) & 0xff
                } else {
                    128 + (status & 0x7f)
                };
            }
            assert!(Instant::now() < deadline, "the child never exited");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The process half of `every_access_in_a_forked_child_is_refused_at_once`:
    /// run alone in a test process of its own (see there).
    #[test]
    fn forked_access_scenario() {
        let Ok(db) = std::env::var("TOOLLEDGER_FORKED_ACCESS") else {
            return;
        };
        let store = std::sync::Arc::new(
            Store::open(std::path::Path::new(&db), StoreOptions::default(), None).unwrap(),
        );
        let forked = |e: &Error| matches!(e, Error::Forked);
        // The non-waiting read, with the connection free: refused, not read
        // through the parent's connection.
        let read_now = in_child(|| match store.read_now(|_| Ok(Ok::<_, Error>(()))) {
            Err(e) if forked(&e) => 0,
            Ok(Some(())) => 20,
            _ => 21,
        });
        // The connection's mutex held by another thread of the parent at
        // the fork (a commit's fsync): nothing waits for it.
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = {
            let store = store.clone();
            std::thread::spawn(move || {
                let guard = store.conn.lock().unwrap();
                held_tx.send(()).unwrap();
                let _ = release_rx.recv_timeout(Duration::from_secs(30));
                drop(guard);
            })
        };
        held_rx.recv().unwrap();
        let unsynced = in_child(|| {
            let _ = store.has_unsynced();
            0
        });
        let read = in_child(|| match store.read(|_| Ok::<_, Error>(())) {
            Err(e) if forked(&e) => 0,
            _ => 22,
        });
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        // The keys held by a re-keying thread at the fork: a read or a
        // write in the child waits for nothing either.
        let keys = store.keys.write().unwrap();
        let keyed = in_child(|| match store.read(|_| Ok::<_, Error>(())) {
            Err(e) if forked(&e) => 0,
            _ => 23,
        });
        drop(keys);
        println!("SCENARIO read_now={read_now} has_unsynced={unsynced} read={read} keys={keyed}");
        assert_eq!(
            (read_now, unsynced, read, keyed),
            (0, 0, 0, 0),
            "20: read_now read through the parent's connection; 142: killed by the alarm (waited forever)"
        );
    }

    #[test]
    fn every_access_in_a_forked_child_is_refused_at_once() {
        // fork() in this multi-threaded test process could copy an
        // allocator lock held by another test: the scenario runs alone.
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "store::forks::tests::forked_access_scenario",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TOOLLEDGER_FORKED_ACCESS", &db)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the scenario process never finished");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("1 passed"),
            "the scenario failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
