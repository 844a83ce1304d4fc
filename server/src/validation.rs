//! Parse at the edge: a request body becomes a typed [`Parsed`] request once, with every
//! problem reported as a 400 naming its parameter. Unknown fields are ignored.
//! Tokenization happens later, off the executor ([`crate::routes::generate`]).

use memra_engine::chat::ChatMessage;
use memra_engine::request::ValidRequest;
use memra_engine::sampling::SamplingParams;
use serde_json::{Map, Value};

use crate::errors::ApiError;
use crate::media::{MARKER, MediaRef};

mod structured;
pub use structured::{
    ResponseFormat, Structured, Tool, ToolChoice, Tools, format_grammar, parse_structured,
};

/// Most stop strings a request may give.
pub const MAX_STOP: usize = 8;
/// Longest stop string, in bytes.
pub const MAX_STOP_LEN: usize = 256;
/// Most `top_logprobs` (chat) / `logprobs` (completions).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most choices (`n`) of one request: each is an engine request of its own.
pub const MAX_CHOICES: usize = 16;
/// Longest `user` / `cache_salt`, in bytes.
pub const MAX_TAG_LEN: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

impl Kind {
    /// The request parameter holding the prompt.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Kind::Chat => "messages",
            Kind::Completion => "prompt",
        }
    }
}

/// What to tokenize.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
    Chat(Vec<ChatMessage>),
}

/// A parsed request, before tokenization.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    pub kind: Kind,
    pub model: String,
    /// Choices to generate (`n`): choice `i` samples as the same request with seed `seed + i`
    /// would, alone.
    pub n: usize,
    pub prompt: PromptInput,
    pub max_tokens: Option<usize>,
    pub params: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// `Some(n)`: logprobs with `n` alternatives.
    pub logprobs: Option<usize>,
    pub user: Option<String>,
    pub cache_salt: Option<String>,
    /// OpenAI's `prompt_cache_key`: a routing hint only (`x-memra-cache-key`); it neither
    /// changes the output nor namespaces the prefix cache (`cache_salt` does).
    pub prompt_cache_key: Option<String>,
    /// `"ignore_eos": true` generates past the end-of-sequence tokens up to `max_tokens`
    /// (benchmarks; as llama-server and vLLM accept it). Stop strings still apply.
    pub ignore_eos: bool,
    /// `"speculative": false` opts out of the model's speculative decoding (same output).
    pub speculative: bool,
    /// `response_format` and tools.
    pub structured: Structured,
    /// Images and videos of a chat request, one per [`MARKER`] in the messages, in order.
    pub media: Vec<MediaRef>,
}

type Obj = Map<String, Value>;

fn parse_object(body: &[u8]) -> Result<Obj, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::invalid(format!(
            "the body is not valid UTF-8 (at byte {})",
            e.valid_up_to()
        ))
    })?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::invalid("the body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(format!(
            "the body is not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        ))),
    }
}

fn present<'a>(o: &'a Obj, k: &str) -> Option<&'a Value> {
    o.get(k).filter(|v| !v.is_null())
}

fn get_str(o: &Obj, k: &str) -> Result<Option<String>, ApiError> {
    match present(o, k) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::param(k, format!("`{k}` must be a string"))),
    }
}

fn get_bool(o: &Obj, k: &str) -> Result<Option<bool>, ApiError> {
    match present(o, k) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::param(k, format!("`{k}` must be true or false"))),
    }
}

fn get_f32(o: &Obj, k: &str, lo: f32, hi: f32, lo_open: bool) -> Result<Option<f32>, ApiError> {
    let Some(v) = present(o, k) else {
        return Ok(None);
    };
    let x = v
        .as_f64()
        .ok_or_else(|| ApiError::param(k, format!("`{k}` must be a number")))? as f32;
    let ok = x.is_finite() && x <= hi && if lo_open { x > lo } else { x >= lo };
    if !ok {
        let from = if lo_open { "greater than" } else { "from" };
        return Err(ApiError::param(
            k,
            format!("`{k}` = {x} is out of range ({from} {lo} to {hi})"),
        ));
    }
    Ok(Some(x))
}

fn get_uint(o: &Obj, k: &str) -> Result<Option<u64>, ApiError> {
    match present(o, k) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| ApiError::param(k, format!("`{k}` must be a non-negative integer"))),
    }
}

fn get_tag(o: &Obj, k: &str) -> Result<Option<String>, ApiError> {
    let s = get_str(o, k)?;
    if s.as_ref().is_some_and(|s| s.len() > MAX_TAG_LEN) {
        return Err(ApiError::param(
            k,
            format!("`{k}` is longer than {MAX_TAG_LEN} bytes"),
        ));
    }
    Ok(s)
}

fn parse_stop(o: &Obj) -> Result<Vec<String>, ApiError> {
    let list = match present(o, "stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::param("stop", "`stop` must be a string or a list of strings")
            })?,
        Some(_) => {
            return Err(ApiError::param(
                "stop",
                "`stop` must be a string or a list of strings",
            ));
        }
    };
    if list.len() > MAX_STOP {
        return Err(ApiError::param(
            "stop",
            format!("at most {MAX_STOP} stop strings are allowed"),
        ));
    }
    if list.iter().any(|s| s.is_empty() || s.len() > MAX_STOP_LEN) {
        return Err(ApiError::param(
            "stop",
            format!("each stop string must be 1 to {MAX_STOP_LEN} bytes"),
        ));
    }
    Ok(list)
}

fn parse_sampling(o: &Obj) -> Result<SamplingParams, ApiError> {
    let d = SamplingParams::default();
    let top_k = match present(o, "top_k") {
        None => 0,
        Some(v) if v.as_i64() == Some(-1) => 0,
        Some(v) => v
            .as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| {
                ApiError::param(
                    "top_k",
                    "`top_k` must be a non-negative integer (or -1 for off)",
                )
            })?,
    };
    let seed = match present(o, "seed") {
        None => 0,
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(u), _) => u,
            (None, Some(i)) => i as u64,
            _ => return Err(ApiError::param("seed", "`seed` must be an integer")),
        },
    };
    let p = SamplingParams {
        temperature: get_f32(o, "temperature", 0.0, 2.0, false)?.unwrap_or(1.0),
        top_k,
        top_p: get_f32(o, "top_p", 0.0, 1.0, true)?.unwrap_or(d.top_p),
        min_p: get_f32(o, "min_p", 0.0, 1.0, false)?.unwrap_or(d.min_p),
        repetition_penalty: get_f32(o, "repetition_penalty", 0.0, 10.0, true)?
            .unwrap_or(d.repetition_penalty),
        presence_penalty: get_f32(o, "presence_penalty", -2.0, 2.0, false)?.unwrap_or(0.0),
        frequency_penalty: get_f32(o, "frequency_penalty", -2.0, 2.0, false)?.unwrap_or(0.0),
        seed,
    };
    p.validate().map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(p)
}

/// A message's content: a string, or a list of parts (text, `image_url`, `video`); each image
/// or video leaves [`MARKER`] in the text where it goes and is appended to `media`.
fn parse_content(i: usize, v: &Value, media: &mut Vec<MediaRef>) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                let part = format!("{param}[{j}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => match p.get("text").and_then(Value::as_str) {
                        Some(t) => out.push_str(t),
                        None => {
                            return Err(ApiError::param(
                                &part,
                                "a text part needs `text` (a string)",
                            ));
                        }
                    },
                    Some("image_url") => {
                        let url = p
                            .get("image_url")
                            .and_then(|u| u.get("url").or(Some(u)))
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                ApiError::param(
                                    &part,
                                    "an image part is {\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,...\"}}",
                                )
                            })?;
                        out.push_str(MARKER);
                        media.push(MediaRef::Image {
                            url: url.to_string(),
                            param: format!("{part}.image_url.url"),
                        });
                    }
                    Some("video") => {
                        media.push(parse_video(p, &part)?);
                        out.push_str(MARKER);
                    }
                    Some("video_url") => {
                        return Err(ApiError::param(
                            &part,
                            "video files are not decoded (memra has no video decoder); send the \
                             video as a list of frames: {\"type\": \"video\", \"video\": \
                             [\"data:image/jpeg;base64,...\", ...], \"fps\": 1}",
                        ));
                    }
                    _ => {
                        return Err(ApiError::param(
                            &part,
                            "a content part is {\"type\": \"text\"}, {\"type\": \"image_url\"} or \
                             {\"type\": \"video\"}",
                        ));
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::param(
            &param,
            format!("`{param}` must be a string or a list of content parts"),
        )),
    }
}

/// `{"type": "video", "video": [frame URLs], "fps": F}`.
fn parse_video(p: &Value, part: &str) -> Result<MediaRef, ApiError> {
    let bad = || {
        ApiError::param(
            part,
            "a video part is {\"type\": \"video\", \"video\": [frame data: URLs], \"fps\": F}",
        )
    };
    let frames = p
        .get("video")
        .and_then(Value::as_array)
        .ok_or_else(bad)?
        .iter()
        .map(|f| f.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)?;
    if frames.is_empty() {
        return Err(ApiError::param(part, "a video needs at least one frame"));
    }
    let fps = match p.get("fps") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_f64() {
            Some(f) if f > 0.0 && f <= 1000.0 => Some(f as f32),
            _ => {
                return Err(ApiError::param(
                    part,
                    "`fps` must be a number from 0 to 1000",
                ));
            }
        },
    };
    Ok(MediaRef::Video {
        frames,
        fps,
        param: format!("{part}.video"),
    })
}

fn parse_messages(o: &Obj, media: &mut Vec<MediaRef>) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(Value::Array(msgs)) = present(o, "messages") else {
        return Err(ApiError::param(
            "messages",
            "`messages` is required: a list of {role, content}",
        ));
    };
    if msgs.is_empty() {
        return Err(ApiError::param("messages", "`messages` must not be empty"));
    }
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let role = match role {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            _ => {
                return Err(ApiError::param(
                    &format!("messages[{i}].role"),
                    "role must be system, user, assistant or tool",
                ));
            }
        };
        let tool_calls = match m.get("tool_calls") {
            Some(v) if role == "assistant" && !v.is_null() => Some(parse_tool_calls(i, v)?),
            _ => None,
        };
        let tool_call_id = match m.get("tool_call_id") {
            Some(Value::String(s)) if role == "tool" => Some(s.clone()),
            _ if role == "tool" => {
                return Err(ApiError::param(
                    &format!("messages[{i}].tool_call_id"),
                    "a tool message needs `tool_call_id` (a string)",
                ));
            }
            _ => None,
        };
        let content = match m.get("content") {
            None | Some(Value::Null) if role == "assistant" => String::new(),
            None | Some(Value::Null) => {
                return Err(ApiError::param(
                    &format!("messages[{i}].content"),
                    "content is required",
                ));
            }
            Some(v) => parse_content(i, v, media)?,
        };
        let mut msg = ChatMessage::new(role, content);
        msg.tool_calls = tool_calls;
        msg.tool_call_id = tool_call_id;
        out.push(msg);
    }
    let markers: usize = out.iter().map(|m| m.content.matches(MARKER).count()).sum();
    if !media.is_empty() && markers != media.len() {
        return Err(ApiError::param(
            "messages",
            "a request with images may not use U+FFFC (the object replacement character) in its text",
        ));
    }
    Ok(out)
}

/// An assistant message's `tool_calls`, as templates read them: each call's `arguments`
/// (a JSON string in the API) becomes the object it encodes.
fn parse_tool_calls(i: usize, v: &Value) -> Result<Value, ApiError> {
    let param = format!("messages[{i}].tool_calls");
    let bad = || {
        ApiError::param(
            &param,
            "`tool_calls` must be a list of {id, type: function, function: {name, arguments}}",
        )
    };
    let calls = v.as_array().ok_or_else(bad)?;
    let mut out = Vec::with_capacity(calls.len());
    for c in calls {
        let f = c
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(bad)?;
        let name = f.get("name").and_then(Value::as_str).ok_or_else(bad)?;
        let args = match f.get("arguments") {
            Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
            Some(a) => a.clone(),
            None => Value::Object(Map::new()),
        };
        out.push(serde_json::json!({
            "id": c.get("id").cloned().unwrap_or(Value::Null),
            "type": "function",
            "function": {"name": name, "arguments": args},
        }));
    }
    Ok(Value::Array(out))
}

fn ids_of(a: &[Value]) -> Option<Vec<u32>> {
    a.iter()
        .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
        .collect()
}

/// A completions prompt: a string, a list of one string, a list of token ids, or a list of one
/// list of token ids.
fn parse_prompt(o: &Obj) -> Result<PromptInput, ApiError> {
    let bad = || ApiError::param("prompt", "`prompt` must be a string or a list of token ids");
    let p = match present(o, "prompt") {
        None => return Err(ApiError::param("prompt", "`prompt` is required")),
        Some(Value::String(s)) => PromptInput::Text(s.clone()),
        Some(Value::Array(a)) => match a.first() {
            None => return Err(ApiError::param("prompt", "`prompt` must not be empty")),
            Some(Value::Number(_)) => PromptInput::Ids(ids_of(a).ok_or_else(bad)?),
            Some(Value::String(s)) if a.len() == 1 => PromptInput::Text(s.clone()),
            Some(Value::Array(inner)) if a.len() == 1 => {
                PromptInput::Ids(ids_of(inner).ok_or_else(bad)?)
            }
            Some(Value::String(_) | Value::Array(_)) => {
                return Err(ApiError::param(
                    "prompt",
                    "a list of several prompts is not supported; send one prompt per request",
                ));
            }
            Some(_) => return Err(bad()),
        },
        Some(_) => return Err(bad()),
    };
    if p == PromptInput::Text(String::new()) || p == PromptInput::Ids(Vec::new()) {
        return Err(ApiError::param("prompt", "`prompt` must not be empty"));
    }
    Ok(p)
}

/// Parses a chat or completions body.
pub fn parse(kind: Kind, body: &[u8], max_tokens_cap: usize) -> Result<Parsed, ApiError> {
    let o = parse_object(body)?;
    let model =
        get_str(&o, "model")?.ok_or_else(|| ApiError::param("model", "`model` is required"))?;
    let n = match present(&o, "n") {
        None => 1,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_CHOICES as u64).contains(&n) => n as usize,
            _ => {
                return Err(ApiError::param(
                    "n",
                    format!("`n` must be an integer from 1 to {MAX_CHOICES}"),
                ));
            }
        },
    };
    let mut media = Vec::new();
    let prompt = match kind {
        Kind::Chat => PromptInput::Chat(parse_messages(&o, &mut media)?),
        Kind::Completion => parse_prompt(&o)?,
    };
    let mut max_tokens = None;
    for k in ["max_tokens", "max_completion_tokens"] {
        if let Some(n) = get_uint(&o, k)? {
            if n == 0 || n > max_tokens_cap as u64 {
                return Err(ApiError::param(
                    k,
                    format!("`{k}` must be from 1 to {max_tokens_cap}"),
                ));
            }
            max_tokens = Some(n as usize);
        }
    }
    let logprobs = match kind {
        Kind::Chat => {
            let top = get_uint(&o, "top_logprobs")?;
            match (get_bool(&o, "logprobs")?.unwrap_or(false), top) {
                (_, Some(t)) if t > MAX_TOP_LOGPROBS as u64 => {
                    return Err(ApiError::param(
                        "top_logprobs",
                        format!("`top_logprobs` must be from 0 to {MAX_TOP_LOGPROBS}"),
                    ));
                }
                (false, Some(_)) => {
                    return Err(ApiError::param(
                        "top_logprobs",
                        "`top_logprobs` needs `logprobs` = true",
                    ));
                }
                (true, t) => Some(t.unwrap_or(0) as usize),
                (false, None) => None,
            }
        }
        Kind::Completion => match present(&o, "logprobs") {
            None | Some(Value::Bool(false)) => None,
            Some(v) => match v.as_u64() {
                Some(n) if n <= MAX_TOP_LOGPROBS as u64 => Some(n as usize),
                _ => {
                    return Err(ApiError::param(
                        "logprobs",
                        format!("`logprobs` must be from 0 to {MAX_TOP_LOGPROBS}"),
                    ));
                }
            },
        },
    };
    let include_usage = match present(&o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => get_bool(so, "include_usage")
            .map_err(|_| {
                ApiError::param(
                    "stream_options.include_usage",
                    "`stream_options.include_usage` must be true or false",
                )
            })?
            .unwrap_or(false),
        Some(_) => {
            return Err(ApiError::param(
                "stream_options",
                "`stream_options` must be an object",
            ));
        }
    };
    Ok(Parsed {
        kind,
        model,
        n,
        prompt,
        max_tokens,
        params: parse_sampling(&o)?,
        stop: parse_stop(&o)?,
        stream: get_bool(&o, "stream")?.unwrap_or(false),
        include_usage,
        logprobs,
        user: get_tag(&o, "user")?,
        cache_salt: get_tag(&o, "cache_salt")?,
        prompt_cache_key: get_tag(&o, "prompt_cache_key")?,
        ignore_eos: get_bool(&o, "ignore_eos")?.unwrap_or(false),
        speculative: get_bool(&o, "speculative")?.unwrap_or(true),
        structured: parse_structured(&o, kind)?,
        media,
    })
}

/// Where a parsed request goes: its tenant and the model's limits.
#[derive(Clone, Debug)]
pub struct Target<'a> {
    pub tenant: &'a str,
    /// The tenant's in-flight limit, carried to the engine with the request.
    pub tenant_max_in_flight: usize,
    pub vocab: usize,
    /// Positions one request may use (prompt + completion).
    pub ctx: usize,
    /// Largest `max_tokens` (`--max-tokens`).
    pub max_tokens_cap: usize,
}

/// The engine request for a tokenized prompt (and the compiled grammar of its structured
/// output, if any): checks token ids against the vocabulary and the
/// prompt plus `max_tokens` against the context (`context_length_exceeded`); a missing
/// `max_tokens` becomes what fits, capped at `max_tokens_cap`.
pub fn finish(
    p: Parsed,
    prompt: Vec<u32>,
    grammar: Option<std::sync::Arc<memra_engine::grammar::Grammar>>,
    to: &Target,
) -> Result<ValidRequest, ApiError> {
    let Target {
        vocab,
        ctx,
        max_tokens_cap,
        ..
    } = *to;
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::param(
            "prompt",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        ));
    }
    if prompt.is_empty() {
        return Err(ApiError::param("prompt", "the prompt has no tokens"));
    }
    let max_tokens = match p.max_tokens {
        Some(m) => m,
        None => ctx.saturating_sub(prompt.len()).min(max_tokens_cap),
    };
    if prompt.len() >= ctx || prompt.len() + max_tokens > ctx {
        return Err(ApiError::context_length(
            p.kind.prompt_param(),
            prompt.len(),
            max_tokens,
            ctx,
        ));
    }
    Ok(ValidRequest {
        media: Vec::new(),
        model: p.model,
        tenant: to.tenant.to_string(),
        prompt,
        max_tokens,
        params: p.params,
        stop: p.stop,
        logprobs: p.logprobs,
        cache_salt: p.cache_salt,
        ignore_eos: p.ignore_eos,
        tenant_max_in_flight: Some(to.tenant_max_in_flight),
        speculative: p.speculative,
        grammar,
    })
}

#[cfg(test)]
mod tests;
