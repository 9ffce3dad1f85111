//! [`Backoff`]: the one pace of every retry, on Redis and in reading the overrides and bans again.

use std::time::Duration;

/// A wait that starts at `first` and doubles after each try, up to `most`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    first: Duration,
    most: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) const fn new(first: Duration, most: Duration) -> Self {
        Backoff {
            first,
            most,
            next: first,
        }
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn first(&self) -> Duration {
        self.first
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn most(&self) -> Duration {
        self.most
    }

    /// The next wait: from half to all of the step (processes that failed together, as at a
    /// Redis restart, do not all try again at once), then the step doubles.
    pub(crate) fn wait(&mut self) -> Duration {
        let step = self.next;
        self.next = step.saturating_mul(2).min(self.most);
        step.mul_f64(0.5 + crate::timer::unit_random() / 2.0)
    }

    /// The wait after `failures` failures in a row (the caller counts): `first` doubled that often.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn after(&self, failures: u32) -> Duration {
        self.first
            .saturating_mul(1 << failures.min(16))
            .min(self.most)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_most() {
        let ms = Duration::from_millis;
        let connecting = Backoff::new(ms(50), ms(500));
        let mut backoff = connecting;
        let steps = [ms(50), ms(100), ms(200), ms(400), ms(500), ms(500)];
        let waits: Vec<Duration> = (0..6).map(|_| backoff.wait()).collect();
        for (wait, step) in waits.iter().zip(steps) {
            assert!(*wait >= step / 2 && *wait <= step, "{wait:?} for {step:?}");
        }
        let again: Vec<Duration> = (0..6)
            .map(|_| {
                let mut first = connecting;
                first.wait()
            })
            .collect();
        assert!(again.iter().any(|w| *w != again[0]), "spread: {again:?}");
        assert_eq!(connecting.after(0), ms(50));
        assert_eq!(connecting.after(2), ms(200));
        assert_eq!(connecting.after(40), ms(500));
    }
}
