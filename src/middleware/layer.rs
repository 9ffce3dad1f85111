//! [`ThrottleLayer`]: the tower [`Layer`] that makes [`Throttle`] services. Its constructors
//! ([`ThrottleLayer::new`], [`ThrottleLayer::builder`]) live with the builder, which validates
//! what it is given.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use crate::engine::shared::Shared;
use crate::handle::{Policies, ThrottleHandle};
use crate::middleware::service::Throttle;
use crate::offenders::Offenders;
use crate::overload::Gate;

/// A tower [`Layer`] that rate-limits requests with one or more [`Policy`](crate::Policy)s.
///
/// The layer is configuration only: it is cheap to clone, and every service it makes (and every clone
/// of those) shares the same backend, so a server with many connections has one limiter.
///
/// For each request the first policy whose route and methods match decides; a request that no policy
/// matches passes untouched. Admitted responses get `RateLimit-Policy` / `RateLimit` fields; rejected
/// requests get `429 Too Many Requests` with `Retry-After` (see [`headers`](crate::headers)). The inner
/// service is called only once the backend has admitted the request, and it is always the service that
/// `poll_ready` readied.
///
/// ```
/// use axum::{routing::get, Router};
/// use tower_throttle::{key::Header, Policy, Quota, ThrottleLayer};
///
/// let policy = Policy::builder("api")
///     .quota(Quota::per_second(5))
///     .key(Header::new("x-api-key"))
///     .build()
///     .unwrap();
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(ThrottleLayer::new(policy));
/// ```
#[must_use]
pub struct ThrottleLayer<K, B> {
    shared: Arc<Shared<K, B>>,
}

impl<K, B> ThrottleLayer<K, B> {
    pub(crate) fn from_shared(shared: Shared<K, B>) -> Self {
        ThrottleLayer {
            shared: Arc::new(shared),
        }
    }

    /// The counter of distinct limited keys, if the layer has one.
    pub fn offenders(&self) -> Option<&Offenders> {
        self.shared.settings.offenders.as_ref()
    }

    /// The overload gate, if the layer has one ([`ThrottleLayerBuilder::overload`]): its limit,
    /// the requests in flight and shed per partition.
    ///
    /// [`ThrottleLayerBuilder::overload`]: crate::ThrottleLayerBuilder::overload
    pub fn overload(&self) -> Option<&Gate> {
        self.shared.settings.overload.as_deref()
    }

    /// The policies in force, in the order they are tried: a snapshot that derefs to
    /// `[Policy<K>]` (a later [reload](ThrottleHandle::reload) does not change it).
    pub fn policies(&self) -> Policies<K> {
        Policies::of(self.shared.table.load_full())
    }

    /// A handle for the application to keep: peek at and reset keys, and reload the policies of
    /// this layer (and of every service it made) while it runs. See [`ThrottleHandle`].
    pub fn handle(&self) -> ThrottleHandle<K, B> {
        ThrottleHandle::new(self.shared.clone())
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }
}

impl<K, B> Clone for ThrottleLayer<K, B> {
    fn clone(&self) -> Self {
        ThrottleLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<K, B> fmt::Debug for ThrottleLayer<K, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.debug_as(f, "ThrottleLayer")
    }
}

impl<S, K, B> Layer<S> for ThrottleLayer<K, B> {
    type Service = Throttle<S, K, B>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle::new(inner, self.shared.clone())
    }
}
