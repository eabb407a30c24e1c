//! Review of 3df08a4 (a suspended owner past its lease judged by its
//! process). Each `defect_*` test failed on 3df08a4 and passes since the
//! fixes after it (RELIABILITY.md, row 69).
//!
//! The fork scenarios run alone in a test process of their own (a fork in
//! this multi-threaded test process could copy a lock another test holds).

use super::lock_files::*;
use std::io::{BufRead, Read};
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use toolledger::ledger::{Begin, Ledger, LedgerConfig};
use toolledger_test_support::*;

/// Runs the scenario test `name` alone in a fresh test process, with `var`
/// set to a fresh directory; its stdout (bounded: 60 s).
fn run_alone(name: &str, var: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(var, dir.path())
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
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains("1 passed"),
        "the scenario failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `fork()`s; the child runs `f` with the write end of a pipe (killed by an
/// alarm after 20 s at most) and never returns. The parent gets the child's
/// pid and the first line the child wrote (EOF bounded by the alarm).
fn fork_owner(f: impl FnOnce(std::fs::File)) -> (i32, String) {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only runs `f` and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        unsafe {
            libc::alarm(20);
            libc::close(fds[0]);
        }
        let w = unsafe { std::fs::File::from_raw_fd(fds[1]) };
        f(w);
        unsafe { libc::_exit(0) };
    }
    unsafe { libc::close(fds[1]) };
    let r = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    let mut line = String::new();
    std::io::BufReader::new(r).read_line(&mut line).unwrap();
    (pid, line.trim().to_owned())
}

fn kill_and_reap(pid: i32) {
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
    }
}

fn proc_stat(pid: i32) -> (String, String) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    (
        fields.first().copied().unwrap_or("?").to_owned(),
        fields.get(19).copied().unwrap_or("?").to_owned(),
    )
}

/// The owner half used by the fork scenarios: opens `db` with a 300 ms
/// lease, begins a call, suspends, reports its session id.
fn own_and_suspend(db: &Path, mut w: std::fs::File) {
    use std::io::Write;
    let ledger = Ledger::open(db, short_lease()).unwrap();
    let Begin::Execute(_) = ledger.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap() else {
        panic!()
    };
    ledger.suspend().unwrap();
    writeln!(w, "{}", ledger.session_id()).unwrap();
    drop(w);
    std::thread::sleep(Duration::from_secs(20));
    std::mem::forget(ledger);
}

// ---------------------------------------------------------------------------
// A. A ledger opened in a child made by fork() records its parent's start time
// ---------------------------------------------------------------------------

#[test]
fn scenario_forked_child_records_its_parents_start_time() {
    let Ok(dir) = std::env::var("REV13_FORKED_START") else {
        return;
    };
    let dir = PathBuf::from(dir);
    // The parent process has used a ledger before it forks (its start time
    // is read once, at the first lock, and kept for the process).
    drop(Ledger::open(&dir.join("first.db"), LedgerConfig::default()).unwrap());
    // Clock ticks are 10 ms: the child starts on a later tick.
    std::thread::sleep(Duration::from_millis(100));
    let db = dir.join("l.db");
    let db2 = db.clone();
    let (pid, session) = fork_owner(move |w| own_and_suspend(&db2, w));
    assert!(!session.is_empty(), "the child never got ready");
    let lock = dir.join(format!("l.db-sessions/{session}.lock"));
    let recorded = std::fs::read_to_string(&lock).unwrap_or_default();
    println!("lock file of the child (pid {pid}):\n{recorded}");
    println!("/proc/{pid}/stat state, start: {:?}", proc_stat(pid));
    println!(
        "/proc/self/stat start: {:?}",
        proc_stat(std::process::id() as i32).1
    );
    // Past its 300 ms lease; the child still runs (it can be thawed and send).
    std::thread::sleep(Duration::from_millis(600));
    let other = Ledger::open(&db, LedgerConfig::default()).unwrap();
    let answer = other.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap();
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    println!("child alive: {alive}; answer: {}", variant(&answer));
    kill_and_reap(pid);
    assert!(alive);
    assert_eq!(
        variant(&answer),
        "InFlight",
        "the running suspended owner (a forked child) was taken over"
    );
}

/// A child made by `fork()` (no exec) opens a ledger of its own (another
/// database, allowed: `Error::Forked` is only for the parent's files),
/// begins a call and suspends. Past the lease, it still runs. Its lock file
/// holds the *parent's* start time (the process-wide cache of
/// `process::own_start` was filled before the fork), so every other process
/// finds "another start time" and takes the call over.
#[test]
fn defect_a_forked_childs_suspended_call_is_taken_over_while_it_runs() {
    let out = run_alone(
        "rev13_review::scenario_forked_child_records_its_parents_start_time",
        "REV13_FORKED_START",
    );
    println!("{out}");
}

// ---------------------------------------------------------------------------
// B. A process whose main thread exited shows as a zombie while it runs
// ---------------------------------------------------------------------------

#[test]
fn scenario_main_thread_exited() {
    let Ok(dir) = std::env::var("REV13_MAIN_EXITED") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let db = dir.join("l.db");
    let db2 = db.clone();
    let (pid, session) = fork_owner(move |w| {
        // The child's only thread is its main thread (the thread group
        // leader): another thread runs the ledger, the main one exits.
        std::thread::spawn(move || {
            own_and_suspend(&db2, w);
            unsafe { libc::_exit(0) };
        });
        // The main thread ends alone (what `pthread_exit` does in C; the raw
        // exit of one thread here, as Rust frames cannot be force-unwound).
        unsafe { libc::syscall(libc::SYS_exit, 0) };
        unreachable!();
    });
    assert!(!session.is_empty(), "the child never got ready");
    std::thread::sleep(Duration::from_millis(600));
    let (state, _) = proc_stat(pid);
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0);
    println!("child {pid}: state {state}, kill(0) ok: {alive}, tasks: {threads}");
    let other = Ledger::open(&db, LedgerConfig::default()).unwrap();
    let answer = other.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap();
    println!("answer: {}", variant(&answer));
    kill_and_reap(pid);
    assert!(alive && threads >= 1);
    assert_eq!(
        variant(&answer),
        "InFlight",
        "a running suspended owner whose main thread exited was taken over"
    );
}

/// Linux shows a process whose main thread ended (`pthread_exit`; its other
/// threads running on) as `Z` in `/proc/<pid>/stat`: `process::still_runs`
/// takes it for a zombie, and the call of a suspended owner that still runs
/// is taken over past the lease.
#[test]
fn defect_a_suspended_owner_whose_main_thread_exited_is_taken_over_while_it_runs() {
    let out = run_alone(
        "rev13_review::scenario_main_thread_exited",
        "REV13_MAIN_EXITED",
    );
    println!("{out}");
}

// ---------------------------------------------------------------------------
// C. exec() keeps the pid and the start time: the session is judged running
// ---------------------------------------------------------------------------

#[test]
fn scenario_owner_execs() {
    let Ok(dir) = std::env::var("REV13_EXECS") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let db = dir.join("l.db");
    let db2 = db.clone();
    let (pid, session) = fork_owner(move |mut w| {
        use std::io::Write;
        let ledger = Ledger::open(&db2, LedgerConfig::default()).unwrap();
        let Begin::Execute(_) = ledger.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap() else {
            panic!()
        };
        writeln!(w, "{}", ledger.session_id()).unwrap();
        drop(w);
        // The process replaces its program (a re-exec, an updater): the
        // ledger and its tool are gone, the lock (close-on-exec) released.
        std::mem::forget(ledger);
        let sleep = c"/bin/sleep";
        let arg = c"20";
        unsafe {
            libc::execl(
                sleep.as_ptr(),
                sleep.as_ptr(),
                arg.as_ptr(),
                std::ptr::null::<libc::c_char>(),
            )
        };
        unsafe { libc::_exit(3) };
    });
    assert!(!session.is_empty(), "the child never got ready");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default() != "sleep\n" {
        assert!(Instant::now() < deadline, "never exec'd");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    let other = Ledger::open(&db, LedgerConfig::default()).unwrap();
    let mut answer = String::new();
    for _ in 0..3 {
        answer = variant(&other.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("owner {pid} now runs /bin/sleep; answer: {answer}");
    kill_and_reap(pid);
    assert_eq!(
        answer, "Reconcile",
        "the session of a process that exec'd another program is still judged running"
    );
}

/// A process that owns a call and then `exec()`s another program keeps its
/// pid and start time: the call stays `InFlight` for as long as the new
/// program runs (before 3df08a4: a free lock and no mark was death at once).
#[test]
fn defect_an_owner_that_execs_another_program_keeps_its_call_in_flight() {
    let out = run_alone("rev13_review::scenario_owner_execs", "REV13_EXECS");
    println!("{out}");
}

// ---------------------------------------------------------------------------
// D. A ledger dropped while suspended, while another process probes its lock
// ---------------------------------------------------------------------------

/// The other process of D: opens the ledger and asks for the call.
#[test]
fn child_asks() {
    let Ok(db) = std::env::var("REV13_ASK") else {
        return;
    };
    let ledger = Ledger::open(Path::new(&db), LedgerConfig::default()).unwrap();
    let b = ledger.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap();
    println!("ASKED {}", variant(&b));
}

fn ask_from_another_process(db: &Path) -> String {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "rev13_review::child_asks", "--nocapture"])
        .env("REV13_ASK", db)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the asking process never finished");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    out.lines()
        .find_map(|l| l.strip_prefix("ASKED ").map(str::to_owned))
        .unwrap_or_default()
}

/// A ledger dropped while suspended deleted its lock file with
/// `Sessions::clean`, which gave up if anyone held the lock at that
/// moment (it now marks the file `closed`, without taking the lock): another process's probe (`clean_dead_sessions`, `liveness_of`,
/// `reseal_alone` take it for an instant). The file stays, free, with the
/// row's lapsed mark; this process runs on, so every other process finds
/// "its process may still run it" and the call is `InFlight` until this
/// process exits (the design: "A ledger dropped while suspended deletes its
/// lock file, so the process running on does not keep its calls").
#[test]
fn defect_a_suspended_ledger_dropped_during_a_probe_keeps_its_call_for_the_process_life() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let app = Ledger::open(&db, short_lease()).unwrap();
    let Begin::Execute(_) = app.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap() else {
        panic!()
    };
    app.suspend().unwrap();
    let lock = dir
        .path()
        .join(format!("l.db-sessions/{}.lock", app.session_id()));
    // Another process's probe holds the lock for its instant (as
    // `Sessions::probe` does: open, try_lock, unlock).
    let probe = std::fs::OpenOptions::new().write(true).open(&lock).unwrap();
    probe.try_lock().unwrap();
    drop(app);
    probe.unlock().unwrap();
    drop(probe);
    std::thread::sleep(Duration::from_millis(600));
    let closed = std::fs::read_to_string(&lock)
        .unwrap_or_default()
        .lines()
        .any(|l| l == "closed");
    let answer = ask_from_another_process(&db);
    println!("lock file marked closed: {closed}; another process is told: {answer}");
    assert_eq!(
        (closed, answer.as_str()),
        (true, "Reconcile"),
        "the dropped ledger's call stays in flight while this process runs"
    );
}
