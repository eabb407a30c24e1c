//! Whether the process that opened a session still runs it.
//!
//! A suspended session has let go of its lock (iOS kills an app that holds a
//! file lock while it is suspended), so its lock cannot tell whether it is
//! alive. Its suspension lease covers it for a while; past the lease, the
//! owner is judged by its process (docs/design.md, "Ownership"): as long as
//! the process that suspended it provably still runs that session, the
//! session stays owner of what it was running, because a thawed process may
//! still send the request its tool was about to send.
//!
//! "Provably gone" is what this module answers, and it errs towards
//! "running": a process that exists but cannot be inspected, or whose start
//! time cannot be read, counts as running. The price of a wrong "running" is
//! a call left in flight until the process ends; the price of a wrong
//! "gone" would be a second request.
//!
//! - The session's row holds its process id, and its lock file the process's
//!   start time (written when the lock is taken), so a process id reused by
//!   another process is told apart where the start time can be read (Linux
//!   and Android, from `/proc`; on Apple platforms the process id alone).
//! - A session of this very process is running while it is open here (the
//!   process-wide, fork-safe list of open sessions in `store::forks`):
//!   dropped or abandoned, it is not.

use crate::model::SessionId;

/// Notes `session` as open in this process (a fork-safe list: a child
/// forked while another thread holds it finds it free).
pub(crate) fn note_open(session: &SessionId) {
    crate::store::note_session_open(session.as_str());
}

/// Notes `session` as no longer open in this process (dropped, or abandoned
/// as a killed process would leave it).
pub(crate) fn note_closed(session: &SessionId) {
    crate::store::note_session_closed(session.as_str());
}

/// Is `session` open in this process?
fn open_here(session: &SessionId) -> bool {
    crate::store::session_open_here(session.as_str())
}

/// This process's start time, as [`start_of`] reads it (once per process:
/// a child made by `fork()` inherits the parent's cache, and reads its own).
/// Lock-free: a child forked while another thread reads it must not wait.
pub(crate) fn own_start() -> Option<u64> {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    /// No start time known (`u64::MAX` is no tick count).
    const NONE: u64 = u64::MAX;
    static PID: AtomicU32 = AtomicU32::new(0);
    static START: AtomicU64 = AtomicU64::new(NONE);
    let pid = std::process::id();
    if PID.load(Ordering::Acquire) == pid {
        let start = START.load(Ordering::Relaxed);
        return (start != NONE).then_some(start);
    }
    let start = start_of(pid).and_then(|(_, start)| start);
    START.store(start.unwrap_or(NONE), Ordering::Relaxed);
    PID.store(pid, Ordering::Release);
    start
}

/// Does the process `pid`, started at `recorded_start` (when known), still
/// run `session`? False only when that is provably not so: no such process,
/// a zombie, another start time (the id was reused), or this process
/// without the session open.
pub(crate) fn still_runs(pid: i64, recorded_start: Option<u64>, session: &SessionId) -> bool {
    let Ok(pid) = u32::try_from(pid) else {
        return false;
    };
    // 0 would signal our own process group; beyond i32 is no process id.
    if pid == 0 || i32::try_from(pid).is_err() {
        return false;
    }
    if pid == std::process::id() {
        if let (Some(recorded), Some(own)) = (recorded_start, own_start()) {
            if recorded != own {
                // An earlier process that had our process id.
                return false;
            }
        }
        return open_here(session);
    }
    if !exists(pid) {
        return false;
    }
    match start_of(pid) {
        Some((state, start)) => {
            if matches!((recorded_start, start), (Some(r), Some(s)) if r != s) {
                return false;
            }
            // A zombie sends nothing. But the process shows as one as soon as
            // its main thread has exited, while its other threads run on.
            !matches!(state, 'Z' | 'X') || a_thread_runs(pid)
        }
        None => true,
    }
}

/// True when a thread of process `pid` is neither a zombie nor dead (from
/// `/proc/<pid>/task`; false where that cannot be listed).
fn a_thread_runs(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(Result::ok).any(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|stat| parse_stat(&stat))
            .is_some_and(|(state, _)| !matches!(state, 'Z' | 'X'))
    })
}

/// True unless `kill(pid, 0)` says there is no such process (`ESRCH`):
/// permission denied means it exists, any other failure counts as existing.
#[cfg(unix)]
fn exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 sends nothing; it only checks that `pid` exists (a
    // positive id: never a process group).
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(not(unix))]
fn exists(_pid: u32) -> bool {
    true
}

/// The state letter and start time (clock ticks since boot) of process
/// `pid`, from `/proc/<pid>/stat`; `None` where there is no such file (no
/// such process, another platform, or a `/proc` that hides it).
fn start_of(pid: u32) -> Option<(char, Option<u64>)> {
    if !cfg!(any(target_os = "linux", target_os = "android")) {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

/// Reads the state (field 3) and start time (field 22) of a `/proc/<pid>/stat`
/// line. The command name (field 2) is in parentheses and may hold spaces
/// and parentheses itself, so the fields are counted from the last `)`.
fn parse_stat(stat: &str) -> Option<(char, Option<u64>)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4..=21 come before the start time.
    let start = fields.nth(18).and_then(|f| f.parse().ok());
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_state_and_start_time_whatever_the_command_name() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615\n";
        assert_eq!(parse_stat(line), Some(('S', Some(987_654))));
        assert_eq!(parse_stat("1 (x) Z 1 2"), Some(('Z', None)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_runs_a_session_only_while_it_is_open_here() {
        let session = SessionId::generate();
        let pid = i64::from(std::process::id());
        assert!(!still_runs(pid, own_start(), &session));
        note_open(&session);
        assert!(still_runs(pid, own_start(), &session));
        assert!(still_runs(pid, None, &session));
        if let Some(start) = own_start() {
            // The same process id, another start: an earlier process.
            assert!(!still_runs(pid, Some(start + 1), &session));
        }
        note_closed(&session);
        assert!(!still_runs(pid, own_start(), &session));
    }

    #[test]
    fn no_process_and_impossible_ids_are_gone() {
        let session = SessionId::generate();
        for pid in [0, -1, i64::from(i32::MAX) + 1, i64::MAX] {
            assert!(!still_runs(pid, None, &session), "{pid}");
        }
        // A child that has exited and been reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = i64::from(child.id());
        child.wait().unwrap();
        assert!(!still_runs(pid, None, &session));
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn another_running_process_runs_unless_its_start_time_differs() {
        let session = SessionId::generate();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = start_of(pid).and_then(|(_, s)| s);
        assert!(start.is_some());
        assert!(still_runs(i64::from(pid), start, &session));
        assert!(still_runs(i64::from(pid), None, &session));
        assert!(!still_runs(i64::from(pid), start.map(|s| s + 1), &session));
        child.kill().unwrap();
        // Killed, not yet reaped: a zombie sends nothing (bounded wait for
        // the kernel to make it one).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while still_runs(i64::from(pid), start, &session) {
            assert!(std::time::Instant::now() < deadline, "never seen gone");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(start_of(pid).map(|(state, _)| state), Some('Z'));
        child.wait().unwrap();
        assert!(!still_runs(i64::from(pid), start, &session));
    }
}
