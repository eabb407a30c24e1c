//! Time, injected: the ledger never reads a system clock directly, so tests
//! can expire suspensions, step the wall clock and reboot without sleeping.
//!
//! Two clocks, for two jobs:
//!
//! - the **wall clock** ([`Clock::now_ms`]) stamps records for people and for
//!   retention (`created_ms`, `updated_ms`, prune cutoffs). It may jump
//!   forwards or backwards (NTP, the user, a dead RTC battery), so nothing
//!   that decides ownership or when a request can no longer land reads it;
//! - the **boot clock** ([`Clock::monotonic`]) measures durations that decide
//!   ownership and safety: how long a suspended owner stays owner, how long
//!   ago an attempt's outcome became unknown. It counts from boot, keeps
//!   counting while the device sleeps, never jumps, and is shared by every
//!   process of the boot (Linux/Android `CLOCK_BOOTTIME`; Apple
//!   `CLOCK_MONOTONIC`, which includes sleep on Darwin). Each reading carries
//!   the boot's identity, so a reading from before a reboot is never compared
//!   with one after it as if they were on one line.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

pub use crate::model::Monotonic;

/// A source of wall-clock time and of the boot clock.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Wall-clock time in milliseconds since the Unix epoch (record
    /// timestamps only; it may jump).
    fn now_ms(&self) -> i64;

    /// The boot clock (see the module docs): never jumps, shared by every
    /// process of one boot.
    fn monotonic(&self) -> Monotonic;
}

/// The system clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }

    fn monotonic(&self) -> Monotonic {
        Monotonic {
            boot_id: boot_id(),
            ms: boot_clock_ms(),
        }
    }
}

/// The identity of the running boot, read once per process.
fn boot_id() -> Arc<str> {
    static BOOT: OnceLock<Arc<str>> = OnceLock::new();
    BOOT.get_or_init(|| Arc::from(read_boot_id().unwrap_or_default().as_str()))
        .clone()
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn read_boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_owned())
}

#[cfg(target_vendor = "apple")]
fn read_boot_id() -> Option<String> {
    let mut buf = [0u8; 64];
    let mut len: libc::size_t = buf.len();
    // SAFETY: the name is NUL-terminated; `buf`/`len` describe a writable buffer.
    let rc = unsafe {
        libc::sysctlbyname(
            c"kern.bootsessionuuid".as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        return None;
    }
    let text = buf.get(..len)?;
    let text = std::str::from_utf8(text)
        .ok()?
        .trim_end_matches('\0')
        .trim();
    (!text.is_empty()).then(|| text.to_owned())
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
fn read_boot_id() -> Option<String> {
    None
}

/// Milliseconds since boot, including time asleep.
#[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple"))]
fn boot_clock_ms() -> i64 {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    const CLOCK: libc::clockid_t = libc::CLOCK_BOOTTIME;
    #[cfg(target_vendor = "apple")]
    const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(CLOCK, &mut ts) } != 0 {
        return 0;
    }
    // `time_t` and `c_long` are 32 bits on 32-bit Android targets.
    #[allow(clippy::useless_conversion)]
    let (secs, nanos) = (i64::from(ts.tv_sec), i64::from(ts.tv_nsec));
    secs.saturating_mul(1000).saturating_add(nanos / 1_000_000)
}

/// Elsewhere: time since this process first asked (a clock of its own, so
/// its boot id is unique to the process and other processes' readings count
/// as another boot).
#[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
fn boot_clock_ms() -> i64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    i64::try_from(
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis(),
    )
    .unwrap_or(i64::MAX)
}

/// A clock that only moves when told to (tests, simulations). The wall clock
/// and the boot clock start together and [`ManualClock::advance`] moves
/// both; [`ManualClock::step_wall`] moves only the wall clock (an NTP or user
/// step) and [`ManualClock::reboot`] starts a new boot.
#[derive(Debug)]
pub struct ManualClock {
    wall: AtomicI64,
    mono: AtomicI64,
    boot: Mutex<Arc<str>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new(0)
    }
}

impl ManualClock {
    /// A clock standing at `start_ms` (wall and boot clock alike), boot `boot-0`.
    pub fn new(start_ms: i64) -> ManualClock {
        ManualClock {
            wall: AtomicI64::new(start_ms),
            mono: AtomicI64::new(start_ms),
            boot: Mutex::new(Arc::from("boot-0")),
        }
    }

    /// Time passes: both clocks move forward by `ms`.
    pub fn advance(&self, ms: i64) {
        self.wall.fetch_add(ms, Ordering::SeqCst);
        self.mono.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the wall clock to `ms` (a step; the boot clock does not move).
    pub fn set(&self, ms: i64) {
        self.wall.store(ms, Ordering::SeqCst);
    }

    /// Steps the wall clock by `delta_ms` (either way); the boot clock does
    /// not move.
    pub fn step_wall(&self, delta_ms: i64) {
        self.wall.fetch_add(delta_ms, Ordering::SeqCst);
    }

    /// A reboot: a new boot id, and the boot clock starts again at `uptime_ms`.
    pub fn reboot(&self, boot_id: &str, uptime_ms: i64) {
        if let Ok(mut boot) = self.boot.lock() {
            *boot = Arc::from(boot_id);
        }
        self.mono.store(uptime_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.wall.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Monotonic {
        let boot_id = self
            .boot
            .lock()
            .map(|b| b.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone());
        Monotonic {
            boot_id,
            ms: self.mono.load(Ordering::SeqCst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_boot_clock_moves_forward_and_names_the_boot() {
        let a = SystemClock.monotonic();
        let b = SystemClock.monotonic();
        assert!(b.ms >= a.ms && a.ms > 0);
        assert_eq!(a.boot_id, b.boot_id);
        #[cfg(target_os = "linux")]
        assert_eq!(a.boot_id.len(), 36, "a UUID from /proc");
    }

    #[test]
    fn a_wall_step_does_not_move_the_boot_clock() {
        let c = ManualClock::new(1_000);
        c.step_wall(61_000);
        assert_eq!(c.now_ms(), 62_000);
        assert_eq!(c.monotonic().ms, 1_000);
        c.step_wall(-3_600_000);
        assert_eq!(c.monotonic().ms, 1_000);
        c.advance(10);
        assert_eq!(c.monotonic().ms, 1_010);
        let before = c.monotonic();
        c.reboot("boot-1", 50);
        assert_eq!(c.monotonic().since(&before), 50);
    }
}
