//! The SSE side of a generation: a task forwards engine events as chunks into the response
//! body's channel. When the client goes away the body (and the channel's receiver) is dropped;
//! the task sees the channel close at once and drops the engine stream, which cancels the
//! request and frees its KV.

use hyper::Response;
use memra_engine::request::Event;
use tokio::sync::mpsc;

use super::running::{Running, observe_token};
use crate::errors::ApiError;
use crate::http::body::{self, Body};
use crate::sse;

/// Chunks buffered between the forwarding task and the socket.
const CHANNEL: usize = 64;

pub fn respond(run: Running) -> Response<Body> {
    let (tx, rx) = mpsc::channel(CHANNEL);
    tokio::spawn(forward(run, tx));
    body::sse(rx)
}

async fn forward(mut run: Running, tx: mpsc::Sender<bytes::Bytes>) {
    if let Some(c) = run.shaper.role_chunk()
        && tx.send(sse::event(&c)).await.is_err()
    {
        return;
    }
    let mut last = None;
    loop {
        let ev = tokio::select! {
            biased;
            _ = tx.closed() => return,
            ev = run.events.recv() => ev,
        };
        let frames = match ev {
            Some(Event::Token(t)) => {
                observe_token(&run, &mut last);
                match run.shaper.token_chunk(&t) {
                    Some(c) => vec![sse::event(&c)],
                    None => continue,
                }
            }
            Some(Event::Text(s)) => match run.shaper.text_chunk(&s) {
                Some(c) => vec![sse::event(&c)],
                None => continue,
            },
            Some(Event::Done {
                finish_reason,
                usage,
            }) => {
                run.state.metrics.usage(&usage);
                let mut f = vec![sse::event(&run.shaper.finish_chunk(finish_reason.as_str()))];
                if run.shaper.include_usage {
                    f.push(sse::event(&run.shaper.usage_chunk(usage)));
                }
                f.push(sse::done());
                send_all(&tx, f).await;
                return;
            }
            Some(Event::Error(m)) => {
                send_all(&tx, vec![sse::event(&ApiError::engine(m).body())]).await;
                return;
            }
            None => {
                let e = ApiError::engine("the engine ended the request without finishing it");
                send_all(&tx, vec![sse::event(&e.body())]).await;
                return;
            }
        };
        if !send_all(&tx, frames).await {
            return;
        }
    }
}

async fn send_all(tx: &mpsc::Sender<bytes::Bytes>, frames: Vec<bytes::Bytes>) -> bool {
    for f in frames {
        if tx.send(f).await.is_err() {
            return false;
        }
    }
    true
}
