//! `/health`, `/ready`, `/metrics` and `/v1/models`.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::json;

use crate::errors::ApiError;
use crate::http::body::{self, Body};
use crate::metrics::{CONTENT_TYPE, ServerLoad};
use crate::openai::{ModelJson, ModelList};
use crate::state::State;

/// Liveness: 200 whenever the process serves HTTP (also while loading and draining).
pub fn health() -> Response<Body> {
    body::json(StatusCode::OK, &json!({"status": "ok"}))
}

/// Readiness: 503 until every model is loaded, and while draining.
pub fn ready(st: &State) -> Response<Body> {
    if st.is_draining() {
        return body::json(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "draining"}),
        );
    }
    if !st.engine.ready() {
        return body::json(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "loading"}),
        );
    }
    body::json(StatusCode::OK, &json!({"status": "ready"}))
}

/// The Prometheus text; with a keyring it takes a key like the inference routes (its labels
/// name tenants).
pub fn metrics(
    st: &State,
    req: &Request<Incoming>,
    tenant: &mut String,
) -> Result<Response<Body>, ApiError> {
    *tenant = super::authenticate(st, req)?.name;
    let models = st.engine.models();
    let block_size = |alias: &str| {
        models
            .iter()
            .find(|m| m.alias == alias)
            .and_then(|m| m.kv_cache.as_ref())
            .map(|k| k.block_size)
    };
    let load = ServerLoad {
        in_flight: st.in_flight(),
        tenants_in_flight: &st.tenants_in_flight(),
        block_size: &block_size,
    };
    let text = st.metrics.render(&st.engine.stats(), &load);
    Ok(body::text(StatusCode::OK, CONTENT_TYPE, text))
}

pub fn models(
    st: &State,
    req: &Request<Incoming>,
    tenant: &mut String,
) -> Result<Response<Body>, ApiError> {
    *tenant = super::authenticate(st, req)?.name;
    let data = st
        .engine
        .models()
        .into_iter()
        .map(|m| ModelJson {
            id: m.alias,
            object: "model",
            created: m.created,
            owned_by: "memra",
            max_model_len: m.context_len,
            backend: m.backend,
            device_profile: m.profile,
            pipeline: m.pipeline,
            kv_cache: m.kv_cache,
        })
        .collect();
    Ok(body::json(
        StatusCode::OK,
        &ModelList {
            object: "list",
            data,
        },
    ))
}
