//! Named crash points: where the torture suite kills the process.
//!
//! The six boundaries of docs/design.md plus "mid-batch after item N". With the
//! `crash-points` cargo feature, [`hit`] aborts the process (no unwinding, no
//! destructors — as a SIGKILL would) when the point is armed; without the
//! feature it compiles to nothing, so release builds carry no hook.
//!
//! Arm a point with the environment variable `TOOLLEDGER_CRASH_AT=<name>` or
//! `<name>:<n>` (abort on the n-th hit, from 1), read once per process, or
//! with [`arm`].

use std::fmt;

/// A place in the protocol where a process can die.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// After the prepared record, before `executing` (approval pending).
    AfterPrepared,
    /// After `executing` is durable, before the request leaves.
    BeforeRequest,
    /// While the request is in flight (hit by the tool itself).
    InFlight,
    /// After the remote side committed, before the local persist.
    AfterRemoteCommit,
    /// After `committed` is durable, before the model saw the result.
    AfterLocalCommit,
    /// After the model got the result, before the delivery mark is saved
    /// (hit by the app's loop).
    AfterModelResult,
    /// In an independent batch, after an item's completion was recorded.
    AfterBatchItem,
}

impl CrashPoint {
    /// Every crash point.
    pub const ALL: [CrashPoint; 7] = [
        CrashPoint::AfterPrepared,
        CrashPoint::BeforeRequest,
        CrashPoint::InFlight,
        CrashPoint::AfterRemoteCommit,
        CrashPoint::AfterLocalCommit,
        CrashPoint::AfterModelResult,
        CrashPoint::AfterBatchItem,
    ];

    /// The kebab-case name used on command lines and in test names.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::AfterPrepared => "after-prepared",
            CrashPoint::BeforeRequest => "before-request",
            CrashPoint::InFlight => "in-flight",
            CrashPoint::AfterRemoteCommit => "after-remote-commit",
            CrashPoint::AfterLocalCommit => "after-local-commit",
            CrashPoint::AfterModelResult => "after-model-result",
            CrashPoint::AfterBatchItem => "after-batch-item",
        }
    }

    /// Parses a name written by [`CrashPoint::name`].
    pub fn parse(name: &str) -> Option<CrashPoint> {
        CrashPoint::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(feature = "crash-points")]
mod armed {
    use super::CrashPoint;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    static ARMED: Mutex<Option<(CrashPoint, u64)>> = Mutex::new(None);
    static FROM_ENV: std::sync::Once = std::sync::Once::new();
    static HITS: AtomicU64 = AtomicU64::new(0);

    fn load_env() {
        FROM_ENV.call_once(|| {
            let Ok(spec) = std::env::var("TOOLLEDGER_CRASH_AT") else {
                return;
            };
            let (name, nth) = match spec.split_once(':') {
                Some((n, k)) => (n, k.parse().unwrap_or(1)),
                None => (spec.as_str(), 1),
            };
            if let (Some(point), Ok(mut armed)) = (CrashPoint::parse(name), ARMED.lock()) {
                *armed = Some((point, nth.max(1)));
            }
        });
    }

    pub fn arm(point: Option<(CrashPoint, u64)>) {
        load_env();
        HITS.store(0, Ordering::SeqCst);
        if let Ok(mut armed) = ARMED.lock() {
            *armed = point;
        }
    }

    pub fn hit(point: CrashPoint) {
        load_env();
        let target = ARMED.lock().ok().and_then(|a| *a);
        if let Some((armed, nth)) = target {
            if armed == point && HITS.fetch_add(1, Ordering::SeqCst) + 1 == nth {
                std::process::abort();
            }
        }
    }
}

/// Arms `point` to abort on its `nth` hit (from 1), or disarms with `None`.
/// A no-op without the `crash-points` feature.
pub fn arm(point: Option<(CrashPoint, u64)>) {
    #[cfg(feature = "crash-points")]
    armed::arm(point);
    #[cfg(not(feature = "crash-points"))]
    let _ = point;
}

/// Marks that execution reached `point`; aborts the process if it is armed.
/// Compiles to nothing without the `crash-points` feature.
#[inline(always)]
pub fn hit(point: CrashPoint) {
    #[cfg(feature = "crash-points")]
    armed::hit(point);
    #[cfg(not(feature = "crash-points"))]
    let _ = point;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in CrashPoint::ALL {
            assert_eq!(CrashPoint::parse(p.name()), Some(p));
        }
        assert_eq!(CrashPoint::parse("after-lunch"), None);
    }
}
