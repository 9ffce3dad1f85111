//! [`Clock`]: where the in-memory backend reads "now".

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A monotonic source of time in nanoseconds since an arbitrary, fixed origin.
///
/// The GCRA never reads a clock itself: backends pass `now` in, which is what makes
/// [`ManualClock`] tests exact.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since this clock's origin. Must never go backwards.
    fn now_nanos(&self) -> u64;

    /// The Unix time of this clock's origin in nanoseconds, so that window algorithms can align
    /// their windows on wall-clock boundaries ("per calendar minute") as Redis does. The default, 0,
    /// aligns them on the origin.
    fn unix_origin_nanos(&self) -> u64 {
        0
    }
}

/// The Unix time now, in nanoseconds (0 before the epoch).
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The Unix time now, in whole seconds (0 before the epoch).
pub(crate) fn unix_secs() -> u64 {
    unix_now() / 1_000_000_000
}

/// The process's monotonic clock ([`Instant`]), with its origin when the clock was created.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Instant,
    unix_origin: u64,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
            unix_origin: unix_now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_nanos(&self) -> u64 {
        // u64 nanoseconds last 584 years of process uptime.
        self.origin.elapsed().as_nanos() as u64
    }

    fn unix_origin_nanos(&self) -> u64 {
        self.unix_origin
    }
}

/// The memory backend's default clock: the CPU's time-stamp counter scaled to nanoseconds, through
/// [quanta](https://docs.rs/quanta) (the clock governor reads by default). About half of
/// [`SystemClock`]'s cost per reading on x86-64 (one `rdtsc`, a multiply and a shift instead of a vDSO
/// `clock_gettime` and `Instant`'s arithmetic).
///
/// **Guarantees.** quanta uses the counter only when the CPU reports an invariant (constant rate,
/// never stopping) TSC and `rdtscp` (`CPUID` leaves `0x8000_0007` and `0x8000_0001`); otherwise, and on
/// targets other than x86-64 and aarch64, it reads the OS monotonic clock, as [`SystemClock`] does. An
/// invariant TSC ticks at one rate on every core and the kernel synchronizes the cores' counters at
/// boot, so readings are monotonic within a thread and across threads that migrate between cores.
/// quanta checks only the CPU's flags, not the kernel's verdict: on a host or VM whose kernel marked
/// the TSC unstable (`/sys/devices/system/clocksource/clocksource0/current_clocksource` is not
/// `tsc`), cores may disagree by microseconds, and a decision may then be lenient by that much; use
/// [`SystemClock`] there. quanta promises no more than that:
/// `rdtsc` is not a serializing instruction, so a thread may read a value a few nanoseconds older than
/// a value another thread read just before a write this thread then observed. The memory backend is
/// exact under that (a decision made with a slightly older `now` is only stricter: see the
/// compare-and-swap in the GCRA table). The scale is calibrated once per process against the OS clock
/// (the first clock built blocks for 10 to 200 ms while quanta calibrates); it does not count time
/// while the machine is suspended, like `CLOCK_MONOTONIC`.
///
/// ```
/// use tower_throttle::clock::{Clock, QuantaClock};
///
/// let clock = QuantaClock::new();
/// let first = clock.now_nanos();
/// let second = clock.now_nanos();
/// assert!(second >= first);
/// ```
#[cfg(feature = "memory")]
#[derive(Clone, Debug)]
pub struct QuantaClock {
    clock: quanta::Clock,
    /// The raw counter reading at this clock's origin.
    origin: u64,
    unix_origin: u64,
}

#[cfg(feature = "memory")]
impl QuantaClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        QuantaClock {
            clock,
            origin,
            unix_origin: unix_now(),
        }
    }
}

#[cfg(feature = "memory")]
impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "memory")]
impl Clock for QuantaClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        // A reading at or before the origin (a core whose counter is behind by a few cycles) is 0.
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }

    fn unix_origin_nanos(&self) -> u64 {
        self.unix_origin
    }
}

/// A clock that moves only when told to; clones share the same time. For deterministic tests.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(shared.now_nanos(), 1_500_000_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Sets the clock to `at` since its origin; ignored if that would move it backwards.
    pub fn set(&self, at: Duration) {
        let at = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_max(at, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_nanos(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }
}
