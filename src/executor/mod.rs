//! The executor: runs registered tools under the whole protocol.
//!
//! Most apps never call the ledger's transitions by hand. They register their
//! tools and hand each model tool call to [`Executor::execute`] (or a whole
//! model response to [`Executor::execute_round`]); the executor applies
//! DESIGN.md's protocol by effect class:
//!
//! - **Read-only** tools run with no records and no syncs; transient failures
//!   are retried with bounded exponential backoff and jitter inside the call.
//! - **Side-effecting** tools go `begin` (durable intent with the downstream
//!   key) → `perform` (the tool sends the key) → `commit` (durable result) →
//!   result for the model. A timeout or transport error is `outcome_unknown`,
//!   never `failed`, and is reconciled before anything else: `lookup` when
//!   the tool supports it (found → commit, not found → retry under the same
//!   key), a retry under the same key when the downstream dedupes by key, and
//!   otherwise an explicit [`CallOutcome::Unknown`] that the app resolves.
//!   An unknown-outcome write is never retried blindly.
//!
//! ```no_run
//! # async fn demo(executor: toolledger::executor::Executor) -> Result<(), toolledger::executor::Error> {
//! use toolledger::executor::CallOutcome;
//! use toolledger::model::{OperationId, ToolCall};
//! let call = ToolCall::custom("call_1", "send_email", r#"{"to":"a@example.com"}"#);
//! match executor.execute(&OperationId::new("op_1")?, 0, call).await? {
//!     CallOutcome::Completed { result_json, replayed, .. } => { /* give result_json to the model */ }
//!     CallOutcome::NeedsApproval { .. } => { /* ask the user */ }
//!     other => { /* unknown, failed, conflict …: tell the app */ }
//! }
//! # Ok(()) }
//! ```

mod batch;
mod error;
mod metrics;
mod outcome;
mod protocol;
mod readonly;
mod tool;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use error::{Error, Result};
pub use metrics::{LatencySummary, Metrics, MetricsSnapshot};
pub use outcome::CallOutcome;
pub use tool::{
    BatchMode, EffectClass, LookupOutcome, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};

use crate::ledger::{Begin, CallSpec, JobApplied, JobUpdate, Ledger, Resolution, Resolved};
use crate::model::{
    ArgsDigest, ExecutionId, ExecutionStatus, OperationId, OperationStatus, ToolCall,
};

/// How the executor retries and times out.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Attempts per side-effecting execution (first try included), across
    /// retryable failures and same-key retries after reconciliation.
    pub max_attempts: u32,
    /// Attempts per read-only call.
    pub read_only_max_attempts: u32,
    /// Time allowed for one `perform`; past it the outcome is unknown.
    pub perform_timeout: Option<Duration>,
    /// First backoff delay; doubles per attempt.
    pub backoff_base: Duration,
    /// Largest backoff delay.
    pub backoff_max: Duration,
    /// How many calls of one round run at the same time.
    pub max_parallel: usize,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            max_attempts: 3,
            read_only_max_attempts: 3,
            perform_timeout: Some(Duration::from_secs(30)),
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
            max_parallel: 4,
        }
    }
}

struct Inner {
    ledger: Arc<Ledger>,
    tools: RwLock<HashMap<String, Arc<dyn ToolHandler>>>,
    config: ExecutorConfig,
    metrics: Metrics,
}

/// Runs tools under the protocol. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor").finish_non_exhaustive()
    }
}

impl Executor {
    /// An executor over `ledger`.
    pub fn new(ledger: Arc<Ledger>, config: ExecutorConfig) -> Executor {
        Executor {
            inner: Arc::new(Inner {
                ledger,
                tools: RwLock::new(HashMap::new()),
                config,
                metrics: Metrics::default(),
            }),
        }
    }

    /// The ledger underneath.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.inner.ledger
    }

    /// The configuration in force.
    pub fn config(&self) -> &ExecutorConfig {
        &self.inner.config
    }

    /// Counters and latency figures so far (no argument or result values).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    pub(crate) fn metrics_sink(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Registers a tool under its descriptor's name.
    ///
    /// # Errors
    /// [`Error::DuplicateTool`] when the name is taken.
    pub fn register(&self, tool: Arc<dyn ToolHandler>) -> Result<()> {
        let name = tool.descriptor().name;
        let mut tools = self
            .inner
            .tools
            .write()
            .map_err(|_| Error::Internal("tool registry lock poisoned".into()))?;
        if tools.contains_key(&name) {
            return Err(Error::DuplicateTool(name));
        }
        tools.insert(name, tool);
        Ok(())
    }

    fn tool(&self, name: &str) -> Result<Arc<dyn ToolHandler>> {
        self.inner
            .tools
            .read()
            .map_err(|_| Error::Internal("tool registry lock poisoned".into()))?
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownTool(name.to_owned()))
    }

    /// Runs one tool call (see the module docs for the protocol).
    ///
    /// # Errors
    /// [`Error::UnknownTool`] (nothing recorded), ledger errors (bad JSON or
    /// ids: nothing recorded; storage failures: no tool runs without its
    /// durable intent).
    pub async fn execute(
        &self,
        op: &OperationId,
        round: u32,
        call: ToolCall,
    ) -> Result<CallOutcome> {
        let mut out = self.execute_round(op, round, vec![call]).await?;
        out.pop()
            .ok_or_else(|| Error::Internal("round produced no outcome".into()))
    }

    /// Runs every call of one model response: side-effecting calls are begun
    /// in one durable transaction (one sync), then all calls run in parallel
    /// up to `max_parallel`. Outcomes come back in call order.
    ///
    /// # Errors
    /// As [`Executor::execute`]; if any call names an unknown tool or has
    /// invalid arguments, nothing of the round is recorded or run.
    pub async fn execute_round(
        &self,
        op: &OperationId,
        round: u32,
        calls: Vec<ToolCall>,
    ) -> Result<Vec<CallOutcome>> {
        let tools = calls
            .iter()
            .map(|c| self.tool(&c.tool_name))
            .collect::<Result<Vec<_>>>()?;
        let descriptors: Vec<ToolDescriptor> = tools.iter().map(|t| t.descriptor()).collect();
        // Oversized arguments are refused before anything copies them (a
        // hostile 100 MB argument must not cost another 100 MB first).
        let max = self.inner.ledger.config().json_limits.max_bytes;
        if let Some(call) = calls.iter().find(|c| c.arguments.len() > max) {
            return Err(crate::model::JsonError::TooLarge {
                size: call.arguments.len(),
                max,
            }
            .into());
        }
        // Read-only arguments are validated up front too, so a bad call
        // anywhere in the round stops the whole round before anything runs.
        let mut prepared_read_only = Vec::new();
        let mut specs = Vec::new();
        for (call, desc) in calls.iter().zip(&descriptors) {
            if desc.effect == EffectClass::ReadOnly {
                prepared_read_only.push(Some(readonly::prepare(self, op, round, call, desc)?));
            } else {
                prepared_read_only.push(None);
                specs.push(CallSpec {
                    call: call.clone(),
                    tool_version: desc.version,
                    requires_approval: desc.requires_approval,
                });
            }
        }
        // A round of only read-only calls writes nothing (no records, no sync).
        let begins = if specs.is_empty() {
            Vec::new()
        } else {
            let (begins, marked) = self.inner.ledger.begin_round_marking(op, round, &specs)?;
            // Attempts of a dead process found here (not by `recover`) whose
            // outcome just became unknown are counted too.
            for (spec, begin) in specs.iter().zip(&begins) {
                if let Begin::Reconcile(t) = begin {
                    if marked.contains(&t.execution_id) {
                        self.inner.metrics.outcome_unknown(&spec.call.tool_name);
                    }
                }
            }
            begins
        };
        let mut begins = begins.into_iter();
        // One call (the common case) runs inline: no task, no thread hop.
        if let ([tool], [desc], [ro]) = (
            tools.as_slice(),
            descriptors.as_slice(),
            prepared_read_only.as_mut_slice(),
        ) {
            let outcome = match ro.take() {
                Some(request) => readonly::run(self, tool.as_ref(), desc, request).await?,
                None => {
                    let begin = begins
                        .next()
                        .ok_or_else(|| Error::Internal("missing begin answer".into()))?;
                    self.drive(tool.as_ref(), desc, begin).await?
                }
            };
            return Ok(vec![outcome]);
        }
        let semaphore = Arc::new(tokio::sync::Semaphore::new(
            self.inner.config.max_parallel.max(1),
        ));
        let mut set = tokio::task::JoinSet::new();
        for (index, ((tool, desc), ro)) in tools
            .into_iter()
            .zip(descriptors)
            .zip(prepared_read_only)
            .enumerate()
        {
            let this = self.clone();
            let permit_source = semaphore.clone();
            let job: Job = match ro {
                Some(request) => Job::ReadOnly(request),
                None => Job::Begin(
                    begins
                        .next()
                        .ok_or_else(|| Error::Internal("missing begin answer".into()))?,
                ),
            };
            set.spawn(async move {
                let _permit = permit_source.acquire_owned().await;
                let out = match job {
                    Job::ReadOnly(request) => {
                        readonly::run(&this, tool.as_ref(), &desc, request).await
                    }
                    Job::Begin(begin) => this.drive(tool.as_ref(), &desc, begin).await,
                };
                (index, out)
            });
        }
        let mut outcomes: Vec<Option<CallOutcome>> = vec![None; calls.len()];
        let mut first_error = None;
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok((index, Ok(outcome))) => {
                    if let Some(slot) = outcomes.get_mut(index) {
                        *slot = Some(outcome);
                    }
                }
                Ok((_, Err(e))) => {
                    first_error.get_or_insert(e);
                }
                Err(join) => {
                    first_error.get_or_insert(Error::Internal(format!("tool task failed: {join}")));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        outcomes
            .into_iter()
            .map(|o| o.ok_or_else(|| Error::Internal("missing outcome".into())))
            .collect()
    }

    /// Approves a waiting call for exactly `digest` and runs it.
    ///
    /// # Errors
    /// Ledger errors (`DigestMismatch`, `InvalidTransition` …), unknown tool.
    pub async fn approve(
        &self,
        id: &ExecutionId,
        digest: &ArgsDigest,
        preview_json: Option<&str>,
    ) -> Result<CallOutcome> {
        self.inner.ledger.approve(id, digest, preview_json)?;
        self.run_existing(id).await
    }

    /// Runs an existing execution that may run now (approved, or a retryable
    /// failure), or reports where it stands.
    ///
    /// # Errors
    /// Ledger errors, unknown tool.
    pub async fn run_existing(&self, id: &ExecutionId) -> Result<CallOutcome> {
        let rec = self
            .inner
            .ledger
            .get(id)?
            .ok_or_else(|| crate::ledger::Error::NotFound(id.clone()))?;
        let tool = self.tool(&rec.tool_name)?;
        let desc = tool.descriptor();
        let begin = match rec.status {
            ExecutionStatus::Approved | ExecutionStatus::FailedBeforeCommit
                if rec.retryable != Some(false) =>
            {
                Begin::Execute(self.inner.ledger.mark_executing(id)?)
            }
            _ => protocol::begin_for_record(self, &rec)?,
        };
        self.drive(tool.as_ref(), &desc, begin).await
    }

    /// Runs `recover()` on the ledger and then deals with what it found:
    /// unknown outcomes are reconciled (lookup / same-key retry, or reported
    /// `Unknown`), approved calls run, committed-but-undelivered results come
    /// back as replays for the model, pending approvals as `NeedsApproval`.
    ///
    /// # Errors
    /// Ledger errors; an execution whose tool is not registered is an
    /// [`Error::UnknownTool`].
    pub async fn recover(&self) -> Result<Vec<CallOutcome>> {
        let (pending, marked) = self.inner.ledger.recover_marking()?;
        // Attempts of a dead process whose outcome became unknown: counted
        // here, where they are discovered (that process's metrics died).
        for rec in pending.iter().filter(|r| marked.contains(&r.execution_id)) {
            self.inner.metrics.outcome_unknown(&rec.tool_name);
        }
        let mut out = Vec::with_capacity(pending.len());
        for rec in pending {
            let tool = self.tool(&rec.tool_name)?;
            let desc = tool.descriptor();
            let begin = match rec.status {
                ExecutionStatus::Approved => {
                    Begin::Execute(self.inner.ledger.mark_executing(&rec.execution_id)?)
                }
                _ => protocol::begin_for_record(self, &rec)?,
            };
            out.push(self.drive(tool.as_ref(), &desc, begin).await?);
        }
        Ok(out)
    }

    /// Resolves an unknown outcome the app settled (e.g. the user checked
    /// their bank): commit the found result, retry under the same key, or
    /// record the failure.
    ///
    /// # Errors
    /// Ledger errors.
    pub async fn resolve_unknown(
        &self,
        id: &ExecutionId,
        resolution: Resolution,
    ) -> Result<CallOutcome> {
        match self.inner.ledger.resolve_unknown(id, resolution)? {
            Resolved::Committed(r) => Ok(CallOutcome::Completed {
                execution_id: r.execution_id,
                result_json: r.result_json,
                external_id: r.external_id,
                replayed: false,
            }),
            Resolved::Retry(ticket) => {
                let rec = self
                    .inner
                    .ledger
                    .get(id)?
                    .ok_or_else(|| crate::ledger::Error::NotFound(id.clone()))?;
                let tool = self.tool(&rec.tool_name)?;
                let desc = tool.descriptor();
                self.drive(tool.as_ref(), &desc, Begin::Execute(ticket))
                    .await
            }
            Resolved::Failed => {
                let rec = self.inner.ledger.get(id)?;
                Ok(CallOutcome::Failed {
                    execution_id: id.clone(),
                    reason: rec.and_then(|r| r.last_reason).unwrap_or_default(),
                    retryable: false,
                })
            }
        }
    }

    /// Applies a webhook event to its execution exactly once (a repeated
    /// `(source, event_id)` is ignored and counted).
    ///
    /// # Errors
    /// Ledger errors.
    pub fn ingest_webhook(
        &self,
        source: &str,
        event_id: &str,
        id: &ExecutionId,
        update: &JobUpdate,
    ) -> Result<JobApplied> {
        let applied = self
            .inner
            .ledger
            .ingest_webhook(source, event_id, id, update)?;
        if applied == JobApplied::DuplicateEvent {
            self.inner.metrics.duplicate_webhook();
        }
        Ok(applied)
    }

    /// Applies a job state obtained by polling.
    ///
    /// # Errors
    /// Ledger errors.
    pub fn record_job_update(&self, id: &ExecutionId, update: &JobUpdate) -> Result<JobApplied> {
        Ok(self.inner.ledger.record_job_update(id, update)?)
    }

    /// Cancels an operation. Calls not yet running are cancelled; a call in
    /// flight finishes honestly (if it commits, the operation becomes
    /// `cancelled_after_side_effect`).
    ///
    /// # Errors
    /// Ledger errors.
    pub fn cancel_operation(&self, op: &OperationId) -> Result<OperationStatus> {
        Ok(self.inner.ledger.cancel_operation(op)?)
    }
}

enum Job {
    ReadOnly(ToolRequest),
    Begin(Begin),
}

/// The delay before attempt `attempt + 1`: exponential from `backoff_base`,
/// capped at `backoff_max`, with "equal jitter" (half fixed, half random) so
/// that many clients retrying together spread out. The random half is derived
/// from the execution id and the clock, so it needs no RNG dependency.
pub(crate) fn backoff(config: &ExecutorConfig, attempt: u32, salt: &str) -> Duration {
    let exp = config.backoff_base.saturating_mul(
        1u32.checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX),
    );
    let ceiling = exp.min(config.backoff_max);
    let half = ceiling / 2;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut x = u64::from(nanos) ^ (u64::from(attempt) << 32);
    for b in salt.bytes() {
        x = (x ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    let span = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    let jitter = if span == 0 { 0 } else { x % (span + 1) };
    half + Duration::from_nanos(jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_exponentially_within_jitter_bounds_and_is_capped() {
        let config = ExecutorConfig {
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_millis(1000),
            ..ExecutorConfig::default()
        };
        for attempt in 1..=10u32 {
            let ceiling = (Duration::from_millis(100) * 2u32.pow(attempt.min(20) - 1))
                .min(Duration::from_millis(1000));
            for salt in ["a", "b", "c", "dd"] {
                let d = backoff(&config, attempt, salt);
                assert!(
                    d >= ceiling / 2 && d <= ceiling,
                    "attempt {attempt}: {d:?} vs {ceiling:?}"
                );
            }
        }
        // Huge attempt numbers do not overflow.
        assert!(backoff(&config, u32::MAX, "x") <= Duration::from_millis(1000));
    }
}
