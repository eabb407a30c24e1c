//! A reading of the boot clock: the clock that decides ownership and
//! safety windows, because it cannot jump (see `ledger::Clock`).

use std::sync::Arc;

/// A reading of the boot clock: which boot, and milliseconds since it began
/// (including time asleep).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Monotonic {
    /// The boot's identity (`""` when the platform does not tell).
    pub boot_id: Arc<str>,
    /// Milliseconds since that boot.
    pub ms: i64,
}

impl Monotonic {
    /// A reading of boot `boot_id` at `ms`.
    pub fn new(boot_id: impl Into<Arc<str>>, ms: i64) -> Monotonic {
        Monotonic {
            boot_id: boot_id.into(),
            ms,
        }
    }

    /// Milliseconds from `earlier` to `self`, or a lower bound of it when a
    /// reboot came between them: the time since this boot began (everything
    /// of the earlier boot happened before that). Never negative.
    pub fn since(&self, earlier: &Monotonic) -> i64 {
        if self.boot_id == earlier.boot_id && self.ms >= earlier.ms {
            self.ms - earlier.ms
        } else {
            // Another boot, or (boot ids unknown) the clock went back: a reboot.
            self.ms.max(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_exact_within_a_boot_and_a_lower_bound_across_boots() {
        assert_eq!(
            Monotonic::new("a", 5_000).since(&Monotonic::new("a", 1_000)),
            4_000
        );
        // Another boot: at least the new boot's uptime has passed.
        assert_eq!(
            Monotonic::new("b", 700).since(&Monotonic::new("a", 90_000)),
            700
        );
        // Unknown boot ids, clock went back: a reboot.
        assert_eq!(
            Monotonic::new("", 300).since(&Monotonic::new("", 9_000)),
            300
        );
        assert_eq!(
            Monotonic::new("", 9_300).since(&Monotonic::new("", 9_000)),
            300
        );
    }
}
