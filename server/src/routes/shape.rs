//! Builds OpenAI-shaped responses and stream chunks from engine events.

use std::sync::Arc;

use memra_engine::request::{TokenEvent, Usage};
use serde_json::{Map, Value};

use crate::engine::ModelText;
use crate::openai::{
    ChatChoice, ChatChunk, ChatCompletion, ChatLogprobs, ChatMessageOut, ChunkChoice, Completion,
    CompletionChoice, CompletionLogprobs, Delta, TokenLogprob, TopLogprob, UsageJson,
};
use crate::validation::Kind;

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
    chat_lp: Vec<TokenLogprob>,
    cmpl_lp: CompletionLogprobs,
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
            created: now_secs(),
            model: i.model,
            fingerprint: i.fingerprint,
            logprobs: i.logprobs,
            include_usage: i.include_usage,
            text: i.text,
            out: String::new(),
            chat_lp: Vec::new(),
            cmpl_lp: CompletionLogprobs::default(),
        }
    }

    /// Records a token's text and logprobs; returns the chunk's logprobs part (streaming).
    fn record(&mut self, t: &TokenEvent) -> (Option<ChatLogprobs>, Option<CompletionLogprobs>) {
        let offset = self.out.len();
        self.out.push_str(&t.text);
        let Some(lp) = t.logprob.filter(|_| self.logprobs) else {
            return (None, None);
        };
        let tok = self.text.token_text(t.id);
        match self.kind {
            Kind::Chat => {
                let top = t
                    .top_logprobs
                    .iter()
                    .map(|&(id, l)| {
                        let s = self.text.token_text(id);
                        TopLogprob {
                            bytes: s.as_bytes().to_vec(),
                            token: s,
                            logprob: l,
                        }
                    })
                    .collect();
                let e = TokenLogprob {
                    bytes: tok.as_bytes().to_vec(),
                    token: tok,
                    logprob: lp,
                    top_logprobs: top,
                };
                self.chat_lp.push(e.clone());
                (Some(ChatLogprobs { content: vec![e] }), None)
            }
            Kind::Completion => {
                let mut top = Map::new();
                for &(id, l) in &t.top_logprobs {
                    top.insert(self.text.token_text(id), Value::from(l));
                }
                let one = CompletionLogprobs {
                    tokens: vec![tok],
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
    pub fn role_chunk(&self) -> Option<Value> {
        (self.kind == Kind::Chat).then(|| {
            self.chat_chunk(
                Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
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
    ) -> Value {
        let c = ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.fingerprint.clone(),
            choices: vec![ChunkChoice {
                index: 0,
                delta,
                logprobs: lp,
                finish_reason: finish,
            }],
            usage: self.usage_field(),
        };
        serde_json::to_value(c).unwrap_or(Value::Null)
    }

    fn cmpl_chunk(
        &self,
        text: String,
        lp: Option<CompletionLogprobs>,
        finish: Option<&'static str>,
    ) -> Value {
        let mut v = serde_json::to_value(Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.fingerprint.clone(),
            choices: vec![CompletionChoice {
                index: 0,
                text,
                logprobs: lp,
                finish_reason: finish,
            }],
            usage: None,
        })
        .unwrap_or(Value::Null);
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// A stream chunk for one token, or `None` when it carries nothing (held-back text, no
    /// logprobs).
    pub fn token_chunk(&mut self, t: &TokenEvent) -> Option<Value> {
        let (clp, plp) = self.record(t);
        if t.text.is_empty() && clp.is_none() && plp.is_none() {
            return None;
        }
        Some(match self.kind {
            Kind::Chat => self.chat_chunk(
                Delta {
                    role: None,
                    content: Some(t.text.clone()),
                },
                clp,
                None,
            ),
            Kind::Completion => self.cmpl_chunk(t.text.clone(), plp, None),
        })
    }

    /// A stream chunk for text that belongs to no token (held back until the end of sequence),
    /// or `None` when it is empty. It carries no logprobs.
    pub fn text_chunk(&mut self, text: &str) -> Option<Value> {
        if text.is_empty() {
            return None;
        }
        self.out.push_str(text);
        Some(match self.kind {
            Kind::Chat => self.chat_chunk(
                Delta {
                    role: None,
                    content: Some(text.to_string()),
                },
                None,
                None,
            ),
            Kind::Completion => self.cmpl_chunk(text.to_string(), None, None),
        })
    }

    /// The chunk carrying `finish_reason`.
    pub fn finish_chunk(&self, reason: &'static str) -> Value {
        match self.kind {
            Kind::Chat => self.chat_chunk(Delta::default(), None, Some(reason)),
            Kind::Completion => self.cmpl_chunk(String::new(), None, Some(reason)),
        }
    }

    /// The last chunk when `stream_options.include_usage`: no choices, the usage.
    pub fn usage_chunk(&self, u: Usage) -> Value {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        serde_json::json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [],
            "usage": UsageJson::from(u),
        })
    }

    /// The whole (non-streaming) response.
    pub fn full(&mut self, reason: &'static str, u: Usage) -> Value {
        let text = std::mem::take(&mut self.out);
        let v = match self.kind {
            Kind::Chat => serde_json::to_value(ChatCompletion {
                id: self.id.clone(),
                object: "chat.completion",
                created: self.created,
                model: self.model.clone(),
                system_fingerprint: self.fingerprint.clone(),
                choices: vec![ChatChoice {
                    index: 0,
                    message: ChatMessageOut {
                        role: "assistant",
                        content: text,
                    },
                    logprobs: self.logprobs.then(|| ChatLogprobs {
                        content: std::mem::take(&mut self.chat_lp),
                    }),
                    finish_reason: reason,
                }],
                usage: u.into(),
            }),
            Kind::Completion => serde_json::to_value(Completion {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                system_fingerprint: self.fingerprint.clone(),
                choices: vec![CompletionChoice {
                    index: 0,
                    text,
                    logprobs: self.logprobs.then(|| std::mem::take(&mut self.cmpl_lp)),
                    finish_reason: Some(reason),
                }],
                usage: Some(u.into()),
            }),
        };
        v.unwrap_or(Value::Null)
    }
}
