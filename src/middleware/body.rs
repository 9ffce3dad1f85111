//! [`ThrottleBody`]: the response body of [`Throttle`](crate::Throttle), holding the request's
//! concurrency slot (and its count in flight through the overload gate, given back with it), and
//! a metered request's guard, until the body ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::engine::slot::ConcurrencySlot;
use crate::meter::MeterGuard;

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
        // The inner service's body, holding nothing: what most responses carry.
        Plain { #[pin] body: B },
        Inner {
            #[pin] body: B,
            slot: Option<ConcurrencySlot>,
            // Settles a metered request's cost when the body ends or is dropped: a client that
            // hangs up mid-stream is charged what was produced.
            meter: Option<Box<MeterGuard>>,
        },
        Full { data: Option<Bytes> },
    }
}

impl<B> ThrottleBody<B> {
    /// The inner body; `slot` is given back, and `meter` settles, when it ends or is dropped.
    pub(crate) fn inner(
        body: B,
        slot: Option<ConcurrencySlot>,
        meter: Option<Box<MeterGuard>>,
    ) -> Self {
        let content = match (slot, meter) {
            (None, None) => Content::Plain { body },
            (slot, meter) => Content::Inner { body, slot, meter },
        };
        ThrottleBody { content }
    }

    /// The inner service's body, when the request holds nothing until it ends.
    pub(crate) fn plain(body: B) -> Self {
        ThrottleBody {
            content: Content::Plain { body },
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

#[cfg(feature = "axum")]
impl ThrottleBody<axum::body::Body> {
    /// As axum's own body: the inner body as it is when the request holds nothing until its end,
    /// a refusal's bytes as they are; else boxed, as axum would box it.
    #[inline]
    pub(crate) fn into_axum(self) -> axum::body::Body {
        match self.content {
            Content::Plain { body } => body,
            Content::Full { data } => data.map_or_else(axum::body::Body::empty, Into::into),
            content => axum::body::Body::new(ThrottleBody { content }),
        }
    }
}

impl<B> std::fmt::Debug for ThrottleBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.content {
            Content::Plain { .. } | Content::Inner { .. } => f.write_str("ThrottleBody::Inner"),
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
            ContentProj::Plain { body } => body.poll_frame(cx),
            ContentProj::Inner { body, slot, meter } => {
                let frame = body.poll_frame(cx);
                match &frame {
                    // Done (or failed): the slot is given back, a metered request settled.
                    Poll::Ready(ended @ (None | Some(Err(_)))) => {
                        if let (Some(_), Some(slot)) = (ended, slot.as_mut()) {
                            slot.failed();
                        }
                        slot.take();
                        meter.take();
                    }
                    // A metered request's usage may come in the trailers.
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some(meter) = meter.as_ref()
                            && let Some(trailers) = frame.trailers_ref()
                        {
                            meter.read_usage(trailers);
                        }
                    }
                    Poll::Pending => {}
                }
                frame
            }
            ContentProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.content {
            Content::Plain { body } | Content::Inner { body, .. } => body.is_end_stream(),
            Content::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.content {
            Content::Plain { body } | Content::Inner { body, .. } => body.size_hint(),
            Content::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
