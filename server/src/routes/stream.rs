//! The SSE side of a generation: a task forwards engine events as chunks into the response
//! body's channel. When the client goes away the body (and the channel's receiver) is dropped;
//! the task sees the channel close at once and drops the engine stream, which cancels the
//! request and frees its KV. A client that stops reading (the channel stays full) is given up
//! after the stream write timeout, with the same effect.

use std::time::Duration;

use hyper::Response;
use memra_engine::request::{Event, Usage};
use tokio::sync::mpsc;

use super::running::{Running, observe_token};
use super::shape;
use crate::errors::ApiError;
use crate::http::body::{self, Body};
use crate::sse;

/// Chunks buffered between the forwarding task and the socket.
const CHANNEL: usize = 64;

/// The SSE response of a request whose choices' `first` events have arrived (generate.rs waits
/// for them before committing the status): a task per choice forwards its chunks (the choices'
/// chunks interleave, each naming its index); when every choice has finished, the usage chunk
/// (`stream_options.include_usage`: the request's, [`shape::combined_usage`]) and `[DONE]`.
pub fn respond(runs: Vec<(Running, Event)>) -> Response<Body> {
    let (tx, rx) = mpsc::channel(CHANNEL);
    tokio::spawn(forward_all(runs, tx));
    body::sse(rx)
}

async fn forward_all(runs: Vec<(Running, Event)>, tx: mpsc::Sender<bytes::Bytes>) {
    let Some((run, _)) = runs.first() else {
        return;
    };
    let wait = run.state.limits.stream_write_timeout;
    let include_usage = run.shaper.include_usage;
    let head = run.shaper.usage_head();
    let tasks: Vec<_> = runs
        .into_iter()
        .map(|(run, first)| tokio::spawn(forward(run, first, tx.clone(), wait)))
        .collect();
    let mut usage = Vec::with_capacity(tasks.len());
    for t in tasks {
        match t.await {
            Ok(Some(u)) => usage.push(u),
            // A choice ended without finishing (the client left, an error was sent).
            _ => return,
        }
    }
    let mut f = Vec::with_capacity(2);
    if include_usage {
        f.push(sse::event(&head.chunk(shape::combined_usage(&usage))));
    }
    f.push(sse::done());
    send_all(&tx, f, wait).await;
}

/// Forwards one choice's chunks; its usage once it finished and its last chunks were sent.
async fn forward(
    mut run: Running,
    first: Event,
    tx: mpsc::Sender<bytes::Bytes>,
    wait: Duration,
) -> Option<Usage> {
    if let Some(c) = run.shaper.role_chunk()
        && !send_all(&tx, vec![sse::event(&c)], wait).await
    {
        return None;
    }
    let mut last = None;
    let mut pending = Some(first);
    loop {
        let ev = match pending.take() {
            Some(ev) => Some(ev),
            None => tokio::select! {
                biased;
                _ = tx.closed() => return None,
                ev = run.events.recv() => ev,
            },
        };
        let frames = match ev {
            Some(Event::Token(t)) => {
                observe_token(&mut run, &mut last);
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
                run.count_usage(&usage);
                let f: Vec<_> = run
                    .shaper
                    .finish_chunks(finish_reason.as_str())
                    .iter()
                    .map(sse::event)
                    .collect();
                return send_all(&tx, f, wait).await.then_some(usage);
            }
            Some(Event::Error(m)) => {
                send_all(&tx, vec![sse::event(&ApiError::engine(m).body())], wait).await;
                return None;
            }
            None => {
                let e = ApiError::engine("the engine ended the request without finishing it");
                send_all(&tx, vec![sse::event(&e.body())], wait).await;
                return None;
            }
        };
        if !send_all(&tx, frames, wait).await {
            return None;
        }
    }
}

/// Sends `frames`; false when the client left or did not read for `wait`.
async fn send_all(
    tx: &mpsc::Sender<bytes::Bytes>,
    frames: Vec<bytes::Bytes>,
    wait: Duration,
) -> bool {
    for f in frames {
        match tokio::time::timeout(wait, tx.send(f)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return false,
            Err(_) => {
                tracing::info!(
                    "stream cancelled: the client read nothing for {} s",
                    wait.as_secs()
                );
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reader_that_stalls_is_given_up_after_the_write_timeout() {
        let (tx, mut rx) = mpsc::channel(1);
        let wait = Duration::from_millis(50);
        let f = || vec![bytes::Bytes::from_static(b"data: x\n\n")];
        assert!(send_all(&tx, f(), wait).await, "room in the channel");
        let t = std::time::Instant::now();
        assert!(
            !send_all(&tx, f(), wait).await,
            "full: the client reads nothing"
        );
        assert!(t.elapsed() >= wait && t.elapsed() < Duration::from_secs(5));
        assert!(rx.recv().await.is_some());
        assert!(send_all(&tx, f(), wait).await, "the client read again");
        drop(rx);
        assert!(!send_all(&tx, f(), wait).await, "the client left");
    }
}
