//! [`ResponseFuture`]: a request's way from its verdict to its response — waiting for a remote
//! decision, waiting out a delay, calling the inner service, or answering a refusal.
//!
//! [`ResponseFuture::carry_out`] is the one place a verdict is carried out: [`Throttle`] uses it when
//! the backend decided at once (memory), and the future itself when a remote decision arrives.
//!
//! [`Throttle`]: crate::Throttle

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::engine::extended::{Prepared, Preparing};
use crate::engine::slot::{ConcurrencySlot, Release};
use crate::engine::verdict::{Admitted, Verdict};
use crate::headers::RateHeaders;
use crate::middleware::body::ThrottleBody;
use crate::near_limit;
use crate::outcome::OutcomeGuard;
use crate::overload::InFlight;

pin_project! {
    /// A request waiting for its turn (delay mode), then for its service to be ready; or only
    /// for that (an admitted request whose service was not readied: it waited for its body).
    struct Delayed<S, ReqBody> {
        #[pin]
        sleep: Option<tokio::time::Sleep>,
        service: S,
        request: Option<Request<ReqBody>>,
        headers: Option<RateHeaders>,
        slot: Option<ConcurrencySlot>,
        outcome: Option<Box<OutcomeGuard>>,
    }
}

pin_project! {
    /// The response future of [`Throttle`](crate::Throttle).
    pub struct ResponseFuture<S, ReqBody, D>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
        // The backend's future, boxed in `Preparing` while it is awaited: a type parameter still,
        // as the public type has always had it.
        decision: PhantomData<fn() -> D>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        // An admitted request with nothing to add to its response: the inner future alone, as
        // small as the state can be (every move of the future is a copy).
        Passing {
            #[pin]
            future: S::Future,
        },
        // A boxed future makes the verdict (a remote decision, or the extended path's steps);
        // the readied service waits beside it.
        Preparing {
            prepare: Preparing,
            // The body, unless the policy reads it (then `Prepared` brings it back), and whether
            // the service was readied (not for a wait the client sets the length of).
            rest: Option<(S, Option<ReqBody>, bool)>,
            in_flight: Option<InFlight>,
        },
        Delaying {
            // Boxed: delays are rare, and a Sleep would make every request's future larger.
            delayed: Pin<Box<Delayed<S, ReqBody>>>,
        },
        Calling {
            #[pin]
            future: S::Future,
            headers: Option<RateHeaders>,
            slot: Option<ConcurrencySlot>,
            outcome: Option<Box<OutcomeGuard>>,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqBody, D> ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>>,
{
    fn of(state: State<S, ReqBody>) -> Self {
        let decision = PhantomData;
        ResponseFuture { state, decision }
    }

    /// The inner service's answer, with nothing added.
    #[inline(always)]
    pub(crate) fn unlimited(future: S::Future) -> Self {
        Self::of(State::Passing { future })
    }

    /// This future, counting the request in flight through the overload gate until its response
    /// ends (at once for a refusal: the service never saw it). A called or delayed request holds
    /// the count as it would a slot; one waiting for a remote decision or a body holds it in its
    /// state. Never inlined: kept out of `call`, a layer without a gate calls no larger a function.
    #[inline(never)]
    pub(crate) fn holding(self, mut in_flight: InFlight) -> Self {
        // Until the service is called, the count learns nothing if the client goes away.
        if let State::Delaying { .. } | State::Preparing { .. } = self.state {
            in_flight.waiting();
        }
        let state = match self.state {
            State::Ready { response } => {
                in_flight.forget();
                State::Ready { response }
            }
            State::Passing { future } => State::Calling {
                future,
                headers: None,
                slot: Some(ConcurrencySlot::and_counting(None, in_flight)),
                outcome: None,
            },
            State::Calling {
                future,
                headers,
                slot,
                outcome,
            } => State::Calling {
                future,
                headers,
                slot: Some(ConcurrencySlot::and_counting(slot, in_flight)),
                outcome,
            },
            // Held as a slot too, so that the service's call can restart its clock: the gate
            // learns the service's latency, not delay mode's wait.
            State::Delaying { mut delayed } => {
                let slot = delayed.as_mut().project().slot;
                *slot = Some(ConcurrencySlot::and_counting(slot.take(), in_flight));
                State::Delaying { delayed }
            }
            // Held until the decision (or the body) has come: the service's call restarts its
            // clock, so that the gate learns the service's latency, not the backend's or the
            // client's.
            State::Preparing { prepare, rest, .. } => State::Preparing {
                prepare,
                rest,
                in_flight: Some(in_flight),
            },
        };
        Self::of(state)
    }

    /// The inner service's answer to a request that holds nothing: only `fields` go on it.
    pub(crate) fn admitted(future: S::Future, fields: RateHeaders) -> Self {
        Self::calling(future, Some(fields), None, None)
    }

    /// `prepare` makes the verdict, then `service` (readied, if `readied`; else it is readied
    /// then) is called with the request rebuilt (`body`: `None` while the policy reads it, and
    /// `prepare` gives it back).
    pub(crate) fn preparing(
        prepare: Preparing,
        (service, readied): (S, bool),
        body: Option<ReqBody>,
    ) -> Self {
        Self::of(State::Preparing {
            prepare,
            rest: Some((service, body, readied)),
            in_flight: None,
        })
    }

    /// An answer the layer made itself (a refusal).
    pub(crate) fn refused(response: Response<Bytes>) -> Self {
        Self::of(State::Ready {
            response: Some(response),
        })
    }

    /// Carries out `verdict`: a refusal is answered; an admitted request calls `service` (readied,
    /// if `readied`; else it is readied before the call) at once or after its delay, and holds its
    /// slot and outcome guard until its response ends.
    #[inline]
    pub(crate) fn carry_out(
        verdict: Verdict,
        (service, readied): (&mut S, bool),
        mut request: Request<ReqBody>,
        release: Option<Release>,
        outcome: Option<Box<OutcomeGuard>>,
    ) -> Self
    where
        S: Clone,
    {
        let Admitted {
            headers,
            delay,
            decision,
            slot,
            near,
        } = match verdict {
            Verdict::Admit(admitted) => admitted,
            Verdict::Reject(response) => {
                crate::meter::unserved(request.extensions());
                return Self::refused(response);
            }
        };
        // Readied in place (the request is large: every move of it is a copy).
        if let Some(decision) = decision {
            crate::policy_decision::record(request.extensions_mut(), *decision);
        }
        if let Some(near) = near {
            near_limit::name(&mut request, *near);
        }
        let slot = match (slot, release) {
            (Some(owner), Some(release)) => Some(ConcurrencySlot::new(release, owner)),
            _ => None,
        };
        if delay.is_zero() && readied {
            Self::calling(service.call(request), headers, slot, outcome)
        } else {
            // A request that waits must not hold what readying reserved (a permit of an inner
            // concurrency limit) while it sleeps, nor leave it to the caller, which may keep its
            // service readied until its next request (a `Buffer`'s worker): the readied service
            // is dropped, the caller gets a fresh clone (readied again before its next call, as
            // always), and another clone readies after the wait.
            if readied {
                drop(take_readied(service));
            }
            let sleep = (!delay.is_zero()).then(|| tokio::time::sleep(delay));
            let delayed = Delayed {
                sleep,
                service: service.clone(),
                request: Some(request),
                headers,
                slot,
                outcome,
            };
            let delayed = Box::pin(delayed);
            Self::of(State::Delaying { delayed })
        }
    }

    /// Carries out the extended path's verdict on the request rebuilt from its parts and body
    /// (`kept` aside, or read for the policy and given back).
    pub(crate) fn carry_out_prepared(
        prepared: Prepared,
        (service, readied): (&mut S, bool),
        kept: Option<ReqBody>,
    ) -> Self
    where
        S: Clone,
        ReqBody: 'static,
    {
        let Prepared {
            parts,
            verdict,
            release,
            outcome,
            body: read,
        } = prepared;
        // The body read for the policy comes back as the request's own type.
        let read = read.and_then(|mut b| b.downcast_mut::<Option<ReqBody>>()?.take());
        match kept.or(read) {
            Some(body) => {
                let request = Request::from_parts(parts, body);
                Self::carry_out(verdict, (service, readied), request, release, outcome)
            }
            // Cannot happen (a body is read only as its own type); answered, not a panic.
            None => Self::refused(body_lost()),
        }
    }

    /// The inner service's answer with what the request carries; with nothing, the future alone.
    fn calling(
        future: S::Future,
        headers: Option<RateHeaders>,
        slot: Option<ConcurrencySlot>,
        outcome: Option<Box<OutcomeGuard>>,
    ) -> Self {
        if headers.is_none() && slot.is_none() && outcome.is_none() {
            return Self::unlimited(future);
        }
        Self::of(State::Calling {
            future,
            headers,
            slot,
            outcome,
        })
    }
}

/// Takes the service that `poll_ready` readied, to call later; `inner` keeps a fresh clone, which
/// the caller must `poll_ready` before the next call, as always.
pub(crate) fn take_readied<S: Clone>(inner: &mut S) -> S {
    let fresh = inner.clone();
    std::mem::replace(inner, fresh)
}

/// The answer to a request whose body the layer read and could not give back (never expected).
fn body_lost() -> Response<Bytes> {
    let mut response = Response::new(Bytes::from_static(b"request body lost\n"));
    *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
    response
}

impl<S, ReqBody, D> fmt::Debug for ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Passing { .. } => "passing",
            State::Preparing { .. } => "preparing",
            State::Delaying { .. } => "delaying",
            State::Calling { .. } => "calling",
            State::Ready { .. } => "ready",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, ReqBody, ResBody, D> Future for ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ReqBody: 'static,
{
    type Output = Result<Response<ThrottleBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_as(cx, ThrottleBody::plain, |body| body)
    }
}

impl<S, ReqBody, ResBody, D> ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ReqBody: 'static,
{
    /// The state after the extended path's verdict. Never inlined: kept out of `poll`, the fast
    /// path's `poll` stays small enough to be inlined into its caller.
    #[inline(never)]
    fn prepared(
        prepared: Prepared,
        (mut service, kept, readied): (S, Option<ReqBody>, bool),
        in_flight: Option<InFlight>,
    ) -> State<S, ReqBody> {
        // Counted from the service's call: the gate learns its latency, not the wait's.
        let in_flight = in_flight.map(|mut in_flight| {
            in_flight.called();
            in_flight
        });
        let carried = Self::carry_out_prepared(prepared, (&mut service, readied), kept);
        match in_flight {
            Some(in_flight) => carried.holding(in_flight).state,
            None => carried.state,
        }
    }

    /// The future's `poll`, with the body made by `plain` of the inner body as it came (nothing
    /// held, no field added) or by `held` of a [`ThrottleBody`]: a response with another body type
    /// (`AxumBody`'s) is made in one step.
    #[inline]
    pub(crate) fn poll_as<O>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        plain: impl FnOnce(ResBody) -> O,
        held: impl FnOnce(ThrottleBody<ResBody>) -> O,
    ) -> Poll<Result<Response<O>, S::Error>> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProj::Passing { future } => {
                    let response = ready!(future.poll(cx))?;
                    return Poll::Ready(Ok(response.map(plain)));
                }
                StateProj::Preparing {
                    prepare,
                    rest,
                    in_flight,
                } => {
                    let prepared = ready!(prepare.as_mut().poll(cx));
                    let rest = rest.take().expect("ResponseFuture polled after completion");
                    Self::prepared(prepared, rest, in_flight.take())
                }
                StateProj::Delaying { delayed } => {
                    let mut delayed = delayed.as_mut().project();
                    if let Some(sleep) = delayed.sleep.as_mut().as_pin_mut() {
                        ready!(sleep.poll(cx));
                        delayed.sleep.set(None);
                    }
                    if let Err(e) = ready!(delayed.service.poll_ready(cx)) {
                        if let Some(slot) = delayed.slot {
                            // From its readiness: the gate learns the service's failure, not
                            // delay mode's wait.
                            slot.called();
                            slot.failed();
                        }
                        return Poll::Ready(Err(e));
                    }
                    let request = delayed
                        .request
                        .take()
                        .expect("ResponseFuture polled after completion");
                    let mut slot = delayed.slot.take();
                    if let Some(slot) = &mut slot {
                        slot.called();
                    }
                    State::Calling {
                        future: delayed.service.call(request),
                        headers: delayed.headers.take(),
                        slot,
                        outcome: delayed.outcome.take(),
                    }
                }
                StateProj::Calling {
                    future,
                    headers,
                    slot,
                    outcome,
                } => {
                    let response = ready!(future.poll(cx));
                    // Counting by outcome: settled by the status (a failed call drops the guard:
                    // with no status, the request counts). A metered request's guard goes on
                    // with the body.
                    let mut meter = None;
                    if let Some(outcome) = outcome.take()
                        && let Ok(response) = &response
                    {
                        meter = (*outcome).settle(response.status(), response.headers());
                    }
                    // In place: the response's head is large, and every move of it is a copy.
                    let mut response = response.inspect_err(|_| {
                        if let Some(slot) = slot {
                            slot.failed();
                        }
                    })?;
                    if let Some(slot) = slot {
                        slot.answered();
                    }
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    let slot = slot.take();
                    return Poll::Ready(Ok(
                        response.map(|body| held(ThrottleBody::inner(body, slot, meter)))
                    ));
                }
                StateProj::Ready { response } => {
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(response.map(|data| held(ThrottleBody::full(data)))));
                }
            };
            state.set(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{BodyExt, Empty};
    use tower::service_fn;

    use super::*;

    type Inner = tower::util::ServiceFn<
        fn(Request<()>) -> std::future::Ready<Result<Response<Empty<Bytes>>, Infallible>>,
    >;
    type Future = ResponseFuture<Inner, (), std::future::Pending<()>>;

    fn service() -> Inner {
        service_fn(|_| std::future::ready(Ok(Response::new(Empty::new()))))
    }

    /// A verdict whose body was read and not given back (never expected) is answered 500, with
    /// the inner service never called, not a panic.
    #[tokio::test]
    async fn a_request_whose_body_is_lost_is_answered_500() {
        let (parts, ()) = Request::new(()).into_parts();
        let verdict = Verdict::Admit(Admitted::unlimited());
        let (release, outcome, body) = (None, None, None);
        let prepared = Prepared {
            parts,
            verdict,
            release,
            outcome,
            body,
        };
        let future: Future =
            ResponseFuture::carry_out_prepared(prepared, (&mut service(), true), None);
        assert_eq!(
            format!("{future:?}"),
            r#"ResponseFuture { state: "ready" }"#
        );
        let response = future.await.unwrap();
        assert_eq!(response.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
        let text = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&text[..], b"request body lost\n");
    }

    #[test]
    fn its_debug_names_its_state() {
        let future: Future = ResponseFuture::unlimited(service().call(Request::new(())));
        assert_eq!(
            format!("{future:?}"),
            r#"ResponseFuture { state: "passing" }"#
        );
    }
}
