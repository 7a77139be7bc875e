//! `streamGenerateContent` without `alt=sse`: Google's other stream
//! framing, one JSON array whose elements arrive as they are made
//! (`[{…}\r\n,{…}\r\n]`). tidegate always asks a Gemini upstream for SSE
//! and relays and translates streams as SSE; this body re-frames the
//! client's finished SSE bytes, event by event, into the array. An error
//! event becomes an element like any other (as Google sends it).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

pin_project_lite::pin_project! {
    /// An SSE body re-framed as a streamed JSON array.
    pub struct JsonArray<B> {
        #[pin]
        inner: B,
        pending: BytesMut,
        opened: bool,
        closed: bool,
    }
}

impl<B> JsonArray<B> {
    /// Re-frames `inner` (an SSE body of Gemini chunks).
    pub fn new(inner: B) -> Self {
        Self { inner, pending: BytesMut::new(), opened: false, closed: false }
    }
}

/// Takes the whole events at the front of `pending` and writes their
/// `data:` as array elements to `out`.
fn drain(pending: &mut BytesMut, opened: &mut bool, out: &mut Vec<u8>) {
    loop {
        // The first blank line, LF or CRLF framed.
        let lf = pending.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
        let crlf = pending.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
        let Some(end) = lf.into_iter().chain(crlf).min() else { return };
        let event = pending.split_to(end);
        let mut data: Vec<&[u8]> = Vec::new();
        for line in event[..].split(|b: &u8| *b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(d) = line.strip_prefix(b"data:") {
                data.push(d.strip_prefix(b" ").unwrap_or(d));
            }
        }
        if data.is_empty() {
            continue;
        }
        out.extend_from_slice(if *opened { b",\r\n" } else { b"[" });
        *opened = true;
        for (i, d) in data.iter().enumerate() {
            if i > 0 {
                out.push(b'\n');
            }
            out.extend_from_slice(d);
        }
    }
}

impl<B> Body for JsonArray<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        loop {
            if *this.closed {
                return Poll::Ready(None);
            }
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    this.pending.extend_from_slice(&data);
                    let mut out = Vec::new();
                    drain(this.pending, this.opened, &mut out);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    *this.closed = true;
                    // A last event without its blank line still counts.
                    this.pending.extend_from_slice(b"\n\n");
                    let mut out = Vec::new();
                    drain(this.pending, this.opened, &mut out);
                    out.extend_from_slice(if *this.opened { b"]" } else { b"[]" });
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.closed
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body of these pieces, last first.
    struct Pieces(Vec<Bytes>);

    impl Body for Pieces {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop().map(|b| Ok(Frame::data(b))))
        }
    }

    #[tokio::test]
    async fn sse_events_become_array_elements_whatever_the_cuts() {
        let sse = "data: {\"a\":1}\r\n\r\n: a comment\n\ndata: {\"b\":2}\n\ndata: {\"c\":3}";
        for cut in 1..sse.len() {
            let (x, y) = sse.split_at(cut);
            let body = Pieces(vec![Bytes::copy_from_slice(y.as_bytes()), Bytes::copy_from_slice(x.as_bytes())]);
            let out = JsonArray::new(body).collect().await.unwrap().to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v, serde_json::json!([{"a": 1}, {"b": 2}, {"c": 3}]), "cut at {cut}");
        }
        let empty = http_body_util::Empty::<Bytes>::new();
        assert_eq!(&JsonArray::new(empty).collect().await.unwrap().to_bytes()[..], b"[]");
    }
}
