//! The HTTP/1.1 server on hyper 1 + tokio: accept loop, per-connection service, graceful drain.

pub mod body;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulConnection, GracefulShutdown};
use tokio::net::TcpListener;

use crate::routes;
use crate::state::State;

/// Answers a connection over the cap with 503 + Retry-After and closes it (at most one second
/// spent on a client that does not read).
fn refuse(mut stream: tokio::net::TcpStream, limit: usize) {
    let e = crate::errors::ApiError::too_many_connections(limit);
    let body = e.body().to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        e.retry_after.unwrap_or(1),
        body.len()
    );
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let send = async {
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
            stream.shutdown().await
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), send).await;
    });
}

/// One HTTP/1.1 connection through the routes; `keep_alive: false` answers one request and
/// closes (connections accepted while draining).
fn connection(
    stream: tokio::net::TcpStream,
    state: Arc<State>,
    keep_alive: bool,
) -> impl GracefulConnection<Error = hyper::Error> + Send + 'static {
    let _ = stream.set_nodelay(true);
    let svc = service_fn(move |req| {
        let st = state.clone();
        async move { Ok::<_, Infallible>(routes::handle(req, st).await) }
    });
    http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .keep_alive(keep_alive)
        .serve_connection(TokioIo::new(stream), svc)
}

/// Serves until `shutdown` resolves, then drains: marks the server draining (`/ready` 503, new
/// inference requests 503 with Retry-After, `/health` 200), lets in-flight requests finish up
/// to the drain timeout, and tells the engine to drain. Returns when done.
pub async fn serve(
    listener: TcpListener,
    state: Arc<State>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    // Connection tasks, to reap them as they end and abort the rest after the drain timeout.
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            acc = listener.accept() => {
                let Some(stream) = accepted(acc).await else { continue };
                if conns.len() >= state.limits.max_connections {
                    refuse(stream, state.limits.max_connections);
                    continue;
                }
                let conn = graceful.watch(connection(stream, state.clone(), true));
                conns.spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!("connection ended: {e}");
                    }
                });
            }
            _ = &mut shutdown => break,
        }
    }
    state.start_draining();
    tracing::info!("draining: {} requests in flight", state.in_flight());
    if drain(&listener, &state, graceful).await {
        tracing::info!("drained");
    } else {
        tracing::warn!(
            "drain timeout: cutting off {} requests still in flight",
            state.in_flight()
        );
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    }
    drop(listener);
    state.engine.drain();
    Ok(())
}

/// The stream of an accepted connection; `None` after a failed accept (out of file
/// descriptors and the like), having backed off instead of spinning.
async fn accepted(
    acc: std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)>,
) -> Option<tokio::net::TcpStream> {
    match acc {
        Ok((s, _)) => Some(s),
        Err(e) => {
            tracing::warn!("accept failed: {e}");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

/// Waits (up to the drain timeout) for the watched connections to finish their requests, while
/// still answering new connections one request each, so a client that arrives during the
/// drain gets 503 (and a probe `/ready` 503) rather than a refused connection. True when every
/// watched connection finished in time.
async fn drain(listener: &TcpListener, state: &Arc<State>, graceful: GracefulShutdown) -> bool {
    let done = tokio::time::timeout(state.limits.drain_timeout, graceful.shutdown());
    tokio::pin!(done);
    let mut late = tokio::task::JoinSet::new();
    let finished = loop {
        tokio::select! {
            r = &mut done => break r.is_ok(),
            Some(_) = late.join_next(), if !late.is_empty() => {}
            acc = listener.accept() => {
                let Some(stream) = accepted(acc).await else { continue };
                if late.len() >= state.limits.max_connections {
                    refuse(stream, state.limits.max_connections);
                    continue;
                }
                late.spawn(connection(stream, state.clone(), false));
            }
        }
    };
    late.abort_all();
    finished
}
