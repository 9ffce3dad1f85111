//! The parts of a [`Policy`](super::Policy) a request meets before any limit.

use std::borrow::Cow;

use http::{Request, StatusCode};

use crate::key::{Key, KeyExtractor};

/// A request extension that chooses the tier (plan) of a policy's quota, such as `"paid"`, for
/// policies with [tiers](super::PolicyBuilder::tier). An authentication middleware that knows the caller's
/// plan inserts it before the throttle layer runs; it takes precedence over a
/// [tier header](super::PolicyBuilder::tier_header). An unknown tier gets the default quota.
///
/// ```
/// use tower_throttle::policy::Tier;
///
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Tier::new("paid"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tier(Cow<'static, str>);

impl Tier {
    /// The tier called `name`.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Tier(name.into())
    }

    /// Its name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What to do with a request from which no key can be extracted (no peer address, a missing header).
///
/// The default is to reject with `400 Bad Request`: letting such requests through would let anyone
/// bypass a per-header limit by leaving the header out. Either way it is logged through `tracing`
/// (a warning the first time per policy, then at debug level), and it is never a 500.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer with this status (4xx) and a problem+json body naming what was missing.
    Reject(StatusCode),
    /// Let the request through, unlimited. A key sent twice counts as missing too (by default,
    /// [`OnDuplicate::Refuse`](crate::key::OnDuplicate::Refuse)): with `Allow`, pick one of the
    /// values ([`OnDuplicate::First`](crate::key::OnDuplicate::First)) where your application
    /// reads that one, or a client sending its key twice is never limited.
    Allow,
}

impl Default for MissingKey {
    fn default() -> Self {
        MissingKey::Reject(StatusCode::BAD_REQUEST)
    }
}

/// Why a policy without a key does not build, and what to give it.
pub(crate) const NO_KEY: &str = "no key: say what its requests count against with .key(…): \
    key::PeerIp (the client's address; in axum, with the crate's `axum` feature), key::ClientIp \
    (the client's address behind trusted proxies), key::Header, key::QueryParam, key::Cookie, \
    key::PathParam, key::Composite (several), key::Global (one key for every request), key::AsyncKey \
    or a closure";

/// The key of a [`PolicyBuilder`](super::PolicyBuilder) that has none yet: [`PolicyBuilder::key`](super::PolicyBuilder::key) replaces it, and
/// [`build`](super::PolicyBuilder::build) refuses a policy that still has it.
#[derive(Clone, Copy, Debug)]
pub struct NoKey(pub(super) ());

// A policy keyed by an async key alone still has a type of key; it is never asked.
impl<B> KeyExtractor<B> for NoKey {
    fn extract(&self, _: &Request<B>) -> Option<Key> {
        None
    }

    fn describe(&self) -> String {
        "its async key".to_owned()
    }
}
