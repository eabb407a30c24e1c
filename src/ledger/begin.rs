//! `begin`: the one entry point that decides whether a tool call may run.
//!
//! The lookup of the execution id and the insert of a new record happen in
//! the same IMMEDIATE transaction, so two threads or processes beginning the
//! same call get exactly one `Execute`; the other sees the first one's
//! `executing` row and answers `InFlight`.

use super::answers::{ApprovalRequest, Begin, CallSpec, StoredResult, Ticket};
use super::retention;
use super::{Error, Ledger, Result, SWEEP_EVERY};
use crate::model::{
    check_transition, digest_arguments, CanonicalArgs, ExecutionId, ExecutionIdParts,
    ExecutionRecord, ExecutionStatus, OperationId, OperationStatus, Transition,
};
use crate::store::{Dao, Durability, NewExecution, StatusFields};

/// A call checked and digested before any write.
struct Prepared<'a> {
    spec: &'a CallSpec,
    id: ExecutionId,
    args: CanonicalArgs,
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
        if let Some(replays) = self.replays_only(&prepared)? {
            return Ok((replays, Vec::new()));
        }
        self.write_begins(op, round, &prepared, None)
    }

    /// A round whose every call already committed (with the same digest) is
    /// answered from a read transaction: a replay writes nothing, so it must
    /// not wait for — or fail on — another connection's write lock, a full
    /// disk or a read-only file. A committed record never changes, so the
    /// answer cannot go stale. `None` when any call needs the write path.
    fn replays_only(&self, calls: &[Prepared<'_>]) -> Result<Option<Vec<Begin>>> {
        self.store.read(|dao| {
            let mut answers = Vec::with_capacity(calls.len());
            for p in calls {
                match dao.execution(&p.id)? {
                    Some(rec) if rec.status.is_committed() && rec.args_digest == p.args.digest => {
                        answers.push(Begin::Replay(StoredResult {
                            execution_id: rec.execution_id,
                            result_json: rec.result_json.unwrap_or_default(),
                            external_id: rec.external_id,
                        }));
                    }
                    _ => return Ok(None),
                }
            }
            Ok(Some(answers))
        })
    }

    /// Begins a compensation of the committed execution `original`: a new
    /// execution with its own id (`<own>:compensates:<original>`), its own
    /// approval and downstream key, linked to the original.
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
        let rec = self
            .get(original)?
            .ok_or_else(|| Error::NotFound(original.clone()))?;
        if !rec.status.is_committed() {
            return Err(Error::NothingToCompensate(original.clone()));
        }
        let mut prepared = self.prepare(op, round, spec)?;
        prepared.id = ExecutionId::compensation(&prepared.id, original);
        let (mut answers, _) = self.write_begins(op, round, &[prepared], Some(original))?;
        answers
            .pop()
            .ok_or_else(|| Error::Internal("compensate produced no answer"))
    }

    fn prepare<'a>(
        &self,
        op: &OperationId,
        round: u32,
        spec: &'a CallSpec,
    ) -> Result<Prepared<'a>> {
        let id = ExecutionId::derive(&ExecutionIdParts {
            operation: op,
            round,
            call_id: &spec.call.call_id,
            tool_name: &spec.call.tool_name,
            tool_version: spec.tool_version,
        })?;
        let args = digest_arguments(
            &spec.call.tool_name,
            spec.tool_version,
            &spec.call.arguments,
            &self.config.json_limits,
        )?;
        Ok(Prepared { spec, id, args })
    }

    fn write_begins(
        &self,
        op: &OperationId,
        round: u32,
        calls: &[Prepared<'_>],
        compensates: Option<&ExecutionId>,
    ) -> Result<(Vec<Begin>, Vec<ExecutionId>)> {
        let now = self.now();
        let sweep = self.sweep_due(calls.len());
        self.write(Durability::Full, |dao| {
            if sweep {
                // Rides in this transaction: a few rows flagged at most.
                dao.sweep_attention(i64::from(SWEEP_EVERY))?;
            }
            let op_status = dao.ensure_operation(op, now)?;
            let mut marked = Vec::new();
            let answers = calls
                .iter()
                .map(|p| match dao.execution(&p.id)? {
                    Some(rec) => {
                        let was_executing = rec.status == ExecutionStatus::Executing;
                        let answer = self.answer_existing(dao, rec, p, op_status, now)?;
                        // Executing, answered Reconcile: its owner was dead and
                        // it was just marked unknown (a live owner is InFlight).
                        if was_executing && matches!(answer, Begin::Reconcile(_)) {
                            marked.push(p.id.clone());
                        }
                        Ok(answer)
                    }
                    None => match dao.tombstone(&p.id)? {
                        // Pruned long ago: refused or reported, never run again.
                        Some(tomb) => Ok(retention::answer_for_tombstone(tomb, &p.args.digest)),
                        None if matches!(
                            op_status,
                            OperationStatus::Cancelled | OperationStatus::CancelledAfterSideEffect
                        ) =>
                        {
                            Ok(Begin::Cancelled {
                                execution_id: p.id.clone(),
                            })
                        }
                        None => self.insert_new(dao, op, round, p, compensates, now),
                    },
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((answers, marked))
        })
    }

    fn insert_new(
        &self,
        dao: &Dao<'_>,
        op: &OperationId,
        round: u32,
        p: &Prepared<'_>,
        compensates: Option<&ExecutionId>,
        now: i64,
    ) -> Result<Begin> {
        let key = p.id.downstream_key();
        let executing = !p.spec.requires_approval;
        let lease = self.lease_deadline(now);
        dao.insert_execution(
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
                args_json: &p.args.json,
                downstream_key: &key,
                requires_approval: p.spec.requires_approval,
                status: if executing {
                    ExecutionStatus::Executing
                } else {
                    ExecutionStatus::Prepared
                },
                attempt_count: u32::from(executing),
                owner_session: executing.then_some(self.session_id()),
                lease_deadline_ms: executing.then_some(lease),
                compensates,
                now_ms: now,
            },
            self.session_id(),
        )?;
        if executing {
            Ok(Begin::Execute(Ticket {
                execution_id: p.id.clone(),
                downstream_key: key,
                attempt: 1,
                tool_name: p.spec.call.tool_name.clone(),
                tool_version: p.spec.tool_version,
                args_json: p.args.json.clone(),
                args_digest: p.args.digest.clone(),
                external_id: None,
            }))
        } else {
            Ok(Begin::NeedsApproval(ApprovalRequest {
                execution_id: p.id.clone(),
                tool_name: p.spec.call.tool_name.clone(),
                args_json: p.args.json.clone(),
                args_digest: p.args.digest.clone(),
            }))
        }
    }

    /// The DESIGN.md table: what a stored record means for a repeated call.
    fn answer_existing(
        &self,
        dao: &Dao<'_>,
        rec: ExecutionRecord,
        p: &Prepared<'_>,
        op_status: OperationStatus,
        now: i64,
    ) -> Result<Begin> {
        let id = rec.execution_id.clone();
        if rec.args_digest != p.args.digest {
            return Ok(Begin::Conflict {
                execution_id: id,
                stored_digest: rec.args_digest,
                new_digest: p.args.digest.clone(),
            });
        }
        use ExecutionStatus as S;
        let op_cancelled = matches!(
            op_status,
            OperationStatus::Cancelled | OperationStatus::CancelledAfterSideEffect
        );
        // In a cancelled operation nothing starts again: work that cannot
        // have run (or provably failed) is cancelled instead.
        if op_cancelled
            && matches!(
                rec.status,
                S::Prepared | S::Approved | S::FailedBeforeCommit
            )
        {
            self.step(
                dao,
                &rec,
                Transition::Cancel,
                StatusFields {
                    reason: Some("operation cancelled"),
                    ..StatusFields::default()
                },
                now,
            )?;
            return Ok(Begin::Cancelled { execution_id: id });
        }
        Ok(match rec.status {
            S::Committed | S::ResultDelivered => Begin::Replay(StoredResult {
                execution_id: id,
                result_json: rec.result_json.unwrap_or_default(),
                external_id: rec.external_id,
            }),
            S::Executing if self.owner_is_live(&rec, now) => Begin::InFlight { execution_id: id },
            S::Executing => {
                let reason = self.abandon_reason(&rec, now);
                self.step(
                    dao,
                    &rec,
                    Transition::MarkUnknown,
                    StatusFields {
                        reason: Some(reason),
                        ..StatusFields::default()
                    },
                    now,
                )?;
                Begin::Reconcile(Ticket::from_record(&rec))
            }
            S::OutcomeUnknown => Begin::Reconcile(Ticket::from_record(&rec)),
            S::Prepared if rec.requires_approval => Begin::NeedsApproval(ApprovalRequest {
                execution_id: id,
                tool_name: rec.tool_name,
                args_json: rec.args_json,
                args_digest: rec.args_digest,
            }),
            S::Prepared | S::Approved => {
                Begin::Execute(self.start_attempt(dao, &rec, Transition::Start, now)?)
            }
            S::FailedBeforeCommit if rec.retryable == Some(true) => {
                Begin::Execute(self.start_attempt(dao, &rec, Transition::Retry, now)?)
            }
            S::FailedBeforeCommit => Begin::Failed {
                execution_id: id,
                reason: rec.last_reason.unwrap_or_default(),
            },
            S::Rejected => Begin::Rejected { execution_id: id },
            S::CancelledBeforeCommit => Begin::Cancelled { execution_id: id },
        })
    }

    /// Moves `rec` into `executing` for its next attempt, owned by this
    /// session, and returns the ticket.
    pub(super) fn start_attempt(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        transition: Transition,
        now: i64,
    ) -> Result<Ticket> {
        let attempt = rec.attempt_count.saturating_add(1);
        self.step(
            dao,
            rec,
            transition,
            StatusFields {
                attempt: Some(attempt),
                lease_deadline_ms: Some(self.lease_deadline(now)),
                ..StatusFields::default()
            },
            now,
        )?;
        let mut ticket = Ticket::from_record(rec);
        ticket.attempt = attempt;
        Ok(ticket)
    }

    /// Applies one checked transition to `rec` inside the open transaction.
    pub(super) fn step(
        &self,
        dao: &Dao<'_>,
        rec: &ExecutionRecord,
        transition: Transition,
        fields: StatusFields<'_>,
        now: i64,
    ) -> Result<ExecutionStatus> {
        let to = check_transition(rec.status, transition)
            .map_err(|e| Error::transition(&rec.execution_id, e))?;
        // `rec` was read in this same transaction: passing its attempt number
        // spares the store a read-back for the log entry (the column is set to
        // the value it already has).
        let fields = StatusFields {
            attempt: fields.attempt.or(Some(rec.attempt_count)),
            ..fields
        };
        let moved = dao.move_status(
            &rec.execution_id,
            rec.status,
            transition,
            to,
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
        Ok(to)
    }
}
