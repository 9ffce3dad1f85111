//! Reading a request body for a body key: at most `max` bytes within a timeout, then the whole
//! body, unchanged, rebuilt in its own type for the inner service ([`Replay`]). Most body types
//! cannot be rebuilt from bytes (hyper's `Incoming`), so the layer reads only those it knows how to
//! rebuild ([`reader`]). The types meet here at run time (`Any`), so that a layer whose policies
//! read no body asks nothing of its request body type, and axum's `Router::layer` (which needs the
//! inner service to take the same body) keeps working.

use std::any::{Any, TypeId};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::Full;
use pin_project_lite::pin_project;

use super::WholeBody;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body read (or being read), as its type was erased: an `Option<T>` holding the rebuilt body.
pub(crate) type ErasedBody = Box<dyn Any + Send>;

/// Reading one body: the rebuilt body, and the whole body if it came within the cap and in time.
pub(crate) type Reading = Pin<Box<dyn Future<Output = (ErasedBody, WholeBody)> + Send>>;

/// Starts reading the body in `slot` (an `Option<T>`), at most `max` bytes within `timeout`.
/// `None`, the body left in its slot, if the slot does not hold this reader's type.
pub(crate) type ReadFn = fn(slot: &mut dyn Any, max: usize, timeout: Duration) -> Option<Reading>;

/// The reader of bodies of type `T`, if the layer can rebuild them.
pub(crate) fn reader<T: 'static>() -> Option<ReadFn> {
    let of = TypeId::of::<T>();
    #[cfg(feature = "axum")]
    if of == TypeId::of::<axum::body::Body>() {
        return Some(start::<axum::body::Body>);
    }
    if of == TypeId::of::<Full<Bytes>>() {
        return Some(start::<Full<Bytes>>);
    }
    if of == TypeId::of::<BoxBody<Bytes, BoxError>>() {
        return Some(start::<BoxBody<Bytes, BoxError>>);
    }
    if of == TypeId::of::<UnsyncBoxBody<Bytes, BoxError>>() {
        return Some(start::<UnsyncBoxBody<Bytes, BoxError>>);
    }
    None
}

fn start<T: ReplayBody>(slot: &mut dyn Any, max: usize, timeout: Duration) -> Option<Reading> {
    let body = slot.downcast_mut::<Option<T>>()?.take()?;
    Some(Box::pin(async move {
        let (body, whole) = read(body, max, timeout).await;
        (Box::new(Some(body)) as ErasedBody, whole)
    }))
}

/// A request body type the layer can rebuild after reading the start of it.
pub(crate) trait ReplayBody:
    Body<Data = Bytes, Error: Send> + Unpin + Send + Sized + 'static
{
    /// The body again: what was read, then the rest.
    fn replay(replay: Replay<Self>) -> Self;
}

#[cfg(feature = "axum")]
impl ReplayBody for axum::body::Body {
    fn replay(replay: Replay<Self>) -> Self {
        axum::body::Body::new(replay)
    }
}

impl ReplayBody for BoxBody<Bytes, BoxError> {
    fn replay(replay: Replay<Self>) -> Self {
        BoxBody::new(replay)
    }
}

impl ReplayBody for UnsyncBoxBody<Bytes, BoxError> {
    fn replay(replay: Replay<Self>) -> Self {
        UnsyncBoxBody::new(replay)
    }
}

impl ReplayBody for Full<Bytes> {
    fn replay(replay: Replay<Self>) -> Self {
        // A `Full` is one frame: read whole (its size is exact, so one over the cap is never read
        // and comes back as it was), or not at all.
        let Replay { read, overflow, .. } = replay;
        Full::new(overflow.unwrap_or(read))
    }
}

/// Reads `body` until it ends, passes `max` bytes, fails or `timeout` passes: the body rebuilt, and
/// the whole of it if it ended within `max` bytes, in time and without an error. The frame that
/// crosses the cap is kept as it came (no copy), and nothing after it is read.
pub(crate) async fn read<T: ReplayBody>(
    mut body: T,
    max: usize,
    timeout: Duration,
) -> (T, WholeBody) {
    if body.size_hint().lower() > max as u64 {
        return (body, None);
    }
    let mut buffer: Vec<u8> = Vec::new();
    let mut overflow = None;
    let mut trailers = None;
    let mut error = None;
    let mut ended = false;
    let reading = async {
        loop {
            match poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                None => {
                    ended = true;
                    return;
                }
                Some(Err(e)) => {
                    error = Some(e);
                    return;
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if buffer.len() + data.len() <= max => {
                        if buffer.capacity() < buffer.len() + data.len() {
                            // Doubling, but never past the cap.
                            let want = (buffer.len() + data.len())
                                .max(buffer.capacity() * 2)
                                .min(max);
                            buffer.reserve_exact(want - buffer.len());
                        }
                        buffer.extend_from_slice(&data);
                    }
                    Ok(data) => {
                        overflow = Some(data);
                        return;
                    }
                    Err(frame) => {
                        // Trailers end a body.
                        trailers = frame.into_trailers().ok();
                        ended = true;
                        return;
                    }
                },
            }
        }
    };
    let in_time = crate::timer::within(timeout, reading).await.is_some();
    let read = Bytes::from(buffer);
    let whole = (in_time && ended && overflow.is_none() && error.is_none()).then(|| read.clone());
    // A body that ended or failed is not polled again.
    let rest = (!ended && error.is_none()).then_some(body);
    let replay = Replay {
        read,
        overflow,
        trailers,
        error,
        rest,
    };
    (T::replay(replay), whole)
}

pin_project! {
    /// A body whose start was read: the bytes read, the frame that crossed the cap, then what the
    /// body had left (its trailers, its error, or the rest of its stream).
    pub(crate) struct Replay<T: Body> {
        read: Bytes,
        overflow: Option<Bytes>,
        trailers: Option<HeaderMap>,
        error: Option<T::Error>,
        rest: Option<T>,
    }
}

impl<T: Body<Data = Bytes> + Unpin> Body for Replay<T> {
    type Data = Bytes;
    type Error = T::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, T::Error>>> {
        let this = self.project();
        if !this.read.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(std::mem::take(this.read)))));
        }
        if let Some(data) = this.overflow.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(error) = this.error.take() {
            return Poll::Ready(Some(Err(error)));
        }
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        match this.rest {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty()
            && self.overflow.is_none()
            && self.error.is_none()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let held = (self.read.len() + self.overflow.as_ref().map_or(0, Bytes::len)) as u64;
        let mut hint = match &self.rest {
            Some(rest) => rest.size_hint(),
            None => SizeHint::with_exact(0),
        };
        let lower = hint.lower().saturating_add(held);
        let upper = hint.upper().map(|u| u.saturating_add(held));
        // The upper first: `set_lower` asserts the lower is no more than the upper it finds.
        if let Some(upper) = upper {
            hint.set_upper(upper);
        }
        hint.set_lower(lower);
        hint
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use http_body_util::BodyExt;
    use tokio::sync::mpsc;

    type Chunks = UnsyncBoxBody<Bytes, BoxError>;

    /// Frames given in advance, then (if any) what a channel sends until it closes.
    struct TestBody {
        frames: VecDeque<Result<Bytes, BoxError>>,
        more: Option<mpsc::Receiver<Bytes>>,
    }

    impl Body for TestBody {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            if let Some(next) = self.frames.pop_front() {
                return Poll::Ready(Some(next.map(Frame::data)));
            }
            match &mut self.more {
                Some(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
                None => Poll::Ready(None),
            }
        }
    }

    fn chunks(parts: &[&'static [u8]], fail: bool) -> Chunks {
        let mut frames: VecDeque<_> = parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
        if fail {
            frames.push_back(Err("reset".into()));
        }
        UnsyncBoxBody::new(TestBody { frames, more: None })
    }

    async fn collect(body: impl Body<Data = Bytes, Error = BoxError>) -> Result<Vec<u8>, String> {
        body.collect()
            .await
            .map(|c| c.to_bytes().to_vec())
            .map_err(|e| e.to_string())
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn a_body_within_the_cap_is_read_whole_and_handed_on() {
        let (body, whole) = read(chunks(&[b"ab", b"cd"], false), 4, SECOND).await;
        assert_eq!(whole.as_deref(), Some(&b"abcd"[..]));
        assert_eq!(collect(body).await.unwrap(), b"abcd");
        let (body, whole) = read(chunks(&[], false), 4, SECOND).await;
        assert_eq!(whole.as_deref(), Some(&b""[..]));
        assert_eq!(collect(body).await.unwrap(), b"");
    }

    /// What was read counts in the size: a client sending it on (hyper's content-length) asks.
    #[tokio::test]
    async fn a_replayed_body_reports_its_size() {
        let (body, _) = read(chunks(&[b"ab", b"cd"], false), 4, SECOND).await;
        assert_eq!(body.size_hint().exact(), Some(4));
        // Past the cap, the rest of an exact size: all of it.
        let exact = Full::new(Bytes::from_static(b"0123456789")).map_err(BoxError::from);
        let (body, whole) = read(Chunks::new(exact), 3, SECOND).await;
        assert_eq!(whole, None);
        assert_eq!(body.size_hint().exact(), Some(10));
    }

    #[tokio::test]
    async fn a_body_over_the_cap_is_handed_on_whole_but_not_read_past_it() {
        let (body, whole) = read(chunks(&[b"ab", b"cd", b"ef", b"gh"], false), 3, SECOND).await;
        assert_eq!(whole, None);
        assert_eq!(collect(body).await.unwrap(), b"abcdefgh");
        let full = Full::new(Bytes::from_static(b"0123456789"));
        let (full, whole) = read(full, 3, SECOND).await;
        assert_eq!(whole, None);
        assert_eq!(full.collect().await.unwrap().to_bytes(), &b"0123456789"[..]);
        let (full, whole) = read(Full::new(Bytes::from_static(b"012")), 3, SECOND).await;
        assert_eq!(whole.as_deref(), Some(&b"012"[..]));
        assert_eq!(full.collect().await.unwrap().to_bytes(), &b"012"[..]);
    }

    #[tokio::test]
    async fn a_failing_body_has_no_whole_and_fails_again_downstream() {
        let (body, whole) = read(chunks(&[b"ab"], true), 16, SECOND).await;
        assert_eq!(whole, None);
        assert_eq!(collect(body).await.unwrap_err(), "reset");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_body_times_out_and_the_rest_still_follows() {
        let (tx, rx) = mpsc::channel(4);
        let frames = VecDeque::from([Ok(Bytes::from_static(b"ab"))]);
        let body: Chunks = UnsyncBoxBody::new(TestBody {
            frames,
            more: Some(rx),
        });
        let (body, whole) = read(body, 16, Duration::from_millis(100)).await;
        assert_eq!(whole, None);
        tx.send(Bytes::from_static(b"cd")).await.unwrap();
        drop(tx);
        assert_eq!(collect(body).await.unwrap(), b"abcd");
    }

    #[test]
    fn only_known_types_are_read() {
        assert!(reader::<Full<Bytes>>().is_some());
        assert!(reader::<Chunks>().is_some());
        assert!(reader::<()>().is_none());
        assert!(reader::<String>().is_none());
        let mut slot: Option<String> = Some("x".into());
        assert!(reader::<Full<Bytes>>().unwrap()(&mut slot, 1, SECOND).is_none());
        assert_eq!(slot.as_deref(), Some("x"));
    }
}
