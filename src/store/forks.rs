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
