//! The execution state machine: statuses and the one table of allowed moves.
//!
//! Every status change in the ledger goes through [`Move::check`]; the store
//! only writes a status from a [`Move`], which nothing else can construct, so
//! no write can bypass the table. The table is the whole lifecycle on one
//! screen:
//!
//! ```text
//! prepared ──► approved ──► executing ──► committed ──► result_delivered
//!    │                         │   ▲          ▲
//!    ├──► rejected             ├──►outcome_unknown ──► executing (not found: same key)
//!    ├──► cancelled_before_commit   └──► failed_before_commit (provably absent)
//!    └──► executing (no approval)
//!                              └──► failed_before_commit ──► executing (retry, same key)
//!                                        │
//!                                        └──► committed (settle_partial: an independent
//!                                             batch whose items committed)
//! ```
//!
//! Nothing leaves `committed` except towards `result_delivered`, and nothing
//! leaves `result_delivered`: a stored side effect is never downgraded to a
//! failure or a cancellation.

use std::fmt;

/// Where one execution stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExecutionStatus {
    /// Recorded, waiting for approval (or for `mark_executing`).
    Prepared,
    /// A human approved these exact arguments (bound to the digest).
    Approved,
    /// The durable intent: the side effect may be under way.
    Executing,
    /// The side effect committed and its result is stored.
    Committed,
    /// The stored result was handed to the model.
    ResultDelivered,
    /// A human refused the call; it never ran.
    Rejected,
    /// Cancelled while nothing could have reached the downstream.
    CancelledBeforeCommit,
    /// The request may have reached the downstream; nobody knows yet.
    OutcomeUnknown,
    /// Provably not committed (the downstream refused it, or it never left).
    FailedBeforeCommit,
}

impl ExecutionStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [ExecutionStatus; 9] = [
        ExecutionStatus::Prepared,
        ExecutionStatus::Approved,
        ExecutionStatus::Executing,
        ExecutionStatus::Committed,
        ExecutionStatus::ResultDelivered,
        ExecutionStatus::Rejected,
        ExecutionStatus::CancelledBeforeCommit,
        ExecutionStatus::OutcomeUnknown,
        ExecutionStatus::FailedBeforeCommit,
    ];

    /// The snake_case name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionStatus::Prepared => "prepared",
            ExecutionStatus::Approved => "approved",
            ExecutionStatus::Executing => "executing",
            ExecutionStatus::Committed => "committed",
            ExecutionStatus::ResultDelivered => "result_delivered",
            ExecutionStatus::Rejected => "rejected",
            ExecutionStatus::CancelledBeforeCommit => "cancelled_before_commit",
            ExecutionStatus::OutcomeUnknown => "outcome_unknown",
            ExecutionStatus::FailedBeforeCommit => "failed_before_commit",
        }
    }

    /// Parses a name written by [`ExecutionStatus::as_str`].
    pub fn parse(name: &str) -> Option<ExecutionStatus> {
        ExecutionStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
    }

    /// True for `committed` and `result_delivered`: a side effect happened
    /// and its result is stored.
    pub fn is_committed(self) -> bool {
        matches!(
            self,
            ExecutionStatus::Committed | ExecutionStatus::ResultDelivered
        )
    }

    /// False for the final statuses (`result_delivered`, `rejected`,
    /// `cancelled_before_commit`): nothing is left to do. Every other status
    /// is listed by `recover()`; the store indexes exactly these rows.
    pub fn needs_attention(self) -> bool {
        !matches!(
            self,
            ExecutionStatus::ResultDelivered
                | ExecutionStatus::Rejected
                | ExecutionStatus::CancelledBeforeCommit
        )
    }
}

impl fmt::Display for ExecutionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a status moved: recorded in the transition log with the move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// prepared → approved.
    Approve,
    /// prepared → rejected.
    Reject,
    /// prepared / approved / failed_before_commit → cancelled_before_commit.
    Cancel,
    /// prepared / approved → executing (first attempt).
    Start,
    /// failed_before_commit → executing, or outcome_unknown → executing after
    /// reconciliation found nothing (next attempt, same downstream key).
    Retry,
    /// executing / outcome_unknown → committed.
    Commit,
    /// committed → result_delivered.
    Deliver,
    /// executing → outcome_unknown.
    MarkUnknown,
    /// executing → failed_before_commit, or outcome_unknown →
    /// failed_before_commit when reconciliation proved the effect absent.
    FailBeforeCommit,
    /// failed_before_commit → committed: an independent batch some of whose
    /// items committed is recorded as the partial commit it is (which items
    /// happened, which did not), never as "nothing happened".
    SettlePartial,
}

impl Transition {
    /// The snake_case name stored in the transition log.
    pub fn as_str(self) -> &'static str {
        match self {
            Transition::Approve => "approve",
            Transition::Reject => "reject",
            Transition::Cancel => "cancel",
            Transition::Start => "start",
            Transition::Retry => "retry",
            Transition::Commit => "commit",
            Transition::Deliver => "deliver",
            Transition::MarkUnknown => "mark_unknown",
            Transition::FailBeforeCommit => "fail_before_commit",
            Transition::SettlePartial => "settle_partial",
        }
    }
}

/// A move that the table does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("transition {transition:?} is not allowed from {from}")]
pub struct InvalidTransition {
    /// The status the execution was in.
    pub from: ExecutionStatus,
    /// The move that was asked for.
    pub transition: Transition,
}

/// The table: every allowed `(from, transition) → to`. Anything else is refused.
const TABLE: &[(ExecutionStatus, Transition, ExecutionStatus)] = {
    use ExecutionStatus as S;
    use Transition as T;
    &[
        (S::Prepared, T::Approve, S::Approved),
        (S::Prepared, T::Reject, S::Rejected),
        (S::Prepared, T::Cancel, S::CancelledBeforeCommit),
        (S::Prepared, T::Start, S::Executing),
        (S::Approved, T::Start, S::Executing),
        (S::Approved, T::Cancel, S::CancelledBeforeCommit),
        (S::Executing, T::Commit, S::Committed),
        (S::Executing, T::MarkUnknown, S::OutcomeUnknown),
        (S::Executing, T::FailBeforeCommit, S::FailedBeforeCommit),
        (S::OutcomeUnknown, T::Commit, S::Committed),
        (S::OutcomeUnknown, T::Retry, S::Executing),
        (
            S::OutcomeUnknown,
            T::FailBeforeCommit,
            S::FailedBeforeCommit,
        ),
        (S::FailedBeforeCommit, T::Retry, S::Executing),
        (S::FailedBeforeCommit, T::Cancel, S::CancelledBeforeCommit),
        (S::FailedBeforeCommit, T::SettlePartial, S::Committed),
        (S::FailedBeforeCommit, T::Commit, S::Committed),
        (S::Committed, T::Deliver, S::ResultDelivered),
    ]
};

/// One allowed move, checked against the table. The only way to build one is
/// [`Move::check`], and the store writes statuses only from a `Move`: a
/// status write that skips the table does not compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a checked move must be written, or the refusal reported"]
pub struct Move {
    from: ExecutionStatus,
    transition: Transition,
    to: ExecutionStatus,
}

impl Move {
    /// Checks `transition` from `from` against the table.
    ///
    /// # Errors
    /// [`InvalidTransition`] for every `(from, transition)` not in the table.
    pub fn check(from: ExecutionStatus, transition: Transition) -> Result<Move, InvalidTransition> {
        TABLE
            .iter()
            .find(|(f, t, _)| *f == from && *t == transition)
            .map(|&(from, transition, to)| Move {
                from,
                transition,
                to,
            })
            .ok_or(InvalidTransition { from, transition })
    }

    /// The status the execution must be in.
    pub fn from(&self) -> ExecutionStatus {
        self.from
    }

    /// The move's name.
    pub fn transition(&self) -> Transition {
        self.transition
    }

    /// The status it leads to.
    pub fn to(&self) -> ExecutionStatus {
        self.to
    }
}

/// Checks one move against the table and returns the status it leads to.
///
/// # Errors
/// [`InvalidTransition`] for every `(from, transition)` not in the table.
#[must_use = "the new status must be written, or the refusal reported"]
pub fn check_transition(
    from: ExecutionStatus,
    transition: Transition,
) -> Result<ExecutionStatus, InvalidTransition> {
    Move::check(from, transition).map(|m| m.to())
}

/// Where one operation (conversation turn / workflow) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationStatus {
    /// Calls may still be begun.
    Open,
    /// The app finished the operation.
    Completed,
    /// Cancelled, and none of its executions can have had an effect.
    Cancelled,
    /// Cancelled while an effect may exist: an execution committed (in
    /// part, for a batch), or was running or had an unknown outcome when it
    /// was stopped (once none of them can have one, it is plain `Cancelled`
    /// again). A committed effect stays; undoing it is a compensation.
    CancelledAfterSideEffect,
}

impl OperationStatus {
    /// The snake_case name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            OperationStatus::Open => "open",
            OperationStatus::Completed => "completed",
            OperationStatus::Cancelled => "cancelled",
            OperationStatus::CancelledAfterSideEffect => "cancelled_after_side_effect",
        }
    }

    /// Parses a name written by [`OperationStatus::as_str`].
    pub fn parse(name: &str) -> Option<OperationStatus> {
        [
            OperationStatus::Open,
            OperationStatus::Completed,
            OperationStatus::Cancelled,
            OperationStatus::CancelledAfterSideEffect,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

impl fmt::Display for OperationStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ExecutionStatus as S;
    use Transition as T;

    const ALL_TRANSITIONS: [Transition; 10] = [
        T::Approve,
        T::Reject,
        T::Cancel,
        T::Start,
        T::Retry,
        T::Commit,
        T::Deliver,
        T::MarkUnknown,
        T::FailBeforeCommit,
        T::SettlePartial,
    ];

    #[test]
    fn every_allowed_move_leads_where_the_design_says() {
        let expected = [
            (S::Prepared, T::Approve, S::Approved),
            (S::Prepared, T::Reject, S::Rejected),
            (S::Prepared, T::Cancel, S::CancelledBeforeCommit),
            (S::Prepared, T::Start, S::Executing),
            (S::Approved, T::Start, S::Executing),
            (S::Approved, T::Cancel, S::CancelledBeforeCommit),
            (S::Executing, T::Commit, S::Committed),
            (S::Executing, T::MarkUnknown, S::OutcomeUnknown),
            (S::Executing, T::FailBeforeCommit, S::FailedBeforeCommit),
            (S::OutcomeUnknown, T::Commit, S::Committed),
            (S::OutcomeUnknown, T::Retry, S::Executing),
            (
                S::OutcomeUnknown,
                T::FailBeforeCommit,
                S::FailedBeforeCommit,
            ),
            (S::FailedBeforeCommit, T::Retry, S::Executing),
            (S::FailedBeforeCommit, T::Cancel, S::CancelledBeforeCommit),
            (S::FailedBeforeCommit, T::SettlePartial, S::Committed),
            (S::FailedBeforeCommit, T::Commit, S::Committed),
            (S::Committed, T::Deliver, S::ResultDelivered),
        ];
        for (from, t, to) in expected {
            assert_eq!(check_transition(from, t), Ok(to), "{from} {t:?}");
        }
        // Every other pair is refused.
        let mut allowed = 0;
        for from in S::ALL {
            for t in ALL_TRANSITIONS {
                match check_transition(from, t) {
                    Ok(_) => {
                        allowed += 1;
                        assert!(expected.iter().any(|(f, tt, _)| *f == from && *tt == t));
                    }
                    Err(e) => assert_eq!(
                        e,
                        InvalidTransition {
                            from,
                            transition: t
                        }
                    ),
                }
            }
        }
        assert_eq!(allowed, expected.len());
    }

    #[test]
    fn nothing_downgrades_a_committed_record() {
        for from in [S::Committed, S::ResultDelivered] {
            for t in ALL_TRANSITIONS {
                if let Ok(to) = check_transition(from, t) {
                    assert!(to.is_committed(), "{from} -> {to}");
                }
            }
        }
        for t in ALL_TRANSITIONS {
            assert!(check_transition(S::ResultDelivered, t).is_err());
        }
    }

    #[test]
    fn unknown_outcome_is_never_cancelled_or_started_fresh() {
        assert!(check_transition(S::OutcomeUnknown, T::Cancel).is_err());
        assert!(check_transition(S::OutcomeUnknown, T::Start).is_err());
        assert!(check_transition(S::Executing, T::Cancel).is_err());
    }

    #[test]
    fn names_round_trip() {
        for s in S::ALL {
            assert_eq!(S::parse(s.as_str()), Some(s));
        }
        assert_eq!(S::parse("failed"), None);
        for s in [
            OperationStatus::Open,
            OperationStatus::Completed,
            OperationStatus::Cancelled,
            OperationStatus::CancelledAfterSideEffect,
        ] {
            assert_eq!(OperationStatus::parse(s.as_str()), Some(s));
        }
    }
}
