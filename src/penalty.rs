//! The penalty box: a key limited `after` times within `within` is banned for `ban` (fail2ban,
//! Rack::Attack's Allow2Ban).

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::BuildError;
use crate::key::Key;
use crate::observe::{sampled, OncePerSecond};

/// A key that is limited `after` times within `within` of its first rejection is banned for `ban`
/// (Rack::Attack's Allow2Ban counting): every request of it is answered 429 with `Retry-After` = the
/// rest of the ban (or the limit's own retry time, if later), without asking the backend.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{key::PeerIp, policy::Penalty, Policy, Quota};
///
/// let login = Policy::builder("login")
///     .key(PeerIp::new())
///     .quota(Quota::per_minute(5))
///     // Three rejections within a minute: banned for ten minutes.
///     .penalty(Penalty::new(3, Duration::from_secs(60), Duration::from_secs(600)).unwrap())
///     .build()
///     .unwrap();
/// # let _ = login;
/// assert!(Penalty::new(0, Duration::from_secs(60), Duration::from_secs(600)).is_err());
/// ```
///
/// The Redis backend keeps strikes and bans in Redis, next to the key's state (`…:{key}:strikes`, a
/// counter expiring `within` after the first strike, and `…:{key}:ban`), in the same atomic call, so
/// every process shares them, one box per policy whatever tier or override quota a key is under;
/// a refusal the policy does not enforce (staged, under pressure only) is no strike. Other
/// backends get an in-process penalty box from the layer, which tracks 100,000 keys a policy at
/// most: one full of bans (keys that rotate get banned too) tracks no new key until a ban ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Penalty {
    after: u32,
    within: Duration,
    ban: Duration,
}

/// The longest `ban` (a year): bans are for abuse, not for accounting.
const LONGEST_BAN: Duration = Duration::from_secs(366 * 86_400);
/// The longest `within` (a day): strikes of keys an attacker invents must not live long.
const LONGEST_WINDOW: Duration = Duration::from_secs(86_400);

impl Penalty {
    /// Banned for `ban` after `after` rejections within `within`. `after` is 1 to 1000, `within` 1 ms
    /// to a day, `ban` 1 ms to a year.
    pub fn new(after: u32, within: Duration, ban: Duration) -> Result<Self, BuildError> {
        let invalid = |what: &str| Err(BuildError::Invalid(format!("penalty: {what}")));
        if !(1..=1000).contains(&after) {
            return invalid("after must be 1 to 1000 rejections");
        }
        for (name, d, longest, what) in [
            ("within", within, LONGEST_WINDOW, "a day"),
            ("ban", ban, LONGEST_BAN, "a year"),
        ] {
            if d < Duration::from_millis(1) || d > longest {
                return invalid(&format!("{name} must be 1 ms to {what}, not {d:?}"));
            }
        }
        Ok(Penalty { after, within, ban })
    }

    /// Rejections that earn a ban.
    pub fn after(&self) -> u32 {
        self.after
    }

    /// The window they must fall in.
    pub fn within(&self) -> Duration {
        self.within
    }

    /// The length of a ban.
    pub fn ban(&self) -> Duration {
        self.ban
    }
}

impl fmt::Display for Penalty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "banned {:?} after {} rejections within {:?}",
            self.ban, self.after, self.within
        )
    }
}

/// Keys tracked by one in-process penalty box at most (about 80 bytes each). A full box forgets what
/// has expired and, if still full, every strike count that is not a ban: an attack with endless fresh
/// keys can neither grow it nor lift a ban. It does so at most every `PRUNE_EVERY`; meanwhile a
/// fresh key's rejection is no strike.
const CAPACITY: usize = 100_000;

/// The in-process penalty box of one policy (for backends that do not keep penalties themselves).
pub(crate) struct PenaltyBox {
    penalty: Penalty,
    entries: Mutex<Entries>,
    /// Logs a full box at most once a second.
    full: OncePerSecond,
}

#[derive(Default)]
struct Entries {
    map: HashMap<Key, Entry>,
    /// A full box prunes at most this often, so that a flood of fresh keys does not make every
    /// rejection a scan of the whole box.
    next_prune: Option<Instant>,
}

const PRUNE_EVERY: Duration = Duration::from_millis(100);

struct Entry {
    /// Rejections since `first`.
    strikes: u32,
    first: Instant,
    banned_until: Option<Instant>,
}

impl PenaltyBox {
    pub(crate) fn new(penalty: Penalty) -> Self {
        PenaltyBox {
            penalty,
            entries: Mutex::default(),
            full: OncePerSecond::default(),
        }
    }

    /// The rest of `key`'s ban, if it is banned.
    pub(crate) fn banned(&self, key: &Key) -> Option<Duration> {
        self.banned_at(key, Instant::now())
    }

    /// [`banned`](Self::banned) at `now` (the tests' manual clock).
    fn banned_at(&self, key: &Key, now: Instant) -> Option<Duration> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let until = entries.map.get(key)?.banned_until?;
        if until > now {
            Some(until - now)
        } else {
            entries.map.remove(key);
            None
        }
    }

    pub(crate) fn penalty(&self) -> Penalty {
        self.penalty
    }

    pub(crate) fn forget(&self, key: &Key) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.map.remove(key);
    }

    /// Counts a rejection of `key`; returns the ban it earned, if any.
    pub(crate) fn strike(&self, key: &Key) -> Option<Duration> {
        self.strike_at(key, Instant::now())
    }

    /// [`strike`](Self::strike) at `now` (the tests' manual clock).
    fn strike_at(&self, key: &Key, now: Instant) -> Option<Duration> {
        let Penalty { after, within, ban } = self.penalty;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.map.len() >= CAPACITY && !entries.map.contains_key(key) {
            // Between two scans of a full box, a fresh key's rejection is no strike.
            if entries.next_prune.is_some_and(|t| now < t) {
                return None;
            }
            entries.next_prune = Some(now + PRUNE_EVERY);
            entries
                .map
                .retain(|_, e| e.banned_until.is_some_and(|u| u > now) || now - e.first < within);
            if entries.map.len() >= CAPACITY {
                entries
                    .map
                    .retain(|_, e| e.banned_until.is_some_and(|u| u > now));
                let bans = entries.map.len();
                sampled!(
                    self.full,
                    warn,
                    (bans,),
                    "penalty box full; strikes that are no ban forgotten"
                );
                if bans >= CAPACITY {
                    return None;
                }
            }
        }
        let entry = entries.map.entry(key.clone()).or_insert(Entry {
            strikes: 0,
            first: now,
            banned_until: None,
        });
        if now - entry.first >= within {
            entry.strikes = 0;
            entry.first = now;
        }
        entry.strikes += 1;
        if entry.strikes >= after {
            entry.strikes = 0;
            entry.banned_until = Some(now + ban);
            return Some(ban);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strikes_outside_the_window_do_not_count_and_bans_end() {
        // A manual clock (`*_at`): every boundary is checked exactly, however slow the machine.
        let within = Duration::from_millis(100);
        let ban = Duration::from_millis(20);
        let b = PenaltyBox::new(Penalty::new(2, within, ban).unwrap());
        let k = Key::from("k");
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        assert_eq!(b.strike_at(&k, t0), None);
        // At exactly `within` the first strike has expired: this one opens a new window.
        assert_eq!(b.strike_at(&k, ms(100)), None, "the first strike expired");
        assert_eq!(b.banned_at(&k, ms(100)), None);
        // The second strike of the new window, 1 ms before it closes: banned.
        assert_eq!(
            b.strike_at(&k, ms(199)),
            Some(ban),
            "two strikes within the window"
        );
        assert_eq!(
            b.banned_at(&k, ms(199)),
            Some(ban),
            "banned right after the strike"
        );
        assert_eq!(
            b.banned_at(&k, ms(218)),
            Some(Duration::from_millis(1)),
            "the rest of the ban"
        );
        assert_eq!(b.banned_at(&k, ms(219)), None, "the ban ended");
        // The ban consumed the strikes: one more rejection is a first strike, not a ban.
        assert_eq!(b.strike_at(&k, ms(220)), None);
        assert_eq!(b.banned_at(&k, ms(220)), None);
        let other = Key::from("other");
        assert_eq!(b.strike_at(&other, ms(221)), None);
        assert_eq!(b.banned_at(&k, ms(221)), None);
    }

    fn fill(b: &PenaltyBox, keys: impl Iterator<Item = String>, at: Instant) {
        for key in keys {
            b.strike_at(&Key::from(key), at);
        }
    }

    #[test]
    fn a_full_box_forgets_expired_strikes_first_and_never_a_ban() {
        let (within, ban) = (Duration::from_millis(100), Duration::from_secs(1));
        let b = PenaltyBox::new(Penalty::new(2, within, ban).unwrap());
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let banned = Key::from("banned");
        b.strike_at(&banned, t0);
        assert_eq!(b.strike_at(&banned, t0), Some(ban));
        // Half the box struck at 0 ms (expired by 120 ms), half at 60 ms (live until 160 ms).
        fill(&b, (1..CAPACITY / 2).map(|i| format!("old{i}")), t0);
        fill(&b, (0..CAPACITY / 2).map(|i| format!("live{i}")), ms(60));
        assert_eq!(b.entries.lock().unwrap().map.len(), CAPACITY);
        // A new key in a full box: the expired strikes go, the live ones and the ban stay.
        assert_eq!(b.strike_at(&Key::from("new"), ms(120)), None);
        // The ban, the live strikes and the new key.
        assert_eq!(b.entries.lock().unwrap().map.len(), 1 + CAPACITY / 2 + 1);
        assert_eq!(
            b.strike_at(&Key::from("live0"), ms(130)),
            Some(ban),
            "a live strike kept"
        );
        assert!(b.banned_at(&banned, ms(130)).is_some(), "the ban kept");
    }

    #[test]
    fn a_box_full_of_live_strikes_forgets_them_and_one_full_of_bans_tracks_no_new_key() {
        let (within, ban) = (Duration::from_secs(60), Duration::from_secs(60));
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let b = PenaltyBox::new(Penalty::new(2, within, ban).unwrap());
        let banned = Key::from("banned");
        b.strike_at(&banned, t0);
        b.strike_at(&banned, t0);
        fill(&b, (1..CAPACITY).map(|i| format!("k{i}")), t0);
        // A key the full box tracks strikes on as ever: its second strike is its ban.
        assert_eq!(b.strike_at(&Key::from("k2"), ms(5)), Some(ban));
        // Nothing has expired: every strike that is not a ban is forgotten.
        assert_eq!(b.strike_at(&Key::from("new"), ms(10)), None);
        assert_eq!(
            b.strike_at(&Key::from("k1"), ms(20)),
            None,
            "k1's strike forgotten"
        );
        assert!(b.banned_at(&banned, ms(20)).is_some(), "the ban kept");
        // A box full of bans: a new key is not tracked (its strike earns nothing), the bans stay.
        let bans = PenaltyBox::new(Penalty::new(1, within, ban).unwrap());
        fill(&bans, (0..CAPACITY).map(|i| format!("b{i}")), t0);
        let fresh = Key::from("fresh");
        assert_eq!(bans.strike_at(&fresh, ms(10)), None, "not tracked");
        assert_eq!(bans.banned_at(&fresh, ms(10)), None);
        assert!(bans.banned_at(&Key::from("b0"), ms(10)).is_some());
        // Pruned at most every PRUNE_EVERY: 50 ms later the full box is not scanned again, and
        // after it, it is (still full of bans: still not tracked).
        assert_eq!(bans.strike_at(&fresh, ms(60)), None);
        assert_eq!(bans.strike_at(&fresh, ms(200)), None);
    }

    #[test]
    fn a_full_box_scans_for_expired_strikes_at_most_every_prune_interval() {
        let within = Duration::from_millis(30);
        let b = PenaltyBox::new(Penalty::new(2, within, Duration::from_secs(60)).unwrap());
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        fill(&b, (0..CAPACITY).map(|i| format!("a{i}")), t0);
        // Full of live strikes at 10 ms: scanned (nothing expired), then every strike forgotten.
        assert_eq!(b.strike_at(&Key::from("n1"), ms(10)), None);
        // Full again at 55 ms: half struck at 20 ms (expired by 60 ms), half at 55 ms (live).
        fill(&b, (0..CAPACITY / 2).map(|i| format!("b{i}")), ms(20));
        fill(&b, (1..CAPACITY / 2).map(|i| format!("c{i}")), ms(55));
        assert_eq!(b.entries.lock().unwrap().map.len(), CAPACITY);
        // At 60 ms, within PRUNE_EVERY of the last scan: no scan (a flood of fresh keys scans a
        // full box ten times a second at most), and the fresh key is not tracked; the strikes
        // in the box count on.
        assert_eq!(b.strike_at(&Key::from("n2"), ms(60)), None);
        assert_eq!(b.entries.lock().unwrap().map.len(), CAPACITY, "not scanned");
        let c1 = Key::from("c1");
        assert_eq!(b.strike_at(&c1, ms(61)), Some(Duration::from_secs(60)));
        // At 111 ms, scanned again: every strike has expired; c1's ban stays.
        assert_eq!(b.strike_at(&Key::from("n3"), ms(111)), None);
        assert_eq!(b.entries.lock().unwrap().map.len(), 2);
        assert!(b.banned_at(&c1, ms(111)).is_some());
    }

    #[test]
    fn a_penalty_reads_back_as_built() {
        let p = Penalty::new(3, Duration::from_secs(10), Duration::from_secs(60)).unwrap();
        assert_eq!(
            (p.after(), p.within(), p.ban()),
            (3, Duration::from_secs(10), Duration::from_secs(60))
        );
        assert_eq!(p.to_string(), "banned 60s after 3 rejections within 10s");
        // The longest ban is a year (366 days), the longest window a day.
        let day = Duration::from_secs(86_400);
        assert!(Penalty::new(1, day, day * 366).is_ok());
        assert!(Penalty::new(1, day, day * 366 + Duration::from_millis(1)).is_err());
        assert!(Penalty::new(1, day + Duration::from_millis(1), day).is_err());
        assert!(Penalty::new(1000, Duration::from_millis(1), Duration::from_millis(1)).is_ok());
        for (after, within) in [(0, day), (1001, day), (1, Duration::ZERO)] {
            assert!(
                Penalty::new(after, within, day).is_err(),
                "{after} {within:?}"
            );
        }
    }
}
