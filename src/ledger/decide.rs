//! The one answer table: what a stored execution means for a request to run
//! it now (`begin` of the same call, `recover`, `run_existing`). Pure: the
//! caller reads the facts and applies the decision.
//!
//! | stored | answer |
//! |---|---|
//! | other arguments (digest differs) | `Conflict` |
//! | committed / result_delivered | `Replay` |
//! | prepared / approved, operation cancelled | cancel it → `Cancelled` |
//! | failed_before_commit, operation cancelled | cancel it → `Cancelled` (batch items committed: settle the partial commit → `Replay`) |
//! | executing, owner alive | `InFlight` |
//! | executing, owner suspended | `InFlight` (ask again after `retry_after`: the rest of its lease, or past it a whole lease while its process lives) |
//! | executing, owner dead | mark `outcome_unknown` → `Reconcile` |
//! | outcome_unknown | `Reconcile` |
//! | prepared, approval required | `NeedsApproval` |
//! | prepared / approved | start attempt 1 → `Execute` |
//! | failed_before_commit, retryable | next attempt, same key → `Execute` |
//! | failed_before_commit, not retryable | `Failed` (batch items committed: settle the partial commit → `Replay`) |
//! | rejected / cancelled_before_commit | `Rejected` / `Cancelled` |
//! | pruned (a tombstone): rejected / cancelled / failed | `Rejected` / `Cancelled` / `Failed` |
//! | pruned (a tombstone): it ran (result delivered, then pruned) | `Failed` ("already executed"): never runs again |

use super::owners::Liveness;
use crate::model::ExecutionStatus;

/// What is known about a stored execution and the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Its status.
    pub status: ExecutionStatus,
    /// For `failed_before_commit`: may it run again?
    pub retryable: Option<bool>,
    /// Does it need a human's approval before it runs?
    pub requires_approval: bool,
    /// Are the request's arguments the stored ones?
    pub same_digest: bool,
    /// Was its operation cancelled?
    pub op_cancelled: bool,
    /// Did items of it (an independent batch) commit?
    pub has_items: bool,
    /// Only its tombstone is left (pruned): `status` is its final status.
    pub pruned: bool,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Different arguments under the same id: refuse, never run.
    Conflict,
    /// Hand back the stored result.
    Replay,
    /// Its owner is running it; ask again after this long (a suspended owner).
    InFlight {
        /// Milliseconds to wait before asking again (a suspended owner: the
        /// rest of its lease, or past it a whole lease).
        retry_after_ms: Option<i64>,
    },
    /// Its owner is dead: the outcome is unknown; reconcile.
    Abandon {
        /// Why the owner counts as dead.
        reason: &'static str,
    },
    /// The outcome is unknown: reconcile before anything else.
    Reconcile,
    /// Waits for a human.
    NeedsApproval,
    /// Start the first attempt.
    Start,
    /// Start the next attempt under the same key.
    Retry,
    /// Failed for good.
    Failed,
    /// A human rejected it.
    Rejected,
    /// It was cancelled.
    Cancelled,
    /// Cancel it now (its operation was cancelled and nothing can have run).
    CancelNow,
    /// Record the partial commit of a batch whose items committed.
    SettlePartial,
    /// It ran and was pruned with its result: refuse, never run again.
    PrunedAfterRun,
}

/// What the app does next with a stored execution, by the same table (for
/// the inspector's `recover` and for apps that list what needs attention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NextStep {
    /// Hand the stored result to the model (again), then mark it delivered.
    HandBackResult,
    /// Nothing: it is finished (delivered, rejected, cancelled, failed for
    /// good).
    Nothing,
    /// A session is running it (or will, if its owner is found dead:
    /// `recover` makes it an unknown outcome first): wait.
    Wait,
    /// Its outcome is unknown: reconcile (lookup or same-key resend), else
    /// ask the user.
    Reconcile,
    /// Ask a human to approve it.
    AskForApproval,
    /// Run it (approved, ready, or a retryable failure: same key).
    Run,
    /// Its operation was cancelled: it will be cancelled when asked for.
    Cancel,
}

impl NextStep {
    /// A short phrase for people.
    pub fn as_str(self) -> &'static str {
        match self {
            NextStep::HandBackResult => "hand the stored result to the model, mark delivered",
            NextStep::Nothing => "nothing",
            NextStep::Wait => "in flight in a live session: wait",
            NextStep::Reconcile => "reconcile: lookup or same-key retry, else ask the user",
            NextStep::AskForApproval => "ask for approval",
            NextStep::Run => "run it (same key)",
            NextStep::Cancel => "cancel it (its operation was cancelled)",
        }
    }

    /// The step for a record, given the facts `decide` needs (the owner of
    /// an `executing` record is taken as alive).
    pub(crate) fn of(facts: &Facts) -> NextStep {
        match decide(facts, || Liveness::Alive) {
            Decision::Replay | Decision::SettlePartial => {
                if facts.status == ExecutionStatus::ResultDelivered {
                    NextStep::Nothing
                } else {
                    NextStep::HandBackResult
                }
            }
            Decision::InFlight { .. } | Decision::Abandon { .. } => NextStep::Wait,
            Decision::Reconcile => NextStep::Reconcile,
            Decision::NeedsApproval => NextStep::AskForApproval,
            Decision::Start | Decision::Retry => NextStep::Run,
            Decision::CancelNow => NextStep::Cancel,
            Decision::Conflict
            | Decision::Failed
            | Decision::Rejected
            | Decision::Cancelled
            | Decision::PrunedAfterRun => NextStep::Nothing,
        }
    }
}

/// The table. `owner` is asked only for an `executing` record.
pub(crate) fn decide(facts: &Facts, owner: impl FnOnce() -> Liveness) -> Decision {
    use ExecutionStatus as S;
    if !facts.same_digest {
        return Decision::Conflict;
    }
    if facts.pruned {
        // Only final records are pruned; what is left answers by its status.
        return match facts.status {
            S::Rejected => Decision::Rejected,
            S::CancelledBeforeCommit => Decision::Cancelled,
            S::FailedBeforeCommit => Decision::Failed,
            _ => Decision::PrunedAfterRun,
        };
    }
    let settle_or = |otherwise| {
        if facts.has_items {
            Decision::SettlePartial
        } else {
            otherwise
        }
    };
    match facts.status {
        S::Committed | S::ResultDelivered => Decision::Replay,
        S::Prepared | S::Approved if facts.op_cancelled => Decision::CancelNow,
        S::FailedBeforeCommit if facts.op_cancelled => settle_or(Decision::CancelNow),
        S::Executing => match owner() {
            Liveness::Alive => Decision::InFlight {
                retry_after_ms: None,
            },
            Liveness::Suspended { remaining_ms } => Decision::InFlight {
                retry_after_ms: Some(remaining_ms),
            },
            Liveness::Dead(reason) => Decision::Abandon { reason },
        },
        S::OutcomeUnknown => Decision::Reconcile,
        S::Prepared if facts.requires_approval => Decision::NeedsApproval,
        S::Prepared | S::Approved => Decision::Start,
        S::FailedBeforeCommit if facts.retryable == Some(true) => Decision::Retry,
        S::FailedBeforeCommit => settle_or(Decision::Failed),
        S::Rejected => Decision::Rejected,
        S::CancelledBeforeCommit => Decision::Cancelled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ExecutionStatus as S;

    fn facts(status: S) -> Facts {
        Facts {
            status,
            retryable: None,
            requires_approval: false,
            same_digest: true,
            op_cancelled: false,
            has_items: false,
            pruned: false,
        }
    }

    fn alive() -> Liveness {
        Liveness::Alive
    }

    #[test]
    fn nothing_runs_twice_and_nothing_runs_in_a_cancelled_operation() {
        for status in S::ALL {
            let f = Facts {
                op_cancelled: true,
                ..facts(status)
            };
            let d = decide(&f, alive);
            assert!(
                !matches!(d, Decision::Start | Decision::Retry),
                "{status}: {d:?}"
            );
            let f = Facts {
                same_digest: false,
                ..facts(status)
            };
            assert_eq!(decide(&f, alive), Decision::Conflict, "{status}");
        }
        for status in [S::Committed, S::ResultDelivered] {
            assert_eq!(decide(&facts(status), alive), Decision::Replay);
        }
    }

    #[test]
    fn an_executing_record_follows_its_owner() {
        let f = facts(S::Executing);
        assert_eq!(
            decide(&f, || Liveness::Alive),
            Decision::InFlight {
                retry_after_ms: None
            }
        );
        assert_eq!(
            decide(&f, || Liveness::Suspended { remaining_ms: 7 }),
            Decision::InFlight {
                retry_after_ms: Some(7)
            }
        );
        assert_eq!(
            decide(&f, || Liveness::Dead("x")),
            Decision::Abandon { reason: "x" }
        );
        // The owner is asked about nothing else.
        for status in S::ALL.into_iter().filter(|s| *s != S::Executing) {
            decide(&facts(status), || panic!("owner asked for {status}"));
        }
    }

    #[test]
    fn a_batch_whose_items_committed_is_never_told_as_failed_or_cancelled() {
        for (retryable, cancelled, expect) in [
            (Some(false), false, Decision::SettlePartial),
            (None, false, Decision::SettlePartial),
            (Some(true), true, Decision::SettlePartial),
            (Some(true), false, Decision::Retry),
        ] {
            let f = Facts {
                retryable,
                op_cancelled: cancelled,
                has_items: true,
                ..facts(S::FailedBeforeCommit)
            };
            assert_eq!(decide(&f, alive), expect, "{retryable:?} {cancelled}");
        }
        let f = Facts {
            retryable: Some(false),
            ..facts(S::FailedBeforeCommit)
        };
        assert_eq!(decide(&f, alive), Decision::Failed);
    }

    #[test]
    fn a_failure_for_good_has_nothing_left_to_do() {
        let f = Facts {
            retryable: Some(false),
            ..facts(S::FailedBeforeCommit)
        };
        assert_eq!(NextStep::of(&f), NextStep::Nothing);
        let f = Facts {
            retryable: Some(true),
            ..facts(S::FailedBeforeCommit)
        };
        assert_eq!(NextStep::of(&f), NextStep::Run);
        assert_eq!(NextStep::of(&facts(S::ResultDelivered)), NextStep::Nothing);
        assert_eq!(NextStep::of(&facts(S::Committed)), NextStep::HandBackResult);
    }

    #[test]
    fn a_tombstone_never_runs_again_and_still_refuses_other_arguments() {
        for status in S::ALL {
            let f = Facts {
                pruned: true,
                retryable: Some(true),
                ..facts(status)
            };
            let d = decide(&f, || panic!("a tombstone has no owner"));
            assert!(
                matches!(
                    d,
                    Decision::Rejected
                        | Decision::Cancelled
                        | Decision::Failed
                        | Decision::PrunedAfterRun
                ),
                "{status}: {d:?}"
            );
            let f = Facts {
                same_digest: false,
                ..f
            };
            assert_eq!(decide(&f, alive), Decision::Conflict, "{status}");
        }
        let f = Facts {
            pruned: true,
            ..facts(S::ResultDelivered)
        };
        assert_eq!(decide(&f, alive), Decision::PrunedAfterRun);
        assert_eq!(NextStep::of(&f), NextStep::Nothing);
    }

    #[test]
    fn approval_gates_only_prepared_records() {
        let f = Facts {
            requires_approval: true,
            ..facts(S::Prepared)
        };
        assert_eq!(decide(&f, alive), Decision::NeedsApproval);
        let f = Facts {
            requires_approval: true,
            ..facts(S::Approved)
        };
        assert_eq!(decide(&f, alive), Decision::Start);
    }
}
