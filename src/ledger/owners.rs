//! Who owns an `executing` execution, and whether that owner is alive.
//!
//! The rule (docs/design.md, "Ownership"): a held session lock means alive,
//! whatever any clock says. An owner whose lock is free or gone is alive only
//! while its suspension mark covers it — `suspend()` writes the mark before
//! it lets go of the lock, and the mark lasts `LedgerConfig::lease` on the
//! boot clock, which cannot jump — or, past the lease or without a mark,
//! while its process may still run it (`process` cannot show it gone, and
//! its lock file, if there, does not say the session closed, and without a
//! mark says it let go to suspend): a suspended process can be thawed and
//! send. Anything else is dead: the process is gone, the lock file says the
//! session closed, a free lock file without a mark does not say
//! `suspended`, or the machine rebooted since. A probe that fails for any other reason counts as alive.

use std::path::PathBuf;

use super::process;
use super::session::{LockRecord, Probe, Sessions};
use super::Ledger;
use crate::model::{Monotonic, SessionId};
use crate::store::{Dao, SessionRow};

/// What a session's lock and mark say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// Its lock is held (or could not be probed): it is running.
    Alive,
    /// Suspended, and still owner for this many milliseconds.
    Suspended {
        /// Time left on its suspension lease (boot clock).
        remaining_ms: i64,
    },
    /// Provably not running; why.
    Dead(&'static str),
}

/// Why an owner was found dead (recorded as the unknown outcome's reason).
pub(crate) const DEAD_LOCK_RELEASED: &str = "owner session died while executing";
/// A suspended owner's lease ran out.
pub(crate) const DEAD_SUSPENSION_LAPSED: &str = "owner session suspended past its lease";
/// The machine rebooted since the owner ran.
pub(crate) const DEAD_REBOOTED: &str = "owner session ended with a reboot";

/// Judges an owner from its lock probe and its registered row, at `now`
/// (the boot clock). `still_runs` answers, for an owner whose lock is not
/// held and that no lease covers (lapsed, or no mark; in this boot where
/// its row says which boot), whether
/// its process may still run it (false only when provably not), given what
/// its lock file must say for that ([`Needs`]). Pure: the lock, its record,
/// the row and the process are read by the caller.
pub(crate) fn judge(
    probe: Probe,
    row: Option<&SessionRow>,
    now: &Monotonic,
    still_runs: impl FnOnce(Needs) -> bool,
) -> Liveness {
    match probe {
        Probe::Held | Probe::Failed => return Liveness::Alive,
        Probe::Free | Probe::Absent => {}
    }
    let Some(row) = row else {
        // No row (its registration was refused, or an older build's
        // session): only a lock file that says its session let go of it to
        // suspend, and names a process that may still run it, is alive.
        let needs = if probe == Probe::Free {
            Needs::SaysSuspended
        } else {
            // No file there, or a copy in its place (which may name the
            // owner's process).
            Needs::Named
        };
        if still_runs(needs) {
            return Liveness::Alive;
        }
        return Liveness::Dead(DEAD_LOCK_RELEASED);
    };
    let (Some(at), Some(lease)) = (row.suspended_ms, row.suspend_lease_ms) else {
        // A free or missing lock file and no mark: the process died, or it
        // let go without a mark (a `suspend()` whose mark the database
        // refused), or someone deleted its lock file. Only the first is
        // death. A free lock file must also say that its session let go of
        // it to suspend: an `exec()` lets go of it too, and leaves no tool
        // behind.
        let same_boot =
            row.boot_id.is_empty() || now.boot_id.is_empty() || *now.boot_id == *row.boot_id;
        let needs = if probe == Probe::Free {
            Needs::SaysSuspended
        } else {
            Needs::Process
        };
        if same_boot && still_runs(needs) {
            return Liveness::Alive;
        }
        return Liveness::Dead(DEAD_LOCK_RELEASED);
    };
    let mark = Monotonic::new(row.boot_id.as_str(), at);
    let rebooted = if row.boot_id.is_empty() || now.boot_id.is_empty() {
        // Boot ids unknown: only a boot clock that went back tells.
        now.ms < at
    } else {
        *now.boot_id != *row.boot_id
    };
    if rebooted {
        return Liveness::Dead(DEAD_REBOOTED);
    }
    let remaining = lease.saturating_sub(now.since(&mark));
    if remaining > 0 {
        Liveness::Suspended {
            remaining_ms: remaining,
        }
    } else if still_runs(Needs::Process) {
        // Past its lease, but its process may be thawed and send: still
        // owner. Ask again in a lease.
        Liveness::Suspended {
            remaining_ms: lease.max(1),
        }
    } else {
        Liveness::Dead(DEAD_SUSPENSION_LAPSED)
    }
}

/// What [`judge`] asks of an owner's lock file before its process is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Needs {
    /// The file is there and free, and no mark covers the session: the
    /// file must say the session let go of it to suspend.
    SaysSuspended,
    /// Nothing more: the process is asked (by the start time in the file
    /// where it has one, by its id alone otherwise: a file deleted, an
    /// older build's empty file, or one a full disk kept empty).
    Process,
    /// No row: the file (a copy put in its place) must name the process.
    Named,
}

/// Does the process of `session` (its row, if any, and its lock file's
/// `record`) still run it, given what `needs` asks of the file? (See
/// `process`.)
pub(crate) fn runs_still(
    session: &SessionId,
    row: Option<&SessionRow>,
    record: &LockRecord,
    needs: Needs,
) -> bool {
    if record.closed {
        return false;
    }
    let said = match needs {
        // A file that says nothing at all (empty: an older build's, or one
        // whose first record a full disk refused) cannot tell an `exec()`
        // from a suspension: the process is asked.
        Needs::SaysSuspended => record.suspended || record.unreadable || record.is_blank(),
        Needs::Process => true,
        Needs::Named => record.pid.is_some(),
    };
    let Some(pid) = row.map(|row| row.pid).or(record.pid) else {
        return false;
    };
    said && process::still_runs(pid, record.start, session)
}

/// Probes the lock file at `path`, with its record (none for a private
/// in-memory store, which has no other sessions).
fn observe(path: Option<&std::path::Path>) -> (Probe, LockRecord) {
    match path {
        Some(path) => Sessions::observe(path),
        None => (Probe::Absent, LockRecord::default()),
    }
}

impl Ledger {
    /// Where `session`'s lock file is: registered in its row, else (a session
    /// of an older build) in this database's sessions directory.
    fn lock_path_of(&self, session: &SessionId, row: Option<&SessionRow>) -> Option<PathBuf> {
        match row {
            Some(row) => Some(PathBuf::from(&row.lock_path)),
            None => self.sessions.default_lock_path(session),
        }
    }

    /// Is the owner `session` of an `executing` row alive? Reads its row in
    /// the caller's transaction and probes its lock.
    pub(crate) fn liveness_of(
        &self,
        dao: &Dao<'_>,
        session: Option<&SessionId>,
        now: &Monotonic,
    ) -> crate::store::Result<Liveness> {
        let Some(session) = session else {
            return Ok(Liveness::Dead(DEAD_LOCK_RELEASED));
        };
        if session == self.session_id() {
            return Ok(Liveness::Alive);
        }
        let row = dao.session(session)?;
        let path = self.lock_path_of(session, row.as_ref());
        let (probe, record) = observe(path.as_deref());
        Ok(judge(probe, row.as_ref(), now, |needs| {
            runs_still(session, row.as_ref(), &record, needs)
        }))
    }

    /// Is any other session of this file alive (registered or not)? For a
    /// change that no other session may see half done.
    pub(crate) fn others_alive(
        &self,
        dao: &Dao<'_>,
        now: &Monotonic,
    ) -> crate::store::Result<bool> {
        let rows = dao.sessions()?;
        for row in rows.iter().filter(|r| &r.session_id != self.session_id()) {
            if !matches!(
                self.liveness_of(dao, Some(&row.session_id), now)?,
                Liveness::Dead(_)
            ) {
                return Ok(true);
            }
        }
        Ok(self.unregistered(&rows).into_iter().any(|(session, path)| {
            let (probe, record) = Sessions::observe(&path);
            !matches!(
                judge(probe, None, now, |needs| runs_still(
                    &session, None, &record, needs
                )),
                Liveness::Dead(_)
            )
        }))
    }

    /// The lock files in the sessions directory of sessions without a row
    /// in `rows` (an older build's, or one whose registration was refused),
    /// other than this session's.
    fn unregistered(&self, rows: &[SessionRow]) -> Vec<(SessionId, PathBuf)> {
        self.sessions
            .lock_files()
            .into_iter()
            .filter(|(session, _)| {
                session != self.session_id() && !rows.iter().any(|r| &r.session_id == session)
            })
            .collect()
    }

    /// Deletes the rows of sessions found dead (killed processes leave them
    /// behind) and returns their lock files, with those of dead sessions
    /// without a row, for [`Ledger::clean_lock_files`] once the caller's
    /// transaction commits: a file deleted by a transaction that then rolled
    /// back would leave a row whose process can only be judged by its id.
    /// Rows of live or suspended sessions, and lock files anyone holds, are
    /// never touched.
    pub(crate) fn clean_dead_sessions(
        &self,
        dao: &Dao<'_>,
        now: &Monotonic,
    ) -> crate::store::Result<Vec<PathBuf>> {
        let mut dead = Vec::new();
        let rows = dao.sessions()?;
        for row in &rows {
            if &row.session_id == self.session_id() {
                continue;
            }
            let path = PathBuf::from(&row.lock_path);
            let (probe, record) = Sessions::observe(&path);
            let liveness = judge(probe, Some(row), now, |needs| {
                runs_still(&row.session_id, Some(row), &record, needs)
            });
            if let Liveness::Dead(_) = liveness {
                dao.delete_session(&row.session_id)?;
                dead.push(path);
            }
        }
        for (session, path) in self.unregistered(&rows) {
            let (probe, record) = Sessions::observe(&path);
            if probe == Probe::Free
                && matches!(
                    judge(probe, None, now, |needs| runs_still(
                        &session, None, &record, needs
                    )),
                    Liveness::Dead(_)
                )
            {
                dead.push(path);
            }
        }
        Ok(dead)
    }

    /// Deletes the lock files [`Ledger::clean_dead_sessions`] returned, once
    /// the transaction that deleted their rows has committed. A file whose
    /// lock someone holds again is left (see [`Sessions::clean`]). The
    /// number of files gone.
    pub(crate) fn clean_lock_files(paths: Vec<PathBuf>) -> usize {
        paths
            .into_iter()
            .filter(|path| Sessions::clean(path))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(boot: &str, suspended: Option<(i64, i64)>) -> SessionRow {
        SessionRow {
            session_id: SessionId::generate(),
            lock_path: "/x".into(),
            boot_id: boot.into(),
            suspended_ms: suspended.map(|s| s.0),
            suspend_lease_ms: suspended.map(|s| s.1),
            opened_ms: 0,
            pid: 1,
        }
    }

    #[test]
    fn a_held_lock_or_a_failed_probe_means_alive_whatever_the_mark_says() {
        let now = Monotonic::new("b", 10_000_000);
        let lapsed = row("a", Some((0, 1)));
        for probe in [Probe::Held, Probe::Failed] {
            assert_eq!(judge(probe, Some(&lapsed), &now, |_| true), Liveness::Alive);
            assert_eq!(judge(probe, None, &now, |_| true), Liveness::Alive);
        }
    }

    #[test]
    fn a_free_lock_is_alive_only_under_a_valid_suspension_mark() {
        let now = Monotonic::new("b", 100_000);
        for probe in [Probe::Free, Probe::Absent] {
            assert_eq!(
                judge(probe, None, &now, |_| false),
                Liveness::Dead(DEAD_LOCK_RELEASED)
            );
            assert_eq!(
                judge(probe, Some(&row("b", None)), &now, |_| false),
                Liveness::Dead(DEAD_LOCK_RELEASED)
            );
            assert_eq!(
                judge(probe, Some(&row("b", Some((90_000, 60_000)))), &now, |_| {
                    true
                }),
                Liveness::Suspended {
                    remaining_ms: 50_000
                }
            );
            assert_eq!(
                judge(probe, Some(&row("b", Some((40_000, 60_000)))), &now, |_| {
                    false
                }),
                Liveness::Dead(DEAD_SUSPENSION_LAPSED)
            );
            // Suspended in another boot: the reboot ended it.
            assert_eq!(
                judge(probe, Some(&row("a", Some((99_000, 60_000)))), &now, |_| {
                    true
                }),
                Liveness::Dead(DEAD_REBOOTED)
            );
        }
        // Unknown boot ids: a boot clock behind the mark means a reboot.
        let now = Monotonic::new("", 5_000);
        assert_eq!(
            judge(
                Probe::Free,
                Some(&row("", Some((90_000, 60_000)))),
                &now,
                |_| true
            ),
            Liveness::Dead(DEAD_REBOOTED)
        );
    }

    #[test]
    fn past_its_lease_a_suspended_owner_is_judged_by_its_process() {
        let now = Monotonic::new("b", 100_000);
        let lapsed = row("b", Some((40_000, 60_000)));
        // Its lock file is there and free, its process runs: still owner,
        // ask again in a lease.
        assert_eq!(
            judge(Probe::Free, Some(&lapsed), &now, |_| true),
            Liveness::Suspended {
                remaining_ms: 60_000
            }
        );
        assert_eq!(
            judge(Probe::Free, Some(&lapsed), &now, |_| false),
            Liveness::Dead(DEAD_SUSPENSION_LAPSED)
        );
        // No lock file (deleted by someone): the process is asked all the
        // same (by its id alone, the start time was in the file).
        assert_eq!(
            judge(Probe::Absent, Some(&lapsed), &now, |_| true),
            Liveness::Suspended {
                remaining_ms: 60_000
            }
        );
        assert_eq!(
            judge(Probe::Absent, Some(&lapsed), &now, |_| false),
            Liveness::Dead(DEAD_SUSPENSION_LAPSED)
        );
        // Inside the lease, and without a mark, the process is not asked.
        let inside = row("b", Some((90_000, 60_000)));
        assert!(matches!(
            judge(Probe::Free, Some(&inside), &now, |_| panic!("asked")),
            Liveness::Suspended { .. }
        ));
        // A row of another boot: whatever has its process id now is not it.
        assert_eq!(
            judge(Probe::Free, Some(&row("a", None)), &now, |_| panic!(
                "asked"
            )),
            Liveness::Dead(DEAD_LOCK_RELEASED)
        );
    }

    #[test]
    fn without_a_mark_a_free_lock_file_must_also_say_it_was_let_go_to_suspend() {
        let now = Monotonic::new("b", 100_000);
        let no_mark = row("b", None);
        let asked = std::cell::Cell::new(None);
        let _ = judge(Probe::Free, Some(&no_mark), &now, |needs| {
            asked.set(Some(needs));
            true
        });
        assert_eq!(asked.get(), Some(Needs::SaysSuspended));
        let _ = judge(Probe::Absent, Some(&no_mark), &now, |needs| {
            asked.set(Some(needs));
            true
        });
        assert_eq!(asked.get(), Some(Needs::Process));
        let lapsed = row("b", Some((40_000, 60_000)));
        let _ = judge(Probe::Free, Some(&lapsed), &now, |needs| {
            asked.set(Some(needs));
            true
        });
        assert_eq!(asked.get(), Some(Needs::Process));
        let _ = judge(Probe::Absent, Some(&lapsed), &now, |needs| {
            asked.set(Some(needs));
            true
        });
        assert_eq!(asked.get(), Some(Needs::Process));
        // No row: a free file must say suspended; no file (or a copy in
        // its place) must name the process.
        let _ = judge(Probe::Free, None, &now, |needs| {
            asked.set(Some(needs));
            true
        });
        assert_eq!(asked.get(), Some(Needs::SaysSuspended));
        let _ = judge(Probe::Absent, None, &now, |needs| {
            asked.set(Some(needs));
            true
        });
        assert_eq!(asked.get(), Some(Needs::Named));
        assert_eq!(
            judge(Probe::Absent, None, &now, |_| false),
            Liveness::Dead(DEAD_LOCK_RELEASED)
        );
    }

    #[test]
    fn a_free_lock_without_a_mark_is_death_only_when_the_process_is_gone() {
        // A `suspend()` whose mark could not be written (a full disk) lets go
        // of the lock all the same: its process still runs it.
        let now = Monotonic::new("b", 100_000);
        assert_eq!(
            judge(Probe::Free, Some(&row("b", None)), &now, |_| true),
            Liveness::Alive
        );
        assert_eq!(
            judge(Probe::Free, Some(&row("b", None)), &now, |_| false),
            Liveness::Dead(DEAD_LOCK_RELEASED)
        );
        // Its lock file deleted by someone while it runs: the same.
        assert_eq!(
            judge(Probe::Absent, Some(&row("b", None)), &now, |_| true),
            Liveness::Alive
        );
    }
}
