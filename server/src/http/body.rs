//! Request bodies read under a size limit (413), and the response body type: a whole buffer or
//! a channel of SSE chunks. Dropping a channel body (the client went away) closes the channel,
//! which the streaming task sees at once.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::errors::ApiError;

/// Bytes past the limit that are still read (and discarded) before a 413, so the client gets
/// the response instead of a connection reset.
const DRAIN_EXTRA: u64 = 16 << 20;

pub enum Body {
    Full(Option<Bytes>),
    Channel(mpsc::Receiver<Bytes>),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Channel(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => SizeHint::with_exact(0),
            Body::Channel(_) => SizeHint::default(),
        }
    }
}

/// A JSON response.
pub fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut r = Response::new(Body::Full(Some(Bytes::from(bytes))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A plain-text response.
pub fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut r = Response::new(Body::Full(Some(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// The HTTP response of an error: its status, the OpenAI error object and `Retry-After`.
pub fn error(e: &ApiError) -> Response<Body> {
    let mut r = json(e.status, &e.body());
    if let Some(s) = e.retry_after {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// An SSE response fed by `rx`.
pub fn sse(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let mut r = Response::new(Body::Channel(rx));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    r
}

/// Reads at most `limit` bytes of a request body: 413 when the declared Content-Length or the
/// bytes actually sent (chunked) exceed it.
pub async fn read_limited(
    headers: &hyper::HeaderMap,
    mut body: Incoming,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let limit64 = limit as u64;
    if declared.is_some_and(|n| n > limit64) {
        if declared.is_some_and(|n| n <= limit64 + DRAIN_EXTRA) {
            discard(body, limit64 + DRAIN_EXTRA).await;
        }
        return Err(ApiError::body_too_large(limit));
    }
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::invalid(format!("reading the body failed: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                discard(body, DRAIN_EXTRA).await;
                return Err(ApiError::body_too_large(limit));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buf))
}

/// Reads and drops up to `max` more bytes (for at most two seconds).
async fn discard(mut body: Incoming, max: u64) {
    let drain = async {
        let mut n = 0u64;
        while let Some(Ok(f)) = body.frame().await {
            if let Ok(d) = f.into_data() {
                n += d.len() as u64;
            }
            if n > max {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
}
