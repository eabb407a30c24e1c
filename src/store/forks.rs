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
//! Nor may the child keep the parent's session alive: a session's lock is
//! a `flock` on its lock file, which belongs to the open file description,
//! and the child's copy of the descriptor would keep it held after the
//! parent died (a helper forked by the app made a dead app look alive for
//! as long as the helper lived). The fork handler points the child's
//! copies of those descriptors at `/dev/null` ([`ParentOnlyFd`]).
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

use std::cell::UnsafeCell;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

/// Forks since the handler was registered, counted in each child.
static FORKS: AtomicU64 = AtomicU64::new(0);
/// True once the fork handler is in place.
static WATCHED: AtomicBool = AtomicBool::new(false);
static WATCH: Once = Once::new();
/// `/dev/null`, open for the life of the process (-1 when it could not be
/// opened): what a child's copies of the parent's session lock descriptors
/// are pointed at.
#[cfg(unix)]
static NULL_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

#[cfg(unix)]
extern "C" fn before_fork() {
    // Runs in the forking thread of the parent just before `fork()`: takes
    // the list of open files, so that no other thread is changing it when
    // the child's copy is made (the child would inherit a lock nobody will
    // release, and a list torn mid-change). Then the parent's session lock
    // descriptors, likewise.
    OPEN_FILES.acquire();
    PARENT_ONLY_FDS.acquire();
    OPEN_SESSIONS.acquire();
}

#[cfg(unix)]
extern "C" fn in_parent() {
    // Runs in the parent right after `fork()`.
    OPEN_SESSIONS.release();
    PARENT_ONLY_FDS.release();
    OPEN_FILES.release();
}

#[cfg(unix)]
extern "C" fn in_child() {
    // Runs in the child right after `fork()`: only async-signal-safe work
    // (lock-free atomics, `dup2`, `fcntl`).
    FORKS.fetch_add(1, Ordering::Relaxed);
    drop_parent_only_fds();
    OPEN_SESSIONS.release();
    PARENT_ONLY_FDS.release();
    OPEN_FILES.release();
}

/// In a child, right after `fork()` (the list held by the fork handler):
/// each descriptor of the parent's session lock files is pointed at
/// `/dev/null` instead, so that the child holds no reference to the open
/// file description that carries the parent's `flock`: the lock goes when
/// the parent dies, whatever the child does. The descriptor number stays
/// valid (closed by the child's copy of its `File`), and the list is
/// emptied (those numbers are the child's to reuse).
#[cfg(unix)]
fn drop_parent_only_fds() {
    let null = NULL_FD.load(Ordering::Relaxed);
    // SAFETY: the fork handler holds the list (this thread is the only one
    // in the child).
    let fds = unsafe { &mut *PARENT_ONLY_FDS.items.get() };
    if null >= 0 {
        for &fd in fds.iter() {
            // SAFETY: plain system calls on descriptors of this process.
            unsafe {
                if libc::dup2(null, fd) == fd {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
        }
    }
    fds.clear();
}

fn watch() {
    WATCH.call_once(|| {
        #[cfg(unix)]
        {
            // SAFETY: the handlers are plain functions that only touch
            // atomics (and, before the fork, wait for another thread's
            // short change of the list, which never forks).
            let registered =
                unsafe { libc::pthread_atfork(Some(before_fork), Some(in_parent), Some(in_child)) }
                    == 0;
            WATCHED.store(registered, Ordering::Relaxed);
            // SAFETY: a plain `open` of a path that is a C string.
            let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            NULL_FD.store(null, Ordering::Relaxed);
        }
    });
}

/// The process a store was opened in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Opener {
    forks: u64,
    pid: u32,
}

impl Opener {
    /// This process, now.
    pub(crate) fn here() -> Opener {
        watch();
        Opener {
            forks: FORKS.load(Ordering::Relaxed),
            pid: std::process::id(),
        }
    }

    /// True in a child made by `fork()` of the process this was taken in
    /// (or of one of its descendants).
    pub(crate) fn forked_since(&self) -> bool {
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

/// A list behind a spin lock, not a `std::sync::Mutex`: a child forked
/// while another thread of the parent held one would wait for it forever
/// (the thread is not in the child). The lock is taken by the fork handler
/// before the fork and released on both sides after it, so the child
/// always finds it free and the list whole. Its holders only push or
/// remove an entry.
struct SpinList<T> {
    busy: AtomicBool,
    items: UnsafeCell<Vec<T>>,
}

// SAFETY: `items` is only reached through `SpinList::lock`, which holds
// `busy` (acquire/release) for as long as the guard lives, and by the fork
// handler, which holds it too.
unsafe impl<T: Send> Sync for SpinList<T> {}

/// The database files (device, inode, forks) this process's stores have
/// open (several stores may have one file open). A child made by `fork()`
/// inherits the list.
static OPEN_FILES: SpinList<FileKey> = SpinList::new();

/// The descriptors of this process's held session lock files (see
/// [`ParentOnlyFd`]).
static PARENT_ONLY_FDS: SpinList<i32> = SpinList::new();

/// The sessions open in this process (not dropped, not abandoned), by id,
/// with the fork count they were opened under: a child inherits the
/// parent's, which are not its own.
static OPEN_SESSIONS: SpinList<(String, u64)> = SpinList::new();

/// Notes the session `id` as open in this process.
pub(crate) fn note_session_open(id: &str) {
    let forks = Opener::here().forks;
    OPEN_SESSIONS.lock().push((id.to_owned(), forks));
}

/// Notes the session `id` as no longer open in this process.
pub(crate) fn note_session_closed(id: &str) {
    let forks = Opener::here().forks;
    let mut open = OPEN_SESSIONS.lock();
    if let Some(i) = open.iter().position(|(s, f)| s == id && *f == forks) {
        open.swap_remove(i);
    }
}

/// Is the session `id` open in this process (opened in it, not in an
/// ancestor before a fork)?
pub(crate) fn session_open_here(id: &str) -> bool {
    let forks = Opener::here().forks;
    OPEN_SESSIONS
        .lock()
        .iter()
        .any(|(s, f)| s == id && *f == forks)
}

impl<T> SpinList<T> {
    const fn new() -> SpinList<T> {
        SpinList {
            busy: AtomicBool::new(false),
            items: UnsafeCell::new(Vec::new()),
        }
    }

    fn acquire(&self) {
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
    }

    fn release(&self) {
        self.busy.store(false, Ordering::Release);
    }

    /// The list, held until the guard is dropped. Waits only for another
    /// thread's push or removal (or a fork in progress): never for a
    /// thread of a parent, since the fork handler hands the child the lock
    /// free. (Where the handler could not be registered, a child forked in
    /// the middle of a change would wait forever; `pthread_atfork` fails
    /// only when out of memory.)
    fn lock(&'static self) -> ListGuard<T> {
        watch();
        self.acquire();
        ListGuard(self)
    }
}

/// A held list.
struct ListGuard<T: 'static>(&'static SpinList<T>);

impl<T> std::ops::Deref for ListGuard<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.0.items.get() }
    }
}

impl<T> std::ops::DerefMut for ListGuard<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        // SAFETY: the guard holds the lock (exclusively).
        unsafe { &mut *self.0.items.get() }
    }
}

impl<T> Drop for ListGuard<T> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// A session lock file's descriptor, which a child made by `fork()` must
/// not keep: `flock` locks belong to the open file description, and a
/// child's copy of the descriptor keeps the parent's lock held after the
/// parent died (a helper the app forked would make a dead app's session
/// look alive for as long as the helper lives). While this lives, every
/// child forked gets the descriptor pointed at `/dev/null` instead. Noted
/// before the file is locked, dropped before it is closed.
#[derive(Debug)]
pub(crate) struct ParentOnlyFd {
    fd: i32,
    opener: Opener,
}

impl ParentOnlyFd {
    /// Opens a file with `open` and notes its descriptor (nothing where
    /// there are no descriptors). The list is held across the open, so no
    /// fork comes between the descriptor's birth and its note: a child
    /// forked then would keep a reference to the description the parent
    /// locks next.
    pub(crate) fn open(
        open: impl FnOnce() -> std::io::Result<std::fs::File>,
    ) -> std::io::Result<(std::fs::File, ParentOnlyFd)> {
        let opener = Opener::here();
        let mut fds = PARENT_ONLY_FDS.lock();
        let file = open()?;
        #[cfg(unix)]
        let fd = {
            use std::os::unix::io::AsRawFd;
            file.as_raw_fd()
        };
        #[cfg(not(unix))]
        let fd = -1;
        if fd >= 0 {
            fds.push(fd);
        }
        drop(fds);
        Ok((file, ParentOnlyFd { fd, opener }))
    }
}

impl Drop for ParentOnlyFd {
    fn drop(&mut self) {
        // In a child the list was emptied at the fork.
        if self.fd < 0 || self.opener.forked_since() {
            return;
        }
        let mut fds = PARENT_ONLY_FDS.lock();
        if let Some(i) = fds.iter().position(|&f| f == self.fd) {
            fds.swap_remove(i);
        }
    }
}

/// Holds the list's lock (tests: a thread of the parent noting or
/// dropping a store at the fork).
#[cfg(test)]
fn lock_open_files() -> impl Drop {
    OPEN_FILES.lock()
}

/// Tests: runs once, in the thread opening a store, right after SQLite
/// opened the file and before `Store::open` returns (a thread of the parent
/// in the middle of an open at the fork).
#[cfg(test)]
pub(super) static AFTER_CONNECT: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>> =
    std::sync::Mutex::new(None);

/// Runs (and clears) [`AFTER_CONNECT`].
#[cfg(test)]
pub(super) fn after_connect() {
    let hook = AFTER_CONNECT.lock().ok().and_then(|mut h| h.take());
    if let Some(f) = hook {
        f();
    }
}

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
/// state for it here is inherited). Never true in a process that was not
/// forked since the library was first used.
pub(super) fn inherited(path: &Path) -> bool {
    watch();
    let now = FORKS.load(Ordering::Relaxed);
    if now == 0 {
        return false;
    }
    let Some((dev, ino)) = identity(path) else {
        return false;
    };
    // The fork handler handed this process the list free and whole.
    OPEN_FILES
        .lock()
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
        OPEN_FILES.lock().push(key);
        Some(OpenFile { key, opener })
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if self.opener.forked_since() {
            return;
        }
        let mut files = OPEN_FILES.lock();
        if let Some(i) = files.iter().position(|f| *f == self.key) {
            files.swap_remove(i);
        }
    }
}

#[cfg(all(test, unix))]
pub(crate) mod tests {
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
    pub(crate) fn in_child(f: impl FnOnce() -> i32) -> i32 {
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

    /// The process half of `a_child_forked_while_the_list_of_open_files_was_locked_opens_its_own_files`.
    #[test]
    fn list_locked_at_fork_scenario() {
        let Ok(db) = std::env::var("TOOLLEDGER_LIST_LOCKED") else {
            return;
        };
        let dir = std::path::Path::new(&db).parent().unwrap().to_path_buf();
        // The parent has a ledger of its own open (the handler is in place).
        let _parent =
            Store::open(std::path::Path::new(&db), StoreOptions::default(), None).unwrap();
        // A file no store of the parent ever opened.
        let other = dir.join("other.db");
        drop(Store::open(&other, StoreOptions::default(), None).unwrap());
        // Another thread of the parent is noting or dropping a store at
        // each fork: it holds the list's lock for a moment (300 ms here).
        let held_at_fork = |f: &dyn Fn() -> i32| {
            let (held_tx, held_rx) = std::sync::mpsc::channel();
            let holder = std::thread::spawn(move || {
                let guard = super::lock_open_files();
                held_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                drop(guard);
            });
            held_rx.recv().unwrap();
            let code = in_child(f);
            holder.join().unwrap();
            code
        };
        // The child opens a new file of its own, then one the parent closed.
        let fresh = dir.join("fresh.db");
        let opened_fresh = held_at_fork(
            &|| match Store::open(&fresh, StoreOptions::default(), None) {
                Ok(store) => {
                    drop(store);
                    0
                }
                Err(Error::Forked) => 30,
                Err(_) => 31,
            },
        );
        let opened_other = held_at_fork(
            &|| match Store::open(&other, StoreOptions::default(), None) {
                Ok(store) => {
                    drop(store);
                    0
                }
                Err(Error::Forked) => 40,
                Err(_) => 41,
            },
        );
        // Nor is the parent's own file let through.
        let parents = held_at_fork(&|| match Store::open(
            std::path::Path::new(&db),
            StoreOptions::default(),
            None,
        ) {
            Err(Error::Forked) => 0,
            _ => 50,
        });
        println!("SCENARIO fresh={opened_fresh} other={opened_other} parents={parents}");
        assert_eq!(
            (opened_fresh, opened_other, parents),
            (0, 0, 0),
            "142: killed by the alarm (waited forever); 40: refused a file the parent never had open"
        );
    }

    /// A child forked while a thread of the parent held the list of open
    /// files (noting or dropping a store) opens its own files, neither
    /// waiting forever for the lock nobody will release nor refusing them.
    #[test]
    fn a_child_forked_while_the_list_of_open_files_was_locked_opens_its_own_files() {
        run_alone(
            "store::forks::tests::list_locked_at_fork_scenario",
            "TOOLLEDGER_LIST_LOCKED",
        );
    }

    /// The process half of `a_child_forked_while_the_list_of_open_sessions_was_locked_notes_its_own`.
    #[test]
    fn sessions_locked_at_fork_scenario() {
        let Ok(_) = std::env::var("TOOLLEDGER_SESSIONS_LOCKED") else {
            return;
        };
        // The handler is in place (as once a store was opened).
        super::watch();
        super::note_session_open("parents");
        // Another thread of the parent notes a session open at the fork:
        // it holds the list's lock for a moment (300 ms).
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let guard = super::OPEN_SESSIONS.lock();
            held_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            drop(guard);
        });
        held_rx.recv().unwrap();
        let code = in_child(|| {
            super::note_session_open("childs");
            match (
                super::session_open_here("childs"),
                super::session_open_here("parents"),
            ) {
                (true, false) => 0,
                (false, _) => 60,
                (true, true) => 61,
            }
        });
        holder.join().unwrap();
        println!("SCENARIO sessions={code}");
        assert_eq!(
            code, 0,
            "142: killed by the alarm (waited forever); 61: the parent's session counted as the child's"
        );
        assert!(super::session_open_here("parents"));
    }

    /// A child forked while a thread of the parent held the list of open
    /// sessions notes its own sessions (the list is handed to it free), and
    /// does not count the parent's as its own.
    #[test]
    fn a_child_forked_while_the_list_of_open_sessions_was_locked_notes_its_own() {
        run_alone(
            "store::forks::tests::sessions_locked_at_fork_scenario",
            "TOOLLEDGER_SESSIONS_LOCKED",
        );
    }

    /// The process half of `a_child_forked_while_its_parent_opens_a_file_may_not_open_it`.
    #[test]
    fn opening_at_fork_scenario() {
        let Ok(db) = std::env::var("TOOLLEDGER_OPENING_AT_FORK") else {
            return;
        };
        let db = std::path::PathBuf::from(db);
        // The handler is in place (a ledger of the parent's, another file).
        let _first = Store::open(
            &db.with_file_name("first.db"),
            StoreOptions::default(),
            None,
        )
        .unwrap();
        // A thread of the parent opens `db`: SQLite has the file open (its
        // lock state for it is in the process) when the fork comes.
        let (connected_tx, connected_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        *super::AFTER_CONNECT.lock().unwrap() = Some(Box::new(move || {
            connected_tx.send(()).unwrap();
            let _ = go_rx.recv_timeout(Duration::from_secs(30));
        }));
        let opener = {
            let db = db.clone();
            std::thread::spawn(move || Store::open(&db, StoreOptions::default(), None).map(drop))
        };
        connected_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the open never reached SQLite");
        let child = in_child(|| match Store::open(&db, StoreOptions::default(), None) {
            Err(Error::Forked) => 0,
            Ok(store) => {
                std::mem::forget(store);
                60
            }
            Err(_) => 61,
        });
        go_tx.send(()).unwrap();
        let parent = opener.join().unwrap();
        println!("SCENARIO child={child} parent_ok={}", parent.is_ok());
        assert_eq!(
            (child, parent.is_ok()),
            (0, true),
            "60: the child opened a file its parent had open in SQLite at the fork"
        );
    }

    /// A child forked while another thread of the parent is inside
    /// `Store::open` of a file (SQLite has it open, the store is not built
    /// yet) may not open that file: SQLite's lock state for it is the
    /// parent's copy.
    #[test]
    fn a_child_forked_while_its_parent_opens_a_file_may_not_open_it() {
        run_alone(
            "store::forks::tests::opening_at_fork_scenario",
            "TOOLLEDGER_OPENING_AT_FORK",
        );
    }

    /// Runs the scenario test `name` alone in a test process of its own,
    /// with `var` set to a database path in a fresh directory.
    pub(crate) fn run_alone(name: &str, var: &str) {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(var, &db)
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

    #[test]
    fn every_access_in_a_forked_child_is_refused_at_once() {
        // fork() in this multi-threaded test process could copy an
        // allocator lock held by another test: the scenario runs alone.
        run_alone(
            "store::forks::tests::forked_access_scenario",
            "TOOLLEDGER_FORKED_ACCESS",
        );
    }
}
