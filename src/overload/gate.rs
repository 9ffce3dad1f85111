//! [`Gate`]: admits a request while the requests in flight are under the adaptive limit, each
//! partition within its guaranteed share or borrowing what the others leave idle.
//!
//! The partitions' counts share one word (16 bits each), so that one compare-and-swap decides and
//! counts a request: no check-then-act gap lets partitions together exceed the limit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::limit::AdaptiveLimit;
use super::options::{drain_time, Overload, PartitionBy};
use crate::clock::Clock;
use crate::error::BuildError;

/// The gate's clock, read twice a request: the TSC where the in-memory backend brings `quanta`.
#[cfg(feature = "memory")]
type GateClock = crate::clock::QuantaClock;
#[cfg(not(feature = "memory"))]
type GateClock = crate::clock::SystemClock;

/// A partition idle this long no longer has its share kept for it.
const ACTIVE_FOR: u64 = 1_000_000_000;
/// A partition's last arrival is written at most this often (nanoseconds): one write per
/// partition per grain, not one per request.
const SEEN_GRAIN: u64 = 10_000_000;
/// The service counts as under pressure for this long after a request was shed.
const PRESSED_FOR: u64 = 1_000_000_000;

#[derive(Debug)]
struct Partition {
    name: Arc<str>,
    share: f64,
    /// The last arrival's time + 1 (0: none yet).
    seen: AtomicU64,
    shed: AtomicU64,
}

/// The gate's metric handles, made on first use: a recorder installed after the layer was built,
/// but before traffic, still gets them (as the policies' do).
#[cfg(feature = "metrics")]
#[derive(Debug)]
struct GateMetrics {
    limit: metrics::Gauge,
    in_flight: metrics::Gauge,
    /// `throttle_requests_shed_total` of each partition.
    shed: Box<[metrics::Counter]>,
}

/// The overload gate of one layer: an adaptive limit on requests in flight, shared by partitions.
///
/// The layer keeps one and counts every request through it; outside a layer (a queue consumer,
/// a simulation) call [`try_admit`](Self::try_admit) and [`finish`](Self::finish) with a clock
/// of your own.
///
/// ```
/// use tower_throttle::overload::{Gate, Overload};
///
/// let gate = Gate::new(&Overload::aimd().limits(2, 2)).unwrap(); // a fixed limit of 2
/// let ms = 1_000_000; // nanoseconds
/// assert!(gate.try_admit(0, 0));
/// assert!(gate.try_admit(0, ms));
/// assert!(!gate.try_admit(0, 2 * ms)); // the third is shed
/// gate.finish(0, 0, 5 * ms, false); // the first ends after 5 ms
/// assert!(gate.try_admit(0, 5 * ms));
/// assert_eq!((gate.in_flight(), gate.shed_of(0)), (2, 1));
/// ```
#[derive(Debug)]
pub struct Gate {
    limit: AdaptiveLimit,
    /// Requests in flight: partition `i`'s count in bits `16 i .. 16 i + 16`.
    in_flight: AtomicU64,
    partitions: Box<[Partition]>,
    partition_by: PartitionBy,
    /// When a request was last shed, + 1 (0: never).
    shed_at: AtomicU64,
    pub(crate) status: StatusCode,
    clock: GateClock,
    #[cfg(feature = "metrics")]
    metrics: std::sync::OnceLock<GateMetrics>,
}

#[derive(Clone, Debug)]
pub(crate) struct Shed {
    pub(crate) partition: Arc<str>,
    pub(crate) retry_after: Duration,
    pub(crate) status: StatusCode,
}

fn count_of(word: u64, partition: usize) -> u32 {
    ((word >> (16 * partition)) & 0xFFFF) as u32
}

/// The requests in flight from which the service is under pressure: within a tenth of `limit`
/// (one at least). Partitions keep their shares from there, and quotas enforced under pressure
/// only bite.
fn pressure_at(limit: u32) -> u32 {
    // A limit of one: under pressure with its one request in flight, not with none.
    (limit - limit.div_ceil(10)).max(1)
}

fn total_of(word: u64, partitions: usize) -> u32 {
    (0..partitions).map(|i| count_of(word, i)).sum()
}

impl Gate {
    /// A gate with the options of `overload`, or the error of [`Overload::validate`].
    pub fn new(overload: &Overload) -> Result<Self, BuildError> {
        overload.validate()?;
        let mut named = overload.partitions.clone();
        if named.is_empty() {
            named.push(("all".into(), 1.0));
        }
        let partitions = named
            .into_iter()
            .map(|(name, share)| Partition {
                name: name.into(),
                share,
                seen: AtomicU64::new(0),
                shed: AtomicU64::new(0),
            })
            .collect();
        let limit = AdaptiveLimit::new(&overload.settings());
        Ok(Gate {
            limit,
            in_flight: AtomicU64::new(0),
            partitions,
            partition_by: overload.partition_by.clone(),
            shed_at: AtomicU64::new(0),
            status: overload.status,
            clock: GateClock::new(),
            #[cfg(feature = "metrics")]
            metrics: std::sync::OnceLock::new(),
        })
    }

    #[cfg(feature = "metrics")]
    fn metrics(&self) -> &GateMetrics {
        self.metrics.get_or_init(|| {
            let shed = |p: &Partition| {
                let partition = p.name.to_string();
                metrics::counter!("throttle_requests_shed_total", "partition" => partition)
            };
            let made = GateMetrics {
                limit: metrics::gauge!("throttle_overload_limit"),
                in_flight: metrics::gauge!("throttle_overload_in_flight"),
                shed: self.partitions.iter().map(shed).collect(),
            };
            made.limit.set(f64::from(self.limit.current()));
            made
        })
    }

    /// The partition named `name` (a policy's or a tier's, as the options say); the last one
    /// for a name no partition has, or none (`None`).
    pub fn partition_of(&self, name: Option<&str>) -> usize {
        let last = self.partitions.len() - 1;
        if last == 0 {
            return 0;
        }
        name.and_then(|name| self.partitions.iter().position(|p| *p.name == *name))
            .unwrap_or(last)
    }

    /// Every partition but the last is one of `names` (the layer's policies or tiers, as the gate
    /// partitions by): a misspelled name would leave its requests to the last partition, unsaid.
    pub(crate) fn check_partitions(&self, names: Vec<&str>) -> Result<(), BuildError> {
        let Some((_, named)) = self.partitions.split_last() else {
            return Ok(());
        };
        match named.iter().find(|p| !names.contains(&&*p.name)) {
            None => Ok(()),
            Some(missing) => Err(BuildError::Invalid(format!(
                "overload partition {:?} names no {} of the layer (only the last partition takes \
                 the requests no other names)",
                missing.name,
                match self.partition_by {
                    PartitionBy::Policy => "policy",
                    PartitionBy::Tier => "tier",
                }
            ))),
        }
    }

    pub(crate) fn partition_by(&self) -> &PartitionBy {
        &self.partition_by
    }

    /// The partitions' names, highest share of the limit first as configured.
    pub fn partitions(&self) -> impl Iterator<Item = &str> {
        self.partitions.iter().map(|p| &*p.name)
    }

    /// The limit on requests in flight now.
    pub fn limit(&self) -> u32 {
        self.limit.current()
    }

    /// Partition `partition`'s guaranteed share of the limit (the whole limit for a gate without
    /// partitions).
    pub fn share_of(&self, partition: usize) -> f64 {
        self.partitions.get(partition).map_or(0.0, |p| p.share)
    }

    /// Whether the service is under pressure now ([`pressed`](Self::pressed) on the gate's own
    /// clock: what a policy enforced under pressure only asks).
    pub fn is_pressed(&self) -> bool {
        self.pressed(self.clock.now_nanos())
    }

    /// The recent latency of a request, admission to the end of its response (as of the last
    /// interval that had enough samples; zero before): what a shed request's `Retry-After` is
    /// derived from.
    pub fn latency(&self) -> Duration {
        self.limit.latency()
    }

    /// Requests in flight now, in every partition.
    pub fn in_flight(&self) -> u32 {
        total_of(
            self.in_flight.load(Ordering::Relaxed),
            self.partitions.len(),
        )
    }

    /// Requests in flight now in partition `partition`.
    pub fn in_flight_of(&self, partition: usize) -> u32 {
        count_of(self.in_flight.load(Ordering::Relaxed), partition)
    }

    /// Requests shed in partition `partition` since the gate was made.
    pub fn shed_of(&self, partition: usize) -> u64 {
        self.partitions
            .get(partition)
            .map_or(0, |p| p.shed.load(Ordering::Relaxed))
    }

    fn guaranteed(&self, i: usize, limit: u32) -> u32 {
        (f64::from(limit) * self.partitions[i].share) as u32
    }

    fn active(&self, i: usize, word: u64, now: u64) -> bool {
        let seen = self.partitions[i].seen.load(Ordering::Relaxed);
        count_of(word, i) > 0 || (seen != 0 && now.saturating_sub(seen - 1) < ACTIVE_FOR)
    }

    /// Admits a request of `partition` at `now` (nanoseconds of the caller's clock) and counts it
    /// in flight, or refuses it (`false`): the requests in flight are at the limit, or the
    /// partition is beyond its share and the rest is kept for other active partitions. An
    /// admitted request must be [`finish`](Self::finish)ed.
    pub fn try_admit(&self, partition: usize, now: u64) -> bool {
        let partition = partition.min(self.partitions.len() - 1);
        let seen = &self.partitions[partition].seen;
        if now.saturating_sub(seen.load(Ordering::Relaxed)) >= SEEN_GRAIN {
            seen.store(now + 1, Ordering::Relaxed);
        }
        let limit = self.limit.current();
        let many = self.partitions.len();
        let mut word = self.in_flight.load(Ordering::Relaxed);
        loop {
            let total = total_of(word, many);
            // Shares are kept under pressure only (within a tenth of the limit, as `pressed`
            // says): kept always, a partition beyond its share was refused with the service
            // idle (the free partition shed at 0.7 of capacity in the simulator's
            // steady_under_capacity), and the limit, not reached, never grew to make room.
            let pressed = total >= pressure_at(limit);
            let over = total >= limit
                || (many > 1
                    && pressed
                    && count_of(word, partition) >= self.guaranteed(partition, limit)
                    && {
                        // Borrowing: leave the unused shares of the other active partitions.
                        let kept: u32 = (0..many)
                            .filter(|&i| i != partition && self.active(i, word, now))
                            .map(|i| self.guaranteed(i, limit).saturating_sub(count_of(word, i)))
                            .sum();
                        total + kept >= limit
                    });
            if over {
                self.shed(partition, now);
                return false;
            }
            let counted = word + (1 << (16 * partition));
            match self.in_flight.compare_exchange_weak(
                word,
                counted,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    // Counted up and down, never set: a set from each thread's reading, racing
                    // another's, could leave a count that no longer holds while idle.
                    #[cfg(feature = "metrics")]
                    self.metrics().in_flight.increment(1.0);
                    return true;
                }
                Err(now_word) => word = now_word,
            }
        }
    }

    fn shed(&self, partition: usize, now: u64) {
        let p = &self.partitions[partition];
        p.shed.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.metrics().shed[partition].increment(1);
        if now.saturating_sub(self.shed_at.load(Ordering::Relaxed)) >= SEEN_GRAIN {
            self.shed_at.store(now + 1, Ordering::Relaxed);
        }
    }

    /// A request of `partition` admitted at `started` ended at `now` (`dropped`: it failed): no
    /// longer in flight, and its latency adapts the limit.
    pub fn finish(&self, partition: usize, started: u64, now: u64, dropped: bool) {
        let Some(in_flight) = self.release(partition) else {
            return; // Not admitted (a caller's mistake): nothing to end, nothing to learn.
        };
        self.sample(started, now, dropped, in_flight);
    }

    fn sample(&self, started: u64, now: u64, dropped: bool, in_flight: u32) {
        let _changed = self
            .limit
            .record(now, now.saturating_sub(started), dropped, in_flight);
        // The count as it moves (this request out), not as each interval closes: an interval
        // does not close while requests are stuck, or once traffic stops.
        #[cfg(feature = "metrics")]
        {
            let metrics = self.metrics();
            if let Some(limit) = _changed {
                metrics.limit.set(f64::from(limit));
            }
            metrics.in_flight.decrement(1.0);
        }
    }

    /// Counts a request out of flight, with no sample; returns how many were in flight before
    /// (`None`: none in its partition, nothing to count out).
    fn release(&self, partition: usize) -> Option<u32> {
        let partition = partition.min(self.partitions.len() - 1);
        let one = 1 << (16 * partition);
        // Never below 0: a `finish` without its `try_admit` (a caller's mistake) would borrow
        // from the next partition's count.
        let before = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |word| {
                (count_of(word, partition) > 0).then(|| word - one)
            });
        let before = before.ok()?;
        Some(total_of(before, self.partitions.len()))
    }

    /// Whether the service is under pressure at `now`: a request was shed within the last
    /// second, or the requests in flight are within a tenth of the limit.
    pub fn pressed(&self, now: u64) -> bool {
        let shed_at = self.shed_at.load(Ordering::Relaxed);
        let limit = self.limit.current();
        (shed_at != 0 && now.saturating_sub(shed_at - 1) < PRESSED_FOR)
            || self.in_flight() >= pressure_at(limit)
    }

    /// Admits a request of `partition` on the gate's own clock: what it holds while in flight
    /// (until its response body ends), or why it was shed.
    pub(crate) fn admit(self: &Arc<Self>, partition: usize) -> Result<InFlight, Shed> {
        let now = self.clock.now_nanos() & STARTED;
        if self.try_admit(partition, now) {
            let partition = partition.min(self.partitions.len() - 1);
            return Ok(InFlight::new(self.clone(), partition, now));
        }
        Err(Shed {
            partition: self.partitions[partition.min(self.partitions.len() - 1)]
                .name
                .clone(),
            retry_after: drain_time(self.limit.latency(), self.in_flight(), self.limit()),
            status: self.status,
        })
    }
}

/// A request in flight through the gate: counted until dropped, when its latency is recorded.
/// Sixteen bytes (the gate, and one word for its start, partition and end), as every response
/// future and body that holds one moves it.
#[derive(Debug)]
pub(crate) struct InFlight {
    gate: Arc<Gate>,
    /// Bits 0–58: when it was admitted (the gate's clock, nanoseconds: 18 years); 59: the
    /// service answered ([`ANSWERED`]); 60–61: its partition; 62–63: how it ended ([`SERVED`],
    /// [`FAILED`], [`REFUSED`], [`WAITING`]).
    word: u64,
}

const STARTED: u64 = (1 << 59) - 1;
/// The service answered (its response's head came): the request's end is a sample of its latency.
/// One that ends before, its client gone, took the service at least that long: a sample only if
/// that says more than the latency learned already (a client that hangs up after a millisecond
/// says nothing of a service that answers in fifty).
const ANSWERED: u64 = 1 << 59;
const SERVED: u64 = 0;
/// The service's error, or its body's: a dropped request.
const FAILED: u64 = 1 << 62;
/// Refused by the layer before the service saw it: no sample.
const REFUSED: u64 = 2 << 62;
/// Waiting, before its service is called (delay mode's wait, a remote decision, a body): dropped
/// so (the client went away), no sample either: the limit learns the service's latency only.
const WAITING: u64 = 3 << 62;

impl InFlight {
    fn new(gate: Arc<Gate>, partition: usize, started: u64) -> Self {
        let word = (started & STARTED) | ((partition as u64 & 3) << 60) | SERVED;
        InFlight { gate, word }
    }

    fn partition(&self) -> usize {
        ((self.word >> 60) & 3) as usize
    }

    pub(crate) fn failed(&mut self) {
        self.word = (self.word & !(3 << 62)) | FAILED;
    }

    /// The request waits before its service is called ([`WAITING`]), until [`called`](Self::called).
    pub(crate) fn waiting(&mut self) {
        self.word = (self.word & !(3 << 62)) | WAITING;
    }

    /// The service is called only now, after a wait the layer made (delay mode's, a remote
    /// decision's): the latency the limit learns is measured from here, the service's and not the
    /// wait's.
    pub(crate) fn called(&mut self) {
        let now = self.gate.clock.now_nanos() & STARTED;
        self.word = (self.word & !STARTED & !ANSWERED & !(3 << 62)) | now | SERVED;
    }

    /// The service answered: see [`ANSWERED`].
    pub(crate) fn answered(&mut self) {
        self.word |= ANSWERED;
    }

    pub(crate) fn forget(mut self) {
        self.word = (self.word & !(3 << 62)) | REFUSED;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Made only by an admission, in its (clamped) partition: the count is there to take, so
        // one `fetch_sub` ends it, where `finish` (open to any caller) must check it first.
        let one = 1 << (16 * self.partition());
        let before = self.gate.in_flight.fetch_sub(one, Ordering::AcqRel);
        let end = self.word & (3 << 62);
        let in_flight = total_of(before, self.gate.partitions.len());
        let now = self.gate.clock.now_nanos() & STARTED;
        let started = self.word & STARTED;
        let unanswered = end == SERVED && self.word & ANSWERED == 0;
        let learned = u64::try_from(self.gate.latency().as_nanos()).unwrap_or(u64::MAX);
        let telling = !unanswered || (learned > 0 && now.saturating_sub(started) > learned);
        if end != REFUSED && end != WAITING && telling {
            self.gate.sample(started, now, end == FAILED, in_flight);
        } else {
            // No sample, but the count the gauge shows moves all the same.
            #[cfg(feature = "metrics")]
            self.gate.metrics().in_flight.decrement(1.0);
        }
    }
}
