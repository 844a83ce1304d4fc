//! Builds OpenAI-shaped responses and stream chunks from engine events.

use std::sync::Arc;

use memra_engine::request::{TokenEvent, Usage};
use serde::Serialize;
use serde_json::Value;

use crate::engine::ModelText;
use crate::openai::{
    ChatChoice, ChatChunk, ChatCompletion, ChatLogprobs, ChatMessageOut, ChunkChoice, Completion,
    CompletionChoice, CompletionLogprobs, Delta, FunctionOut, TokenLogprob, ToolCallOut,
    TopLogprob, TopLogprobMap, UsageJson,
};
use crate::tools::{self, ToolStyle};
use crate::validation::{Kind, Tools};

/// A response or stream chunk, serialized as built (struct field order, and each completions
/// `top_logprobs` map in probability order).
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Shaped {
    ChatChunk(ChatChunk),
    Chat(ChatCompletion),
    Completion(Completion),
    Json(Value),
}

/// The fixed parts of one response and the text/logprobs gathered so far.
pub struct Shaper {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub fingerprint: String,
    pub logprobs: bool,
    pub include_usage: bool,
    pub text: Arc<dyn ModelText>,
    /// Generated text so far (non-streaming; also the completions text offsets).
    pub out: String,
    /// Characters in `out`.
    out_chars: usize,
    chat_lp: Vec<TokenLogprob>,
    cmpl_lp: CompletionLogprobs,
    /// The request's tools and the model's tool format: the text is held until the end,
    /// where calls are read out of it.
    tools: Option<(Tools, ToolStyle)>,
    request_id: String,
    /// The choice this shaper builds (`n` > 1: one shaper a choice).
    index: usize,
}

/// Unix seconds now.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub struct ShaperInit {
    pub kind: Kind,
    pub request_id: String,
    pub model: String,
    pub fingerprint: String,
    pub logprobs: bool,
    pub include_usage: bool,
    pub text: Arc<dyn ModelText>,
    pub tools: Option<(Tools, ToolStyle)>,
    /// The choice's index (0 when the request has one).
    pub index: usize,
}

/// A token's name in completions logprobs (`tokens` and the `top_logprobs` keys): its text when
/// its bytes are UTF-8, else `bytes:\xNN...` (OpenAI's form), so that tokens holding different
/// parts of a character stay distinct.
pub fn completion_token(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => {
            let mut s = String::from("bytes:");
            for b in bytes {
                s.push_str(&format!("\\x{b:02x}"));
            }
            s
        }
    }
}

impl Shaper {
    pub fn new(i: ShaperInit) -> Shaper {
        let prefix = match i.kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        Shaper {
            kind: i.kind,
            id: format!("{prefix}-{}", i.request_id),
            request_id: i.request_id,
            created: now_secs(),
            model: i.model,
            fingerprint: i.fingerprint,
            logprobs: i.logprobs,
            include_usage: i.include_usage,
            text: i.text,
            out: String::new(),
            out_chars: 0,
            chat_lp: Vec::new(),
            cmpl_lp: CompletionLogprobs::default(),
            tools: i.tools,
            index: i.index,
        }
    }

    /// The tool calls in the whole text (when the request has tools and the generation ended
    /// normally), with their ids, and the text outside them.
    fn tool_calls(&self, reason: &str) -> Option<(Option<String>, Vec<ToolCallOut>)> {
        let (t, style) = self.tools.as_ref()?;
        if reason != "stop" {
            return None;
        }
        let (content, calls) = tools::parse(&self.out, t, *style)?;
        let calls = calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| ToolCallOut {
                id: match self.index {
                    0 => format!("call_{}_{i}", self.request_id),
                    c => format!("call_{}-{c}_{i}", self.request_id),
                },
                kind: "function",
                function: FunctionOut {
                    name: c.name,
                    arguments: c.arguments,
                },
            })
            .collect();
        Some((content, calls))
    }

    /// Appends generated text; returns the character offset where it starts.
    fn push_text(&mut self, text: &str) -> usize {
        let offset = self.out_chars;
        self.out.push_str(text);
        self.out_chars += text.chars().count();
        offset
    }

    /// Records a token's text and logprobs; returns the chunk's logprobs part (streaming).
    fn record(&mut self, t: &TokenEvent) -> (Option<ChatLogprobs>, Option<CompletionLogprobs>) {
        let offset = self.push_text(&t.text);
        let Some(lp) = t.logprob.filter(|_| self.logprobs) else {
            return (None, None);
        };
        let bytes = self.text.token_bytes(t.id);
        match self.kind {
            Kind::Chat => {
                let top = t
                    .top_logprobs
                    .iter()
                    .map(|&(id, l)| {
                        let bytes = self.text.token_bytes(id);
                        TopLogprob {
                            token: String::from_utf8_lossy(&bytes).into_owned(),
                            logprob: l,
                            bytes,
                        }
                    })
                    .collect();
                let e = TokenLogprob {
                    token: String::from_utf8_lossy(&bytes).into_owned(),
                    logprob: lp,
                    bytes,
                    top_logprobs: top,
                };
                self.chat_lp.push(e.clone());
                (Some(ChatLogprobs { content: vec![e] }), None)
            }
            Kind::Completion => {
                let top = TopLogprobMap(
                    t.top_logprobs
                        .iter()
                        .map(|&(id, l)| (completion_token(&self.text.token_bytes(id)), l))
                        .collect(),
                );
                let one = CompletionLogprobs {
                    tokens: vec![completion_token(&bytes)],
                    token_logprobs: vec![lp],
                    top_logprobs: vec![top],
                    text_offset: vec![offset],
                };
                self.cmpl_lp.tokens.extend(one.tokens.iter().cloned());
                self.cmpl_lp.token_logprobs.push(lp);
                self.cmpl_lp
                    .top_logprobs
                    .extend(one.top_logprobs.iter().cloned());
                self.cmpl_lp.text_offset.push(offset);
                (None, Some(one))
            }
        }
    }

    fn usage_field(&self) -> Option<Option<UsageJson>> {
        self.include_usage.then_some(None)
    }

    /// The first chat chunk (the assistant role); completions have none.
    pub fn role_chunk(&self) -> Option<Shaped> {
        (self.kind == Kind::Chat).then(|| {
            self.chat_chunk(
                Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    tool_calls: None,
                },
                None,
                None,
            )
        })
    }

    fn chat_chunk(
        &self,
        delta: Delta,
        lp: Option<ChatLogprobs>,
        finish: Option<&'static str>,
    ) -> Shaped {
        Shaped::ChatChunk(ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.fingerprint.clone(),
            choices: vec![ChunkChoice {
                index: self.index,
                delta,
                logprobs: lp,
                finish_reason: finish,
            }],
            usage: self.usage_field(),
        })
    }

    fn cmpl_chunk(
        &self,
        text: String,
        lp: Option<CompletionLogprobs>,
        finish: Option<&'static str>,
    ) -> Shaped {
        Shaped::Completion(Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.fingerprint.clone(),
            choices: vec![CompletionChoice {
                index: self.index,
                text,
                logprobs: lp,
                finish_reason: finish,
            }],
            usage: self.usage_field(),
        })
    }

    /// A chunk carrying `text` (and a token's logprobs, if any).
    fn text_or_token_chunk(
        &self,
        text: &str,
        clp: Option<ChatLogprobs>,
        plp: Option<CompletionLogprobs>,
    ) -> Shaped {
        match self.kind {
            Kind::Chat => self.chat_chunk(
                Delta {
                    role: None,
                    content: Some(text.to_string()),
                    tool_calls: None,
                },
                clp,
                None,
            ),
            Kind::Completion => self.cmpl_chunk(text.to_string(), plp, None),
        }
    }

    /// A stream chunk for one token, or `None` when it carries nothing (held-back text, no
    /// logprobs).
    pub fn token_chunk(&mut self, t: &TokenEvent) -> Option<Shaped> {
        let (clp, plp) = self.record(t);
        if self.tools.is_some() {
            return None;
        }
        if t.text.is_empty() && clp.is_none() && plp.is_none() {
            return None;
        }
        Some(self.text_or_token_chunk(&t.text, clp, plp))
    }

    /// A stream chunk for text that belongs to no token (held back until the end of sequence),
    /// or `None` when it is empty. It carries no logprobs.
    pub fn text_chunk(&mut self, text: &str) -> Option<Shaped> {
        if text.is_empty() {
            return None;
        }
        self.push_text(text);
        if self.tools.is_some() {
            return None;
        }
        Some(self.text_or_token_chunk(text, None, None))
    }

    /// The chunk carrying `finish_reason`.
    pub fn finish_chunk(&self, reason: &'static str) -> Shaped {
        match self.kind {
            Kind::Chat => self.chat_chunk(Delta::default(), None, Some(reason)),
            Kind::Completion => self.cmpl_chunk(String::new(), None, Some(reason)),
        }
    }

    /// The last chunks of a stream: with tools, the held text is read for calls and sent as
    /// tool-call deltas (each call's id and name, then its arguments) with `finish_reason`
    /// `tool_calls`, or else as one content chunk; then the chunk carrying `finish_reason`.
    pub fn finish_chunks(&mut self, reason: &'static str) -> Vec<Shaped> {
        if self.tools.is_none() {
            return vec![self.finish_chunk(reason)];
        }
        let mut out = Vec::new();
        let delta = |content: Option<String>, calls: Option<Vec<Value>>| Delta {
            role: None,
            content,
            tool_calls: calls,
        };
        match self.tool_calls(reason) {
            Some((content, calls)) => {
                if let Some(c) = content {
                    out.push(self.chat_chunk(delta(Some(c), None), None, None));
                }
                for (i, c) in calls.iter().enumerate() {
                    let head = serde_json::json!([{"index": i, "id": c.id, "type": "function",
                        "function": {"name": c.function.name, "arguments": ""}}]);
                    out.push(self.chat_chunk(
                        delta(None, serde_json::from_value(head).ok()),
                        None,
                        None,
                    ));
                    let args = serde_json::json!([{"index": i,
                        "function": {"arguments": c.function.arguments}}]);
                    out.push(self.chat_chunk(
                        delta(None, serde_json::from_value(args).ok()),
                        None,
                        None,
                    ));
                }
                out.push(self.finish_chunk("tool_calls"));
            }
            None => {
                if !self.out.is_empty() {
                    out.push(self.chat_chunk(delta(Some(self.out.clone()), None), None, None));
                }
                out.push(self.finish_chunk(reason));
            }
        }
        out
    }

    /// What the last chunk of a stream (the usage) needs of the response.
    pub fn usage_head(&self) -> UsageHead {
        UsageHead {
            kind: self.kind,
            id: self.id.clone(),
            created: self.created,
            model: self.model.clone(),
            fingerprint: self.fingerprint.clone(),
        }
    }

    /// The whole (non-streaming) response.
    pub fn full(&mut self, reason: &'static str, u: Usage) -> Shaped {
        let calls = self.tool_calls(reason);
        let text = std::mem::take(&mut self.out);
        let (content, tool_calls, reason) = match calls {
            Some((content, calls)) => (content, Some(calls), "tool_calls"),
            None => (Some(text.clone()), None, reason),
        };
        match self.kind {
            Kind::Chat => Shaped::Chat(ChatCompletion {
                id: self.id.clone(),
                object: "chat.completion",
                created: self.created,
                model: self.model.clone(),
                system_fingerprint: self.fingerprint.clone(),
                choices: vec![ChatChoice {
                    index: self.index,
                    message: ChatMessageOut {
                        role: "assistant",
                        content,
                        tool_calls,
                    },
                    logprobs: self.logprobs.then(|| ChatLogprobs {
                        content: std::mem::take(&mut self.chat_lp),
                    }),
                    finish_reason: reason,
                }],
                usage: u.into(),
            }),
            Kind::Completion => Shaped::Completion(Completion {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                system_fingerprint: self.fingerprint.clone(),
                choices: vec![CompletionChoice {
                    index: self.index,
                    text,
                    logprobs: self.logprobs.then(|| std::mem::take(&mut self.cmpl_lp)),
                    finish_reason: Some(reason),
                }],
                usage: Some(Some(u.into())),
            }),
        }
    }
}

/// The fixed parts of a response that its usage chunk repeats.
pub struct UsageHead {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
}

impl UsageHead {
    /// The last chunk when `stream_options.include_usage`: no choices, the usage.
    pub fn chunk(&self, u: Usage) -> Shaped {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        Shaped::Json(serde_json::json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [],
            "usage": UsageJson::from(u),
        }))
    }
}

/// The usage of a request of several choices (`choices[0]` first): its prompt once, with
/// the first choice's cached tokens; the generated and drafted tokens of every choice.
pub fn combined_usage(choices: &[Usage]) -> Usage {
    let first = choices.first().copied().unwrap_or_default();
    Usage {
        completion_tokens: choices.iter().map(|u| u.completion_tokens).sum(),
        drafted_tokens: choices.iter().map(|u| u.drafted_tokens).sum(),
        accepted_tokens: choices.iter().map(|u| u.accepted_tokens).sum(),
        ..first
    }
}

/// The whole response of several choices: the first choice's response (from [`Shaper::full`])
/// holding every choice in index order and `usage`.
pub fn merge_full(parts: Vec<Shaped>, usage: Usage) -> Shaped {
    let mut parts = parts.into_iter();
    let Some(mut head) = parts.next() else {
        return Shaped::Json(Value::Null);
    };
    for p in parts {
        match (&mut head, p) {
            (Shaped::Chat(h), Shaped::Chat(c)) => h.choices.extend(c.choices),
            (Shaped::Completion(h), Shaped::Completion(c)) => h.choices.extend(c.choices),
            _ => {}
        }
    }
    match &mut head {
        Shaped::Chat(h) => h.usage = usage.into(),
        Shaped::Completion(h) => h.usage = Some(Some(usage.into())),
        _ => {}
    }
    head
}

#[cfg(test)]
mod tests {
    use super::completion_token;

    #[test]
    fn completion_tokens_name_partial_characters_by_their_bytes() {
        assert_eq!(completion_token(b" hello"), " hello");
        assert_eq!(completion_token(&[0xE4]), "bytes:\\xe4");
        assert_eq!(completion_token(&[0xE4, 0xB8]), "bytes:\\xe4\\xb8");
        assert_eq!(completion_token("中".as_bytes()), "中");
    }
}
