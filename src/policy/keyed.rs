//! Quotas with keys of their own ([`PolicyBuilder::quota_keyed`]): what the builder checks, and how
//! such a limit is named.

use crate::error::BuildError;
use crate::key::KeySpec;
use crate::policy::PolicyBuilder;
use crate::quota::Quota;

impl<K> PolicyBuilder<K> {
    /// Adds `quota` to the policy's stack, counted against `key` rather than the policy's
    /// [key](Self::key): "10 a minute per user **and** 1,000 a minute per organisation" is
    /// `quota_keyed(per_minute(10), Header::new("x-user-id"))` and `quota_keyed(per_minute(1000),
    /// Header::new("x-org-id"))`. Call it after [`quota`](Self::quota) or
    /// [`quotas`](Self::quotas) (which set the stack anew); their quotas count against the
    /// policy's key.
    ///
    /// The backend decides every quota in one atomic step, each under its own key
    /// ([`Charges::keyed`](crate::backend::Charges::keyed)): the request passes only if every
    /// one admits it, and a refusal by one charges none of the others (the organisation's
    /// refusal leaves the user's quota as it was). A request without one of the keys gets the
    /// policy's [missing-key](crate::policy::MissingKey) answer. Each limit is named after the
    /// policy, its period and its key (`api.1m.x-user-id`), so `RateLimit` and
    /// `RateLimit-Policy` name each one. Memory and Redis decide them (the Lua scripts, alone or
    /// coalesced; in `Cell` mode too, where the stack runs on Lua as every stack does). On a
    /// Redis Cluster the keys of such a policy share one hash tag (its first limit's name), so
    /// one script on one node decides each request exactly: that policy's load goes to that
    /// node (see the [key layout](crate::redis::RedisBackend#key-layout)).
    ///
    /// Not with [tiers](Self::tier), a [penalty](Self::penalty), a [budget](Self::budget),
    /// per-customer quotas, counting by outcome or a metered limit, nor a key from the body
    /// (an error at build). [`ThrottleHandle::peek`](crate::ops::ThrottleHandle::peek) reports
    /// each limit under the key it is given: peek the user's key for the user's limit, the
    /// organisation's for the organisation's.
    ///
    /// ```
    /// use tower_throttle::{key::Header, Policy, Quota};
    ///
    /// let api = Policy::builder("api")
    ///     .key(Header::new("x-user-id"))
    ///     .quota(Quota::per_minute(10))
    ///     .quota_keyed(Quota::per_minute(1000), Header::new("x-org-id"))
    ///     .build()
    ///     .unwrap();
    /// let names: Vec<&str> = api.limits().iter().map(|l| l.name()).collect();
    /// assert_eq!(names, ["api.1m", "api.1m.x-org-id"]);
    /// ```
    pub fn quota_keyed(mut self, quota: Quota, key: impl Into<KeySpec>) -> Self {
        self.opts
            .extras
            .quota_keys
            .resize(self.opts.quotas.len(), None);
        self.opts.quotas.push(quota);
        self.opts.extras.quota_keys.push(Some(key.into()));
        self
    }

    /// Binds the `path:` keys of the quotas with keys of their own to the route (what they cannot
    /// be used with is in compat.rs).
    pub(super) fn check_quota_keys(&mut self) -> Result<(), BuildError> {
        if self.opts.extras.quota_keys.iter().all(Option::is_none) {
            self.opts.extras.quota_keys.clear();
            return Ok(());
        }
        let route = self.opts.route.clone();
        let invalid =
            |why: String| BuildError::Invalid(format!("policy {:?}: {why}", self.opts.name));
        for key in self.opts.extras.quota_keys.iter_mut().flatten() {
            if matches!(key, KeySpec::Body(_)) {
                return Err(invalid(format!(
                    "a quota's own key cannot come from the body ({key}); use the policy's key \
                     (body_key) for it"
                )));
            }
            let bound = std::mem::replace(key, KeySpec::Global).for_route(route.as_deref());
            *key = bound.map_err(invalid)?;
        }
        Ok(())
    }
}

/// The part of a limit's name that tells its key: a header's, parameter's or cookie's name, or
/// the key's spelling with every character a name cannot hold as `-` (`header:x-user-id` →
/// `x-user-id`, `ip` → `ip`).
pub(super) fn key_label(key: &KeySpec) -> String {
    let spelled = key.to_string();
    let name = match spelled.split_once(':') {
        Some((_, name)) if !matches!(key, KeySpec::Composite(_)) => name,
        _ => &spelled,
    };
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}
