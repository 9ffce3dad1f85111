//! [`Backoff`]: the one pace of every retry in the backend — connecting one server or a lazily
//! started Cluster, a Cluster's `TRYAGAIN`, a concurrency slot's release, an open circuit's probes.

use std::time::Duration;

/// A wait that starts at `first` and doubles after each try, up to `most`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    first: Duration,
    most: Duration,
    next: Duration,
}

/// Connecting (both keepers): every 50 ms, backing off to 500 ms.
pub(crate) const CONNECTING: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_millis(500));

impl Backoff {
    /// `first`, then twice as long each time, at most `most`.
    pub(crate) const fn new(first: Duration, most: Duration) -> Self {
        Backoff {
            first,
            most,
            next: first,
        }
    }

    /// The first wait.
    pub(crate) const fn first(&self) -> Duration {
        self.first
    }

    /// The wait now; the next one is twice as long (at most `most`).
    pub(crate) fn wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = wait.saturating_mul(2).min(self.most);
        wait
    }

    /// The wait after `failures` failures in a row (the caller counts): `first` doubled that often.
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
        let mut backoff = CONNECTING;
        let waits: Vec<Duration> = (0..6).map(|_| backoff.wait()).collect();
        assert_eq!(waits, [ms(50), ms(100), ms(200), ms(400), ms(500), ms(500)]);
        assert_eq!(CONNECTING.after(0), ms(50));
        assert_eq!(CONNECTING.after(2), ms(200));
        assert_eq!(CONNECTING.after(40), ms(500));
    }
}
