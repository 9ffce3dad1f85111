//! [`ThrottleBody`]: the response body of [`Throttle`](crate::Throttle).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::service::SlotGuard;

pin_project! {
    /// The inner service's body, or the small body of a response the middleware made itself (a 429).
    #[project = BodyProj]
    pub struct ThrottleBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B, guard: Option<SlotGuard> },
        Full { data: Option<Bytes> },
    }
}

impl<B> ThrottleBody<B> {
    /// The inner service's body; `guard` (a concurrency slot) is given back when the body ends or is
    /// dropped.
    pub(crate) fn inner(body: B, guard: Option<SlotGuard>) -> Self {
        ThrottleBody {
            kind: Kind::Inner { body, guard },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        ThrottleBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> std::fmt::Debug for ThrottleBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ThrottleBody::Inner"),
            Kind::Full { data } => f.debug_tuple("ThrottleBody::Full").field(data).finish(),
        }
    }
}

impl<B> Body for ThrottleBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, guard } => {
                let frame = body.poll_frame(cx);
                // The body is done (or failed): the request no longer holds its slot.
                if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
                    guard.take();
                }
                frame
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
