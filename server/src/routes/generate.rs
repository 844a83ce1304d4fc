//! `POST /v1/chat/completions` and `POST /v1/completions`: auth, admission, body, parse,
//! tokenize (off the executor), submit, then a whole response or an SSE stream.

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Request, Response, StatusCode};
use memra_engine::request::{Event, SubmitError};

use super::running::{Running, observe_token};
use super::shape::{Shaper, ShaperInit};
use super::stream;
use crate::errors::ApiError;
use crate::http::body::{self, Body};
use crate::state::State;
use crate::validation::{self, Kind, Parsed, PromptInput};

fn check_content_type(req: &Request<Incoming>) -> Result<(), ApiError> {
    match req.headers().get(CONTENT_TYPE) {
        None => Ok(()),
        Some(v) => {
            let v = v.to_str().unwrap_or("").to_ascii_lowercase();
            if v.starts_with("application/json") {
                Ok(())
            } else {
                Err(ApiError::invalid(
                    "the Content-Type must be application/json (with curl: -H 'content-type: application/json')",
                ))
            }
        }
    }
}

/// Serves one inference request; sets `tenant` once it is known (for metrics).
pub async fn handle(
    kind: Kind,
    req: Request<Incoming>,
    st: &Arc<State>,
    request_id: &str,
    tenant: &mut String,
) -> Result<Response<Body>, ApiError> {
    let started = Instant::now();
    let who = super::authenticate(st, &req)?;
    *tenant = who.name.clone();
    check_content_type(&req)?;
    let permit = st.admit(&who)?;
    let (parts, incoming) = req.into_parts();
    let bytes = body::read_limited(&parts.headers, incoming, st.limits.max_body_bytes).await?;
    let parsed = validation::parse(kind, &bytes, st.limits.max_tokens)?;
    drop(bytes);
    let model = st
        .engine
        .models()
        .into_iter()
        .find(|m| m.alias == parsed.model)
        .ok_or_else(|| {
            if st.engine.ready() {
                ApiError::model_not_found(&parsed.model)
            } else {
                ApiError::loading()
            }
        })?;
    let text = model.text.clone();
    let input = parsed.prompt.clone();
    let ids = tokio::task::spawn_blocking(move || match input {
        PromptInput::Text(s) => text.encode(&s),
        PromptInput::Chat(m) => text.encode_chat(&m),
        PromptInput::Ids(ids) => Ok(ids),
    })
    .await
    .map_err(|e| ApiError::engine(format!("tokenizer task failed: {e}")))??;
    let shaper = Shaper::new(ShaperInit {
        kind,
        request_id: request_id.to_string(),
        model: parsed.model.clone(),
        fingerprint: st.fingerprint(),
        logprobs: parsed.logprobs.is_some(),
        include_usage: parsed.include_usage,
        text: model.text.clone(),
    });
    let Parsed {
        stream: streaming, ..
    } = parsed;
    let target = validation::Target {
        tenant: &who.name,
        tenant_max_in_flight: st.tenant_limit(&who),
        vocab: model.text.vocab_size(),
        ctx: model.context_len,
        max_tokens_cap: st.limits.max_tokens,
    };
    let vr = validation::finish(parsed, ids, &target)?;
    let events = st.engine.submit(vr).map_err(|e| match e {
        SubmitError::ContextLength {
            prompt,
            max_tokens,
            ctx,
        } => ApiError::context_length(kind.prompt_param(), prompt, max_tokens, ctx),
        e => ApiError::from(e),
    })?;
    let run = Running {
        events,
        shaper,
        state: st.clone(),
        started,
        permit,
    };
    if streaming {
        Ok(stream::respond(run))
    } else {
        collect(run).await
    }
}

/// Gathers the whole generation into one response.
async fn collect(mut run: Running) -> Result<Response<Body>, ApiError> {
    let mut last: Option<Instant> = None;
    loop {
        match run.events.recv().await {
            Some(Event::Token(t)) => {
                observe_token(&run, &mut last);
                let _ = run.shaper.token_chunk(&t);
            }
            Some(Event::Text(s)) => {
                let _ = run.shaper.text_chunk(&s);
            }
            Some(Event::Done {
                finish_reason,
                usage,
            }) => {
                run.state.metrics.usage(&usage);
                let v = run.shaper.full(finish_reason.as_str(), usage);
                drop(run.permit);
                return Ok(body::json(StatusCode::OK, &v));
            }
            Some(Event::Error(m)) => return Err(ApiError::engine(m)),
            None => {
                return Err(ApiError::engine(
                    "the engine ended the request without finishing it",
                ));
            }
        }
    }
}
