//! Counters and latency figures. Only ids, tool names and timings: argument
//! and result values never reach metrics (they are not even passed in).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Latency buckets in microseconds (upper bounds); the last is open-ended.
const BUCKETS_US: [u64; 16] = [
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    5_000_000,
    u64::MAX,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS_US.len()],
    total: u64,
    sum_us: u64,
}

impl Histogram {
    fn record(&mut self, us: u64) {
        let i = BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(BUCKETS_US.len() - 1);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.total += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    /// Upper bound of the bucket holding quantile `q` (0..=1).
    fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((self.total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (count, bound) in self.counts.iter().zip(BUCKETS_US) {
            seen += count;
            if seen >= rank {
                return bound;
            }
        }
        u64::MAX
    }
}

/// Latency figures of one tool's `perform` calls.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// A point-in-time copy of the executor's metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// `perform` attempts started (read-only and side-effecting).
    pub attempts: u64,
    /// Results handed back from storage without running anything.
    pub replays: u64,
    /// Attempts whose outcome became unknown: reported so by the tool, or
    /// found left `executing` by a process that died (by
    /// [`Executor::recover`](super::Executor::recover) or when the call is
    /// asked for again).
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
    /// Steps of an attempt refused because another attempt had superseded
    /// it (what the stale attempt learnt is kept as evidence in the ledger).
    pub stale_attempts: u64,
    /// Side-effect latency per tool.
    pub latency: Vec<LatencySummary>,
}

/// Live metrics, updated by the executor.
#[derive(Debug, Default)]
pub struct Metrics {
    attempts: AtomicU64,
    replays: AtomicU64,
    outcome_unknown: AtomicU64,
    reconciled_found: AtomicU64,
    reconciled_not_found: AtomicU64,
    reconcile_failures: AtomicU64,
    conflicts: AtomicU64,
    in_flight: AtomicU64,
    duplicate_webhooks: AtomicU64,
    stale_attempts: AtomicU64,
    latency: Mutex<BTreeMap<String, Histogram>>,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Metrics {
    pub(crate) fn attempt(&self) {
        bump(&self.attempts);
    }
    pub(crate) fn replay(&self) {
        bump(&self.replays);
    }
    pub(crate) fn outcome_unknown(&self, _tool: &str) {
        bump(&self.outcome_unknown);
    }
    pub(crate) fn reconciled(&self, found: bool) {
        bump(if found {
            &self.reconciled_found
        } else {
            &self.reconciled_not_found
        });
    }
    pub(crate) fn reconcile_failed(&self) {
        bump(&self.reconcile_failures);
    }
    pub(crate) fn conflict(&self) {
        bump(&self.conflicts);
    }
    pub(crate) fn in_flight(&self) {
        bump(&self.in_flight);
    }
    pub(crate) fn duplicate_webhook(&self) {
        bump(&self.duplicate_webhooks);
    }
    pub(crate) fn stale_attempt(&self) {
        bump(&self.stale_attempts);
    }
    pub(crate) fn latency(&self, tool: &str, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        if let Ok(mut map) = self.latency.lock() {
            map.entry(tool.to_owned()).or_default().record(us);
        }
    }

    /// A copy of every figure.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let latency = self
            .latency
            .lock()
            .map(|map| {
                map.iter()
                    .map(|(tool, h)| LatencySummary {
                        tool: tool.clone(),
                        count: h.total,
                        mean_us: h.sum_us.checked_div(h.total).unwrap_or(0),
                        p50_us: h.quantile(0.5),
                        p99_us: h.quantile(0.99),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let (replays, in_flight, conflicts) = (
            get(&self.replays),
            get(&self.in_flight),
            get(&self.conflicts),
        );
        MetricsSnapshot {
            attempts: get(&self.attempts),
            replays,
            outcome_unknown: get(&self.outcome_unknown),
            reconciled_found: get(&self.reconciled_found),
            reconciled_not_found: get(&self.reconciled_not_found),
            reconcile_failures: get(&self.reconcile_failures),
            conflicts,
            in_flight,
            prevented_duplicates: replays + in_flight + conflicts,
            duplicate_webhooks: get(&self.duplicate_webhooks),
            stale_attempts: get(&self.stale_attempts),
            latency,
        }
    }
}
