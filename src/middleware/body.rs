//! [`ThrottleBody`]: the response body of [`Throttle`](crate::Throttle), holding the request's
//! concurrency slot until the body ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::middleware::slot::ConcurrencySlot;

pin_project! {
    /// The inner service's body, or the small body of a response the middleware made itself (a 429).
    #[project = BodyProj]
    pub struct ThrottleBody<B> {
        #[pin]
        content: Content<B>,
    }
}

pin_project! {
    #[project = ContentProj]
    enum Content<B> {
        Inner { #[pin] body: B, slot: Option<ConcurrencySlot> },
        Full { data: Option<Bytes> },
    }
}

impl<B> ThrottleBody<B> {
    /// The inner service's body; `slot` (a concurrency slot) is given back when the body ends or is
    /// dropped.
    pub(crate) fn inner(body: B, slot: Option<ConcurrencySlot>) -> Self {
        ThrottleBody {
            content: Content::Inner { body, slot },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        ThrottleBody {
            content: Content::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> std::fmt::Debug for ThrottleBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.content {
            Content::Inner { .. } => f.write_str("ThrottleBody::Inner"),
            Content::Full { data } => f.debug_tuple("ThrottleBody::Full").field(data).finish(),
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
        match self.project().content.project() {
            ContentProj::Inner { body, slot } => {
                let frame = body.poll_frame(cx);
                // The body is done (or failed): the request no longer holds its slot.
                if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
                    slot.take();
                }
                frame
            }
            ContentProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.content {
            Content::Inner { body, .. } => body.is_end_stream(),
            Content::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.content {
            Content::Inner { body, .. } => body.size_hint(),
            Content::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
