//! `begin`: the one entry point that decides whether a tool call may run.
//!
//! The lookup of the execution id and the insert of a new record happen in
//! the same IMMEDIATE transaction, so two threads or processes beginning the
//! same call get exactly one `Execute`; the other sees the first one's
//! `executing` row and answers `InFlight`. What a stored record means is the
//! one table in `decide`; [`Ledger::continue_execution`] applies the same
//! table to a stored execution without a new request (recovery).

use std::time::Duration;

use super::answers::{ApprovalRequest, AttemptId, Begin, CallSpec, StoredResult, Ticket};
use super::decide::{decide, Decision, Facts};
use super::owners::Liveness;
use super::retention;
use super::{Error, Ledger, Result, SWEEP_EVERY};
use crate::model::{
    as_version_3_parsed, digest_with, ArgsDigest, CanonicalArgs, DigestScheme, ExecutionId,
    ExecutionIdParts, ExecutionRecord, ExecutionStatus, Monotonic, Move, OperationId,
    OperationStatus, Transition,
};
use crate::store::{
    Dao, Durability, Error as StorageError, Fence, NewExecution, StatusFields, StoredAnswer,
};

/// Why an attempt whose `begin` failed after writing it is failed before
/// commit.
const UNSENT_REASON: &str =
    "not sent: its begin failed (the intent's sync) before it was handed out";

/// A call checked and digested before any write.
pub(super) struct Prepared<'a> {
    spec: &'a CallSpec,
    id: ExecutionId,
    args: CanonicalArgs,
}

/// The id of `spec`'s call in round `round` of `op`.
fn call_id(op: &OperationId, round: u32, spec: &CallSpec) -> Result<ExecutionId> {
    Ok(ExecutionId::derive(&ExecutionIdParts {
        operation: op,
        round,
        call_id: &spec.call.call_id,
        tool_name: &spec.call.tool_name,
        tool_version: spec.tool_version,
    })?)
}

impl Prepared<'_> {
    /// The call's digest to compare with a stored record's `stored` digest,
    /// under the record's `scheme`. A record of schema version 3 is compared
    /// as version 3 digested: numbers as doubles, over the arguments as
    /// sent or, when that differs from `stored`, over the arguments as
    /// version 3's parser would have handed them over for the same model
    /// response ([`as_version_3_parsed`]); a match of either is the same
    /// request to version 3.
    fn digest_for(
        &self,
        dao: &Dao<'_>,
        scheme: DigestScheme,
        stored: &ArgsDigest,
        ledger: &Ledger,
    ) -> Result<ArgsDigest> {
        // As stored: keyed when the ledger is encrypted (under the
        // transaction's keys: never the keys' lock while the connection is
        // held, which a re-key takes in the other order).
        let legacy = |arguments: &str| -> Result<ArgsDigest> {
            let plain = digest_with(
                DigestScheme::NearestDouble,
                &self.spec.call.tool_name,
                self.spec.tool_version,
                arguments,
                &ledger.config.json_limits,
            )?
            .digest;
            Ok(dao.stored_digest(&plain))
        };
        Ok(match scheme {
            DigestScheme::Exact => self.args.digest.clone(),
            DigestScheme::NearestDouble => {
                let as_sent = legacy(&self.spec.call.arguments)?;
                if &as_sent == stored {
                    return Ok(as_sent);
                }
                match as_version_3_parsed(&self.spec.call.arguments)
                    .and_then(|rewritten| legacy(&rewritten).ok())
                {
                    Some(digest) if &digest == stored => digest,
                    _ => as_sent,
                }
            }
        })
    }
}

fn is_cancelled(op: OperationStatus) -> bool {
    matches!(
        op,
        OperationStatus::Cancelled | OperationStatus::CancelledAfterSideEffect
    )
}

impl Ledger {
    /// Begins one call. See [`Ledger::begin_round`].
    ///
    /// # Errors
    /// As [`Ledger::begin_round`].
    pub fn begin(&self, op: &OperationId, round: u32, spec: &CallSpec) -> Result<Begin> {
        let mut answers = self.begin_round(op, round, std::slice::from_ref(spec))?;
        answers
            .pop()
            .ok_or_else(|| Error::Internal("begin produced no answer"))
    }

    /// Begins every call of one model response in one durable transaction
    /// (one sync for N parallel calls) and answers, per call, in order: run
    /// it, ask for approval, replay the stored result, or refuse.
    ///
    /// Every call is validated (ids, JSON) before anything is written: if one
    /// is invalid, nothing of the round is recorded.
    ///
    /// # Errors
    /// [`Error::Json`] / [`Error::Id`] for bad input (nothing recorded);
    /// storage errors (nothing recorded).
    pub fn begin_round(
        &self,
        op: &OperationId,
        round: u32,
        calls: &[CallSpec],
    ) -> Result<Vec<Begin>> {
        Ok(self.begin_round_marking(op, round, calls)?.0)
    }

    /// [`Ledger::begin_round`], also saying which executions it found left
    /// `executing` by a dead owner and turned into `outcome_unknown` (the
    /// executor counts them in its metrics).
    pub(crate) fn begin_round_marking(
        &self,
        op: &OperationId,
        round: u32,
        calls: &[CallSpec],
    ) -> Result<(Vec<Begin>, Vec<ExecutionId>)> {
        let prepared = calls
            .iter()
            .map(|spec| self.prepare(op, round, spec))
            .collect::<Result<Vec<_>>>()?;
        // One transaction when the write lock is free (a replay in it writes
        // nothing); otherwise a replay is answered from a read, and only
        // what needs a write waits for the lock.
        match self.write_begins(op, round, &prepared, None, false) {
            Ok(Some(out)) => return Ok(out),
            Ok(None) => {}
            Err(e) => return Err(e),
        }
        if let Some(replays) = self.replays_only(&prepared)? {
            return Ok((replays, Vec::new()));
        }
        self.write_begins(op, round, &prepared, None, true)?
            .ok_or(Error::Internal("a waiting write returned nothing"))
    }

    /// A round whose every call already committed (with the same digest) is
    /// answered from a read transaction: a replay writes nothing, so it must
    /// not wait for — or fail on — another connection's write lock, a full
    /// disk or a read-only file. A committed record never changes, so the
    /// answer cannot go stale. `None` when any call needs the write path.
    fn replays_only(&self, calls: &[Prepared<'_>]) -> Result<Option<Vec<Begin>>> {
        self.read(|dao| {
            let mut answers = Vec::with_capacity(calls.len());
            for p in calls {
                match dao.stored_answer(&p.id)? {
                    Some(stored) if stored.status.is_committed() => {
                        match self.answer_committed(dao, p, stored)? {
                            replay @ Begin::Replay(_) => answers.push(replay),
                            _ => return Ok(None),
                        }
                    }
                    _ => return Ok(None),
                }
            }
            Ok(Some(answers))
        })
    }

    /// [`Ledger::begin`] of one call, answered at once where that needs no
    /// write and no wait: the replay of an execution that committed with
    /// the same digest, read without waiting for the store
    /// ([`Ledger::read_now`]). `Ok(None)` for everything else — a new call,
    /// any other stored state, a record digested by an older scheme — and
    /// whenever the read would wait (the store's connection held by another
    /// call, SQLite busy): then `begin` answers, on a thread that may wait.
    /// Writes nothing and queues nothing (`begin` queues no delivery mark
    /// for a replay either). For a caller that must not block, such as an
    /// app's main thread.
    ///
    /// # Errors
    /// As `begin` for bad input ([`Error::Json`], [`Error::Id`]: nothing
    /// recorded); [`Error::Store`] with `Suspended` for a suspended
    /// ledger, as `begin`; storage errors of the read.
    pub fn begin_now(
        &self,
        op: &OperationId,
        round: u32,
        spec: &CallSpec,
    ) -> Result<Option<Begin>> {
        // Most calls asked here are new (the suspending forms ask first for
        // every call): the id is looked up before the arguments are
        // digested, and only a committed record pays for the digest. The
        // arguments are checked before the read all the same (as strictly
        // as the digest checks them), so bad input gives `begin`'s error,
        // in `begin`'s order.
        let id = call_id(op, round, spec)?;
        crate::model::canonical::validate(&spec.call.arguments, &self.config.json_limits)?;
        // `replays_only`'s rule and narrow read, for the current digest
        // scheme only; a conflict is left to `begin`. The digest is keyed
        // under the read's own keys (taken with the connection, at once).
        let answer = self.read_now(|dao| {
            Ok(match dao.stored_answer(&id)? {
                Some(stored)
                    if stored.status.is_committed()
                        && stored.digest_scheme == DigestScheme::Exact =>
                {
                    self.replay_in_place(dao, spec, &id, stored)
                }
                _ => Ok(None),
            })
        })?;
        Ok(answer.flatten())
    }

    /// `begin_now`'s answer for a committed record of the current digest
    /// scheme: the arguments digested (keyed under the read's own keys) and
    /// compared; a replay, or `None` (a conflict is left to `begin`).
    fn replay_in_place(
        &self,
        dao: &Dao<'_>,
        spec: &CallSpec,
        id: &ExecutionId,
        stored: StoredAnswer,
    ) -> Result<Option<Begin>> {
        let mut args = self.digest_of(spec)?;
        args.digest = dao.stored_digest(&args.digest);
        let p = Prepared {
            spec,
            id: id.clone(),
            args,
        };
        Ok(match self.answer_committed(dao, &p, stored)? {
            replay @ Begin::Replay(_) => Some(replay),
            _ => None,
        })
    }

    /// Begins a compensation of the committed execution `original`: a new
    /// execution with its own id (`<own>:compensates:<original>`), its own
    /// approval and downstream key, linked to the original. Whether it needs
    /// approval is `spec.requires_approval` (the executor's
    /// `Executor::compensate` takes it from the compensating tool). `op` is
    /// the compensation's own operation: in a cancelled one nothing begins
    /// (the answer is `Cancelled`), so undoing a cancelled turn's effect
    /// runs in another operation.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::NothingToCompensate`] when `original`
    /// did not commit; the errors of [`Ledger::begin_round`].
    pub fn compensate(
        &self,
        original: &ExecutionId,
        op: &OperationId,
        round: u32,
        spec: &CallSpec,
    ) -> Result<Begin> {
        // A missing original is decided in the write below: a compensation
        // begun before the original was pruned still answers (its record or
        // its tombstone), and a new one finds the original gone (`NotFound`).
        if let Some(rec) = self.get(original)? {
            if !rec.status.is_committed() {
                return Err(Error::NothingToCompensate(original.clone()));
            }
        }
        let mut prepared = self.prepare(op, round, spec)?;
        prepared.id = ExecutionId::compensation(&prepared.id, original)?;
        let (mut answers, _) = self
            .write_begins(op, round, &[prepared], Some(original), true)?
            .ok_or(Error::Internal("a waiting write returned nothing"))?;
        answers
            .pop()
            .ok_or_else(|| Error::Internal("compensate produced no answer"))
    }

    /// What a stored execution means now, by the same table as `begin` (the
    /// request is the stored call itself): replay, run it (a durable new
    /// attempt), reconcile (a dead owner's attempt becomes unknown), wait, or
    /// refuse. Used to recover and to run an approved or retryable execution.
    ///
    /// # Errors
    /// [`Error::NotFound`], storage errors.
    pub fn continue_execution(&self, id: &ExecutionId) -> Result<Begin> {
        let now = self.now();
        let mono = self.clock.monotonic();
        self.write(Durability::Full, |dao| {
            let rec = dao
                .execution(id)?
                .ok_or_else(|| Error::NotFound(id.clone()))?;
            let op_cancelled = dao
                .operation_status(&rec.operation_id)?
                .is_some_and(is_cancelled);
            let new_digest = rec.args_digest.clone();
            self.answer_existing(dao, rec, &new_digest, op_cancelled, now, &mono)
                .map(|(answer, _)| answer)
        })
    }

    /// What a new ask does with attempt `attempt` of its execution, for
    /// that attempt alone: when it is the current one and already unknown,
    /// or running in a session that is dead (marked unknown here, as
    /// `continue_execution` marks it), the `Reconcile` ticket; `None`,
    /// with nothing written, for anything else — another attempt, a live
    /// or suspended owner, this session's own, a finished or failed call.
    /// Unlike `continue_execution` it never starts an attempt: a caller
    /// that reports a result for `attempt` must not begin the next one
    /// (owned by its session, run by nobody) when the row moved on between
    /// its check and this transaction.
    ///
    /// # Errors
    /// Storage errors.
    pub(crate) fn take_over_dead_attempt(&self, attempt: &AttemptId) -> Result<Option<Ticket>> {
        let now = self.now();
        let mono = self.clock.monotonic();
        self.write(Durability::Full, |dao| {
            let Some(mut rec) = dao.execution(&attempt.execution_id)? else {
                return Ok(None);
            };
            if rec.attempt_count != attempt.attempt {
                return Ok(None);
            }
            match rec.status {
                ExecutionStatus::OutcomeUnknown => {
                    if rec.unknown_since.is_none() {
                        // A record of schema version 3: its window starts now.
                        dao.stamp_unknown(&rec.execution_id, &mono)?;
                        rec.unknown_since = Some(mono.clone());
                    }
                    Ok(Some(Ticket::from_record(&rec)))
                }
                ExecutionStatus::Executing => {
                    match self.liveness_of(dao, rec.owner_session.as_ref(), &mono)? {
                        Liveness::Dead(reason) => Ok(
                            if self.abandon_attempt(dao, &mut rec, reason, &mono, now)? {
                                Some(Ticket::from_record(&rec))
                            } else {
                                None
                            },
                        ),
                        Liveness::Alive | Liveness::Suspended { .. } => Ok(None),
                    }
                }
                _ => Ok(None),
            }
        })
    }

    pub(super) fn prepare<'a>(
        &self,
        op: &OperationId,
        round: u32,
        spec: &'a CallSpec,
    ) -> Result<Prepared<'a>> {
        let mut prepared = self.prepare_plain(op, round, spec)?;
        // In an encrypted ledger the digest stored and compared is keyed.
        // Keyed here, before the transaction: the keys of an open ledger
        // never change under it (encrypting and re-keying run on a ledger of
        // their own, alone with the file: `reseal_alone`).
        prepared.args.digest = self.store.stored_digest(prepared.args.digest)?;
        Ok(prepared)
    }

    /// The call checked, its id derived and its arguments digested (plain:
    /// not keyed yet). The same bad-input errors as [`Ledger::begin`].
    fn prepare_plain<'a>(
        &self,
        op: &OperationId,
        round: u32,
        spec: &'a CallSpec,
    ) -> Result<Prepared<'a>> {
        let id = call_id(op, round, spec)?;
        let args = self.digest_of(spec)?;
        Ok(Prepared { spec, id, args })
    }

    /// The call's arguments digested under the current scheme (plain).
    fn digest_of(&self, spec: &CallSpec) -> Result<CanonicalArgs> {
        Ok(crate::model::digest_arguments(
            &spec.call.tool_name,
            spec.tool_version,
            &spec.call.arguments,
            &self.config.json_limits,
        )?)
    }

    /// Begins `calls` in one transaction. `wait`: for the write lock (else
    /// `Ok(None)` when it is not free at once, and a transaction that only
    /// answered from what is stored writes nothing).
    fn write_begins(
        &self,
        op: &OperationId,
        round: u32,
        calls: &[Prepared<'_>],
        compensates: Option<&ExecutionId>,
        wait: bool,
    ) -> Result<Option<(Vec<Begin>, Vec<ExecutionId>)>> {
        let now = self.now();
        let mono = self.clock.monotonic();
        let sweep = self.sweep_due(calls.len());
        // Attempts an earlier `begin` wrote but never handed out (its
        // intent's sync failed): settled in this transaction first.
        let unsent = self.unsent_attempts();
        // The attempts this transaction hands out, by the index of their
        // call: for the policy at each commit, and for the case where its
        // intent's sync fails (copied once, inside the transaction).
        let handed = std::cell::RefCell::new(Vec::new());
        let body = |dao: &Dao<'_>| {
            if let Some(unsent) = &unsent {
                self.settle_unsent(dao, unsent, now)?;
            }
            if sweep {
                // Rides in this transaction: a few rows flagged at most.
                dao.sweep_attention(i64::from(SWEEP_EVERY))?;
            }
            // The operation, and whether the first call's id is taken, in
            // one read of index entries.
            let (op_status, first_taken) = match calls.first() {
                Some(p) => dao.operation_and_taken(op, &p.id)?,
                None => (dao.operation_status(op)?, false),
            };
            let op_status = match op_status {
                Some(status) => status,
                None => {
                    dao.insert_operation(op, now)?;
                    OperationStatus::Open
                }
            };
            let mut marked = Vec::new();
            let answers = calls
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let taken = if i == 0 {
                        first_taken
                    } else {
                        dao.execution_id_taken(&p.id)?
                    };
                    // The usual case first: a new call (no record, no
                    // tombstone) is inserted without reading a record.
                    if !is_cancelled(op_status) && !taken {
                        if let Some(original) = compensates {
                            // Read again in this transaction: a prune since
                            // `compensate` read it may have removed it, and
                            // the link to it could not be written.
                            match dao.execution(original)? {
                                Some(rec) if rec.status.is_committed() => {}
                                Some(_) => {
                                    return Err(Error::NothingToCompensate(original.clone()))
                                }
                                None => return Err(Error::NotFound(original.clone())),
                            }
                        }
                        if let Some(answer) =
                            self.insert_new(dao, op, round, p, compensates, now)?
                        {
                            return Ok(answer);
                        }
                    }
                    self.answer_stored(dao, p, op_status, now, &mono, &mut marked)
                })
                .collect::<Result<Vec<_>>>()?;
            handed
                .borrow_mut()
                .extend(answers.iter().enumerate().filter_map(|(i, a)| match a {
                    Begin::Execute(ticket) => Some((i, ticket.attempt_id(), ticket.attempt)),
                    _ => None,
                }));
            Ok((answers, marked))
        };
        // The intent is durable before this returns; another session that
        // sees it a moment earlier only answers `InFlight` or a refusal.
        let written = if wait {
            self.write(Durability::Synced, body).map(Some)
        } else {
            self.write_now(Durability::Synced, body)
        };
        let out = match written {
            Ok(Some(out)) => out,
            Ok(None) => return Ok(None),
            Err(e) => {
                // The transaction committed and its sync failed: its
                // attempts are `executing` under this live session, never
                // handed out, and would answer `InFlight` until the process
                // ends. The next `begin` records them as not sent. (While
                // one is `executing` no other attempt of its execution can
                // be begun, so the next `begin` finds exactly it.)
                if matches!(e, Error::Store(StorageError::NotDurable(_))) {
                    self.note_unsent(handed.into_inner().into_iter().map(|(_, a, _)| a).collect());
                }
                return Err(e);
            }
        };
        if let Some(unsent) = unsent {
            self.forget_unsent(&unsent);
        }
        // For the policy at each commit: what the call declared and when its
        // key's first request could go out (a first attempt's request goes
        // out after this).
        if self.config.deferred_commits.enabled {
            for (i, attempt, number) in handed.into_inner() {
                if let Some(p) = calls.get(i) {
                    self.remember_begun(attempt, number == 1, p.spec.downstream);
                }
            }
        }
        Ok(Some(out))
    }

    /// Inside a write transaction: records each attempt of `unsent` that is
    /// still this session's running attempt as failed before commit and
    /// retryable (no request went out for it: its `begin` failed, so nobody
    /// was handed it); any other (rolled back with its transaction, or moved
    /// on since) is left as it is.
    fn settle_unsent(&self, dao: &Dao<'_>, unsent: &[AttemptId], now: i64) -> Result<()> {
        for attempt in unsent {
            let Some(rec) = dao.execution(&attempt.execution_id)? else {
                continue;
            };
            let running_here = rec.status == ExecutionStatus::Executing
                && rec.attempt_count == attempt.attempt
                && rec.owner_session.as_ref() == Some(self.session_id());
            if !running_here {
                continue;
            }
            self.fail_step(dao, &rec, attempt, UNSENT_REASON, true, now)?;
        }
        Ok(())
    }

    /// The answer for a call whose id is taken (a stored execution or a
    /// tombstone), or that falls in a cancelled operation, inside the open
    /// transaction. Pushes onto `marked` an execution found left `executing`
    /// by a dead owner and turned into `outcome_unknown`.
    fn answer_stored(
        &self,
        dao: &Dao<'_>,
        p: &Prepared<'_>,
        op_status: OperationStatus,
        now: i64,
        mono: &Monotonic,
        marked: &mut Vec<ExecutionId>,
    ) -> Result<Begin> {
        // A committed execution answers from a narrow read (the replay's
        // path); any other stored status reads the whole record.
        match dao.stored_answer(&p.id)? {
            Some(stored) if stored.status.is_committed() => {
                return self.answer_committed(dao, p, stored);
            }
            Some(_) => {}
            None => return self.answer_unstored(dao, p, op_status),
        }
        match dao.execution(&p.id)? {
            Some(rec) => {
                let digest = p.digest_for(dao, rec.digest_scheme, &rec.args_digest, self)?;
                let (answer, abandoned) =
                    self.answer_existing(dao, rec, &digest, is_cancelled(op_status), now, mono)?;
                if abandoned {
                    marked.push(p.id.clone());
                }
                Ok(answer)
            }
            None => Err(Error::Internal(
                "an execution was read and gone in one transaction",
            )),
        }
    }

    /// The answer for a committed execution, by the table of
    /// [`decide`]: other arguments conflict, the same ones replay (a
    /// committed record answers nothing else, whatever its operation's status).
    fn answer_committed(
        &self,
        dao: &Dao<'_>,
        p: &Prepared<'_>,
        stored: StoredAnswer,
    ) -> Result<Begin> {
        let digest = p.digest_for(dao, stored.digest_scheme, &stored.args_digest, self)?;
        if digest != stored.args_digest {
            return Ok(Begin::Conflict {
                execution_id: p.id.clone(),
                stored_digest: stored.args_digest,
                new_digest: digest,
            });
        }
        Ok(Begin::Replay(StoredResult {
            execution_id: p.id.clone(),
            result_json: stored.result_json.unwrap_or_default(),
            external_id: stored.external_id,
            partial: stored.partial,
        }))
    }

    /// The answer for a call whose id no execution has: a tombstone's, or
    /// `Cancelled` in a cancelled operation.
    fn answer_unstored(
        &self,
        dao: &Dao<'_>,
        p: &Prepared<'_>,
        op_status: OperationStatus,
    ) -> Result<Begin> {
        match dao.tombstone(&p.id)? {
            // Pruned long ago: refused or reported, never run again.
            Some(tomb) => {
                let digest = p.digest_for(dao, tomb.digest_scheme, &tomb.args_digest, self)?;
                Ok(retention::answer_for_tombstone(tomb, &digest))
            }
            None if is_cancelled(op_status) => Ok(Begin::Cancelled {
                execution_id: p.id.clone(),
            }),
            // The insert found the id taken; this transaction holds the
            // write lock, so it cannot have been freed since.
            None => Err(Error::Internal(
                "an execution id was taken and free in one transaction",
            )),
        }
    }

    /// Inserts `p` as a new execution (`executing`, or `prepared` when it
    /// needs approval) and answers for it; `None` when a stored execution
    /// has its id (nothing written then). The caller checked the tombstones
    /// (and found the id free: `None` only if that check was wrong).
    fn insert_new(
        &self,
        dao: &Dao<'_>,
        op: &OperationId,
        round: u32,
        p: &Prepared<'_>,
        compensates: Option<&ExecutionId>,
        now: i64,
    ) -> Result<Option<Begin>> {
        let key = p.id.downstream_key();
        let executing = !p.spec.requires_approval;
        // The tool gets the arguments as the model sent them (checked, not
        // rewritten); the digest is over their canonical form.
        let args_json = &p.spec.call.arguments;
        let inserted = dao.insert_execution(
            &NewExecution {
                execution_id: &p.id,
                operation_id: op,
                round,
                position: p.spec.call.position,
                provider: p.spec.call.provider,
                provider_call_id: &p.spec.call.call_id,
                tool_name: &p.spec.call.tool_name,
                tool_version: p.spec.tool_version,
                args_digest: &p.args.digest,
                args_json,
                downstream_key: &key,
                requires_approval: p.spec.requires_approval,
                status: if executing {
                    ExecutionStatus::Executing
                } else {
                    ExecutionStatus::Prepared
                },
                attempt_count: u32::from(executing),
                owner_session: executing.then_some(self.session_id()),
                compensates,
                now_ms: now,
            },
            self.session_id(),
        )?;
        if !inserted {
            return Ok(None);
        }
        Ok(Some(if executing {
            Begin::Execute(Ticket {
                execution_id: p.id.clone(),
                downstream_key: key,
                attempt: 1,
                tool_name: p.spec.call.tool_name.clone(),
                tool_version: p.spec.tool_version,
                args_json: args_json.clone(),
                args_digest: p.args.digest.clone(),
                external_id: None,
                unknown_since: None,
                earlier_unknown: None,
                resend: false,
            })
        } else {
            Begin::NeedsApproval(ApprovalRequest {
                execution_id: p.id.clone(),
                tool_name: p.spec.call.tool_name.clone(),
                args_json: args_json.clone(),
                args_digest: p.args.digest.clone(),
            })
        }))
    }

    /// What a stored record means for a request with `new_digest` (the
    /// `decide` table), applied inside the open transaction. Also says
    /// whether a dead owner's attempt was just turned into an unknown outcome.
    fn answer_existing(
        &self,
        dao: &Dao<'_>,
        mut rec: ExecutionRecord,
        new_digest: &ArgsDigest,
        op_cancelled: bool,
        now: i64,
        mono: &Monotonic,
    ) -> Result<(Begin, bool)> {
        let facts = Facts {
            status: rec.status,
            retryable: rec.retryable,
            requires_approval: rec.requires_approval,
            same_digest: &rec.args_digest == new_digest,
            op_cancelled,
            has_items: rec.status == ExecutionStatus::FailedBeforeCommit
                && dao.has_batch_items(&rec.execution_id)?,
            pruned: false,
        };
        let mut probe_error = None;
        let decision = decide(&facts, || {
            match self.liveness_of(dao, rec.owner_session.as_ref(), mono) {
                Ok(liveness) => liveness,
                Err(e) => {
                    // A probe that fails counts as alive; a storage error is
                    // reported below.
                    probe_error = Some(e);
                    Liveness::Alive
                }
            }
        });
        if let Some(e) = probe_error {
            return Err(e.into());
        }
        let id = rec.execution_id.clone();
        let answer = match decision {
            Decision::Conflict => Begin::Conflict {
                execution_id: id,
                stored_digest: rec.args_digest,
                new_digest: new_digest.clone(),
            },
            Decision::Replay => Begin::Replay(StoredResult::of(&rec)),
            Decision::InFlight { retry_after_ms } => Begin::InFlight {
                execution_id: id,
                retry_after: retry_after_ms
                    .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            },
            Decision::Abandon { reason } => {
                if !self.abandon_attempt(dao, &mut rec, reason, mono, now)? {
                    return Err(Error::Internal(
                        "an executing row moved inside its transaction",
                    ));
                }
                return Ok((Begin::Reconcile(Ticket::from_record(&rec)), true));
            }
            Decision::Reconcile => {
                if rec.unknown_since.is_none() {
                    // A record of schema version 3: its window starts now.
                    dao.stamp_unknown(&id, mono)?;
                    rec.unknown_since = Some(mono.clone());
                }
                Begin::Reconcile(Ticket::from_record(&rec))
            }
            Decision::NeedsApproval => Begin::NeedsApproval(ApprovalRequest {
                execution_id: id,
                tool_name: rec.tool_name,
                args_json: rec.args_json,
                args_digest: rec.args_digest,
            }),
            Decision::Start => {
                Begin::Execute(self.start_attempt(dao, &rec, Transition::Start, now)?)
            }
            Decision::Retry => {
                Begin::Execute(self.start_attempt(dao, &rec, Transition::Retry, now)?)
            }
            Decision::Failed => Begin::Failed {
                execution_id: id,
                reason: rec.last_reason.unwrap_or_default(),
            },
            Decision::Rejected => Begin::Rejected { execution_id: id },
            Decision::Cancelled => Begin::Cancelled { execution_id: id },
            Decision::CancelNow => {
                self.step(
                    dao,
                    &rec,
                    Transition::Cancel,
                    None,
                    StatusFields {
                        reason: Some("operation cancelled"),
                        ..StatusFields::default()
                    },
                    now,
                )?;
                Begin::Cancelled { execution_id: id }
            }
            Decision::SettlePartial => {
                let reason = rec.last_reason.clone();
                Begin::Replay(self.settle_partial(dao, &rec, None, reason.as_deref(), now)?)
            }
            // Only a tombstone decides this (see `retention::answer_for_tombstone`).
            Decision::PrunedAfterRun => Begin::Failed {
                execution_id: id,
                reason: super::PRUNED_EXECUTED_REASON.to_owned(),
            },
        };
        Ok((answer, false))
    }

    /// Moves `rec` into `executing` for its next attempt, owned by this
    /// session, and returns the ticket. The one place an attempt starts: it
    /// refuses to start one in a cancelled operation.
    pub(super) fn start_attempt(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        transition: Transition,
        now: i64,
    ) -> Result<Ticket> {
        if dao
            .operation_status(&rec.operation_id)?
            .is_some_and(is_cancelled)
        {
            return Err(Error::OperationCancelled(rec.execution_id.clone()));
        }
        let attempt = rec.attempt_count.saturating_add(1);
        self.step(
            dao,
            rec,
            transition,
            None,
            StatusFields {
                attempt: Some(attempt),
                ..StatusFields::default()
            },
            now,
        )?;
        let mut ticket = Ticket::from_record(rec);
        ticket.attempt = attempt;
        ticket.unknown_since = None;
        Ok(ticket)
    }

    /// Applies one checked transition to `rec` inside the open transaction,
    /// fenced by `attempt` when given (the store refuses the move unless the
    /// row is still at that attempt and, for a running attempt's own steps,
    /// owned by this session).
    pub(super) fn step(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        transition: Transition,
        attempt: Option<(&AttemptId, bool)>,
        fields: StatusFields<'_>,
        now: i64,
    ) -> Result<ExecutionStatus> {
        let mv = Move::check(rec.status, transition)
            .map_err(|e| Error::transition(&rec.execution_id, e))?;
        // `rec` was read in this same transaction: passing its attempt number
        // spares the store a read-back for the log entry (the column is set to
        // the value it already has).
        let fields = StatusFields {
            attempt: fields.attempt.or(Some(rec.attempt_count)),
            ..fields
        };
        let fence = attempt.map(|(a, own)| Fence {
            attempt: a.attempt,
            session: own.then_some(self.session_id()),
        });
        let moved = dao.move_status(
            &rec.execution_id,
            mv,
            fence,
            &fields,
            self.session_id(),
            now,
        )?;
        if !moved {
            return Err(Error::InvalidTransition {
                execution_id: rec.execution_id.clone(),
                from: rec.status,
                transition,
            });
        }
        if matches!(
            mv.to(),
            ExecutionStatus::CancelledBeforeCommit | ExecutionStatus::FailedBeforeCommit
        ) {
            self.settle_cancelled_operation(dao, &rec.operation_id, now)?;
        }
        Ok(mv.to())
    }

    /// An operation stopped while an effect was possible is
    /// `cancelled_after_side_effect`; once none of its executions can have
    /// an effect any more (nothing committed, running or unknown, no batch
    /// item committed, no effect kept as evidence), it is plain `cancelled`
    /// again.
    fn settle_cancelled_operation(&self, dao: &Dao<'_>, op: &OperationId, now: i64) -> Result<()> {
        if dao.operation_status(op)? != Some(OperationStatus::CancelledAfterSideEffect) {
            return Ok(());
        }
        for rec in dao.executions_of(op)? {
            let possible = matches!(
                rec.status,
                ExecutionStatus::Committed
                    | ExecutionStatus::ResultDelivered
                    | ExecutionStatus::Executing
                    | ExecutionStatus::OutcomeUnknown
            ) || (rec.status == ExecutionStatus::FailedBeforeCommit
                && dao.has_batch_items(&rec.execution_id)?)
                // Settled as absent, but an effect was found afterwards
                // (kept as evidence): the effect exists all the same.
                || dao.has_effect_evidence(&rec.execution_id)?;
            if possible {
                return Ok(());
            }
        }
        dao.set_operation_status(op, OperationStatus::Cancelled, now)?;
        Ok(())
    }
}
