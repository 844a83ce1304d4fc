//! OpenAI response shapes (chat completions, completions, chunks, models, usage, logprobs).

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

/// Speculative decoding's share of the completion (OpenAI's predicted-output fields): draft
/// tokens accepted and rejected. Both 0 when the request did not speculate.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct CompletionTokensDetails {
    pub accepted_prediction_tokens: usize,
    pub rejected_prediction_tokens: usize,
}

#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct UsageJson {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    pub completion_tokens_details: CompletionTokensDetails,
}

impl From<memra_engine::request::Usage> for UsageJson {
    fn from(u: memra_engine::request::Usage) -> Self {
        UsageJson {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
            completion_tokens_details: CompletionTokensDetails {
                accepted_prediction_tokens: u.accepted_tokens,
                rejected_prediction_tokens: u.drafted_tokens.saturating_sub(u.accepted_tokens),
            },
        }
    }
}

/// One alternative in chat logprobs.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// One generated token in chat logprobs.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChatMessageOut {
    pub role: &'static str,
    /// `null` when the message is only tool calls.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// A function the function-calling output names, with its arguments as JSON text.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FunctionOut {
    pub name: String,
    pub arguments: String,
}

/// One tool call of a chat message.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionOut,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageJson,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool-call deltas: `{"index", "id", "type", "function": {"name", "arguments"}}`, the
    /// first chunk of a call with its id and name, the next with its arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<UsageJson>>,
}

/// Completions logprobs (the legacy shape).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<TopLogprobMap>,
    /// Character offsets in the text where each token's text starts.
    pub text_offset: Vec<usize>,
}

/// A completions `top_logprobs` entry: `{token: logprob}`, serialized as a JSON object whose
/// keys keep this order (most likely first).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopLogprobMap(pub Vec<(String, f32)>);

impl Serialize for TopLogprobMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    /// Absent, `null` (stream chunks with `include_usage`) or the usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<UsageJson>>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ModelJson {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub max_model_len: usize,
    /// memra: where the model runs (`cpu`, `cuda:0`) and the device profile (tuned kernel
    /// parameters) when it has one.
    pub backend: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_profile: Option<String>,
    /// memra: how the model is split over pipeline stages (`--pp`): each stage's device,
    /// layers and bytes, and the hand-over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<String>,
    /// memra: the KV cache's element format, bytes per position and capacity in positions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCacheJson>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct KvCacheJson {
    pub dtype: String,
    pub bytes_per_token: usize,
    pub capacity_tokens: usize,
    /// Positions per KV block (the prefix cache's unit); not in the API.
    #[serde(skip)]
    pub block_size: usize,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelJson>,
}
