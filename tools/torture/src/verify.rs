//! The invariants, checked after every run from three independent records:
//! the service's committed effects (ground truth), the ledger file, and the
//! transcript of what the model was given.
//!
//! 1. Every logical effect happened exactly once at the service — or its
//!    execution is `outcome_unknown` (the app was told) and it happened at
//!    most once.
//! 2. Every result the model was given for a call is byte-identical, and
//!    equal to the ledger's stored result.
//! 3. No committed record was ever downgraded: the transition log holds no
//!    move out of `committed` other than `deliver`, and none out of
//!    `result_delivered`.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;
use toolledger::ledger::{Ledger, LedgerConfig};
use toolledger::model::{ExecutionStatus, OperationId};

use super::service::Effect;
use super::workload;

/// What one run's checks found. Every field but `logical_calls` and
/// `unknown_unresolved` must be 0 for the run to pass.
#[derive(Debug, Default, Clone, Copy)]
pub struct Findings {
    /// Logical effects expected (calls, with a batch counting per item).
    pub logical_calls: u64,
    /// Effects beyond the first for one key, plus effects under no expected key.
    pub duplicates: u64,
    /// Executions left `outcome_unknown` (the app was told, could not resolve).
    pub unknown_unresolved: u64,
    /// A committed record without its effect, an effect without a committed
    /// record, or an execution missing from the ledger after completion.
    pub lost_records: u64,
    /// Transcript results that differ from each other or from the ledger.
    pub transcript_mismatches: u64,
    /// Committed executions the model never got.
    pub undelivered: u64,
    /// Transitions out of `committed` other than `deliver`.
    pub downgrades: u64,
}

impl Findings {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &Findings) {
        self.logical_calls += other.logical_calls;
        self.duplicates += other.duplicates;
        self.unknown_unresolved += other.unknown_unresolved;
        self.lost_records += other.lost_records;
        self.transcript_mismatches += other.transcript_mismatches;
        self.undelivered += other.undelivered;
        self.downgrades += other.downgrades;
    }

    /// True when no invariant is broken.
    pub fn ok(&self) -> bool {
        self.duplicates == 0
            && self.lost_records == 0
            && self.transcript_mismatches == 0
            && self.undelivered == 0
            && self.downgrades == 0
    }
}

/// Reads the transcript: execution id → every result given for it. Lines
/// that do not parse (a line torn by a kill) are skipped.
fn transcript(path: &Path) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if let (Some(id), Some(result)) = (
            v.get("id").and_then(Value::as_str),
            v.get("result").and_then(Value::as_str),
        ) {
            out.entry(id.to_owned())
                .or_default()
                .push(result.to_owned());
        }
    }
    out
}

/// Checks one finished run. `Err` when the ledger cannot even be read.
pub fn check(
    db: &Path,
    transcript_path: &Path,
    op: &str,
    effects: &[Effect],
    problems: &mut Vec<String>,
) -> Result<Findings, String> {
    let ledger = Ledger::open(db, LedgerConfig::default()).map_err(|e| format!("reopen: {e}"))?;
    let op = OperationId::new(op).map_err(|e| e.to_string())?;
    let expected = workload::expected(&op)?;
    let given = transcript(transcript_path);
    let mut per_key: HashMap<&str, u64> = HashMap::new();
    for effect in effects {
        *per_key
            .entry(effect.key.as_deref().unwrap_or(""))
            .or_default() += 1;
    }
    let mut f = Findings::default();
    let mut known_keys = 0u64;
    for exp in &expected {
        let id = &exp.execution_id;
        f.logical_calls += exp.keys.len() as u64;
        let rec = ledger.get(id).map_err(|e| e.to_string())?;
        let status = rec.as_ref().map(|r| r.status);
        for key in &exp.keys {
            let n = per_key.get(key.as_str()).copied().unwrap_or(0);
            known_keys += n;
            f.duplicates += n.saturating_sub(1);
            let committed = status.is_some_and(ExecutionStatus::is_committed);
            if committed && n == 0 {
                problems.push(format!(
                    "{id}: committed in the ledger, no effect at the service"
                ));
                f.lost_records += 1;
            }
            if !committed && status != Some(ExecutionStatus::OutcomeUnknown) && n > 0 {
                problems.push(format!(
                    "{id}: effect at the service, ledger says {status:?}"
                ));
                f.lost_records += 1;
            }
            if n > 1 {
                problems.push(format!("{id}: {n} effects under one key"));
            }
        }
        let Some(rec) = rec else {
            problems.push(format!("{id}: missing from the ledger"));
            f.lost_records += 1;
            continue;
        };
        match rec.status {
            s if s.is_committed() => {}
            ExecutionStatus::OutcomeUnknown => f.unknown_unresolved += 1,
            other => {
                problems.push(format!("{id}: ended {other}"));
                f.lost_records += 1;
            }
        }
        let results = given.get(id.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        if rec.status.is_committed() && results.is_empty() {
            problems.push(format!("{id}: the model never got its result"));
            f.undelivered += 1;
        }
        for r in results {
            if Some(r.as_str()) != rec.result_json.as_deref() {
                problems.push(format!(
                    "{id}: the model got a result that differs from the stored one"
                ));
                f.transcript_mismatches += 1;
            }
        }
        if !results.is_empty() && !rec.status.is_committed() {
            problems.push(format!(
                "{id}: the model got a result, the ledger now says {}",
                rec.status
            ));
            f.lost_records += 1;
        }
        for t in ledger.transitions(id).map_err(|e| e.to_string())? {
            // A note (a refused stale attempt, …) keeps the status: not a move.
            if t.from == Some(t.to) {
                continue;
            }
            let out_of_committed = match t.from {
                Some(ExecutionStatus::Committed) => t.to != ExecutionStatus::ResultDelivered,
                Some(ExecutionStatus::ResultDelivered) => true,
                _ => false,
            };
            if out_of_committed {
                problems.push(format!("{id}: downgraded {:?} → {}", t.from, t.to));
                f.downgrades += 1;
            }
        }
    }
    let stray = effects.len() as u64 - known_keys;
    if stray > 0 {
        problems.push(format!("{stray} effects under keys no call owns"));
        f.duplicates += stray;
    }
    Ok(f)
}
