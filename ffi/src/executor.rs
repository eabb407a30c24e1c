//! The exported [`ToolExecutor`]: registers foreign tools and runs model tool
//! calls under the whole protocol (durable intent → perform → durable result,
//! replay, approval, reconciliation of unknown outcomes).
//!
//! Async methods are driven by a tokio runtime inside the library, so they
//! can be awaited from Swift concurrency, Kotlin coroutines or Python asyncio
//! without blocking the caller's thread. Python apps must call
//! `uniffi_set_event_loop(loop)` once, so tools' async `perform` can be
//! scheduled on their loop from the library's threads.

use std::sync::Arc;

use toolledger_core::executor as core;
use toolledger_core::model::{ArgsDigest, ExecutionId, OperationId};

use super::error::LedgerError;
use super::execution::{JobApplied, JobUpdate, OperationStatus};
use super::ledger::Ledger;
use super::outcome::{CallOutcome, ExecutorConfig, MetricsSnapshot};
use super::records::{Resolution, ToolCall};
use super::tool::{ForeignTool, ToolHandler};

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// Runs registered tools under the effectively-once protocol.
#[derive(Debug, uniffi::Object)]
pub struct ToolExecutor {
    pub(crate) inner: core::Executor,
}

#[uniffi::export]
impl ToolExecutor {
    /// An executor over `ledger`, with no tools registered yet.
    #[uniffi::constructor]
    pub fn new(ledger: Arc<Ledger>, config: ExecutorConfig) -> Arc<ToolExecutor> {
        Arc::new(ToolExecutor {
            inner: core::Executor::new(ledger.inner.clone(), config.into()),
        })
    }

    /// Registers a tool under its descriptor's name (the descriptor is read
    /// now, once).
    ///
    /// # Errors
    /// `InvalidInput` when the name is already registered or `descriptor()`
    /// threw.
    pub fn register(&self, tool: Arc<dyn ToolHandler>) -> Result<()> {
        let adapter = ForeignTool::new(tool).map_err(|e| LedgerError::InvalidInput {
            message: format!("the tool's descriptor() failed: {e}"),
        })?;
        Ok(self.inner.register(Arc::new(adapter))?)
    }

    /// Counters and latency figures so far.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics().into()
    }

    /// The configured `perform_timeout_ms` (`None`: no bound): how long one
    /// attempt of a tool may take before its outcome is unknown. A language
    /// layer that runs a suspending tool itself, through the caller-driven
    /// steps, bounds the tool by it as the library bounds the tools it calls.
    pub fn perform_timeout_ms(&self) -> Option<u64> {
        self.inner
            .config()
            .perform_timeout
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// The configured `max_parallel` (at least 1): how many tools of one
    /// round run at once. A language layer that walks a round's calls
    /// itself (`start_round`) keeps the same bound.
    pub fn max_parallel(&self) -> u32 {
        u32::try_from(self.inner.config().max_parallel.max(1)).unwrap_or(u32::MAX)
    }

    /// Applies a webhook event to its execution exactly once (a repeated
    /// `(source, event_id)` is ignored).
    ///
    /// # Errors
    /// `NotFound`, `InvalidInput` for a result that is not JSON, `Storage`.
    pub fn ingest_webhook(
        &self,
        source: String,
        event_id: String,
        execution_id: ExecutionId,
        update: JobUpdate,
    ) -> Result<JobApplied> {
        Ok(self
            .inner
            .ingest_webhook(&source, &event_id, &execution_id, &update.into())?
            .into())
    }

    /// Applies a background job's state obtained by polling.
    ///
    /// # Errors
    /// As `ingest_webhook`.
    pub fn record_job_update(
        &self,
        execution_id: ExecutionId,
        update: JobUpdate,
    ) -> Result<JobApplied> {
        Ok(self
            .inner
            .record_job_update(&execution_id, &update.into())?
            .into())
    }

    /// Cancels an operation: calls not yet running are cancelled; a call in
    /// flight finishes honestly (if it commits, the operation becomes
    /// `CancelledAfterSideEffect`).
    ///
    /// # Errors
    /// `Storage`.
    pub fn cancel_operation(&self, operation_id: OperationId) -> Result<OperationStatus> {
        Ok(self.inner.cancel_operation(&operation_id)?.into())
    }
}

#[uniffi::export(async_runtime = "tokio")]
impl ToolExecutor {
    /// Runs one tool call: replays a stored result, asks for approval, or
    /// runs the tool with a durable intent first and a durable result after.
    ///
    /// # Errors
    /// `UnknownTool` and `InvalidInput` (nothing recorded), `Storage` (no
    /// tool runs without its durable intent).
    pub async fn execute(
        &self,
        operation_id: OperationId,
        round: u32,
        call: ToolCall,
    ) -> Result<CallOutcome> {
        let inner = self.inner.clone();
        let outcome =
            detached(async move { inner.execute(&operation_id, round, call.into()).await }).await?;
        Ok(outcome.into())
    }

    /// Runs every call of one model response: begun in one durable
    /// transaction, run in parallel, outcomes in call order. If any call
    /// names an unknown tool or has invalid arguments, nothing runs.
    ///
    /// # Errors
    /// As `execute`.
    pub async fn execute_round(
        &self,
        operation_id: OperationId,
        round: u32,
        calls: Vec<ToolCall>,
    ) -> Result<Vec<CallOutcome>> {
        let calls = calls.into_iter().map(Into::into).collect();
        let inner = self.inner.clone();
        let outcomes =
            detached(async move { inner.execute_round(&operation_id, round, calls).await }).await?;
        Ok(outcomes.into_iter().map(Into::into).collect())
    }

    /// Approves a waiting call for exactly `args_digest` and runs it.
    /// Approving again a call already approved for the same digest (a
    /// double tap) approves nothing more and answers where it stands:
    /// `InFlight` while it runs, its stored result once committed.
    ///
    /// # Errors
    /// `DigestMismatch` (nothing unlocked), `InvalidTransition` (rejected,
    /// or it never waited for an approval), `NotFound`, `UnknownTool`.
    pub async fn approve(
        &self,
        execution_id: ExecutionId,
        args_digest: ArgsDigest,
        preview_json: Option<String>,
    ) -> Result<CallOutcome> {
        let inner = self.inner.clone();
        let outcome = detached(async move {
            inner
                .approve(&execution_id, &args_digest, preview_json.as_deref())
                .await
        })
        .await?;
        Ok(outcome.into())
    }

    /// Runs an existing execution that may run now (approved, or a retryable
    /// failure), or reports where it stands.
    ///
    /// # Errors
    /// `NotFound`, `UnknownTool`, `Storage`.
    pub async fn run_existing(&self, execution_id: ExecutionId) -> Result<CallOutcome> {
        let inner = self.inner.clone();
        let outcome = detached(async move { inner.run_existing(&execution_id).await }).await?;
        Ok(outcome.into())
    }

    /// Call at app start and after resume: runs the ledger's `recover`, then
    /// reconciles unknown outcomes (lookup / same-key retry, or `Unknown`),
    /// runs approved calls, replays committed-but-undelivered results and
    /// reports pending approvals. An execution it cannot deal with (its tool
    /// is not registered, …) is listed in `failed`; every other one is
    /// recovered.
    ///
    /// # Errors
    /// `Storage` for the scan itself.
    pub async fn recover(&self) -> Result<Recovery> {
        let inner = self.inner.clone();
        let recovery = detached(async move { inner.recover().await }).await?;
        Ok(Recovery {
            outcomes: recovery.outcomes.into_iter().map(Into::into).collect(),
            failed: recovery
                .failed
                .into_iter()
                .map(|f| RecoveryFailure {
                    execution_id: f.execution_id,
                    error: f.error.to_string(),
                    kind: RecoveryFailureKind::of(f.error),
                })
                .collect(),
        })
    }

    /// Begins and runs a compensation (a refund for a payment) of the
    /// committed execution `original`, under the compensating tool's own
    /// descriptor: its own id, key and approval, linked to the original.
    ///
    /// # Errors
    /// `UnknownTool`; `InvalidInput` when `original` never committed or the
    /// call is malformed; `NotFound`; `Storage`.
    pub async fn compensate(
        &self,
        original: ExecutionId,
        operation_id: OperationId,
        round: u32,
        call: ToolCall,
    ) -> Result<CallOutcome> {
        let inner = self.inner.clone();
        let call = call.into();
        let outcome = detached(async move {
            inner
                .compensate(&original, &operation_id, round, call)
                .await
        })
        .await?;
        Ok(outcome.into())
    }

    /// Resolves the unknown outcome of attempt `attempt` (from the `Unknown`
    /// outcome) that the app settled (e.g. the user checked their bank):
    /// commit the found result, retry under the same key, or record the
    /// failure.
    ///
    /// # Errors
    /// `StaleAttempt` when another attempt has started since;
    /// `InvalidTransition` unless the outcome is unknown, `NotFound`.
    pub async fn resolve_unknown(
        &self,
        execution_id: ExecutionId,
        attempt: u32,
        resolution: Resolution,
    ) -> Result<CallOutcome> {
        let inner = self.inner.clone();
        let resolution = resolution.into();
        let attempt = toolledger_core::ledger::AttemptId::new(execution_id, attempt);
        let outcome =
            detached(async move { inner.resolve_unknown(&attempt, resolution).await }).await?;
        Ok(outcome.into())
    }
}

/// What `recover` did.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
// Printed redacted (ids, tool, status, sizes): see `redact`.
#[uniffi::export(Debug, Display)]
pub struct Recovery {
    /// One outcome per execution that needed attention.
    pub outcomes: Vec<CallOutcome>,
    /// Executions it could not deal with, and why; every other one was
    /// recovered.
    pub failed: Vec<RecoveryFailure>,
}

/// One execution `recover` could not deal with.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct RecoveryFailure {
    /// The execution.
    pub execution_id: ExecutionId,
    /// What kind of failure (act on this, not on the text).
    pub kind: RecoveryFailureKind,
    /// Why, for people (no argument or result values).
    pub error: String,
}

/// Runs the protocol as its own task on the library's tokio runtime, so that
/// a foreign caller that stops waiting (a cancelled Kotlin coroutine, a
/// cancelled Swift `Task`) only loses the answer: the attempt still ends
/// honestly (committed, failed or unknown) instead of being dropped halfway
/// and left `executing` while this process lives.
async fn detached<T, F>(work: F) -> Result<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = core::Result<T>> + Send + 'static,
{
    match tokio::spawn(work).await {
        Ok(result) => Ok(result?),
        Err(join) => Err(LedgerError::Internal {
            message: if join.is_panic() {
                "the executor task panicked".into()
            } else {
                "the executor task was cancelled".into()
            },
        }),
    }
}

/// Why `recover` could not deal with one execution.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Enum)]
pub enum RecoveryFailureKind {
    /// Its tool is not registered: register it and recover again.
    UnknownTool {
        /// The tool's name.
        name: String,
    },
    /// The database failed on this execution.
    Storage {
        /// What kind of storage failure.
        kind: super::error::StorageKind,
    },
    /// Anything else (see the message).
    Other,
}

impl RecoveryFailureKind {
    fn of(error: core::Error) -> RecoveryFailureKind {
        match LedgerError::from(error) {
            LedgerError::UnknownTool { name } => RecoveryFailureKind::UnknownTool { name },
            LedgerError::Storage { kind, .. } => RecoveryFailureKind::Storage { kind },
            _ => RecoveryFailureKind::Other,
        }
    }
}
