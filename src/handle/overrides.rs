//! [`ThrottleHandle`]'s overrides and timed bans (`overrides/`): set, listed and removed while the
//! service runs.

use std::time::{Duration, SystemTime};

use super::{find, HandleError, KeyFromText, ThrottleHandle};
use crate::backend::Backend;
use crate::overrides::cache::{Field, MAX_PATTERNS};
use crate::overrides::{bans_table, decode_until, encode_until, overrides_table, Override};
use crate::per_customer::Namespace;

impl<K, B> ThrottleHandle<K, B>
where
    B: Backend,
{
    /// Overrides policy `policy` for `key`: another quota, unlimited or blocked
    /// ([`Override`]), from the next request on, in every process sharing the backend (Redis: one
    /// hash per policy, which outlives restarts; in memory: this layer only).
    ///
    /// `key` is a key as [`peek`](Self::peek) takes it, a pattern `prefix*` (every key that starts
    /// with `prefix`), or `*` (every key of the policy: its quota changed fleet-wide, without a
    /// reload; a reload keeps it). An exact key wins over a pattern, a longer pattern over a
    /// shorter one, and any over `*`. Setting an override again replaces it.
    ///
    /// The decisions cached under the policy's limits (the Redis backend's deny cache and leased
    /// slices) are dropped in every process, so a key whose limit was raised is not refused by a
    /// refusal made under its old one. A quota override keeps the key's state under a name of its
    /// own, `<policy>.override` (which `RateLimit` fields show), with the policy's algorithm: a key
    /// refused under its old quota starts afresh under the new one, a changed override's quota
    /// reads the override's state (the GCRA rebases its backlog), and a removed override leaves
    /// the key its state under the policy's own quota.
    ///
    /// An error when the policy does not exist, `key` is not one of its keys or patterns, the
    /// backend cannot enforce the quota (or the policy's cost exceeds it), the policy is metered or
    /// its quotas have keys of their own (its quota cannot be overridden; unlimited and blocked
    /// can), or the backend fails.
    ///
    /// ```
    /// use tower_throttle::{key::Header, ops::Override, Policy, Quota, ThrottleLayer};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let layer = ThrottleLayer::new(
    ///     Policy::builder("api")
    ///         .quota(Quota::per_minute(10))
    ///         .key(Header::new("x-customer"))
    ///         .build()
    ///         .unwrap(),
    /// );
    /// let handle = layer.handle();
    /// handle.set_override("api", "acme", Override::Quota(Quota::per_minute(1000))).await.unwrap();
    /// handle.set_override("api", "premium_*", Override::Unlimited).await.unwrap();
    /// assert_eq!(handle.overrides("api").unwrap().len(), 2);
    /// assert_eq!(handle.peek("api", "acme").await.unwrap().override_in_force,
    ///            Some(Override::Quota(Quota::per_minute(1000))));
    /// handle.remove_override("api", "premium_*").await.unwrap();
    /// assert!(handle.set_override("api", "a*b*", Override::Blocked).await.is_err());
    /// # });
    /// ```
    pub async fn set_override(
        &self,
        policy: &str,
        key: &str,
        value: Override,
    ) -> Result<(), HandleError>
    where
        K: KeyFromText,
    {
        let field = self.field_of(policy, key)?;
        if let Override::Quota(quota) = value {
            let table = self.shared.table.load_full();
            let rules = find(&table, policy)?.compiled();
            if !rules.overridable.takes_quota_override() {
                return Err(invalid(
                    policy,
                    "the quota of a metered policy, or of one whose quotas have keys of their own, \
                     cannot be overridden (unlimited and blocked can)"
                        .to_owned(),
                ));
            }
            rules
                .overridable
                .quotas
                .enforceable(Namespace::Override, quota, rules.cost, |l| {
                    self.shared.validate_one(l)
                })
                .map_err(|e| invalid(policy, e.to_string()))?;
        }
        self.write(policy, false, &field, Some(&value.encode()))
            .await?;
        tracing::info!(policy, key = %self.logged(&field), to = %value, "override set");
        Ok(())
    }

    /// Removes the override of `key` (a key, a pattern or `*`, as
    /// [`set_override`](Self::set_override) took it) under policy `policy`, everywhere; no error
    /// when there was none.
    pub async fn remove_override(&self, policy: &str, key: &str) -> Result<(), HandleError>
    where
        K: KeyFromText,
    {
        self.remove(policy, false, key, "override removed").await
    }

    /// Policy `policy`'s overrides as this process holds them (the records' as of their last
    /// change): each key (as logs show it), pattern or `*`, with its override.
    ///
    /// A policy not in force that still has overrides or bans here (one a [reload](Self::reload)
    /// removed, or another process's, heard on a shared Redis) has them listed too, and removable
    /// by [`remove_override`](Self::remove_override) and [`lift_ban`](Self::lift_ban) with the keys
    /// as listed (so are those of a policy a reload gave another kind of key): out of force, they
    /// are kept (another process may still run the policy) and in force again if a policy of that
    /// name comes back.
    pub fn overrides(&self, policy: &str) -> Result<Vec<(String, Override)>, HandleError> {
        self.holding(policy)?;
        Ok(self.shared.overrides.overrides_of(policy))
    }

    /// Bans `key` (a key, a pattern or `*`, as [`set_override`](Self::set_override) takes it)
    /// under policy `policy` for `duration`: its requests are refused with `429` and a
    /// `Retry-After` of the ban's rest, in every process sharing the backend, until it ends or is
    /// [lifted](Self::lift_ban). A ban comes before any override of the key, and of the bans
    /// that match a key (its own, patterns, `*`) the one that ends last holds. A ban is one of the
    /// policy's refusals: where the policy does not enforce them (a dry run, a key outside a
    /// staged share, no pressure for a policy enforced under pressure) the key keeps its quota
    /// and its requests count as the backend decides them; [`Override::Blocked`] refuses whatever the
    /// policy's mode. Banning again replaces the end. Returns the end (a wall-clock instant, which every process reads alike).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{key::Header, Policy, Quota, ThrottleLayer};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let layer = ThrottleLayer::new(
    ///     Policy::builder("api").quota(Quota::per_minute(10)).key(Header::new("x-user")).build().unwrap(),
    /// );
    /// let handle = layer.handle();
    /// handle.ban("api", "mallory", Duration::from_secs(3600)).await.unwrap();
    /// assert_eq!(handle.bans("api").unwrap()[0].0, "mallory");
    /// assert!(handle.peek("api", "mallory").await.unwrap().banned_until.is_some());
    /// handle.lift_ban("api", "mallory").await.unwrap();
    /// assert!(handle.bans("api").unwrap().is_empty());
    /// # });
    /// ```
    pub async fn ban(
        &self,
        policy: &str,
        key: &str,
        duration: Duration,
    ) -> Result<SystemTime, HandleError>
    where
        K: KeyFromText,
    {
        let field = self.field_of(policy, key)?;
        // At most a quota's longest period (2^62 ns: its `Retry-After` fits every client's
        // integers), and as the records keep it (milliseconds in 64 bits).
        let longest = Duration::from_nanos(1 << 62);
        let until = SystemTime::now()
            .checked_add(duration)
            .filter(|_| !duration.is_zero() && duration <= longest)
            .filter(|until| decode_until(&encode_until(*until)).is_some())
            .ok_or_else(|| {
                let why =
                    format!("a ban lasts more than 0 and at most 146 years, not {duration:?}");
                invalid(policy, why)
            })?;
        self.write(policy, true, &field, Some(&encode_until(until)))
            .await?;
        tracing::info!(
            policy,
            key = %self.logged(&field),
            seconds = duration.as_secs(),
            "key banned"
        );
        Ok(until)
    }

    /// Lifts the timed ban of `key` (as [`ban`](Self::ban) took it) under policy `policy`,
    /// everywhere; no error when there was none.
    pub async fn lift_ban(&self, policy: &str, key: &str) -> Result<(), HandleError>
    where
        K: KeyFromText,
    {
        self.remove(policy, true, key, "ban lifted").await
    }

    /// Policy `policy`'s timed bans that have not ended, with their ends (a policy a reload
    /// removed too, as [`overrides`](Self::overrides) says).
    pub fn bans(&self, policy: &str) -> Result<Vec<(String, SystemTime)>, HandleError> {
        self.holding(policy)?;
        Ok(self.shared.overrides.bans_of(policy, SystemTime::now()))
    }

    /// Reads every policy's overrides and bans from the backend again. A layer reads them when it
    /// is built (in a tokio runtime) and whenever the backend hears of a change; a server that
    /// must not serve a request before they are in force awaits this first.
    pub async fn refresh_overrides(&self) -> Result<(), HandleError> {
        Ok(self.shared.overrides.refresh_all().await?)
    }

    /// The records' field for `text` under `policy`: `*`, `prefix*` or a key, as logs show keys.
    fn field_of(&self, policy: &str, text: &str) -> Result<String, HandleError>
    where
        K: KeyFromText,
    {
        match text.find('*') {
            Some(0) if text == "*" => {
                find(&self.shared.table.load_full(), policy)?;
                Ok(text.to_owned())
            }
            Some(at) if at + 1 == text.len() => {
                let table = self.shared.table.load_full();
                let prefix = find(&table, policy)?.key().pattern_from_text(&text[..at]);
                // An address's keys render as `!` and its digits: another character matches none.
                let address = |c: char| c.is_ascii_hexdigit() || c == '.' || c == ':';
                if let Some(digits) = prefix.strip_prefix('!') {
                    if !digits.chars().all(address) {
                        let why =
                            format!("{text:?}: an address pattern is an address's start (10.0.*)");
                        return Err(invalid(policy, why));
                    }
                    if digits.contains(':') {
                        let groups = crate::overrides::ipv6_groups(digits).ok_or_else(|| {
                            let why = format!(
                                "{text:?}: an IPv6 pattern is whole groups, each followed by `:` \
                                 (2001:db8:0:*), with no `::`"
                            );
                            invalid(policy, why)
                        })?;
                        return Ok(format!("!{groups}*"));
                    }
                }
                Ok(prefix + "*")
            }
            Some(_) => Err(invalid(
                policy,
                format!("{text:?}: a pattern has one `*`, at its end"),
            )),
            None => Ok(self.key_of(policy, text)?.to_string()),
        }
    }

    /// `field` as the layer's logs show keys: a key's pseudonym where the layer redacts keys (a
    /// pattern or `*` is the operator's rule, shown as written).
    fn logged(&self, field: &str) -> String {
        match Field::of(field) {
            Field::Exact(key) => (self.shared.table.load_full().judge.shown(&key)).to_string(),
            Field::Prefix(_) | Field::All => field.to_owned(),
        }
    }

    /// Removes `key`'s field (as [`field_of`](Self::field_of) reads it) from policy `policy`'s
    /// bans (or overrides), logging `removed`.
    async fn remove(
        &self,
        policy: &str,
        bans: bool,
        key: &str,
        removed: &str,
    ) -> Result<(), HandleError>
    where
        K: KeyFromText,
    {
        // A field as listed is removed as it is: a policy a reload removed has no key kind to
        // read it, and one a reload gave another kind of key reads it otherwise, or not at all.
        let overrides = &self.shared.overrides;
        let listed = match bans {
            true => {
                (overrides.bans_of(policy, SystemTime::now()).into_iter()).any(|(f, _)| f == key)
            }
            false => overrides
                .overrides_of(policy)
                .into_iter()
                .any(|(f, _)| f == key),
        };
        let field = match self.field_of(policy, key) {
            _ if listed => key.to_owned(),
            Err(HandleError::UnknownPolicy(_)) if overrides.holds(policy) => key.to_owned(),
            field => field?,
        };
        self.write(policy, bans, &field, None).await?;
        tracing::info!(policy, key = %self.logged(&field), "{removed}");
        Ok(())
    }

    /// Policy `policy` in force, or one not in force that holds overrides or bans here yet.
    fn holding(&self, policy: &str) -> Result<(), HandleError> {
        match find(&self.shared.table.load_full(), policy) {
            Err(_) if self.shared.overrides.holds(policy) => Ok(()),
            found => found.map(drop),
        }
    }

    /// Writes `field` of policy `policy`'s bans (or overrides) and puts the table in force here at
    /// once (the other processes read it when they hear of the change). A value is refused when
    /// the table already holds as many patterns as a request may scan, and `field` would add one.
    async fn write(
        &self,
        policy: &str,
        bans: bool,
        field: &str,
        value: Option<&str>,
    ) -> Result<(), HandleError> {
        if value.is_some() && !self.shared.overrides.has_room(policy, bans, field) {
            let why = format!(
                "{field:?}: the policy has {MAX_PATTERNS} patterns already (remove one first)"
            );
            return Err(invalid(policy, why));
        }
        match value {
            Some(_) => find(&self.shared.table.load_full(), policy).map(drop)?,
            None => self.holding(policy)?,
        }
        let table = match bans {
            true => bans_table(policy),
            false => overrides_table(policy),
        };
        let store = self.shared.overrides.store().clone();
        let written = store.write(&table, field, value).await;
        // Read back whatever came of it: a write kept whose telling failed is in force here.
        let read = self.shared.overrides.refresh(&table).await;
        written?;
        read?;
        Ok(())
    }
}

fn invalid(policy: &str, reason: String) -> HandleError {
    HandleError::InvalidOverride {
        policy: policy.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;
    use crate::key::{Composite, Header, KeySpec, PeerIp};
    use crate::{MemoryBackend, Policy, Quota, ThrottleLayer};

    /// A policy holds at most `MAX_PATTERNS` patterns of bans, as of overrides: one more is
    /// refused, saying so, and not kept; a key, or a pattern already set, still may be. (The table
    /// is filled outside a runtime: each write through the handle reads the whole table again.)
    #[test]
    fn a_ban_pattern_past_the_cap_is_refused() {
        let policy = Policy::builder("api")
            .key(Header::new("x-user"))
            .quota(Quota::per_minute(2))
            .build()
            .unwrap();
        let layer = ThrottleLayer::builder()
            .backend(MemoryBackend::new())
            .policy(policy)
            .build()
            .unwrap();
        let handle = layer.handle();
        let store = handle.shared.overrides.store().clone();
        let until = encode_until(SystemTime::now() + Duration::from_secs(86_400));
        let mut noop = Context::from_waker(Waker::noop());
        for i in 0..MAX_PATTERNS {
            let write = store.write(&bans_table("api"), &format!("p{i}_*"), Some(&until));
            let Poll::Ready(written) = pin!(write).poll(&mut noop) else {
                panic!("the in-process records write at once");
            };
            written.unwrap();
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let overrides = &handle.shared.overrides;
            overrides.refresh(&bans_table("api")).await.unwrap();
            let day = Duration::from_secs(86_400);
            let refused = handle.ban("api", "more_*", day).await.unwrap_err();
            assert!(
                refused.to_string().contains("patterns already"),
                "{refused}"
            );
            assert_eq!(handle.bans("api").unwrap().len(), MAX_PATTERNS);
            handle.ban("api", "p7_*", day).await.unwrap();
            handle.ban("api", "alice", day).await.unwrap();
            // Overrides count their own patterns.
            let blocked = Override::Blocked;
            handle.set_override("api", "more_*", blocked).await.unwrap();
        });
    }

    /// A pattern is written as a key is given: as a request carries it or as logs show it, and for
    /// an address policy without its `!`; it matches the keys that start with it.
    #[tokio::test]
    async fn a_pattern_matches_keys_as_they_are_given() {
        let layer = |key: KeySpec| {
            let policy = Policy::builder("api").key(key).quota(Quota::per_minute(2));
            let layer = ThrottleLayer::builder().policy(policy.build().unwrap());
            layer.build().unwrap().handle()
        };
        let orgs = layer(KeySpec::Header(Header::new("x-org")));
        orgs.set_override("api", "org:acme:*", Override::Blocked)
            .await
            .unwrap();
        assert_eq!(fields(orgs.overrides("api").unwrap()), ["org%3Aacme%3A*"]);
        let orgs = &orgs;
        let state = |key| async move { orgs.peek("api", key).await.unwrap().override_in_force };
        assert_eq!(state("org:acme:42").await, Some(Override::Blocked));
        assert_eq!(state("org:other:42").await, None);
        // As shown, the same pattern.
        orgs.remove_override("api", "org%3Aacme%3A*").await.unwrap();
        assert_eq!(state("org:acme:42").await, None);

        let peers = layer(KeySpec::PeerIp(PeerIp::new()));
        let day = Duration::from_secs(86_400);
        peers.ban("api", "10.0.*", day).await.unwrap();
        peers.ban("api", "!192.168.*", day).await.unwrap();
        let peers = &peers;
        let banned =
            |key| async move { peers.peek("api", key).await.unwrap().banned_until.is_some() };
        assert!(banned("10.0.3.4").await && banned("192.168.0.1").await);
        assert!(!banned("10.1.3.4").await);
        assert!(
            peers.ban("api", "bob*", day).await.is_err(),
            "no address starts so"
        );
        let shown = orgs.ban("api", "!bob*", day).await;
        assert!(shown.is_ok(), "a header's value may: {shown:?}");
        assert_eq!(
            fields(peers.bans("api").unwrap()),
            ["!10.0.*", "!192.168.*"]
        );
        // An IPv6 address's key is written in lower case, whatever case the pattern was given in.
        peers.ban("api", "2001:DB8:*", day).await.unwrap();
        assert!(banned("2001:db8::1").await);
        // Whole groups, zeros and all, match their network: its keys show as `2001:db9::`
        // (a /64, zero groups dropped), and a group written with leading zeros is the same group.
        peers.ban("api", "2001:0db9:0:*", day).await.unwrap();
        assert!(banned("2001:db9::1").await && banned("2001:db9:0:7::1").await);
        assert!(!banned("2001:db9:1::1").await);
        let eight_groups = "2001:db9:0:0:0:0:0:1:*";
        for refused in [
            "2001:db9::*",
            "2001:db9:0*",
            "2001:db9:12345:*",
            eight_groups,
        ] {
            let err = peers
                .ban("api", refused, day)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains("whole groups"), "{refused}: {err}");
        }

        // A composite key's pattern names its first parts whole, as its keys are given.
        let parts = [
            KeySpec::Header(Header::new("x-org")),
            KeySpec::Header(Header::new("x-user")),
        ];
        let members = layer(KeySpec::Composite(Composite::new(parts).unwrap()));
        members.ban("api", "acme|*", day).await.unwrap();
        let members = &members;
        let banned = |key| async move {
            members
                .peek("api", key)
                .await
                .unwrap()
                .banned_until
                .is_some()
        };
        assert!(banned("acme|bob").await);
        assert!(!banned("acme2|bob").await && !banned("other|acme").await);
    }

    /// The fields of a listing, in order.
    fn fields<T>(listed: Vec<(String, T)>) -> Vec<String> {
        listed.into_iter().map(|(field, _)| field).collect()
    }

    /// A ban whose end the records cannot keep is refused, not written and then ignored.
    #[tokio::test]
    async fn a_ban_past_what_the_records_keep_is_refused() {
        let policy = Policy::builder("api")
            .key(Header::new("x-user"))
            .quota(Quota::per_minute(2));
        let handle = ThrottleLayer::new(policy.build().unwrap()).handle();
        let ages = Duration::from_secs(u64::MAX / 1_000 + 1);
        let refused = handle.ban("api", "mallory", ages).await;
        assert!(
            matches!(refused, Err(HandleError::InvalidOverride { .. })),
            "{refused:?}"
        );
        assert!(handle.bans("api").unwrap().is_empty());
    }
}
