//! [`AdaptiveLimit`]: a limit on requests in flight that follows the service's latency.
//!
//! **Measured**: each request's latency from admission to the end of its response body, in
//! intervals of at least [`INTERVAL`] and three typical latencies. An interval's latency is the
//! **geometric mean** of its samples: slow clients holding their slot for seconds move it a little,
//! a queue (which delays every request) moves it in full.
//!
//! **Baseline** (the unloaded latency): the lowest smoothed interval latency. It moves down at
//! once, and **up only on evidence** that the latency is not a queue's: after the limit was cut to
//! 60 % or less of an episode's reference (or to the minimum), the latency did not fall with it
//! (above the geometric middle of "fell in proportion" and "did not fall") while the throughput
//! did (elasticity ½ or more: by Little's law a slower service at the same throughput is a queue,
//! one still building when the reference was measured, as after a capacity drop). Samples of requests
//! admitted before a cut drained are counted apart (stale): they wait behind the old queue, and
//! judging the cut by them read a queue as a slow dependency (the limit drifted in `capacity_drop`).
//!
//! **A baseline is not trusted until the throughput vouches for it** (`little.rs`): the lowest
//! latency seen is a queue's where the service was never seen unloaded (overloaded from the start)
//! or where it became faster under a queue (the baseline came down to the new latency at the old
//! concurrency: the trial's `slow_then_fast`, 48 clients over 16 workers, 3× the unloaded latency
//! and nothing shed). Little's law tells the two apart without an idle service: the concurrency is
//! useful while raising it raises the completion rate. Where two recent intervals that used their
//! limit differ in concurrency by a fifth or more and the throughput did not follow (elasticity
//! under ½), both were past the knee; if the lower one's latency reads as a baseline not yet
//! confirmed (within 1.2×), the baseline holds a queue, and the limit **drains** to ¾ of the lower
//! concurrency an interval at a time (each judged after the cut's stale requests drained) while the
//! throughput holds. The first step where the throughput falls with the concurrency is below the
//! knee: its latency is the baseline, confirmed, and the gradient goes on from there (BBR's `max
//! throughput × min latency`, the minimum taken where the throughput says it is not a queue's). A
//! confirmed baseline is not drained again until it falls by a quarter (a new, faster service). The
//! concurrency is the limit the interval ran under (its peak in flight if lower): a mean in flight
//! by Little (latencies over the span) was off by a fifth at an interval's edges and hid the growth
//! past the knee. The constants are in `little.rs`.
//!
//! **Gradient, not Vegas**: Vegas's queue estimate `limit × (1 − rtt_min / rtt)` needs a true
//! minimum RTT; a stale one makes every later sample look queued and sticks it at the minimum
//! (go-concurrency-limits #117). The gradient is scale-free (`latency / baseline`), and its
//! baseline has an explicit rule to move. The cut goes halfway to where the latency is back
//! within the tolerance (`limit × √(tolerance / ratio)`, at most half), from the peak in flight
//! if lower: the next interval finishes the cut if the queue was the whole of it.
//!
//! **Failure modes avoided**:
//! * upward drift under a steady queue (Netflix concurrency-limits PR #134: Gradient2's long-term
//!   average follows the queue): no average follows a latency up; a queue's latency stays above the
//!   baseline and keeps the limit cut (`latency_rises_with_concurrency`, test
//!   `gradient_shrinks_under_a_queue_without_drifting_up`); a drain only cuts;
//! * stuck at the minimum (#117): at the minimum a latency that stays high becomes the baseline,
//!   and a latency within the tolerance grows the limit by at least 1 an interval (for the gradient
//!   up to `sqrt(limit)`, in proportion to how far below the tolerance the latency is); a drain
//!   that reaches the minimum takes its latency as the baseline;
//! * pinning spikes (Envoy #8337): nothing forces the concurrency down on a timer to measure the
//!   baseline; a drain steps down by quarters, on evidence only, once per new baseline, and stops
//!   at the first fall in throughput (one interval at ¾ of the knee);
//! * a real latency step (a slower dependency) read as a queue: its throughput falls with the
//!   concurrency (`L / latency`), which the queue test reads as below the knee, so a drain that
//!   meets it confirms it as the baseline (`latency_step`, the slow phase of `slow_then_fast`);
//! * an idle service inflating its limit: growth only in an interval whose peak in flight reached
//!   [`USED`] of the limit; a latency above the tolerance with the limit not reached cuts nothing
//!   either (it shed on noise in `steady_under_capacity`).
//!
//! **Defaults, from the simulator** (`tests/overload`, `benchmarks/overload-sim.md`):
//! `tolerance` 1.5 (1.8 let a queue stand: `capacity_drop_overloaded` at 42 % goodput and a p99
//! of 4.3 × the unloaded one, `overloaded_from_start_closed` 1.60 × for 1.41 ×; 1.3 cut on
//! noise: 75 % goodput in `slow_clients`); `interval` 25 ms (50 ms: 91 % goodput in
//! `slow_clients`, the p99 ratios within 0.03; 100 ms: 90 %, and `capacity_drop_overloaded`'s p99
//! at 2.06 ×); `backoff` 0.9, Netflix's AIMD default, not tuned (AIMD is the comparison).
//!
//! **Concurrency**: `record` loads the interval's end and last cut, does one `fetch_add` on a word
//! packing the interval's sample count and sum of log-latencies, a `fetch_max` only on a new peak
//! in flight and a `fetch_add` only for a dropped or stale request. Whoever crosses the interval's
//! end closes it under a `Mutex::try_lock`, swapping the accumulators out: a sample added after the
//! swap counts in the next interval; none is lost. The queue test runs in the closer only.
//! `current` is one relaxed load.

mod little;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use little::{Little, Sample, Verdict};

/// Which algorithm adapts the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LimitAlgorithm {
    /// Additive increase, multiplicative decrease: one more while requests succeed quickly, a
    /// fraction less when one fails or takes longer than a threshold.
    Aimd,
    /// Follows the gradient of latency against its unloaded baseline.
    #[default]
    Gradient,
}

// The adaptation's constants (the module doc says which scenario set which): the shortest
// sampling interval; the latency ratio to the baseline above which the limit is cut; AIMD's cut,
// the limit's new fraction.
const INTERVAL: Duration = Duration::from_millis(25);
const TOLERANCE: f64 = 1.5;
const BACKOFF: f64 = 0.9;
/// An interval whose peak in flight reached this fraction of the limit used it: only such an
/// interval grows the limit.
pub(crate) const USED: f64 = 0.8;

/// What adapts the limit, validated by [`Overload`](super::Overload)'s build.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LimitSettings {
    pub(crate) algorithm: LimitAlgorithm,
    pub(crate) min: u32,
    pub(crate) max: u32,
    pub(crate) initial: u32,
}

/// Fractional bits of a log2 latency in the accumulator.
const LOG_SCALE: f64 = 256.0;
/// The accumulator's low bits: the sum of log2 latencies (at most 64 × 256 = 2^14 a sample).
const SUM_BITS: u32 = 44;
const SUM_MASK: u64 = (1 << SUM_BITS) - 1;
/// An interval is closed early past this many samples, far below the 20 bits of its count.
const MAX_SAMPLES: u64 = 1 << 18;
/// An interval with fewer samples is extended (too noisy to act on), unless requests dropped.
const MIN_SAMPLES: u64 = 10;
/// The weight of an interval in the smoothed latency the baseline is taken from.
const SMOOTHING: f64 = 0.25;
/// A congested episode whose limit fell to this fraction without the latency falling with it
/// shows a latency that is not a queue's.
const INSENSITIVE_CUT: f64 = 0.6;

/// What only the closer of an interval touches.
#[derive(Debug)]
struct State {
    /// The limit, unrounded (additive growth of less than 1 accumulates).
    limit: f64,
    /// The smoothed log2 latency of the last intervals.
    smoothed: Option<f64>,
    /// The log2 unloaded latency.
    baseline: Option<f64>,
    /// Samples counted in closed intervals (the no-lost-sample test's tally).
    counted: u64,
    /// In a congested episode (intervals above the tolerance, one after the other).
    congested: bool,
    /// The episode's reference: concurrency, latency ratio and log throughput (if measured) of
    /// its second interval (the first measured a queue still building, below what its
    /// concurrency holds).
    episode: Option<(f64, f64, Option<f64>)>,
    little: Little,
}

/// A limit on requests in flight, adapted to the latency of the requests that end.
#[derive(Debug)]
pub struct AdaptiveLimit {
    limit: AtomicU32,
    /// The interval's sample count (high bits) and sum of log2 latencies × 256 (low bits).
    samples: AtomicU64,
    peak: AtomicU32,
    drops: AtomicU32,
    /// Samples of requests admitted before the last cut took effect, counted apart: they
    /// measured the concurrency before it, and judging the cut by them reads the old queue as
    /// the new one.
    stale: AtomicU64,
    /// A request admitted before this is stale: `u64::MAX` from a cut until the requests in
    /// flight fell to the new limit (those admitted meanwhile wait behind the old queue), then
    /// that time.
    cut_at: AtomicU64,
    /// When the interval began and ends (the clock of `record`).
    start: AtomicU64,
    end: AtomicU64,
    /// The last interval's typical latency (its geometric mean), nanoseconds.
    mean: AtomicU64,
    state: Mutex<State>,
    settings: LimitSettings,
}

fn log2_fixed(latency: u64) -> u64 {
    ((latency.max(1) as f64).log2() * LOG_SCALE) as u64
}

impl AdaptiveLimit {
    pub(crate) fn new(settings: &LimitSettings) -> Self {
        // Unvalidated settings must not panic (clamp does with min > max): bounds made sane.
        let mut settings = settings.clone();
        settings.min = settings.min.max(1);
        settings.max = settings.max.max(settings.min);
        settings.initial = settings.initial.clamp(settings.min, settings.max);
        AdaptiveLimit {
            limit: AtomicU32::new(settings.initial),
            samples: AtomicU64::new(0),
            peak: AtomicU32::new(0),
            drops: AtomicU32::new(0),
            stale: AtomicU64::new(0),
            cut_at: AtomicU64::new(0),
            start: AtomicU64::new(0),
            end: AtomicU64::new(0),
            mean: AtomicU64::new(0),
            state: Mutex::new(State {
                limit: f64::from(settings.initial),
                smoothed: None,
                baseline: None,
                counted: 0,
                congested: false,
                episode: None,
                little: Little::default(),
            }),
            settings,
        }
    }

    /// The limit now.
    pub fn current(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    /// A request ended at `now_nanos` (the clock the gate was given) after `latency_nanos`;
    /// `dropped`: it failed or timed out; `in_flight`: requests in flight when it ended.
    /// `Some(limit)`: the limit was adapted (a sampling interval ended with this request).
    pub fn record(
        &self,
        now_nanos: u64,
        latency_nanos: u64,
        dropped: bool,
        in_flight: u32,
    ) -> Option<u32> {
        let end = self.end.load(Ordering::Relaxed);
        // A clock gone back before the interval began resynchronizes instead of stalling.
        let resync = self.gone_back(now_nanos);
        let cut_at = self.cut_at.load(Ordering::Relaxed);
        if cut_at == u64::MAX && in_flight <= self.current() {
            self.cut_at.store(now_nanos, Ordering::Relaxed);
        }
        if now_nanos.saturating_sub(latency_nanos) < cut_at {
            self.stale.fetch_add(1, Ordering::Relaxed);
            if !resync {
                return None;
            }
            let mut state = self.state.try_lock().ok()?;
            return self.close(&mut state, now_nanos);
        }
        let before = self.samples.fetch_add(
            (1 << SUM_BITS) + log2_fixed(latency_nanos),
            Ordering::Relaxed,
        );
        if in_flight > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(in_flight, Ordering::Relaxed);
        }
        if dropped {
            self.drops.fetch_add(1, Ordering::Relaxed);
        }
        let due = now_nanos >= end || resync || (before >> SUM_BITS) + 1 >= MAX_SAMPLES;
        if !due {
            return None;
        }
        let mut state = self.state.try_lock().ok()?;
        self.close(&mut state, now_nanos)
    }

    /// Whether `now` lies more than an interval before the current one began: a clock gone back
    /// (a restored VM, a reset test clock). Less is a request that read the clock just before
    /// another closed the interval, which must not undo that close (a cut's stale requests).
    fn gone_back(&self, now: u64) -> bool {
        now.saturating_add(INTERVAL.as_nanos() as u64) < self.start.load(Ordering::Relaxed)
    }

    /// Closes the interval (its closer holds the state): the limit adapted to its samples.
    fn close(&self, state: &mut State, now: u64) -> Option<u32> {
        let interval = INTERVAL.as_nanos() as u64;
        let word = self.samples.load(Ordering::Relaxed);
        let count = word >> SUM_BITS;
        let end = self.end.load(Ordering::Relaxed);
        let resync = self.gone_back(now);
        let early = count >= MAX_SAMPLES;
        if !(now >= end || resync || early) {
            return None; // Another thread closed it meanwhile.
        }
        let drops = self.drops.load(Ordering::Relaxed);
        if resync {
            self.cut_at.store(0, Ordering::Relaxed);
        }
        if count < MIN_SAMPLES && drops == 0 {
            if resync {
                self.start.store(now, Ordering::Relaxed);
                self.end
                    .store(now.saturating_add(interval), Ordering::Relaxed);
            }
            return None; // Too few samples yet: the interval goes on.
        }
        let word = self.samples.swap(0, Ordering::Relaxed);
        let peak = self.peak.swap(0, Ordering::Relaxed);
        let drops = self.drops.swap(0, Ordering::Relaxed);
        // Stale samples are completions too: the throughput counts them (and the tally).
        let stale = self.stale.swap(0, Ordering::Relaxed);
        state.counted += (word >> SUM_BITS) + stale;
        let count = (word >> SUM_BITS).max(1);
        let log = (word & SUM_MASK) as f64 / LOG_SCALE / count as f64;
        let typical = log.exp2().min(1e12) as u64;
        self.mean.store(typical, Ordering::Relaxed);
        // The next interval spans at least three typical latencies.
        let span = interval.max(typical.saturating_mul(3));
        // The throughput: completions over the interval's span, stale ones too.
        let began = self.start.load(Ordering::Relaxed);
        let rate = (!resync && now > began)
            .then(|| (((word >> SUM_BITS) + stale) as f64 / (now - began) as f64).ln());
        self.start.store(now, Ordering::Relaxed);
        self.end.store(now.saturating_add(span), Ordering::Relaxed);

        let limit = self.adapt(state, log, peak, drops > 0, rate.map(|r| (r, stale == 0)));
        if limit < self.limit.swap(limit, Ordering::Relaxed) {
            self.cut_at.store(u64::MAX, Ordering::Relaxed);
        }
        Some(limit)
    }

    /// The new limit after an interval of log2 latency `log`, peak in flight `peak`.
    fn adapt(
        &self,
        state: &mut State,
        log: f64,
        peak: u32,
        dropped: bool,
        rate: Option<(f64, bool)>,
    ) -> u32 {
        let s = &self.settings;
        let smoothed = state
            .smoothed
            .map_or(log, |prev| prev + SMOOTHING * (log - prev));
        state.smoothed = Some(smoothed);
        let baseline = state.baseline.map_or(smoothed, |b| b.min(smoothed));
        state.baseline = Some(baseline);
        let ratio = (log - baseline).exp2();
        let (min, max) = (f64::from(s.min), f64::from(s.max));
        let mut limit = state.limit.clamp(min, max);
        let used = f64::from(peak) >= USED * limit;
        // What these samples were admitted under (a stale one is counted apart).
        let under = limit.min(f64::from(peak)).max(min);
        if s.algorithm == LimitAlgorithm::Gradient {
            let sample = rate.map(|(rate, clean)| Sample {
                in_flight: under.ln(),
                rate,
                log,
                clean,
            });
            match state.little.judge(sample, used, baseline, min) {
                Verdict::Go => {}
                Verdict::Hold => {
                    state.limit = limit;
                    return limit as u32;
                }
                Verdict::Cut(to) => {
                    state.episode = None;
                    state.congested = false;
                    state.limit = to.min(limit).clamp(min, max);
                    return state.limit as u32;
                }
                Verdict::Baseline => {
                    state.baseline = Some(log);
                    state.smoothed = Some(log);
                    state.episode = None;
                    state.congested = false;
                    return limit as u32;
                }
            }
        }
        // A latency above the tolerance while the limit is not reached is not the limit's to
        // fix (yet): cutting then sheds on noise (`steady_under_capacity`).
        let congested =
            (ratio > TOLERANCE && used) || (dropped && s.algorithm == LimitAlgorithm::Aimd);

        if congested {
            match state.episode {
                None if state.congested => {
                    state.episode = Some((under, ratio, rate.map(|(r, _)| r)))
                }
                None => state.congested = true,
                // A queue's delay falls with the concurrency (in proportion, above the
                // workers): a latency above the geometric middle of "fell in proportion" and
                // "did not fall" after a real cut is not ours. It becomes the baseline, uncut.
                Some((start, start_ratio, start_rate)) => {
                    let cut = under / start;
                    // The throughput must have fallen with the concurrency too: by the latency
                    // alone, the real side by side's capacity drop (`DROP_TO=3`) raised the
                    // baseline to 2× (its reference measured a queue still building).
                    let fell = match (start_rate, rate) {
                        // Elasticity ½ or more: the throughput followed the concurrency down.
                        (Some(before), Some((now, _))) => (now - before) / cut.ln() >= 0.5,
                        _ => true,
                    };
                    if (cut <= INSENSITIVE_CUT || under <= min)
                        && ratio >= start_ratio * cut.sqrt()
                        && fell
                    {
                        state.baseline = Some(log);
                        state.smoothed = Some(log);
                        state.little.confirm(log);
                        state.episode = None;
                        state.congested = false;
                        state.limit = limit;
                        return limit as u32;
                    }
                }
            }
            limit = match s.algorithm {
                LimitAlgorithm::Aimd => limit * BACKOFF,
                // Cut halfway (geometrically) to where the latency would be back within the
                // tolerance, at most by half an interval, from what was actually in flight (a cut
                // above it changes nothing). A cut all the way there (`tolerance / ratio`)
                // overshoots where part of the latency is not a queue's: `slow_clients` lost 9 points
                // of goodput with it (87 % against 96 %), and a cut to the baseline (1 / ratio)
                // a fifth more.
                LimitAlgorithm::Gradient => under * (TOLERANCE / ratio).sqrt().max(0.5),
            }
            .max(min);
        } else {
            state.episode = None;
            state.congested = false;
            if used {
                limit += match s.algorithm {
                    LimitAlgorithm::Aimd => 1.0,
                    // Slower near the tolerance: full growth there overshot into a standing queue
                    // (the real side by side's p99 at 2.3 × the unloaded one, 1.8 without).
                    LimitAlgorithm::Gradient => (limit.sqrt()
                        * ((TOLERANCE - ratio) / (TOLERANCE - 1.0)).clamp(0.0, 1.0))
                    .max(1.0),
                };
            }
        }
        state.limit = limit.clamp(min, max);
        state.limit as u32
    }

    /// The recent typical latency of a request (the geometric mean of the last interval's:
    /// slow clients do not stretch it), for a refusal's `Retry-After`.
    pub fn latency(&self) -> Duration {
        Duration::from_nanos(self.mean.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests;
