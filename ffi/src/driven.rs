//! Caller-driven calls on the exported [`ToolExecutor`]: the app's layer runs
//! the tool inline, on its own thread, and reports what it did.
//!
//! `execute` is async: it hops to the library's tokio runtime and calls the
//! tool back into Swift, Kotlin or Python from a library thread. These
//! methods are synchronous (one short SQLite transaction each, like the
//! `Ledger` methods: call them off the main thread) and never call back:
//! `start` answers a replay at once, and hands out an attempt to perform;
//! the caller runs its tool and `report`s. The rules are `execute`'s, decided
//! by the same core code (see the core's `executor::driven`): the intent is
//! durable before `Perform`; a report names its attempt (`CallerAttempt`,
//! the fencing token) and a stale one is refused and kept as evidence; a
//! second caller of the same call gets `InFlight`; a process that dies
//! between the effect and the report is reconciled by the next `start` or
//! `recover`.
//!
//! Report every `Perform` (`Unknown` when the tool threw or the caller gave
//! up): until then the call is `InFlight` in this process. Independent
//! batch tools run through `execute` only.

use toolledger_core::executor as core;
use toolledger_core::model::{ExecutionId, OperationId};

use super::error::LedgerError;
use super::executor::ToolExecutor;
use super::outcome::CallOutcome;
use super::records::ToolCall;
use super::tool::{LookupOutcome, PerformOutcome, ToolRequest};

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// One attempt (or lookup) the caller runs itself. Its execution id and
/// attempt number are the attempt's fencing token: hand it back unchanged.
// No `Debug`: it holds argument values, which are never logged.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
pub struct CallerAttempt {
    /// What the tool gets: arguments, the downstream key to send, the
    /// attempt number.
    pub request: ToolRequest,
    /// A read-only call: nothing is recorded for it.
    pub read_only: bool,
}

impl From<core::CallerAttempt> for CallerAttempt {
    fn from(a: core::CallerAttempt) -> CallerAttempt {
        CallerAttempt {
            request: a.request.into(),
            read_only: a.read_only,
        }
    }
}

impl From<CallerAttempt> for core::CallerAttempt {
    fn from(a: CallerAttempt) -> core::CallerAttempt {
        core::CallerAttempt {
            request: a.request.into(),
            read_only: a.read_only,
        }
    }
}

/// What the caller does next for one call.
// No `Debug`: it holds argument or result values, which are never logged.
#[derive(Clone, PartialEq, Eq, uniffi::Enum)]
pub enum CallerStep {
    /// Run the tool now with `attempt.request` (its intent is durable), then
    /// `report` what it did.
    Perform {
        /// The attempt.
        attempt: CallerAttempt,
    },
    /// An earlier attempt's outcome is unknown and the tool can look effects
    /// up: run the lookup with `attempt.request`, then `report_lookup`.
    Lookup {
        /// The attempt whose outcome is unknown.
        attempt: CallerAttempt,
    },
    /// A retryable failure with attempts left: wait `after_ms`, then `retry`.
    Retry {
        /// The attempt that failed.
        attempt: CallerAttempt,
        /// The backoff, in ms.
        after_ms: u64,
    },
    /// Finished: the answer for the model (or the app).
    Done {
        /// The outcome.
        outcome: CallOutcome,
    },
}

impl From<core::CallerStep> for CallerStep {
    fn from(s: core::CallerStep) -> CallerStep {
        match s {
            core::CallerStep::Perform(a) => CallerStep::Perform { attempt: a.into() },
            core::CallerStep::Lookup(a) => CallerStep::Lookup { attempt: a.into() },
            core::CallerStep::Retry { attempt, after } => CallerStep::Retry {
                attempt: attempt.into(),
                after_ms: super::records::millis(after),
            },
            core::CallerStep::Done(outcome) => CallerStep::Done {
                outcome: outcome.into(),
            },
        }
    }
}

#[uniffi::export]
impl ToolExecutor {
    /// Starts one tool call that the caller runs itself: validates and
    /// begins it as `execute` does and answers what to do next (a replay,
    /// or an attempt to perform, …). Nothing runs here.
    ///
    /// # Errors
    /// `UnknownTool` and `InvalidInput` (nothing recorded; also for an
    /// independent batch tool), `Storage` (nothing handed out without its
    /// durable intent).
    pub fn start(
        &self,
        operation_id: OperationId,
        round: u32,
        call: ToolCall,
    ) -> Result<CallerStep> {
        Ok(self.inner.start(&operation_id, round, call.into())?.into())
    }

    /// `start` for every call of one model response: every call checked
    /// first (a bad call anywhere: nothing recorded), the side-effecting
    /// ones begun in one durable transaction (one sync for the round), one
    /// first step per call, in call order. Walk each step as `start`'s, in
    /// parallel if the tools allow (keeping `max_parallel` is the
    /// caller's). If a call's step fails after the round was begun, the
    /// attempts handed out for the others are recorded as never sent and
    /// the error is thrown: nothing is left in flight.
    ///
    /// # Errors
    /// As `start`, for any call of the round.
    pub fn start_round(
        &self,
        operation_id: OperationId,
        round: u32,
        calls: Vec<ToolCall>,
    ) -> Result<Vec<CallerStep>> {
        let calls = calls.into_iter().map(Into::into).collect();
        Ok(self
            .inner
            .start_round(&operation_id, round, calls)?
            .into_iter()
            .map(Into::into)
            .collect())
    }

    /// `start` answered at once, without waiting: a replay of a call that
    /// committed with the same arguments (exactly `start`'s answer), read
    /// only if the ledger's connection is free at this moment; `None` for
    /// anything else (a new call, a read-only tool, any other stored state)
    /// and whenever answering would wait for the disk or another call —
    /// then call `start` where waiting is allowed. Writes nothing. For a
    /// caller that must not block, such as an app's main thread.
    ///
    /// # Errors
    /// As `start` for bad input and an unknown tool (nothing recorded);
    /// `Suspended` for a suspended ledger, as `start`; `Storage`.
    pub fn start_now(
        &self,
        operation_id: OperationId,
        round: u32,
        call: ToolCall,
    ) -> Result<Option<CallerStep>> {
        Ok(self
            .inner
            .start_now(&operation_id, round, &call.into())?
            .map(Into::into))
    }

    /// Reports what the tool did for a `Perform` attempt (`Unknown` when it
    /// threw or the caller gave up) and answers what to do next. A stale
    /// report (another attempt superseded it) changes nothing — a result it
    /// carried is kept as evidence — and gets the current truth.
    ///
    /// # Errors
    /// `InvalidInput` for an attempt the execution never had, or whose kind
    /// is not its tool's; `NotFound`, `UnknownTool`, `Storage`.
    pub fn report(&self, attempt: CallerAttempt, outcome: PerformOutcome) -> Result<CallerStep> {
        Ok(self
            .inner
            .report(&attempt.into(), Ok(outcome.into()))?
            .into())
    }

    /// `report` for a side-effecting `Perform` attempt named by its fencing
    /// token alone: `attempt.request.execution_id` and
    /// `attempt.request.attempt`. The same rules; a language saves passing
    /// the whole attempt back. A read-only attempt is reported with
    /// `report` (nothing is stored for a token to name).
    ///
    /// # Errors
    /// As `report` (`NotFound` for a read-only call's id too).
    pub fn report_attempt(
        &self,
        execution_id: ExecutionId,
        attempt: u32,
        outcome: PerformOutcome,
    ) -> Result<CallerStep> {
        Ok(self
            .inner
            .report_attempt(&execution_id, attempt, Ok(outcome.into()))?
            .into())
    }

    /// Reports that the caller was interrupted (cancelled, a
    /// `KeyboardInterrupt`) while it ran side-effecting `Perform` attempt
    /// `attempt` of `execution_id`: the outcome is unknown, and unlike a
    /// `report_attempt` of `Unknown` nothing is handed out (no same-key
    /// resend an interrupted caller would not run); the next ask reconciles
    /// it. An attempt this executor has not outstanding changes nothing and
    /// gets the current truth. Keep argument values out of `reason`.
    ///
    /// # Errors
    /// `NotFound`, `UnknownTool`, `Storage`.
    pub fn report_interrupted(
        &self,
        execution_id: ExecutionId,
        attempt: u32,
        reason: String,
    ) -> Result<CallerStep> {
        Ok(self
            .inner
            .report_interrupted(&execution_id, attempt, &reason)?
            .into())
    }

    /// Reports that the caller never sent side-effecting `Perform` attempt
    /// `attempt` of `execution_id` (it was interrupted — cancelled, a
    /// `KeyboardInterrupt` — after it got the attempt and before the request
    /// left). Nothing more is handed out: a same-key resend after an unknown
    /// outcome leaves the call unknown (the next ask reconciles it: a resend
    /// under the same key, a lookup, or the unknown outcome for the app),
    /// any other attempt is recorded failed before commit, retryable (the
    /// next ask runs it). Report an attempt that may have been sent with
    /// `report_attempt` and `Unknown` instead. An attempt this executor has
    /// not outstanding changes nothing and gets the current truth. Keep
    /// argument values out of `reason`: it is stored.
    ///
    /// # Errors
    /// `NotFound`, `UnknownTool`, `Storage`.
    pub fn abandon_attempt(
        &self,
        execution_id: ExecutionId,
        attempt: u32,
        reason: String,
    ) -> Result<CallerStep> {
        Ok(self
            .inner
            .abandon_attempt(&execution_id, attempt, &reason)?
            .into())
    }

    /// Reports what the lookup found for a `Lookup` and answers what to do
    /// next (commit a found effect, resend under the same key, or the
    /// unknown outcome).
    ///
    /// # Errors
    /// As `report`.
    pub fn report_lookup(
        &self,
        attempt: CallerAttempt,
        found: LookupOutcome,
    ) -> Result<CallerStep> {
        Ok(self
            .inner
            .report_lookup(&attempt.into(), Ok(found.into()))?
            .into())
    }

    /// Reports that the lookup for a `Lookup` failed (the outcome stays
    /// unknown). Keep argument values out of `message`: it is stored.
    ///
    /// # Errors
    /// As `report`.
    pub fn report_lookup_error(
        &self,
        attempt: CallerAttempt,
        message: String,
    ) -> Result<CallerStep> {
        Ok(self
            .inner
            .report_lookup(&attempt.into(), Err(core::ToolError::new(message)))?
            .into())
    }

    /// After a `Retry`'s wait: starts the next attempt (unless the operation
    /// was cancelled meanwhile) and answers what to do next.
    ///
    /// # Errors
    /// As `report`.
    pub fn retry(&self, attempt: CallerAttempt) -> Result<CallerStep> {
        Ok(self.inner.retry(&attempt.into())?.into())
    }
}
