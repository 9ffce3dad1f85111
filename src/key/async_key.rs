//! [`AsyncKey`]: a key that takes a wait to find — an API key checked against a database before it
//! is counted, or an axum extractor the application already has.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use super::value::Key;

pub(crate) enum Found {
    Key(Key),
    /// No key, or a key the extractor refused.
    Nothing,
    TimedOut,
}

/// The parts back, with what was found in them.
type Finding = Pin<Box<dyn Future<Output = (Parts, Found)> + Send>>;

/// `found` as a [`Found`], or `TimedOut` after `timeout`.
async fn within(timeout: Duration, found: impl Future<Output = Option<Key>>) -> Found {
    match crate::timer::within(timeout, found).await {
        Some(Some(key)) => Found::Key(key),
        Some(None) => Found::Nothing,
        None => Found::TimedOut,
    }
}

/// How long an async key may take by default.
pub const DEFAULT_ASYNC_KEY_TIMEOUT: Duration = Duration::from_millis(100);

/// A key extractor that may wait: for [`PolicyBuilder::async_key`](crate::PolicyBuilder::async_key).
///
/// A request whose key comes back `None` — no key, or one the extractor refused (an unknown API
/// key) — gets the policy's [missing-key](crate::policy::MissingKey) answer (a 400 by default). One whose
/// key takes longer than the [timeout](Self::timeout) (100 ms by default; logged at warn at most
/// once a second) is the application's trouble, not the client's: the layer's
/// [`OnBackendError`](crate::OnBackendError) answers, as for a backend that cannot decide (`Local`
/// lets it through, as `Allow` does: there is no key to count). Requests with an async key go through the layer's slower path (a boxed
/// future); policies without one are not affected.
///
/// ```
/// use tower_throttle::key::AsyncKey;
/// use tower_throttle::{Key, Policy, Quota};
///
/// // The API key counts only if the application knows it.
/// async fn known(api_key: &str) -> bool {
///     api_key.starts_with("live_")
/// }
///
/// let key = AsyncKey::new(|parts| {
///     let api_key = parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
///     async move {
///         let api_key = api_key?;
///         known(&api_key).await.then(|| Key::from(api_key))
///     }
/// })
/// .describe("a known x-api-key");
/// let policy = Policy::builder("api")
///     .quota(Quota::per_second(10))
///     .async_key(key)
///     .build()
///     .unwrap();
/// # let _ = policy;
/// ```
#[derive(Clone)]
pub struct AsyncKey {
    extract: Arc<dyn Fn(Parts, Duration) -> Finding + Send + Sync>,
    what: Arc<str>,
    timeout: Duration,
}

impl fmt::Debug for AsyncKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncKey")
            .field("what", &self.what)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl AsyncKey {
    /// The key `extract` finds. It sees the request's parts and returns a future that owns what it
    /// needs (clone it out of the parts first).
    pub fn new<F, Fut>(extract: F) -> Self
    where
        F: Fn(&Parts) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<Key>> + Send + 'static,
    {
        Self::from_parts_fn(move |parts: Parts, timeout| {
            let found = extract(&parts);
            Box::pin(async move { (parts, within(timeout, found).await) }) as Finding
        })
    }

    /// The key from an axum extractor the application already has (anything
    /// `FromRequestParts<()>`, such as its own `AuthUser`), by `to_key`; an extractor that rejects
    /// the request gives no key. See [`from_extractor_with_state`](Self::from_extractor_with_state)
    /// for extractors that need the router's state.
    ///
    /// ```
    /// use axum::extract::FromRequestParts;
    /// use http::request::Parts;
    /// use tower_throttle::key::AsyncKey;
    /// use tower_throttle::Key;
    ///
    /// /// The application's extractor: the signed-in user.
    /// struct User(String);
    ///
    /// impl<S: Sync> FromRequestParts<S> for User {
    ///     type Rejection = http::StatusCode;
    ///     async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
    ///         let user = parts.headers.get("x-user").and_then(|v| v.to_str().ok());
    ///         user.map(|u| User(u.to_owned())).ok_or(http::StatusCode::UNAUTHORIZED)
    ///     }
    /// }
    ///
    /// let key = AsyncKey::from_extractor(|User(name): User| Some(Key::from(name)));
    /// # let _ = key;
    /// ```
    #[cfg(feature = "axum")]
    pub fn from_extractor<T, F>(to_key: F) -> Self
    where
        T: axum::extract::FromRequestParts<()> + 'static,
        F: Fn(T) -> Option<Key> + Send + Sync + 'static,
    {
        Self::from_extractor_with_state((), to_key)
    }

    /// [`from_extractor`](Self::from_extractor) for an extractor of a router with state `state`.
    #[cfg(feature = "axum")]
    pub fn from_extractor_with_state<T, St, F>(state: St, to_key: F) -> Self
    where
        T: axum::extract::FromRequestParts<St> + 'static,
        St: Clone + Send + Sync + 'static,
        F: Fn(T) -> Option<Key> + Send + Sync + 'static,
    {
        let to_key = Arc::new(to_key);
        let what = format!("the extractor {}", std::any::type_name::<T>());
        Self::from_parts_fn(move |mut parts: Parts, timeout| {
            let (state, to_key) = (state.clone(), to_key.clone());
            Box::pin(async move {
                let extracted = T::from_request_parts(&mut parts, &state);
                let found = within(timeout, async {
                    extracted.await.ok().and_then(|t| to_key(t))
                });
                let found = found.await;
                (parts, found)
            }) as Finding
        })
        .describe(what)
    }

    fn from_parts_fn(extract: impl Fn(Parts, Duration) -> Finding + Send + Sync + 'static) -> Self {
        AsyncKey {
            extract: Arc::new(extract),
            what: "a key from an async extractor".into(),
            timeout: DEFAULT_ASYNC_KEY_TIMEOUT,
        }
    }

    /// Says what the key is, for logs and the missing-key answer ("expected {what}").
    pub fn describe(mut self, what: impl Into<String>) -> Self {
        self.what = what.into().into();
        self
    }

    /// How long the key may take (default 100 ms; more than 0).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub(crate) fn what(&self) -> &str {
        &self.what
    }

    pub(crate) fn timeout_value(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn extract(&self, parts: Parts) -> Finding {
        (self.extract)(parts, self.timeout)
    }
}
