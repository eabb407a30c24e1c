//! What the executor hands back: per-call outcomes, its configuration and
//! its metrics, as FFI values.

use std::time::Duration;

use toolledger_core::executor as core;
use toolledger_core::model::{ArgsDigest, ExecutionId};

/// How the executor retries and times out. Every field has a default.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct ExecutorConfig {
    /// Attempts per side-effecting execution (first try included).
    #[uniffi(default = 3)]
    pub max_attempts: u32,
    /// Attempts per read-only call.
    #[uniffi(default = 3)]
    pub read_only_max_attempts: u32,
    /// Time allowed for one `perform`, in ms; past it the outcome is unknown.
    /// None waits forever.
    #[uniffi(default = Some(30000))]
    pub perform_timeout_ms: Option<u64>,
    /// First backoff delay in ms; doubles per attempt.
    #[uniffi(default = 200)]
    pub backoff_base_ms: u64,
    /// Largest backoff delay in ms.
    #[uniffi(default = 5000)]
    pub backoff_max_ms: u64,
    /// How many calls of one round run at the same time.
    #[uniffi(default = 4)]
    pub max_parallel: u32,
}

impl From<ExecutorConfig> for core::ExecutorConfig {
    fn from(c: ExecutorConfig) -> core::ExecutorConfig {
        core::ExecutorConfig {
            max_attempts: c.max_attempts,
            read_only_max_attempts: c.read_only_max_attempts,
            perform_timeout: c.perform_timeout_ms.map(Duration::from_millis),
            backoff_base: Duration::from_millis(c.backoff_base_ms),
            backoff_max: Duration::from_millis(c.backoff_max_ms),
            max_parallel: usize::try_from(c.max_parallel).unwrap_or(usize::MAX),
        }
    }
}

/// The result of running (or replaying, or refusing) one tool call.
#[derive(Clone, PartialEq, Eq, uniffi::Enum)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub enum CallOutcome {
    /// A result for the model. `replayed` is true when it is the stored
    /// result of an earlier run (nothing ran now).
    Completed {
        /// The execution.
        execution_id: ExecutionId,
        /// The result JSON, byte for byte as committed.
        result_json: String,
        /// The downstream's id for the effect.
        external_id: Option<String>,
        /// True for a replay of a stored result.
        replayed: bool,
        /// True for an independent batch that committed only some of its
        /// items: `result_json` says which happened and which did not.
        partial: bool,
    },
    /// The call waits for a human: show the preview, then `approve` this
    /// digest (which runs it).
    NeedsApproval {
        /// The execution.
        execution_id: ExecutionId,
        /// Tool name.
        tool_name: String,
        /// The digest the approval must name.
        args_digest: ArgsDigest,
        /// The tool's preview for the approval prompt.
        preview_json: Option<String>,
    },
    /// A background job runs downstream; its result arrives by polling or
    /// webhook (`record_job_update`, `ingest_webhook`).
    Pending {
        /// The execution.
        execution_id: ExecutionId,
        /// The downstream's job id.
        job_id: String,
    },
    /// The effect may or may not have happened and nothing could tell yet.
    /// With `retry_after_ms`, ask again after that long (a request already
    /// sent may still land until then; nothing is sent meanwhile). Without
    /// it, the app resolves it (`resolve_unknown`, naming `attempt`),
    /// usually by asking the user.
    Unknown {
        /// The execution.
        execution_id: ExecutionId,
        /// The attempt whose outcome is unknown.
        attempt: u32,
        /// Why it is unknown.
        reason: String,
        /// When to ask again, in ms, if waiting can settle it.
        retry_after_ms: Option<u64>,
    },
    /// Provably not committed.
    Failed {
        /// The execution.
        execution_id: ExecutionId,
        /// Why.
        reason: String,
        /// Whether a later run may try again (same key).
        retryable: bool,
    },
    /// The call id is known with different arguments; nothing ran.
    Conflict {
        /// The execution.
        execution_id: ExecutionId,
        /// Digest of the recorded arguments.
        stored_digest: ArgsDigest,
        /// Digest of the offered arguments.
        new_digest: ArgsDigest,
    },
    /// Another live session is running it (or a suspended one: ask again
    /// after `retry_after_ms`; its claim ends once its lease lapsed and its
    /// process is gone).
    InFlight {
        /// The execution.
        execution_id: ExecutionId,
        /// When to ask again, in ms, if known.
        retry_after_ms: Option<u64>,
    },
    /// A human rejected it.
    Rejected {
        /// The execution.
        execution_id: ExecutionId,
    },
    /// It or its operation was cancelled and it did not happen: it never
    /// ran, or a lookup after the stop found nothing.
    Cancelled {
        /// The execution.
        execution_id: ExecutionId,
    },
}

impl From<core::CallOutcome> for CallOutcome {
    fn from(o: core::CallOutcome) -> CallOutcome {
        use core::CallOutcome as C;
        match o {
            C::Completed {
                execution_id,
                result_json,
                external_id,
                replayed,
                partial,
            } => CallOutcome::Completed {
                execution_id,
                result_json,
                external_id,
                replayed,
                partial,
            },
            C::NeedsApproval {
                execution_id,
                tool_name,
                args_digest,
                preview_json,
            } => CallOutcome::NeedsApproval {
                execution_id,
                tool_name,
                args_digest,
                preview_json,
            },
            C::Pending {
                execution_id,
                job_id,
            } => CallOutcome::Pending {
                execution_id,
                job_id,
            },
            C::Unknown {
                execution_id,
                attempt,
                reason,
                retry_after,
            } => CallOutcome::Unknown {
                execution_id,
                attempt,
                reason,
                retry_after_ms: retry_after.map(super::records::millis),
            },
            C::Failed {
                execution_id,
                reason,
                retryable,
            } => CallOutcome::Failed {
                execution_id,
                reason,
                retryable,
            },
            C::Conflict {
                execution_id,
                stored_digest,
                new_digest,
            } => CallOutcome::Conflict {
                execution_id,
                stored_digest,
                new_digest,
            },
            C::InFlight {
                execution_id,
                retry_after,
            } => CallOutcome::InFlight {
                execution_id,
                retry_after_ms: retry_after.map(super::records::millis),
            },
            C::Rejected { execution_id } => CallOutcome::Rejected { execution_id },
            C::Cancelled { execution_id } => CallOutcome::Cancelled { execution_id },
        }
    }
}

/// Latency figures of one tool's `perform` calls.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct LatencySummary {
    /// Tool name.
    pub tool: String,
    /// Number of calls measured.
    pub count: u64,
    /// Mean, microseconds.
    pub mean_us: u64,
    /// Median (bucket upper bound), microseconds.
    pub p50_us: u64,
    /// 99th percentile (bucket upper bound), microseconds.
    pub p99_us: u64,
}

/// A point-in-time copy of the executor's metrics (ids, counts and timings
/// only; never argument or result values).
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct MetricsSnapshot {
    /// `perform` attempts started (read-only and side-effecting).
    pub attempts: u64,
    /// Results handed back from storage without running anything.
    pub replays: u64,
    /// Attempts whose outcome became unknown: reported so by the tool, or
    /// found left executing by a process that died (by `recover` or when
    /// the call is asked for again).
    pub outcome_unknown: u64,
    /// Reconciliations whose lookup found the effect.
    pub reconciled_found: u64,
    /// Reconciliations whose lookup proved the effect absent.
    pub reconciled_not_found: u64,
    /// Lookups that failed.
    pub reconcile_failures: u64,
    /// Calls refused because their id is known with other arguments.
    pub conflicts: u64,
    /// Calls refused because another live session runs them.
    pub in_flight: u64,
    /// Duplicates prevented: replays + in-flight refusals + conflicts.
    pub prevented_duplicates: u64,
    /// Webhook events ignored because they were processed before.
    pub duplicate_webhooks: u64,
    /// Side-effect latency per tool.
    pub latency: Vec<LatencySummary>,
}

impl From<core::MetricsSnapshot> for MetricsSnapshot {
    fn from(m: core::MetricsSnapshot) -> MetricsSnapshot {
        MetricsSnapshot {
            attempts: m.attempts,
            replays: m.replays,
            outcome_unknown: m.outcome_unknown,
            reconciled_found: m.reconciled_found,
            reconciled_not_found: m.reconciled_not_found,
            reconcile_failures: m.reconcile_failures,
            conflicts: m.conflicts,
            in_flight: m.in_flight,
            prevented_duplicates: m.prevented_duplicates,
            duplicate_webhooks: m.duplicate_webhooks,
            latency: m
                .latency
                .into_iter()
                .map(|l| LatencySummary {
                    tool: l.tool,
                    count: l.count,
                    mean_us: l.mean_us,
                    p50_us: l.p50_us,
                    p99_us: l.p99_us,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_match_the_core() {
        // The `#[uniffi(default = …)]` literals above must track the core.
        let core = core::ExecutorConfig::default();
        assert_eq!(core.max_attempts, 3);
        assert_eq!(core.read_only_max_attempts, 3);
        assert_eq!(core.perform_timeout, Some(Duration::from_millis(30000)));
        assert_eq!(core.backoff_base, Duration::from_millis(200));
        assert_eq!(core.backoff_max, Duration::from_millis(5000));
        assert_eq!(core.max_parallel, 4);
    }
}
