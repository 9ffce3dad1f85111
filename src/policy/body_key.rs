//! The builder's keys from the request body ([`PolicyBuilder::body_key`]) and how much of a body
//! a policy reads ([`PolicyBuilder::max_body`], [`PolicyBuilder::body_timeout`]).

use std::time::Duration;

use crate::key::{BodyField, KeySpec};
use crate::policy::PolicyBuilder;

/// Keys from the request body.
impl<K> PolicyBuilder<K> {
    /// Keys on a field of the request body instead of [`key`](Self::key) (which this replaces):
    /// `BodyField::json("username")` for a login form sent as JSON, `BodyField::form("email")` for
    /// an HTML form. The policy's key is then [`KeySpec::Body`], so it mixes with `KeySpec` keys in
    /// one layer.
    ///
    /// The layer reads at most [`max_body`](Self::max_body) bytes of the body (16 KiB by default)
    /// within [`body_timeout`](Self::body_timeout) (2 s), before the backend is asked, and hands
    /// the whole body on, unchanged, to the inner service (what it read, then the rest of the
    /// stream). A body larger than that, one that fails or is late, and one without the field (see
    /// [`BodyField`] for how values are decoded) get the [missing-key](crate::policy::MissingKey)
    /// answer (a 400 by default). Only the requests of such a policy are read; other policies pay
    /// nothing.
    ///
    /// The layer reads the request body types it can rebuild: axum's `Body` (so `Router::layer`
    /// works as it is), and http-body-util's `Full<Bytes>`, `BoxBody<Bytes, BoxError>` and
    /// `UnsyncBoxBody<Bytes, BoxError>`. In a hyper server, box hyper's `Incoming` first
    /// (`request.map(|b| b.map_err(BoxError::from).boxed())`). Other body types are not read: their
    /// requests have no key (logged at warn).
    ///
    /// ```
    /// use axum::{routing::post, Router};
    /// use tower_throttle::key::BodyField;
    /// use tower_throttle::{Policy, Quota, ThrottleLayer};
    ///
    /// let login = Policy::builder("login")
    ///     .route("/login")
    ///     .quota(Quota::per_minute(5))
    ///     .body_key(BodyField::json("username").unwrap())
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(login.key().to_string(), "json:username");
    /// let app: Router = Router::new()
    ///     .route("/login", post(|body: String| async move { body }))
    ///     .layer(ThrottleLayer::new(login));
    /// ```
    pub fn body_key(self, field: BodyField) -> PolicyBuilder<KeySpec> {
        let mut builder = self.key(KeySpec::Body(field.clone()));
        builder.opts.extras.body_key = Some(field);
        builder
    }

    /// The most bytes of a request body the policy reads for its [body key](Self::body_key) or a
    /// metered [estimate from the body](crate::Estimate::body) (default 16 KiB, at most 1 GiB): a
    /// larger body has no key (it is still handed on whole). Each request in flight holds at most
    /// this much (and the one frame that crossed it).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.opts.extras.max_body = Some(bytes);
        self
    }

    /// How long the body may take to arrive, up to [`max_body`](Self::max_body) (default 2 s, at
    /// most 1 hour): a slower one has no key (the rest of it still goes to the inner service).
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        self.opts.extras.body_timeout = Some(timeout);
        self
    }
}
