//! The executor: runs registered tools under the whole protocol.
//!
//! Most apps never call the ledger's transitions by hand. They register their
//! tools and hand each model tool call to [`Executor::execute`] (or a whole
//! model response to [`Executor::execute_round`]); the executor applies
//! docs/design.md's protocol by effect class:
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
mod driven;
mod error;
mod metrics;
mod outcome;
mod protocol;
mod readonly;
mod tool;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use driven::{CallerAttempt, CallerStep};
pub use error::{Error, Result};
pub use metrics::{LatencySummary, Metrics, MetricsSnapshot};
pub use outcome::CallOutcome;
pub use tool::{
    BatchMode, EffectClass, LookupOutcome, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest, DEFAULT_LANDING_WINDOW,
};

use std::collections::HashMap as Map;
use std::sync::Mutex;

use crate::ledger::{
    AttemptId, Begin, CallSpec, JobApplied, JobUpdate, Ledger, Resolution, Ticket,
};
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
    /// The attempts this executor is driving right now, and the ones it
    /// started and stopped driving without finishing (the caller's future
    /// was dropped, or a step failed): in this process nobody will finish
    /// those, so their outcome is unknown rather than "in flight".
    attempts: Mutex<Attempts>,
}

impl Drop for Inner {
    /// The last handle of the executor is gone, and its orphans with it: no
    /// other executor of the ledger knows them (they are `executing` under
    /// this live session, so every ask would answer `InFlight` for the life
    /// of the process). While the ledger lives on (the app's, another
    /// executor's) each is settled by [`Ledger::settle_orphan`]: a kept
    /// result committed, a batch's kept items recorded and the rest made a
    /// retryable failure (the next ask runs the items not run yet), any
    /// other orphan's outcome unknown (reconciled at the next ask). What
    /// cannot be written now (suspended, a full disk) is left to the
    /// ledger's next `recover()`, which `resume()` runs. When the ledger goes
    /// with this executor, only kept results and items are written: the next
    /// session sees a dead owner, as after a crash.
    fn drop(&mut self) {
        let lives_on = Arc::strong_count(&self.ledger) > 1;
        let attempts = match self.attempts.get_mut() {
            Ok(a) => std::mem::take(a),
            Err(poisoned) => std::mem::take(poisoned.into_inner()),
        };
        let (mut unrecorded, mut unrecorded_items) =
            (attempts.unrecorded, attempts.unrecorded_items);
        for (id, attempt) in attempts.orphans {
            let orphan = crate::ledger::Stranded {
                attempt: AttemptId::new(id.clone(), attempt),
                kept: unrecorded
                    .remove(&id)
                    .filter(|(at, _, _)| *at == attempt)
                    .map(|(_, result, external_id)| (result, external_id)),
                items: unrecorded_items
                    .remove(&id)
                    .filter(|(at, _)| *at == attempt)
                    .map(|(_, items)| items)
                    .unwrap_or_default(),
            };
            if lives_on {
                if let Err(crate::ledger::Error::Store(_)) = self.ledger.settle_orphan(&orphan) {
                    self.ledger.strand(orphan);
                }
            } else {
                // The ledger goes with this executor: only what is known (a
                // kept result, kept items) is written, best effort; the rest
                // is for the next session, which sees a dead owner.
                for (index, result_json, external_id) in &orphan.items {
                    let _ = self.ledger.record_batch_item(
                        &orphan.attempt,
                        *index,
                        result_json,
                        external_id.as_deref(),
                    );
                }
                if orphan.kept.is_some() {
                    let _ = self.ledger.settle_orphan(&orphan);
                }
            }
        }
    }
}

#[derive(Default)]
struct Attempts {
    running: Map<ExecutionId, u32>,
    orphans: Map<ExecutionId, u32>,
    /// Attempts handed to callers that run the tool themselves
    /// ([`Executor::start`]), until reported; each is in `running` too.
    driven: Map<ExecutionId, driven::Driven>,
    /// Lookups handed to such callers ([`driven::CallerStep::Lookup`]) and
    /// not reported yet: the attempt and when (boot clock) each was handed
    /// out, which is no later than the moment the caller's lookup looked.
    /// A report takes the earliest (it cannot tell which hand-out it
    /// answers).
    lookups: Map<ExecutionId, Vec<(u32, crate::model::Monotonic)>>,
    /// Results of orphaned attempts that their tool reported and the ledger
    /// could not write (suspended meanwhile, a full disk): the attempt, the
    /// result and the external id. Taking the orphan over commits it.
    unrecorded: Map<ExecutionId, (u32, String, Option<String>)>,
    /// The same for items of an independent batch: the attempt, and each
    /// item's index, result and external id. Taking the orphan over records
    /// them and goes on with the items not run yet.
    unrecorded_items: Map<ExecutionId, (u32, Vec<KeptItem>)>,
}

/// A batch item's index, result and external id, kept by the executor.
type KeptItem = (u32, String, Option<String>);

/// What taking over an orphan of this executor led to.
pub(crate) enum Takeover {
    /// Its outcome is unknown now: reconcile it.
    Reconcile(Ticket),
    /// Its tool had reported a result the ledger could not write then: now
    /// committed.
    Committed(crate::ledger::StoredResult),
    /// An independent batch whose items' results the ledger could not write
    /// then: now recorded; no item was in flight, so the attempt goes on
    /// with the items not run yet.
    Continue(Ticket),
}

/// What [`Executor::recover`] did.
#[derive(Debug, Default)]
pub struct Recovery {
    /// One outcome per execution that needed attention, in the order found.
    pub outcomes: Vec<CallOutcome>,
    /// Executions it could not deal with (its tool is not registered, a
    /// storage error on that row …); every other row was recovered.
    pub failed: Vec<RecoveryFailure>,
}

/// One execution `recover` could not deal with, and why.
#[derive(Debug)]
pub struct RecoveryFailure {
    /// The execution.
    pub execution_id: ExecutionId,
    /// Why.
    pub error: Error,
}

/// Marks an attempt as being driven by this executor while it lives; if it
/// is dropped before [`Running::finish`], the attempt becomes an orphan.
pub(crate) struct Running {
    inner: Arc<Inner>,
    id: ExecutionId,
    attempt: u32,
    finished: bool,
}

impl Running {
    pub(crate) fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.inner.ledger.end_running(&self.id, self.attempt);
        if let Ok(mut a) = self.inner.attempts.lock() {
            a.running.remove(&self.id);
            if !self.finished {
                let attempt = self.attempt;
                a.orphans
                    .entry(self.id.clone())
                    .and_modify(|x| *x = (*x).max(attempt))
                    .or_insert(attempt);
            }
        }
    }
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
                attempts: Mutex::new(Attempts::default()),
            }),
        }
    }

    /// Keeps the result of `attempt`, reported by its tool, that the ledger
    /// could not write (see `Attempts::unrecorded`).
    pub(crate) fn keep_unrecorded(
        &self,
        attempt: &AttemptId,
        result_json: &str,
        external_id: Option<&str>,
    ) {
        if let Ok(mut a) = self.inner.attempts.lock() {
            a.unrecorded.insert(
                attempt.execution_id.clone(),
                (
                    attempt.attempt,
                    result_json.to_owned(),
                    external_id.map(str::to_owned),
                ),
            );
        }
    }

    /// Keeps the result of item `index` of the independent batch `attempt`,
    /// reported by its tool, that the ledger could not write.
    pub(crate) fn keep_unrecorded_item(
        &self,
        attempt: &AttemptId,
        index: u32,
        result_json: &str,
        external_id: Option<&str>,
    ) {
        if let Ok(mut a) = self.inner.attempts.lock() {
            let entry = a
                .unrecorded_items
                .entry(attempt.execution_id.clone())
                .or_insert_with(|| (attempt.attempt, Vec::new()));
            if entry.0 != attempt.attempt {
                *entry = (attempt.attempt, Vec::new());
            }
            entry.1.push((
                index,
                result_json.to_owned(),
                external_id.map(str::to_owned),
            ));
        }
    }

    /// Registers the attempt of `ticket` as driven by this executor.
    pub(crate) fn running(&self, ticket: &Ticket) -> Running {
        self.inner
            .ledger
            .note_running(&ticket.execution_id, ticket.attempt);
        if let Ok(mut a) = self.inner.attempts.lock() {
            a.orphans.remove(&ticket.execution_id);
            a.unrecorded.remove(&ticket.execution_id);
            if a.unrecorded_items
                .get(&ticket.execution_id)
                .is_some_and(|(at, _)| *at != ticket.attempt)
            {
                a.unrecorded_items.remove(&ticket.execution_id);
            }
            a.running
                .insert(ticket.execution_id.clone(), ticket.attempt);
        }
        Running {
            inner: self.inner.clone(),
            id: ticket.execution_id.clone(),
            attempt: ticket.attempt,
            finished: false,
        }
    }

    /// For an `InFlight` answer about an attempt this executor started and
    /// stopped driving (its caller went away mid-call): nobody in this
    /// process will finish it, so its outcome becomes unknown and it is
    /// reconciled now. `None` when someone is running it.
    pub(crate) fn take_over_orphan(&self, id: &ExecutionId) -> Result<Option<Takeover>> {
        // Claimed in the same lock that finds it: two asks at once must not
        // both take it over (both would go on with a batch's next item).
        let claimed = match self.inner.attempts.lock() {
            Ok(mut a) if !a.running.contains_key(id) => a
                .orphans
                .remove(id)
                .map(|attempt| (attempt, a.unrecorded.get(id).cloned())),
            _ => None,
        };
        let Some((attempt, unrecorded)) = claimed else {
            return Ok(None);
        };
        let taken = self.take_over_claimed(id, attempt, unrecorded);
        if taken.is_err() {
            // Not written (a storage error): still nobody's in this process,
            // so still this executor's orphan, for the next ask.
            if let Ok(mut a) = self.inner.attempts.lock() {
                a.orphans.entry(id.clone()).or_insert(attempt);
            }
        }
        taken
    }

    /// [`Executor::take_over_orphan`] once the orphan is claimed.
    fn take_over_claimed(
        &self,
        id: &ExecutionId,
        attempt: u32,
        unrecorded: Option<(u32, String, Option<String>)>,
    ) -> Result<Option<Takeover>> {
        if let Some((_, result_json, external_id)) = unrecorded.filter(|(at, _, _)| *at == attempt)
        {
            // The tool's result, which the ledger could not write when it
            // came: written now (fenced: refused if the attempt is no longer
            // current, and then kept as evidence).
            let attempt_id = AttemptId::new(id.clone(), attempt);
            let committed = self.inner.ledger.commit_valid(
                &attempt_id,
                &result_json,
                external_id.as_deref(),
                None,
            );
            match committed {
                Ok(stored) => {
                    if let Ok(mut a) = self.inner.attempts.lock() {
                        a.orphans.remove(id);
                        a.unrecorded.remove(id);
                    }
                    return Ok(Some(Takeover::Committed(stored)));
                }
                // Still not writable: still this executor's orphan.
                Err(crate::ledger::Error::Store(e)) => {
                    return Err(crate::ledger::Error::Store(e).into())
                }
                Err(_) => {
                    if let Ok(mut a) = self.inner.attempts.lock() {
                        a.unrecorded.remove(id);
                    }
                }
            }
        }
        let items = self.inner.attempts.lock().ok().and_then(|a| {
            a.unrecorded_items
                .get(id)
                .filter(|(at, _)| *at == attempt)
                .map(|(_, items)| items.clone())
        });
        if let Some(items) = items {
            let attempt_id = AttemptId::new(id.clone(), attempt);
            let mut recorded = true;
            for (index, result_json, external_id) in &items {
                match self.inner.ledger.record_batch_item(
                    &attempt_id,
                    *index,
                    result_json,
                    external_id.as_deref(),
                ) {
                    Ok(_) => {}
                    // Still not writable: still this executor's orphan.
                    Err(crate::ledger::Error::Store(e)) => {
                        return Err(crate::ledger::Error::Store(e).into())
                    }
                    Err(_) => recorded = false,
                }
            }
            if let Ok(mut a) = self.inner.attempts.lock() {
                a.unrecorded_items.remove(id);
            }
            if recorded {
                if let Some(rec) = self.inner.ledger.get(id)? {
                    if rec.status == ExecutionStatus::Executing
                        && rec.attempt_count == attempt
                        && rec.owner_session.as_ref() == Some(self.inner.ledger.session_id())
                    {
                        // Its last item's result is recorded and nothing
                        // was sent after it: the attempt goes on.
                        if let Ok(mut a) = self.inner.attempts.lock() {
                            a.orphans.remove(id);
                        }
                        return Ok(Some(Takeover::Continue(Ticket::from_record(&rec))));
                    }
                }
            }
        }
        let Some(rec) = self.inner.ledger.get(id)? else {
            return Ok(None);
        };
        let ours = rec.status == ExecutionStatus::Executing
            && rec.attempt_count == attempt
            && rec.owner_session.as_ref() == Some(self.inner.ledger.session_id());
        if let Ok(mut a) = self.inner.attempts.lock() {
            a.orphans.remove(id);
            // A result kept for another attempt is stale: nothing commits it.
            a.unrecorded.remove(id);
        }
        if !ours {
            return Ok(None);
        }
        let attempt_id = AttemptId::new(id.clone(), attempt);
        match self.inner.ledger.mark_outcome_unknown(
            &attempt_id,
            "its caller stopped waiting while it ran; the outcome is unknown",
        ) {
            Ok(since) => {
                self.inner.metrics.outcome_unknown(&rec.tool_name);
                let mut ticket = Ticket::from_record(&rec);
                ticket.unknown_since = Some(since);
                Ok(Some(Takeover::Reconcile(ticket)))
            }
            // Another ask took it over between the read above and this
            // write (the mark is fenced by the row's status and attempt):
            // it is being reconciled there.
            Err(
                crate::ledger::Error::StaleAttempt { .. }
                | crate::ledger::Error::InvalidTransition { .. },
            ) => Ok(None),
            Err(e) => {
                // Not recorded (a storage error): still nobody's in this
                // process, so still this executor's orphan, for the next
                // ask to take over. Forgetting it would leave the call
                // `executing` under this live session: `InFlight` for the
                // life of the process.
                if let Ok(mut a) = self.inner.attempts.lock() {
                    if !a.running.contains_key(id) {
                        a.orphans.entry(id.clone()).or_insert(attempt);
                    }
                }
                Err(e.into())
            }
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
        check_timer()?;
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
                    downstream: desc.downstream(),
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
                None => {
                    let begin = begins
                        .next()
                        .ok_or_else(|| Error::Internal("missing begin answer".into()))?;
                    // Begun and durable, not sent yet: this executor's orphan
                    // until its task starts driving it (`running`), so a
                    // task dropped before then is reconciled when asked for.
                    let queued = match &begin {
                        Begin::Execute(t) => Some(self.running(t)),
                        _ => None,
                    };
                    Job::Begin(begin, queued)
                }
            };
            set.spawn(async move {
                let _permit = permit_source.acquire_owned().await;
                let out = match job {
                    Job::ReadOnly(request) => {
                        readonly::run(&this, tool.as_ref(), &desc, request).await
                    }
                    Job::Begin(begin, queued) => {
                        let out = this.drive(tool.as_ref(), &desc, begin).await;
                        if let Some(q) = queued {
                            q.finish();
                        }
                        out
                    }
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
    /// Approving again a call already approved for the same `digest` (a
    /// double tap, a retry after the run half failed, a second device)
    /// approves nothing more and answers where the call stands, as
    /// [`Executor::run_existing`] does: `InFlight` while it runs, the stored
    /// result once committed (a replay), an approved call that did not start
    /// is started. A rejected call stays refused.
    ///
    /// # Errors
    /// Ledger errors (`DigestMismatch`, `InvalidTransition` for a call that
    /// was rejected or never waited for this approval …), unknown tool.
    pub async fn approve(
        &self,
        id: &ExecutionId,
        digest: &ArgsDigest,
        preview_json: Option<&str>,
    ) -> Result<CallOutcome> {
        check_timer()?;
        match self.inner.ledger.approve(id, digest, preview_json) {
            Ok(()) => {}
            Err(crate::ledger::Error::InvalidTransition { from, .. })
                if from != ExecutionStatus::Rejected
                    && self.inner.ledger.was_approved(id, digest)? => {}
            Err(e) => return Err(e.into()),
        }
        self.run_existing(id).await
    }

    /// Runs an existing execution that may run now (approved, or a retryable
    /// failure), or reports where it stands, by the same table as a repeated
    /// call: a committed one is replayed, an abandoned one reconciled, one a
    /// live session runs is `InFlight`, and nothing starts in a cancelled
    /// operation.
    ///
    /// # Errors
    /// Ledger errors, unknown tool.
    pub async fn run_existing(&self, id: &ExecutionId) -> Result<CallOutcome> {
        check_timer()?;
        let rec = self
            .inner
            .ledger
            .get(id)?
            .ok_or_else(|| crate::ledger::Error::NotFound(id.clone()))?;
        let tool = self.tool(&rec.tool_name)?;
        let desc = tool.descriptor();
        let begin = self.inner.ledger.continue_execution(id)?;
        self.drive(tool.as_ref(), &desc, begin).await
    }

    /// Begins and runs a compensation of the committed execution `original`
    /// (a refund for a payment): a new execution with its own id, key and
    /// approval, linked to the original, run under the compensating tool's
    /// own descriptor (its approval rule, keys, lookup and batch mode).
    /// `op` is the compensation's own operation: nothing begins in a
    /// cancelled one (`Cancelled`), so a cancelled turn's effect is undone
    /// from another operation.
    ///
    /// # Errors
    /// [`Error::UnknownTool`]; ledger errors (`NothingToCompensate` when
    /// `original` never committed, bad input).
    pub async fn compensate(
        &self,
        original: &ExecutionId,
        op: &OperationId,
        round: u32,
        call: ToolCall,
    ) -> Result<CallOutcome> {
        check_timer()?;
        let tool = self.tool(&call.tool_name)?;
        let desc = tool.descriptor();
        let spec = CallSpec {
            call,
            tool_version: desc.version,
            requires_approval: desc.requires_approval,
            downstream: desc.downstream(),
        };
        let begin = self.inner.ledger.compensate(original, op, round, &spec)?;
        self.drive(tool.as_ref(), &desc, begin).await
    }

    /// Runs `recover()` on the ledger and then deals with what it found:
    /// unknown outcomes are reconciled (lookup / same-key retry, or reported
    /// `Unknown`), approved calls run, committed-but-undelivered results come
    /// back as replays for the model, pending approvals as `NeedsApproval`,
    /// failures as `Failed`. One execution that cannot be dealt with (its
    /// tool is not registered, it moved meanwhile and fails, a storage error
    /// on it) is reported in [`Recovery::failed`]; every other one is
    /// recovered.
    ///
    /// # Errors
    /// Ledger errors of the scan itself.
    pub async fn recover(&self) -> Result<Recovery> {
        check_timer()?;
        let (pending, marked) = self.inner.ledger.recover_marking()?;
        // Attempts of a dead process whose outcome became unknown: counted
        // here, where they are discovered (that process's metrics died).
        for rec in pending.iter().filter(|r| marked.contains(&r.execution_id)) {
            self.inner.metrics.outcome_unknown(&rec.tool_name);
        }
        let mut recovery = Recovery::default();
        for rec in pending {
            let id = rec.execution_id.clone();
            match self.recover_one(&rec).await {
                Ok(outcome) => recovery.outcomes.push(outcome),
                Err(error) => recovery.failed.push(RecoveryFailure {
                    execution_id: id,
                    error,
                }),
            }
        }
        Ok(recovery)
    }

    async fn recover_one(&self, rec: &crate::model::ExecutionRecord) -> Result<CallOutcome> {
        let tool = self.tool(&rec.tool_name)?;
        let desc = tool.descriptor();
        if rec.status == ExecutionStatus::FailedBeforeCommit
            && rec.retryable == Some(true)
            && self.inner.ledger.batch_items(&rec.execution_id)?.is_empty()
        {
            // Reported, not run again: the app (or the model) decides.
            return Ok(CallOutcome::Failed {
                execution_id: rec.execution_id.clone(),
                reason: rec.last_reason.clone().unwrap_or_default(),
                retryable: true,
            });
        }
        let begin = self.inner.ledger.continue_execution(&rec.execution_id)?;
        self.drive(tool.as_ref(), &desc, begin).await
    }

    /// Resolves attempt `attempt`'s unknown outcome the app settled (e.g.
    /// the user checked their bank): commit the found result, retry under
    /// the same key, or record the failure. Refused (`StaleAttempt`) when
    /// another attempt has started since.
    ///
    /// # Errors
    /// Ledger errors.
    pub async fn resolve_unknown(
        &self,
        attempt: &AttemptId,
        resolution: Resolution,
    ) -> Result<CallOutcome> {
        check_timer()?;
        let resolved = self.inner.ledger.resolve_unknown(attempt, resolution)?;
        match self.after_resolution(attempt, resolved) {
            protocol::Step::Perform(ticket) => {
                let id = &attempt.execution_id;
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
            protocol::Step::Done(CallOutcome::Unknown { .. }) => {
                // Recorded as failed: say so, with the recorded reason.
                let rec = self.inner.ledger.get(&attempt.execution_id)?;
                Ok(CallOutcome::Failed {
                    execution_id: attempt.execution_id.clone(),
                    reason: rec.and_then(|r| r.last_reason).unwrap_or_default(),
                    retryable: false,
                })
            }
            protocol::Step::Done(outcome) => Ok(outcome),
            protocol::Step::Reconcile(_) | protocol::Step::Retry { .. } => Err(Error::Internal(
                "a resolution cannot lead to another reconciliation or a retry".into(),
            )),
        }
    }

    /// A finished job's result as the tool path stores one (a text that is
    /// not JSON as a JSON string, one over the limits as the size marker):
    /// the job's effect happened, so its result is never refused.
    fn storable_update<'u>(&self, update: &'u JobUpdate) -> std::borrow::Cow<'u, JobUpdate> {
        match update {
            JobUpdate::Succeeded { result_json } => {
                let limits = &self.inner.ledger.config().json_limits;
                let stored = protocol::storable_result(result_json.clone(), limits);
                if &stored == result_json {
                    std::borrow::Cow::Borrowed(update)
                } else {
                    std::borrow::Cow::Owned(JobUpdate::Succeeded {
                        result_json: stored,
                    })
                }
            }
            _ => std::borrow::Cow::Borrowed(update),
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
        let update = self.storable_update(update);
        let applied = self
            .inner
            .ledger
            .ingest_webhook(source, event_id, id, &update)?;
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
        let update = self.storable_update(update);
        Ok(self.inner.ledger.record_job_update(id, &update)?)
    }

    /// Cancels an operation. Calls not yet running are cancelled and nothing
    /// starts in it again (no retry, no next batch item); a call in flight
    /// finishes honestly. It is `cancelled_after_side_effect` as soon as any
    /// effect may exist (committed, running, unknown, committed batch items).
    ///
    /// # Errors
    /// Ledger errors.
    pub fn cancel_operation(&self, op: &OperationId) -> Result<OperationStatus> {
        Ok(self.inner.ledger.cancel_operation(op)?)
    }
}

enum Job {
    ReadOnly(ToolRequest),
    Begin(Begin, Option<Running>),
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

/// Refuses, before anything is written, a call made on a tokio runtime
/// without a timer: the first `tokio::time` use of a call (its timeout, a
/// backoff) would panic there, after its intent was recorded. Making a
/// `Sleep` registers nothing; on a runtime without a timer it panics, which
/// is caught here (the panic hook still prints it once per such call).
fn check_timer() -> Result<()> {
    std::panic::catch_unwind(|| drop(tokio::time::sleep(std::time::Duration::ZERO)))
        .map_err(|_| Error::NoTimer)
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
