//! The queue test of the gradient's baseline, by Little's law: the concurrency that is useful is
//! the one that raises the completion rate. Between two intervals whose concurrency differs, a
//! completion rate that stayed flat says both were past the service's knee: the latency they
//! differ by, and any latency that reads as the baseline there, is a queue's.
//!
//! The [module doc](super) says when this test runs and why it is safe.

/// The smallest change of concurrency (natural log) that two intervals are compared across:
/// below it, the completion rate's noise (a few % an interval) swamps the response.
const STEP: f64 = 0.2;
/// How many recent intervals an interval is compared with: the limit's steps (`sqrt(limit)`)
/// are often below [`STEP`] from one interval to the next.
const RECENT: usize = 4;
/// The elasticity (Δ ln throughput / Δ ln concurrency) under which the throughput is flat: 1
/// below the knee (throughput follows concurrency), 0 past it (a queue).
const FLAT: f64 = 0.5;
/// A queue is suspected only where the lower concurrency's latency reads as at most this much
/// above the baseline: then the baseline itself must hold a queue. Above it, the baseline is
/// below the queue's latency, and the gradient already cuts to it.
const NEAR_BASELINE: f64 = 1.2;
/// The step of a drain: the concurrency's new fraction, an interval at a time, while the
/// throughput holds.
pub(super) const DRAIN: f64 = 0.75;
/// A baseline that fell below the confirmed one by this factor is a new, unconfirmed one.
const RECONFIRM: f64 = 1.25;

/// What an interval measured for the test: concurrency and throughput by Little's law.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    /// Natural log of the concurrency it ran under (the limit, or the peak in flight if lower).
    pub(super) in_flight: f64,
    /// Natural log of the completions a nanosecond, stale ones included.
    pub(super) rate: f64,
    /// Log2 latency (the gradient's measure).
    pub(super) log: f64,
    /// No stale sample: the interval measured one concurrency, not a cut's transition.
    pub(super) clean: bool,
}

#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// The gradient as usual.
    Go,
    /// A drain's transition interval: the limit stays.
    Hold,
    /// Past the knee with a baseline that holds a queue: the limit cut to this concurrency.
    Cut(f64),
    /// The throughput fell with the concurrency: this interval is below the knee, and its
    /// latency is the baseline.
    Baseline,
}

/// The test's state (the closer of an interval holds it).
#[derive(Debug, Default)]
pub(super) struct Little {
    /// The last clean intervals whose limit was used, oldest first (at most [`RECENT`]).
    recent: Vec<Sample>,
    /// The baseline (log2) when last confirmed: measured below the knee, or raised on evidence
    /// that the latency is not a queue's. `None`: not confirmed, the queue test may drain.
    confirmed: Option<f64>,
    draining: bool,
}

impl Little {
    pub(super) fn confirm(&mut self, baseline: f64) {
        self.confirmed = Some(baseline);
        self.draining = false;
    }

    /// Judges an interval (`None`: no rate measured, the clock went back); `used`: its peak in
    /// flight reached the limit's [`USED`](super::USED), `min`: the limit's minimum.
    pub(super) fn judge(
        &mut self,
        sample: Option<Sample>,
        used: bool,
        baseline: f64,
        min: f64,
    ) -> Verdict {
        // A baseline that moved down (the service got faster, or a queue shrank) is new:
        // whether it holds a queue is not known yet.
        if self
            .confirmed
            .is_some_and(|c| baseline < c - RECONFIRM.log2())
        {
            self.confirmed = None;
        }
        let Some(now) = sample.filter(|_| used) else {
            // Not using its limit, the throughput is the arrivals', not the service's.
            self.recent.clear();
            self.draining = false;
            return Verdict::Go;
        };
        if !now.clean {
            // A cut's transition: the old queue drains at the old rate. Compared next interval.
            return if self.draining {
                Verdict::Hold
            } else {
                Verdict::Go
            };
        }
        let above_min = now.in_flight.exp() > min * 1.1;
        if self.draining {
            // Compared with the interval before the cut (the only one kept).
            let before = self.recent.first().copied().unwrap_or(now);
            let step = now.in_flight - before.in_flight;
            self.recent = vec![now];
            if step < -STEP && (now.rate - before.rate) / step < FLAT && above_min {
                return Verdict::Cut(now.in_flight.exp() * DRAIN);
            }
            self.draining = false;
            if step < -STEP || !above_min {
                // The throughput followed the concurrency down (or it is at the minimum):
                // below the knee, its latency is the service's own.
                self.confirm(now.log);
                return Verdict::Baseline;
            }
            // The concurrency did not move with the cut (demand fell): inconclusive.
            return Verdict::Go;
        }
        // Any recent interval a step away whose throughput this one's did not follow: both
        // were past the knee. (A false alarm costs one drain step and confirms the baseline.)
        let queued = self.recent.iter().find(|r| {
            let step = now.in_flight - r.in_flight;
            step.abs() >= STEP && (now.rate - r.rate) / step < FLAT
        });
        let lower = queued.map(|r| if r.in_flight < now.in_flight { *r } else { now });
        if self.recent.len() == RECENT {
            self.recent.remove(0);
        }
        self.recent.push(now);
        if let Some(lower) = lower.filter(|l| {
            self.confirmed.is_none()
                && (l.log - baseline).exp2() <= NEAR_BASELINE
                && l.in_flight.exp() > min * 1.1
        }) {
            self.draining = true;
            // The drain's next interval is compared with the lower one, known to be past the knee.
            self.recent = vec![lower];
            return Verdict::Cut(lower.in_flight.exp() * DRAIN);
        }
        Verdict::Go
    }
}
