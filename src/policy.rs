//! [`Policy`]: which requests a limit applies to, what they are keyed by and what they cost.

use http::{Method, Request, StatusCode};

use crate::key::PeerIp;
use crate::{BuildError, Limit, Penalty, Quota};

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
    /// Let the request through, unlimited.
    Allow,
}

impl Default for MissingKey {
    fn default() -> Self {
        MissingKey::Reject(StatusCode::BAD_REQUEST)
    }
}

/// A limit applied to some requests: a named [`Quota`], a key extractor, and optionally a route,
/// methods and a cost per request.
///
/// ```
/// use http::Method;
/// use tower_throttle::{key::Header, Policy, Quota};
///
/// let reply = Policy::builder("reply")
///     .quota(Quota::per_minute(30).with_max_burst(15))
///     .key(Header::new("x-user-id"))
///     .route("/reply")
///     .methods([Method::POST])
///     .cost(1)
///     .build()
///     .unwrap();
/// assert_eq!(reply.limit().name(), "reply");
///
/// // Invalid configuration is an error when the policy is built:
/// let err = Policy::builder("reply").quota(Quota::per_second(0)).build().unwrap_err();
/// assert_eq!(err.to_string(), r#"policy "reply": quota count must be at least 1"#);
/// ```
#[derive(Clone, Debug)]
pub struct Policy<K> {
    limit: Limit,
    key: K,
    cost: u64,
    methods: Option<Box<[Method]>>,
    route: Option<Route>,
    missing_key: MissingKey,
}

impl Policy<PeerIp> {
    /// Starts a policy called `name` (see [`Limit`] for the rules on names), keyed by the peer IP
    /// until [`key`](PolicyBuilder::key) says otherwise.
    pub fn builder(name: impl Into<String>) -> PolicyBuilder<PeerIp> {
        PolicyBuilder {
            name: name.into(),
            quota: None,
            key: PeerIp::new(),
            cost: 1,
            methods: None,
            route: None,
            missing_key: MissingKey::default(),
            penalty: None,
        }
    }
}

impl<K> Policy<K> {
    /// The named quota.
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// The key extractor.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// Units each request costs.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// What happens when a request has no key.
    pub fn missing_key(&self) -> MissingKey {
        self.missing_key
    }

    /// The route pattern this policy is restricted to, if any.
    pub fn route(&self) -> Option<&str> {
        self.route.as_ref().map(|r| r.pattern.as_str())
    }

    /// Whether this policy applies to `request` (its route and method).
    pub fn applies_to<B>(&self, request: &Request<B>) -> bool {
        if let Some(methods) = &self.methods {
            if !methods.contains(request.method()) {
                return false;
            }
        }
        match &self.route {
            None => true,
            Some(route) => route.matches(request),
        }
    }
}

/// Builds a [`Policy`].
#[derive(Debug)]
#[must_use]
pub struct PolicyBuilder<K> {
    name: String,
    quota: Option<Quota>,
    key: K,
    cost: u64,
    methods: Option<Vec<Method>>,
    route: Option<String>,
    missing_key: MissingKey,
    penalty: Option<Penalty>,
}

impl<K> PolicyBuilder<K> {
    /// Bans keys that are limited too often (see [`Penalty`]).
    pub fn penalty(mut self, penalty: Penalty) -> Self {
        self.penalty = Some(penalty);
        self
    }

    /// The quota (required).
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quota = Some(quota);
        self
    }

    /// The key extractor (default: [`PeerIp`]).
    pub fn key<K2>(self, key: K2) -> PolicyBuilder<K2> {
        PolicyBuilder {
            name: self.name,
            quota: self.quota,
            key,
            cost: self.cost,
            methods: self.methods,
            route: self.route,
            missing_key: self.missing_key,
            penalty: self.penalty,
        }
    }

    /// Units each request costs (default 1; at least 1 and at most the limit).
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Applies the policy to these methods only (default: every method). `GET` includes `HEAD`, which
    /// runs the same handler in axum.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = Some(methods.into_iter().collect());
        self
    }

    /// Applies the policy to one route only, in axum path syntax (`/users/{id}`, `/files/{*path}`).
    ///
    /// With the `axum` feature and a layer added by `Router::layer`, the route is compared with the
    /// request's `MatchedPath`, exactly as the router spells it: the full path (`/api/users/{id}`), or,
    /// for a layer inside `Router::nest("/api", ..)`, also the nested router's own path
    /// (`/users/{id}`). Without `MatchedPath` (outside axum, or a layer wrapped around the whole
    /// router) the pattern is matched against the request path: `{name}` matches one non-empty
    /// segment, `{*name}` the rest. Only needed for a layer that holds several policies; a layer added
    /// with `route_layer` to one route applies to that route anyway.
    pub fn route(mut self, pattern: impl Into<String>) -> Self {
        self.route = Some(pattern.into());
        self
    }

    /// What to do when a request has no key (default: reject with 400).
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = missing_key;
        self
    }

    /// Validates the policy.
    pub fn build(self) -> Result<Policy<K>, BuildError> {
        let quota = self.quota.ok_or_else(|| {
            BuildError::Invalid(format!("policy {:?}: a quota is required", self.name))
        })?;
        let mut limit = Limit::new(self.name, quota)?;
        if let Some(penalty) = self.penalty {
            limit = limit.with_penalty(penalty);
        }
        if self.cost == 0 || self.cost > limit.max_cost() {
            return Err(BuildError::Cost {
                policy: limit.name().to_owned(),
                cost: self.cost,
                limit: limit.max_cost(),
            });
        }
        if let MissingKey::Reject(status) = self.missing_key {
            if !status.is_client_error() {
                return Err(BuildError::Invalid(format!(
                    "policy {:?}: a request without a key must be rejected with a 4xx status, not {status}",
                    limit.name()
                )));
            }
        }
        let methods = match self.methods {
            Some(m) if m.is_empty() => {
                return Err(BuildError::Invalid(format!(
                    "policy {:?}: methods is empty (leave it out to match every method)",
                    limit.name()
                )))
            }
            // axum's `get` answers HEAD with the GET handler: a GET policy that let HEAD through
            // would let anyone run the handler unlimited.
            Some(mut m) => {
                if m.contains(&Method::GET) && !m.contains(&Method::HEAD) {
                    m.push(Method::HEAD);
                }
                Some(m.into_boxed_slice())
            }
            None => None,
        };
        let route = self
            .route
            .map(|r| Route::parse(&r))
            .transpose()
            .map_err(|why| BuildError::Invalid(format!("policy {:?}: {why}", limit.name())))?;
        Ok(Policy {
            limit,
            key: self.key,
            cost: self.cost,
            methods,
            route,
            missing_key: self.missing_key,
        })
    }
}

/// A route pattern in axum syntax.
#[derive(Clone, Debug)]
struct Route {
    pattern: String,
    segments: Box<[Segment]>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
    Rest,
}

impl Route {
    fn parse(pattern: &str) -> Result<Route, String> {
        if !pattern.starts_with('/') {
            return Err(format!("route {pattern:?} must start with '/'"));
        }
        let parts: Vec<&str> = pattern[1..].split('/').collect();
        let mut segments = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let segment =
                if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                    if let Some(name) = inner.strip_prefix('*') {
                        if i + 1 != parts.len() || name.is_empty() {
                            return Err(format!(
                                "route {pattern:?}: a wildcard {{*name}} must be the last segment"
                            ));
                        }
                        Segment::Rest
                    } else if inner.is_empty() || inner.contains(['{', '}']) {
                        return Err(format!("route {pattern:?}: bad parameter {part:?}"));
                    } else {
                        Segment::Param
                    }
                } else if part.contains(['{', '}']) {
                    return Err(format!(
                        "route {pattern:?}: parameters must be whole segments ({part:?})"
                    ));
                } else {
                    Segment::Literal((*part).to_owned())
                };
            segments.push(segment);
        }
        Ok(Route {
            pattern: pattern.to_owned(),
            segments: segments.into(),
        })
    }

    fn matches<B>(&self, request: &Request<B>) -> bool {
        #[cfg(feature = "axum")]
        if let Some(matched) = request.extensions().get::<axum::extract::MatchedPath>() {
            let matched = matched.as_str();
            if matched == self.pattern {
                return true;
            }
            // Inside `Router::nest("/api", ..)` axum's MatchedPath is the full "/api/users/{id}"; the
            // nested router's own "/users/{id}" names the same route.
            let nested = request.extensions().get::<axum::extract::NestedPath>();
            return match nested.and_then(|n| matched.strip_prefix(n.as_str())) {
                Some("") => self.pattern == "/",
                Some(rest) => rest == self.pattern,
                None => false,
            };
        }
        self.matches_path(request.uri().path())
    }

    fn matches_path(&self, path: &str) -> bool {
        let Some(path) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = path.split('/');
        for segment in self.segments.iter() {
            match segment {
                Segment::Rest => return true,
                Segment::Literal(lit) => {
                    if parts.next() != Some(lit.as_str()) {
                        return false;
                    }
                }
                Segment::Param => match parts.next() {
                    Some(p) if !p.is_empty() => {}
                    _ => return false,
                },
            }
        }
        parts.next().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_like_axum() {
        let r = Route::parse("/users/{id}/posts").unwrap();
        assert!(r.matches_path("/users/7/posts"));
        assert!(!r.matches_path("/users//posts"));
        assert!(!r.matches_path("/users/7/posts/1"));
        assert!(!r.matches_path("/users/7"));
        let r = Route::parse("/files/{*path}").unwrap();
        assert!(r.matches_path("/files/a/b/c"));
        assert!(!r.matches_path("/other/a"));
        let r = Route::parse("/").unwrap();
        assert!(r.matches_path("/"));
        assert!(!r.matches_path("/x"));
        assert!(Route::parse("users").is_err());
        assert!(Route::parse("/a/{*rest}/b").is_err());
        assert!(Route::parse("/a/x{id}").is_err());
    }

    #[test]
    fn bad_policies_are_errors() {
        let q = Quota::per_second(5);
        let err = |b: PolicyBuilder<PeerIp>| b.build().unwrap_err().to_string();
        assert!(err(Policy::builder("p")).contains("quota is required"));
        assert!(err(Policy::builder("p").quota(q).cost(0)).contains("cost must be at least 1"));
        assert!(err(Policy::builder("p").quota(q).cost(6)).contains("exceeds the limit 5"));
        assert!(err(Policy::builder("p").quota(q).methods([])).contains("methods is empty"));
        assert!(err(Policy::builder("p").quota(q).route("x")).contains("must start with '/'"));
        assert!(err(Policy::builder("bad name").quota(q)).contains("may only contain"));
        assert!(err(Policy::builder("p")
            .quota(q)
            .on_missing_key(MissingKey::Reject(StatusCode::INTERNAL_SERVER_ERROR)))
        .contains("4xx"));
    }
}
