//! Request routing: probes (no key), metrics, models and inference (keyed when a keyring is
//! configured: metrics carry tenant names). Every response
//! gets an `x-request-id` header and is counted in `memra_requests_total`.

pub mod generate;
pub mod info;
pub mod running;
pub mod shape;
pub mod stream;

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, HeaderValue};
use hyper::{Method, Request, Response};

use crate::auth::Tenant;
use crate::errors::ApiError;
use crate::http::body::{self, Body};
use crate::state::State;
use crate::validation::Kind;

/// The request id: the client's `x-request-id` when it is short and plain, else a random one.
pub fn request_id(req: &Request<Incoming>) -> String {
    let given = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| {
            !s.is_empty()
                && s.len() <= 64
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        });
    match given {
        Some(s) => s.to_string(),
        None => {
            let mut b = [0u8; 12];
            if getrandom::fill(&mut b).is_err() {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                b.copy_from_slice(&t.to_le_bytes()[..12]);
            }
            crate::keys::to_hex(&b)
        }
    }
}

/// The tenant of a keyed route.
pub fn authenticate(st: &State, req: &Request<Incoming>) -> Result<Tenant, ApiError> {
    st.auth
        .authenticate(req.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes))
}

/// Dispatches one request.
pub async fn handle(req: Request<Incoming>, st: Arc<State>) -> Response<Body> {
    let rid = request_id(&req);
    let path = req.uri().path().to_string();
    let mut tenant = String::from("-");
    let method = req.method().clone();
    let (route, result) = match (&method, path.as_str()) {
        (&Method::GET, "/health") => ("health", Ok(info::health())),
        (&Method::GET, "/ready") => ("ready", Ok(info::ready(&st))),
        (&Method::GET, "/metrics") => ("metrics", info::metrics(&st, &req, &mut tenant)),
        (&Method::GET, "/v1/models") => ("models", info::models(&st, &req, &mut tenant)),
        (&Method::POST, "/v1/chat/completions") => (
            "chat",
            generate::handle(Kind::Chat, req, &st, &rid, &mut tenant).await,
        ),
        (&Method::POST, "/v1/completions") => (
            "completions",
            generate::handle(Kind::Completion, req, &st, &rid, &mut tenant).await,
        ),
        (_, "/health" | "/ready" | "/metrics" | "/v1/models") => {
            ("other", Err(ApiError::method_not_allowed("GET")))
        }
        (_, "/v1/chat/completions" | "/v1/completions") => {
            ("other", Err(ApiError::method_not_allowed("POST")))
        }
        _ => ("other", Err(ApiError::not_found(&path))),
    };
    let mut resp = result.unwrap_or_else(|e| body::error(&e));
    st.metrics.request(route, resp.status().as_u16(), &tenant);
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}
