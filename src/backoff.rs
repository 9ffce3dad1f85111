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

    pub(crate) fn wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = wait.saturating_mul(2).min(self.most);
        wait
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
        let waits: Vec<Duration> = (0..6).map(|_| backoff.wait()).collect();
        assert_eq!(waits, [ms(50), ms(100), ms(200), ms(400), ms(500), ms(500)]);
        assert_eq!(connecting.after(0), ms(50));
        assert_eq!(connecting.after(2), ms(200));
        assert_eq!(connecting.after(40), ms(500));
    }
}
