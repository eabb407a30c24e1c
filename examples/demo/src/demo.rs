//! `toolledger-demo`: a scripted AI tool loop that survives being killed.
//!
//! One run has three phases:
//!
//! 1. **Recover.** `Ledger::recover()` lists what an earlier (crashed) run
//!    left behind, and each item gets what docs/design.md prescribes: an unknown
//!    outcome is reconciled by looking the downstream key up at the remote
//!    (found → commit that effect; not found → retry under the same key); a
//!    committed result nobody saw is handed to the model and marked
//!    delivered; a call waiting for approval is approved and run.
//! 2. **Script.** Rounds 0–2 of [`crate::script`] are begun from the top.
//!    Whatever already happened is a `Replay` from `begin` and never runs
//!    again; the rest runs, through the crash boundaries of
//!    [`crate::crash`].
//! 3. **Read-back and check.** Every call is asked for again (round 3): all
//!    must replay. Then the remote's own records are counted and the
//!    transcript is checked for results that changed between hand-overs.
//!
//! Output is one line per step with execution ids, tool names and statuses
//! only; the last line is `logical_calls=<n> side_effects=<n> duplicates=<n>`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use toolledger::ledger::{
    AttemptId, Begin, Ledger, LedgerConfig, Resolution, Resolved, StoredResult, Ticket,
};
use toolledger::model::{ArgsDigest, DownstreamKey, ExecutionId, ExecutionStatus, OperationId};

use crate::crash::{Boundary, CrashPlan};
use crate::remote::Remote;
use crate::script::{self, Tool, CALLS, OPERATION, READ_BACK_ROUND, WORK_ROUNDS};
use crate::transcript::Transcript;
use crate::DemoArgs;
use crate::{CliError, CliResult};

/// Runs the demo; the exit code says whether every call completed once.
///
/// # Errors
/// Ledger errors (a file that is not a ledger: nothing is created next to
/// it), remote and transcript I/O errors.
pub fn run(args: &DemoArgs) -> CliResult<ExitCode> {
    let db = match &args.db {
        Some(path) => path.clone(),
        None => fresh_db()?,
    };
    // The ledger first: if `db` is not a ledger, fail before creating the
    // outbox and transcript next to it.
    let ledger = Ledger::open(&db, LedgerConfig::default())?;
    let outbox = sibling(&db, ".outbox");
    let transcript = sibling(&db, ".transcript");
    let mut demo = Demo {
        remote: Remote::open(&outbox)?,
        transcript: Transcript::open(&transcript)?,
        crash: CrashPlan::new(args.crash_at, args.crash_tool.clone()),
        op: OperationId::new(OPERATION)?,
        ledger,
        read_back_failures: 0,
    };
    say!("demo: ledger    {}", db.display());
    say!("demo: remote    {}", outbox.display());
    say!("demo: transcript {}", transcript.display());
    if let Some(boundary) = args.crash_at {
        let only = args
            .crash_tool
            .as_deref()
            .unwrap_or("any side-effecting tool");
        say!("demo: armed to crash at {boundary} ({only})");
    }

    demo.recover()?;
    for index in WORK_ROUNDS {
        demo.run_round(index)?;
    }
    demo.read_back()?;
    demo.ledger.complete_operation(&demo.op)?;
    if demo.crash.is_armed() {
        eprintln!("demo: note: the crash boundary was never reached in this run");
    }
    if args.db.is_none() {
        say!(
            "demo: files kept; try `toolledger inspect {}`",
            db.display()
        );
    }
    // The last line of output is the machine-readable summary.
    let ok = demo.report()?;
    if !ok {
        eprintln!("demo: FAILED: a call did not complete exactly once (see the check line)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// A fresh temporary ledger path in a new directory.
fn fresh_db() -> CliResult<PathBuf> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("toolledger-demo-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir.join("demo.db"))
}

/// `<db><suffix>`, next to the ledger file.
fn sibling(db: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(db.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

/// Prints one step: ids, tool names and statuses only.
fn step(id: &ExecutionId, tool: Tool, what: impl std::fmt::Display) {
    say!("  {id} [{}] {what}", tool.name);
}

fn unexpected(id: &ExecutionId, what: &str) -> CliError {
    CliError::Other(format!("execution {id}: unexpected answer: {what}"))
}

/// One demo run's state.
struct Demo {
    ledger: Ledger,
    remote: Remote,
    transcript: Transcript,
    crash: CrashPlan,
    op: OperationId,
    read_back_failures: usize,
}

impl Demo {
    /// Phase 1: hand everything an earlier run left behind to the right step.
    fn recover(&mut self) -> CliResult<()> {
        let pending = self.ledger.recover()?;
        say!("recover: {} execution(s) need attention", pending.len());
        for rec in pending {
            let id = rec.execution_id.clone();
            if rec.operation_id != self.op {
                say!(
                    "  {id} [{}] not a demo execution: left alone",
                    rec.tool_name
                );
                continue;
            }
            let tool = script::tool(&rec.tool_name)?;
            match rec.status {
                ExecutionStatus::OutcomeUnknown => {
                    let why = rec.last_reason.as_deref().unwrap_or("outcome unknown");
                    step(&id, tool, format!("recover: outcome_unknown ({why})"));
                    let attempt = AttemptId::new(id.clone(), rec.attempt_count);
                    self.reconcile(tool, &attempt, &rec.downstream_key)?;
                }
                ExecutionStatus::Committed => {
                    step(&id, tool, "recover: committed, never delivered: replay");
                    let stored = StoredResult {
                        result_json: rec
                            .result_json
                            .ok_or_else(|| unexpected(&id, "committed without a result"))?,
                        execution_id: rec.execution_id,
                        external_id: rec.external_id,
                        partial: rec.partial,
                    };
                    self.give(tool, &stored)?;
                }
                ExecutionStatus::Prepared if rec.requires_approval => {
                    step(&id, tool, "recover: prepared, waiting for approval");
                    self.approve_and_run(tool, &id, &rec.args_json, &rec.args_digest)?;
                }
                other => step(&id, tool, format!("recover: {other}: left to the script")),
            }
        }
        Ok(())
    }

    /// Phase 2: one model response, begun in one transaction.
    fn run_round(&mut self, index: u32) -> CliResult<()> {
        let calls = script::round(index);
        say!("round {index}: the model asks for {} call(s)", calls.len());
        let specs: Vec<_> = calls.iter().map(script::ScriptedCall::spec).collect();
        let answers = self.ledger.begin_round(&self.op, index, &specs)?;
        for (call, answer) in calls.iter().zip(answers) {
            self.handle(call.tool, answer)?;
        }
        Ok(())
    }

    /// Does what `begin` said.
    fn handle(&mut self, tool: Tool, answer: Begin) -> CliResult<()> {
        let id = answer.execution_id().clone();
        match answer {
            Begin::Execute(ticket) => {
                let attempt = ticket.attempt;
                step(
                    &id,
                    tool,
                    format!("begin: execute, executing durable (attempt {attempt})"),
                );
                let stored = self.perform(tool, &ticket)?;
                self.give(tool, &stored)
            }
            Begin::NeedsApproval(request) => {
                step(&id, tool, "begin: needs approval, prepared durable");
                self.crash.reached(Boundary::AfterPrepared, tool.name);
                self.approve_and_run(tool, &id, &request.args_json, &request.args_digest)
            }
            Begin::Replay(stored) => {
                step(
                    &id,
                    tool,
                    "begin: replay of the stored result (nothing runs)",
                );
                self.give(tool, &stored)
            }
            Begin::Reconcile(ticket) => {
                step(&id, tool, "begin: outcome unknown: reconcile");
                self.reconcile(tool, &ticket.attempt_id(), &ticket.downstream_key)
            }
            // Nothing to run: the summary reports the call as not completed.
            refused => {
                let what = match refused {
                    Begin::InFlight { .. } => "in flight in another live session: not touched",
                    Begin::Conflict { .. } => "conflict (recorded with other arguments): not run",
                    Begin::Failed { .. } => "failed before commit, no retry",
                    Begin::Rejected { .. } => "rejected",
                    Begin::Cancelled { .. } => "cancelled",
                    _ => "unexpected answer: not run",
                };
                step(&id, tool, format!("begin: {what}"));
                Ok(())
            }
        }
    }

    /// The demo script plays the human: approves exactly these arguments
    /// (by digest, with the preview it was shown), then runs the call.
    fn approve_and_run(
        &mut self,
        tool: Tool,
        id: &ExecutionId,
        args_json: &str,
        digest: &ArgsDigest,
    ) -> CliResult<()> {
        let preview = if tool == script::PAY {
            Some(script::payment_preview(args_json)?)
        } else {
            None
        };
        self.ledger.approve(id, digest, preview.as_deref())?;
        step(
            id,
            tool,
            "approved (bound to the args digest, preview stored)",
        );
        let ticket = self.ledger.mark_executing(id)?;
        step(
            id,
            tool,
            format!("executing durable (attempt {})", ticket.attempt),
        );
        let stored = self.perform(tool, &ticket)?;
        self.give(tool, &stored)
    }

    /// Runs one attempt against the remote and commits its result, passing
    /// the boundaries `before-request`, `in-flight`, `after-remote-commit`
    /// and `after-local-commit`.
    fn perform(&mut self, tool: Tool, ticket: &Ticket) -> CliResult<StoredResult> {
        let id = &ticket.execution_id;
        self.crash.reached(Boundary::BeforeRequest, tool.name);
        let crash = &self.crash;
        let done = self.remote.perform(
            tool.name,
            tool.id_prefix,
            tool.dedupe,
            ticket.downstream_key.as_str(),
            || crash.reached(Boundary::InFlight, tool.name),
        )?;
        if done.deduplicated {
            step(id, tool, "remote: known key, existing effect returned");
        } else {
            step(id, tool, "remote: effect committed");
        }
        self.crash.reached(Boundary::AfterRemoteCommit, tool.name);
        let result = tool.result_json(&done.external_id);
        let stored = self
            .ledger
            .commit(&ticket.attempt_id(), &result, Some(&done.external_id))?;
        step(id, tool, "committed: result durable in the ledger");
        self.crash.reached(Boundary::AfterLocalCommit, tool.name);
        Ok(stored)
    }

    /// Reconciles an unknown outcome by looking our key up at the remote.
    fn reconcile(&mut self, tool: Tool, attempt: &AttemptId, key: &DownstreamKey) -> CliResult<()> {
        let id = &attempt.execution_id;
        match self.remote.lookup(key.as_str())? {
            Some(external_id) => {
                step(
                    id,
                    tool,
                    "reconcile: effect found at the remote by reference",
                );
                let found = Resolution::Found {
                    result_json: tool.result_json(&external_id),
                    external_id: Some(external_id),
                };
                match self.ledger.resolve_unknown(attempt, found)? {
                    Resolved::Committed(stored) => {
                        step(id, tool, "committed: found effect recorded");
                        self.crash.reached(Boundary::AfterLocalCommit, tool.name);
                        self.give(tool, &stored)
                    }
                    other => Err(unexpected(id, &format!("{other:?}"))),
                }
            }
            None => {
                step(
                    id,
                    tool,
                    "reconcile: not found at the remote: retry, same key",
                );
                match self
                    .ledger
                    .resolve_unknown(attempt, Resolution::NotFoundRetry)?
                {
                    Resolved::Retry(ticket) => {
                        step(
                            id,
                            tool,
                            format!("executing durable (attempt {})", ticket.attempt),
                        );
                        let stored = self.perform(tool, &ticket)?;
                        self.give(tool, &stored)
                    }
                    other => Err(unexpected(id, &format!("{other:?}"))),
                }
            }
        }
    }

    /// Hands a committed result to the model (the transcript), passing
    /// `after-model-result`, then marks it delivered (lazy write).
    fn give(&mut self, tool: Tool, stored: &StoredResult) -> CliResult<()> {
        let id = &stored.execution_id;
        self.transcript.give(id, &stored.result_json)?;
        step(id, tool, "result given to the model");
        self.crash.reached(Boundary::AfterModelResult, tool.name);
        self.ledger.mark_delivered(std::slice::from_ref(id))?;
        step(id, tool, "result_delivered");
        Ok(())
    }

    /// Phase 3a: the conversation is reloaded; every call must replay.
    fn read_back(&mut self) -> CliResult<()> {
        say!("round {READ_BACK_ROUND}: read-back: every earlier call is asked for again");
        for call in CALLS {
            match self.ledger.begin(&self.op, call.round, &call.spec())? {
                Begin::Replay(stored) => {
                    step(
                        &stored.execution_id,
                        call.tool,
                        "begin: replay (nothing runs)",
                    );
                    self.give(call.tool, &stored)?;
                }
                other => {
                    let id = other.execution_id().clone();
                    step(
                        &id,
                        call.tool,
                        "begin: NOT a replay: the call did not complete",
                    );
                    self.read_back_failures += 1;
                }
            }
        }
        Ok(())
    }

    /// Phase 3b: counts from the remote and the transcript. Returns whether
    /// every logical call completed exactly once.
    fn report(&self) -> CliResult<bool> {
        let mut completed = 0;
        for call in CALLS {
            let rec = self.ledger.get(&call.execution_id(&self.op)?)?;
            if rec.is_some_and(|r| r.status.is_committed()) {
                completed += 1;
            }
        }
        let counts = self.remote.counts()?;
        let transcript = self.transcript.check()?;
        let logical = CALLS.len();
        say!(
            "check: completed={completed}/{logical} read_back_failures={} \
             transcript_entries={} transcript_mismatches={}",
            self.read_back_failures,
            transcript.entries,
            transcript.mismatches
        );
        say!(
            "logical_calls={logical} side_effects={} duplicates={}",
            counts.effects,
            counts.duplicates()
        );
        Ok(completed == logical
            && counts.duplicates() == 0
            && transcript.mismatches == 0
            && self.read_back_failures == 0)
    }
}
