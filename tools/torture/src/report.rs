//! What runs end with: how each life ended, one run's report, the totals.

use toolledger::crashpoint::CrashPoint;

use super::verify::Findings;

/// Totals over all runs.
#[derive(Debug, Default)]
pub struct Totals {
    /// Runs finished.
    pub runs: u64,
    /// Worker processes started.
    pub lives: u64,
    /// Lives ended by an armed crash point (abort).
    pub crash_point_kills: u64,
    /// Lives ended by the supervisor's SIGKILL.
    pub sigkills: u64,
    /// Kills per crash point name.
    pub per_point: Vec<(CrashPoint, u64)>,
    /// Runs that failed (worker error or a broken invariant).
    pub failed_runs: u64,
    /// Invariant findings.
    pub findings: Findings,
    /// Sum of the `resolved_unknowns=` of the finishing lives.
    pub app_resolved_unknowns: u64,
    /// Sum of the `replays=` of the finishing lives.
    pub replays: u64,
    /// Sum of the `duplicate_webhooks=` of the finishing lives.
    pub duplicate_webhooks_ignored: u64,
    /// Live-owner runs: SIGSTOP/SIGCONT cycles of live workers.
    pub stops: u64,
    /// Live-owner runs: suspend/resume cycles of the workers' ledgers.
    pub suspends: u64,
    /// Live-owner runs: calls found in flight in the other live worker.
    pub in_flight_waits: u64,
}

impl Totals {
    /// Lives ended by a kill of either kind.
    pub fn kills(&self) -> u64 {
        self.crash_point_kills + self.sigkills
    }
}

/// How one life ended.
#[derive(Debug, Clone)]
pub enum End {
    /// Exit 0: the workload completed; the worker's summary line.
    Finished(String),
    /// Aborted at this armed crash point.
    Aborted(CrashPoint),
    /// SIGKILLed by the supervisor.
    Killed,
    /// Anything else: a failure.
    Error(String),
}

/// One run's lives and checks.
pub struct RunReport {
    /// How each life ended, in order.
    pub lives: Vec<End>,
    /// How long the first life took, ms.
    pub first_life_ms: f64,
    /// What the checks found.
    pub findings: Findings,
    /// Every problem, in words.
    pub problems: Vec<String>,
}

impl RunReport {
    /// Lives ended by a kill.
    pub fn kills(&self) -> u64 {
        self.lives
            .iter()
            .filter(|e| matches!(e, End::Aborted(_) | End::Killed))
            .count() as u64
    }

    /// True when every check held.
    pub fn passed(&self) -> bool {
        self.problems.is_empty() && self.findings.ok()
    }
}

impl Totals {
    /// Adds one run's report.
    pub fn add_run(&mut self, report: &RunReport) {
        self.runs += 1;
        self.lives += report.lives.len() as u64;
        for end in &report.lives {
            match end {
                End::Aborted(point) => {
                    self.crash_point_kills += 1;
                    if let Some(slot) = self.per_point.iter_mut().find(|(p, _)| p == point) {
                        slot.1 += 1;
                    }
                }
                End::Killed => self.sigkills += 1,
                End::Finished(summary) => {
                    self.app_resolved_unknowns += summary_field(summary, "resolved_unknowns");
                    self.replays += summary_field(summary, "replays");
                    self.duplicate_webhooks_ignored += summary_field(summary, "duplicate_webhooks");
                    self.suspends += summary_field(summary, "suspends");
                    self.in_flight_waits += summary_field(summary, "in_flight_waits");
                }
                End::Error(_) => {}
            }
        }
        self.findings.add(&report.findings);
        if !report.passed() {
            self.failed_runs += 1;
        }
    }
}

fn summary_field(summary: &str, name: &str) -> u64 {
    summary
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}
