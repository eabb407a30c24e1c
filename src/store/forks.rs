//! Which process a store was opened in. SQLite forbids carrying an open
//! connection across `fork()` (the child's copy shares the parent's file
//! descriptors and in-memory lock state, but not its POSIX locks), and the
//! ledger's session — its id, its lock, the attempts it handed out — is the
//! parent's. So a store refuses every use in a child made by `fork()` of
//! the process that opened it ([`Error::Forked`](super::Error::Forked)):
//! the child opens the ledger again, as a session of its own.
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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

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
