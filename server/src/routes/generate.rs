//! `POST /v1/chat/completions` and `POST /v1/completions`: auth, body (under a size limit and
//! a timeout, before any slot is taken), parse, admission, a byte bound on the prompt, tokenize
//! (in a bounded pool off the executor, the slot held until the work ends), submit, wait for
//! the first token (a drain meanwhile: 503 `draining`), then a whole response or an SSE stream.

use std::sync::Arc;
use std::time::Instant;

use memra_engine::grammar::Grammar;

use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use memra_engine::request::{Event, SubmitError, Usage};

use super::running::{Running, observe_token};
use super::shape::{self, Shaped, Shaper, ShaperInit};
use super::stream;
use crate::cache_key::{self, KeyInput};
use crate::errors::ApiError;
use crate::http::body::{self, Body};
use crate::media::{self, MediaLimits, MediaRef, Vision};
use crate::state::{Permit, State};
use crate::tools;
use crate::validation::{self, Kind, Parsed, PromptInput, Structured, format_grammar};
use memra_engine::vision::MediaSpan;

/// Bytes of prompt text allowed per token of context: a prompt longer than context x this
/// cannot fit once tokenized (a token is rarely over 16 bytes), so it is refused before the
/// tokenizer sees it.
pub const MAX_PROMPT_BYTES_PER_TOKEN: usize = 32;

/// Bytes of the user-supplied prompt text.
fn prompt_bytes(p: &PromptInput) -> usize {
    match p {
        PromptInput::Text(s) => s.len(),
        PromptInput::Chat(m) => m.iter().map(|m| m.content.len() + m.role.len()).sum(),
        PromptInput::Ids(_) => 0,
    }
}

/// The prompt's ids, the compiled grammar of its structured output and its image rows.
type Prepared = (Vec<u32>, Option<Arc<Grammar>>, Vec<MediaSpan>);

/// What a request's prompt is made of: its text (or messages), structured output, images.
struct PromptWork {
    input: PromptInput,
    structured: Structured,
    media: Vec<MediaRef>,
    /// Images fetched from allowed hosts.
    fetched: media::Fetched,
    vision: Option<Arc<Vision>>,
    limits: MediaLimits,
}

/// The images and videos of a chat prompt: decoded (every limit checked first), laid out
/// (a video on the Qwen ViT: the model's video path, media/video.rs), encoded by the tower (or
/// found in its cache), their tokens spliced in where their markers were.
fn prepare_media(
    text: &dyn crate::engine::ModelText,
    messages: &[memra_engine::chat::ChatMessage],
    w: &PromptWork,
    style: crate::tools::ToolStyle,
) -> Result<(Vec<u32>, Vec<MediaSpan>), ApiError> {
    let v = w.vision.as_ref().ok_or_else(|| {
        ApiError::param(
            "messages",
            "this model does not take images (serve it with `+mmproj=PATH`)",
        )
    })?;
    let decoded = v.with_target(|to| media::decode_all(&w.media, &w.limits, &w.fetched, to))?;
    let (parts, markers) = media::video::parts(decoded, &v.tower)?;
    let messages = media::video::timestamped(messages, &markers);
    let (ids, at) = match &w.structured.tools {
        Some(t) => text.encode_chat_media(
            &tools::messages_for(&messages, t, style),
            Some(&t.raw),
            media::MARKER,
        )?,
        None => text.encode_chat_media(&messages, None, media::MARKER)?,
    };
    if at.len() != parts.len() {
        return Err(ApiError::param(
            "messages",
            format!(
                "the chat template kept {} of the request's {} images",
                at.len(),
                parts.len()
            ),
        ));
    }
    let images = parts
        .iter()
        .map(|p| p.embed(v))
        .collect::<memra_engine::Result<Vec<Vec<_>>>>()?;
    Ok(media::splice(ids, &at, images, v))
}

/// Renders and tokenizes the prompt (tools in the template, or described in a system message)
/// and compiles the grammar the output must follow: a forced tool call's, else the response
/// format's. A grammar that does not compile is a 400 naming `tools` or `response_format`.
fn prepare(text: &dyn crate::engine::ModelText, w: PromptWork) -> Result<Prepared, ApiError> {
    let style = text.tool_style();
    let s = &w.structured;
    let mut spans = Vec::new();
    let ids = match &w.input {
        PromptInput::Text(t) => text.encode(t)?,
        PromptInput::Chat(m) if !w.media.is_empty() => {
            let (ids, sp) = prepare_media(text, m, &w, style)?;
            spans = sp;
            ids
        }
        PromptInput::Chat(m) => match &s.tools {
            Some(t) => text.encode_chat_tools(&tools::messages_for(m, t, style), &t.raw)?,
            None => text.encode_chat(m)?,
        },
        PromptInput::Ids(ids) => ids.clone(),
    };
    let (spec, param) = match s.tools.as_ref().and_then(|t| tools::grammar(t, style)) {
        Some(g) => (Some(g), "tools"),
        None => (format_grammar(&s.format), "response_format"),
    };
    let grammar = spec
        .map(|g| {
            text.grammar(&g)
                .map_err(|e| ApiError::param(param, e.to_string()))
        })
        .transpose()?;
    Ok((ids, grammar, spans))
}

/// Tokenizes (and compiles the grammar) in the bounded pool. The in-flight `permit` travels
/// into the blocking task and comes back with the ids, so a client that hangs up does not free
/// its slot while its tokenization still runs.
async fn tokenize(
    st: &Arc<State>,
    text: Arc<dyn crate::engine::ModelText>,
    work: PromptWork,
    permit: Permit,
) -> Result<(Prepared, Permit), ApiError> {
    let worker = st
        .tokenize_pool
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::engine("the tokenizer pool is closed"))?;
    let task = tokio::task::spawn_blocking(move || {
        let r = prepare(text.as_ref(), work);
        drop(worker);
        (r, permit)
    });
    let limit = st.limits.tokenize_timeout;
    match tokio::time::timeout(limit, task).await {
        Ok(Ok((r, permit))) => Ok((r?, permit)),
        Ok(Err(e)) => Err(ApiError::engine(format!("tokenizer task failed: {e}"))),
        Err(_) => Err(ApiError::engine(format!(
            "tokenizing the prompt took over {} s",
            limit.as_secs()
        ))),
    }
}

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
    if st.is_draining() {
        return Err(ApiError::from(SubmitError::Draining));
    }
    let (parts, incoming) = req.into_parts();
    let read = body::read_limited(&parts.headers, incoming, st.limits.max_body_bytes);
    let bytes = tokio::time::timeout(st.limits.body_timeout, read)
        .await
        .map_err(|_| ApiError::body_timeout(st.limits.body_timeout.as_secs()))??;
    let parsed = validation::parse(kind, &bytes, st.limits.max_tokens)?;
    drop(bytes);
    let permit = st.admit(&who)?;
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
    let byte_limit = model.context_len.saturating_mul(MAX_PROMPT_BYTES_PER_TOKEN);
    let n_bytes = prompt_bytes(&parsed.prompt);
    if n_bytes > byte_limit {
        return Err(ApiError::prompt_too_many_bytes(
            kind.prompt_param(),
            n_bytes,
            byte_limit,
            model.context_len,
        ));
    }
    let fetched = match &model.vision {
        Some(_) => media::fetch_allowed(&parsed.media, &st.limits.media).await?,
        None => media::Fetched::new(),
    };
    let work = PromptWork {
        input: parsed.prompt.clone(),
        structured: parsed.structured.clone(),
        media: parsed.media.clone(),
        fetched,
        vision: model.vision.clone(),
        limits: st.limits.media.clone(),
    };
    let ((ids, grammar, spans), permit) = tokenize(st, model.text.clone(), work, permit).await?;
    if st.is_draining() {
        return Err(ApiError::from(SubmitError::Draining));
    }
    let cache_key = st.limits.cache_key_header.then(|| {
        cache_key::cache_key(&KeyInput {
            model: &parsed.model,
            tenant: &who.name,
            cache_salt: parsed.cache_salt.as_deref(),
            prompt_cache_key: parsed.prompt_cache_key.as_deref(),
            user: parsed.user.as_deref(),
            prompt: &parsed.prompt,
            ids: &ids,
            block: model.kv_cache.as_ref().map_or(16, |k| k.block_size),
        })
    });
    let shaper_of = |index| {
        Shaper::new(ShaperInit {
            kind,
            request_id: request_id.to_string(),
            model: parsed.model.clone(),
            fingerprint: st.fingerprint(),
            logprobs: parsed.logprobs.is_some(),
            include_usage: parsed.include_usage,
            text: model.text.clone(),
            tools: parsed
                .structured
                .tools
                .clone()
                .map(|t| (t, model.text.tool_style())),
            index,
        })
    };
    let mut shapers: Vec<Shaper> = (0..parsed.n).map(shaper_of).collect();
    let created = shapers[0].created;
    shapers.iter_mut().for_each(|s| s.created = created);
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
    let mut vr = validation::finish(parsed, ids, grammar, &target)?;
    vr.media = spans;
    // `n` > 1: an engine request a choice, choice i seeded `seed + i` (its bytes are those of
    // that request alone), each admitted before any is submitted.
    let mut permits = vec![permit];
    for _ in 1..shapers.len() {
        permits.push(st.admit(&who)?);
    }
    let seed = vr.params.seed;
    let mut runs = Vec::with_capacity(shapers.len());
    for (i, (shaper, permit)) in shapers.into_iter().zip(permits).enumerate() {
        let mut r = vr.clone();
        r.params.seed = seed.wrapping_add(i as u64);
        let events = st.engine.submit(r).map_err(|e| match e {
            SubmitError::ContextLength {
                prompt,
                max_tokens,
                ctx,
            } => ApiError::context_length(kind.prompt_param(), prompt, max_tokens, ctx),
            e => ApiError::from(e),
        })?;
        runs.push(Running {
            events,
            shaper,
            state: st.clone(),
            started,
            permit,
            tokens: 0,
            counted: false,
        });
    }
    let mut started_runs = Vec::with_capacity(runs.len());
    for mut run in runs {
        let first = first_event(&mut run).await?;
        started_runs.push((run, first));
    }
    let mut resp = if streaming {
        stream::respond(started_runs)
    } else {
        collect_all(started_runs).await?
    };
    if let Some(v) = cache_key.and_then(|k| HeaderValue::from_str(&k).ok()) {
        resp.headers_mut().insert(cache_key::HEADER, v);
    }
    Ok(resp)
}

/// Waits for the request's first event from the engine. Until it comes nothing is sent (a
/// stream's status and headers included), so a drain that starts meanwhile answers 503
/// `draining` with Retry-After, and the caller's dropping `run` cancels the request in the
/// engine (it frees its KV): a request still queued on a replica that is going away is retried
/// elsewhere instead of holding the drain up or being cut off. An engine error before any
/// token is an HTTP error too.
async fn first_event(run: &mut Running) -> Result<Event, ApiError> {
    let st = run.state.clone();
    let ev = tokio::select! {
        biased;
        ev = run.events.recv() => ev,
        _ = st.drain_started() => return Err(ApiError::from(SubmitError::Draining)),
    };
    match ev {
        Some(Event::Error(m)) => Err(ApiError::engine(m)),
        Some(ev) => Ok(ev),
        None => Err(ApiError::engine(
            "the engine ended the request without finishing it",
        )),
    }
}

/// Gathers every choice's whole generation (each from its `first` event on, all at once) into
/// one response: choice 0's with every choice and the request's usage. The choices run in a
/// JoinSet owned by this future: a client that leaves (hyper drops the future) or a choice's
/// error cancels every choice's request.
async fn collect_all(runs: Vec<(Running, Event)>) -> Result<Response<Body>, ApiError> {
    let n = runs.len();
    let mut set = tokio::task::JoinSet::new();
    for (i, (run, first)) in runs.into_iter().enumerate() {
        set.spawn(async move { (i, collect(run, first).await) });
    }
    let mut done: Vec<Option<(Shaped, Usage)>> = (0..n).map(|_| None).collect();
    while let Some(r) = set.join_next().await {
        let (i, r) = r.map_err(|e| ApiError::engine(format!("a choice's task failed: {e}")))?;
        done[i] = Some(r?);
    }
    let (mut parts, usage): (Vec<Shaped>, Vec<Usage>) = done.into_iter().flatten().unzip();
    let v = match parts.len() {
        1 => parts.remove(0),
        _ => shape::merge_full(parts, shape::combined_usage(&usage)),
    };
    Ok(body::json(StatusCode::OK, &v))
}

/// Gathers one choice's whole generation (from its `first` event on): its response and usage.
async fn collect(mut run: Running, first: Event) -> Result<(Shaped, Usage), ApiError> {
    let mut last: Option<Instant> = None;
    let mut pending = Some(first);
    loop {
        let ev = match pending.take() {
            Some(ev) => Some(ev),
            None => run.events.recv().await,
        };
        match ev {
            Some(Event::Token(t)) => {
                observe_token(&mut run, &mut last);
                let _ = run.shaper.token_chunk(&t);
            }
            Some(Event::Text(s)) => {
                let _ = run.shaper.text_chunk(&s);
            }
            Some(Event::Done {
                finish_reason,
                usage,
            }) => {
                run.count_usage(&usage);
                return Ok((run.shaper.full(finish_reason.as_str(), usage), usage));
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
