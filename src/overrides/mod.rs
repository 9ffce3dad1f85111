//! Overrides and timed bans: what an operator changes for one key, a pattern of keys or every key
//! of a policy while the service runs.
//!
//! They are kept in the backend's [`Records`](crate::backend::Records) when it has them (Redis:
//! one hash per policy, so every process applies them and they outlive restarts), otherwise in the
//! layer. Each process holds them as a snapshot ([`cache`]) that the request path reads: a policy
//! without any costs one relaxed atomic load per request.
//!
//! Who matches: an exact key first, then the longest pattern (`premium_*`), then `*`.

pub(crate) mod cache;
pub(crate) mod ipv6;

pub(crate) use ipv6::ipv6_groups;

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::quota::Quota;

/// What an override does to the requests of the keys it names
/// ([`ThrottleHandle::set_override`](crate::ops::ThrottleHandle::set_override)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Override {
    /// Another quota, in place of the policy's (every tier, every stacked limit), with the policy's
    /// algorithm: the key counts under a name of its own, `<policy>.override`, so it starts afresh
    /// under the override and finds its old state when the override goes.
    Quota(Quota),
    /// No limit: let through without asking the backend.
    Unlimited,
    /// Refused with `403 Forbidden`, as a deny list refuses.
    Blocked,
}

impl Override {
    /// The text kept in the backend's records.
    pub(crate) fn encode(&self) -> String {
        match self {
            Override::Quota(q) => format!(
                "quota {} {} {}",
                q.count(),
                q.period().as_nanos(),
                q.max_burst()
            ),
            Override::Unlimited => "unlimited".to_owned(),
            Override::Blocked => "blocked".to_owned(),
        }
    }

    /// The override `text` encodes (`encode`'s inverse), or `None` for text this version does not
    /// know (written by another).
    pub(crate) fn decode(text: &str) -> Option<Override> {
        let mut words = text.split(' ');
        let made = match words.next()? {
            "unlimited" => Override::Unlimited,
            "blocked" => Override::Blocked,
            "quota" => {
                let mut number = || words.next()?.parse::<u128>().ok();
                let (count, period, max_burst) = (number()?, number()?, number()?);
                // A concurrency quota's period may pass 2^64 ns (585 years): it means nothing.
                let (secs, nanos) = (period / 1_000_000_000, (period % 1_000_000_000) as u32);
                let period = Duration::new(u64::try_from(secs).ok()?, nanos);
                let (count, max_burst) =
                    (u64::try_from(count).ok()?, u64::try_from(max_burst).ok()?);
                Override::Quota(Quota::cl_throttle(max_burst, count, period))
            }
            _ => return None,
        };
        words.next().is_none().then_some(made)
    }
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Override::Quota(q) => write!(f, "{} per {:?}", q.count(), q.period()),
            Override::Unlimited => f.write_str("unlimited"),
            Override::Blocked => f.write_str("blocked"),
        }
    }
}

/// What applies to one request's key under its policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InForce {
    Override(Override),
    /// A timed ban, for this long yet.
    Banned(Duration),
}

/// An end of a timed ban as the records keep it: milliseconds since the Unix epoch (a wall-clock
/// instant, which every process reads alike).
pub(crate) fn encode_until(until: SystemTime) -> String {
    let ms = until
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    ms.to_string()
}

pub(crate) fn decode_until(text: &str) -> Option<SystemTime> {
    let ms: u64 = text.parse().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// The name of policy `policy`'s table of overrides in the records.
pub(crate) fn overrides_table(policy: &str) -> String {
    format!("overrides:{policy}")
}

/// The name of policy `policy`'s table of timed bans in the records.
pub(crate) fn bans_table(policy: &str) -> String {
    format!("bans:{policy}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_reads_back_as_written() {
        for o in [
            Override::Unlimited,
            Override::Blocked,
            Override::Quota(Quota::per_minute(1000)),
            Override::Quota(Quota::per_second(5).with_max_burst(20)),
            // Past 2^64 ns: a concurrency quota's period, which means nothing, may be that long.
            Override::Quota(Quota::per_period(5, Duration::from_secs(600 * 31_557_600))),
        ] {
            assert_eq!(Override::decode(&o.encode()), Some(o));
        }
        for bad in [
            "",
            "quota 1 2",
            "quota 1 2 3 4",
            "unlimited x",
            "quota a b c",
            "ban",
        ] {
            assert_eq!(Override::decode(bad), None, "{bad:?}");
        }
        let at = UNIX_EPOCH + Duration::from_millis(1_800_000_000_123);
        assert_eq!(decode_until(&encode_until(at)), Some(at));
    }
}
