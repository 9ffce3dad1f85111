//! Keys and key extractors: who a request counts against.
//!
//! A [`KeyExtractor`] turns a request into a [`Key`] (or `None` when the request carries no key, which
//! the policy's [`MissingKey`](crate::policy::MissingKey) setting then handles). Built in:
//!
//! * [`PeerIp`]: the TCP peer address (axum's `ConnectInfo<SocketAddr>` with the `axum` feature, or
//!   a [`PeerAddr`] extension), IPv6 grouped by prefix (/64 by default). It never reads
//!   `X-Forwarded-For` or `X-Real-IP`: a client can write anything there.
//! * [`ClientIp`]: the client behind proxies you trust, from their forwarding header; the peer
//!   address for everyone else.
//! * [`Header`]: a header's value, such as an API key or a user id (sent once: see [`OnDuplicate`]).
//! * [`QueryParam`], [`Cookie`], [`PathParam`]: a query parameter, a cookie, a parameter of the
//!   route (`/orgs/{org}/...`); [`Composite`]: several of these together.
//! * [`Extension`]: a value that earlier middleware (authentication) put in the request's extensions.
//! * [`Global`]: one key for every request.
//! * [`BodyField`]: a field of a JSON or form body (`json:username`), for
//!   [`PolicyBuilder::body_key`](crate::PolicyBuilder::body_key).
//! * any closure `Fn(&Request<B>) -> Option<K>` where `K: Into<Key>`.
//!
//! ```
//! use http::Request;
//! use tower_throttle::key::{Header, Key, KeyExtractor};
//!
//! let req = Request::builder().header("x-api-key", "k-123").body(()).unwrap();
//! assert_eq!(Header::new("x-api-key").extract(&req), Some(Key::from("k-123")));
//!
//! let by_path = |req: &Request<()>| Some(req.uri().path().to_owned());
//! assert_eq!(by_path.extract(&req), Some(Key::from("/")));
//! ```
//!
//! To mix extractors of different kinds in one layer's table of policies, convert them into a
//! [`KeySpec`] (`KeySpec::from(PeerIp::new())`), or box them as [`BoxKeyExtractor`]s; [`KeySpec`]
//! shows the compiler error that asks for it.
//!
//! # A key per API client: bearer tokens and JWT claims
//!
//! **After authentication** (the usual place), key on what your authentication middleware verified
//! and put in the request's extensions, such as the JWT's `sub` claim, with [`Extension`]: a
//! client cannot choose it. One user with several tokens shares one limit.
//!
//! ```
//! use http::Request;
//! use tower_throttle::key::{Extension, Key, KeyExtractor};
//!
//! /// Inserted by your authentication layer once the token's signature checked out.
//! #[derive(Clone)]
//! struct Claims {
//!     sub: String,
//! }
//! impl From<Claims> for Key {
//!     fn from(claims: Claims) -> Key {
//!         Key::from(claims.sub)
//!     }
//! }
//!
//! let mut req = Request::new(());
//! req.extensions_mut().insert(Claims { sub: "user-7".into() });
//! assert_eq!(Extension::<Claims>::new().extract(&req), Some(Key::from("user-7")));
//! ```
//!
//! **Before authentication** (to shield the token check itself), key on the `Authorization: Bearer`
//! token with a closure, **hashed** with [`Key::hashed`]: the key is written into Redis key names
//! and may be logged, and a raw token there is a credential anyone reading Redis could replay. A
//! token that nobody has verified yet costs a client nothing to change, so a fresh made-up token is
//! a fresh key: keep a per-IP policy in front of (or stacked with) this one.
//!
//! ```
//! use http::{header::AUTHORIZATION, Request};
//! use tower_throttle::key::{Key, KeyExtractor};
//!
//! let bearer_token = |req: &Request<()>| {
//!     let value = req.headers().get(AUTHORIZATION)?.as_bytes();
//!     // The scheme is case-insensitive (RFC 9110); the token is what follows one space.
//!     let token = value.get(7..).filter(|_| value[..7].eq_ignore_ascii_case(b"bearer "))?;
//!     (!token.is_empty()).then(|| Key::hashed(token))
//! };
//!
//! let req = |auth: &str| Request::builder().header(AUTHORIZATION, auth).body(()).unwrap();
//! let key = bearer_token.extract(&req("Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig")).unwrap();
//! assert_eq!(bearer_token.extract(&req("bearer eyJhbGciOiJIUzI1NiJ9.e30.sig")), Some(key.clone()));
//! assert!(key.to_string().starts_with("#sha256:")); // never the token itself
//! assert!(!key.to_string().contains("eyJ"));
//! assert_eq!(bearer_token.extract(&req("Basic dXNlcjpwYXNz")), None); // no key: 400 by default
//! ```
//!
//! Use it as any extractor: `Policy::builder("api").key(bearer_token)`, with the request type your
//! server's (`&Request<axum::body::Body>` in axum).

pub(crate) mod ahead;
mod async_key;
pub(crate) mod body;
mod client_ip;
mod extract;
mod sources;
mod spec;
mod value;

pub use async_key::{AsyncKey, DEFAULT_ASYNC_KEY_TIMEOUT};
pub use body::{BodyField, DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY};
pub(crate) use client_ip::parse_net;
pub use client_ip::{ClientIp, ForwardedHeader, InvalidCidr, TrustedProxies, MAX_HOPS};
pub use extract::{
    BoxKeyExtractor, Extension, Global, Header, InvalidPrefix, KeyExtractor, OnDuplicate, PeerAddr,
    PeerIp,
};
pub(crate) use sources::{percent_decode, query_values};
pub use sources::{Cookie, PathParam, QueryParam};
pub use spec::{Composite, KeySpec, MAX_KEY_PARTS};
pub use value::{Key, MAX_KEY_LEN};
