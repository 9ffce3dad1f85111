//! How a request of the layer's extended path comes by its key ([`KeyAhead`], [`BodyAhead`], the
//! body read started before the steps), and why a request has none ([`Missing`]).

use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;

use crate::key::async_key::{AsyncKey, Found};
use crate::key::body::read::{reader, ErasedBody, Reading};
use crate::key::body::{BodyField, BodyRule};
use crate::key::Key;

/// Why a request has no key.
pub(crate) enum Missing {
    /// The policy's key is not in the request: what was expected (the missing-key answer).
    Expected(String),
    /// The async key did not come within its timeout (the failure policy answers).
    Late,
}

/// A request's key as `Throttle::call` hands it over.
pub(crate) enum KeyAhead {
    Read(Result<Key, Missing>),
    Async(AsyncKey),
    Body,
}

/// The request body of a policy that reads it; a body type the layer cannot rebuild is not read.
pub(crate) enum BodyAhead {
    Reading(Reading),
    Unreadable(&'static str),
}

impl BodyAhead {
    /// Starts reading `body`; a body type the layer cannot rebuild comes back as it is.
    pub(crate) fn start<ReqBody: 'static>(
        body: ReqBody,
        rule: &BodyRule,
    ) -> (Self, Option<ReqBody>) {
        let mut slot = Some(body);
        match reader::<ReqBody>().and_then(|start| start(&mut slot, rule.max, rule.timeout)) {
            Some(reading) => (BodyAhead::Reading(reading), None),
            None => (
                BodyAhead::Unreadable(std::any::type_name::<ReqBody>()),
                slot,
            ),
        }
    }

    /// The body read (to rebuild the request with) and the whole of it, if it came whole;
    /// `unreadable` is told why a body was not read.
    pub(crate) async fn read(
        self,
        unreadable: impl FnOnce(&str),
    ) -> (Option<ErasedBody>, Option<Bytes>) {
        match self {
            BodyAhead::Reading(reading) => {
                let (read, whole) = reading.await;
                (Some(read), whole)
            }
            BodyAhead::Unreadable(type_name) => {
                unreadable(&format!(
                    "the layer cannot read request bodies of type {type_name}"
                ));
                (None, None)
            }
        }
    }
}

impl KeyAhead {
    /// The request's key, once its body (if the policy reads it) is `whole`: `field` is the
    /// policy's key from the body; `late` is told the async key's timeout when it passes.
    pub(crate) async fn resolve(
        self,
        parts: Parts,
        (whole, field): (Option<&[u8]>, Option<&BodyField>),
        late: impl FnOnce(Duration),
    ) -> (Parts, Result<Key, Missing>) {
        match self {
            KeyAhead::Read(key) => (parts, key),
            KeyAhead::Body => {
                let key = match field {
                    Some(field) => whole
                        .and_then(|body| field.key(&parts.headers, body))
                        .ok_or_else(|| Missing::Expected(field.describe())),
                    None => Err(Missing::Expected("a key from the body".into())),
                };
                (parts, key)
            }
            KeyAhead::Async(async_key) => {
                let (parts, found) = async_key.extract(parts).await;
                let key = match found {
                    Found::Key(key) => Ok(key),
                    Found::Nothing => Err(Missing::Expected(async_key.what().to_owned())),
                    Found::TimedOut => {
                        late(async_key.timeout_value());
                        Err(Missing::Late)
                    }
                };
                (parts, key)
            }
        }
    }
}
