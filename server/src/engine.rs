//! What the server needs from an engine: submit a validated request, list models with their
//! tokenizer / chat template, report stats, drain. The real `EngineHandle` and the test
//! `FakeEngine` (fake.rs, feature `test-util`) both implement [`Generate`].

use std::sync::Arc;

use memra_engine::Result;
use memra_engine::chat::ChatMessage;
use memra_engine::engine::EngineStats;
use memra_engine::grammar::{Grammar, GrammarSpec};
use memra_engine::request::{EventStream, SubmitError, ValidRequest};
use serde_json::Value;

pub use crate::openai::KvCacheJson;
use crate::tools::ToolStyle;

/// The text side of one model (tokenizer + chat template). Called off the async executor
/// (`spawn_blocking`): encoding and template rendering can be slow for long inputs.
pub trait ModelText: Send + Sync {
    /// Tokenizes a completion prompt (BOS as the model wants it).
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// Renders the conversation with the chat template (opening the assistant turn) and
    /// tokenizes it.
    fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>>;
    /// The raw bytes of one token (for logprobs: OpenAI's `bytes`, and the lossy `token`);
    /// empty for an unknown id.
    fn token_bytes(&self, id: u32) -> Vec<u8>;
    fn vocab_size(&self) -> usize;
    /// [`ModelText::encode_chat`] with the request's function definitions (the OpenAI `tools`
    /// list) for a template that renders them. The default ignores them.
    fn encode_chat_tools(&self, messages: &[ChatMessage], _tools: &Value) -> Result<Vec<u32>> {
        self.encode_chat(messages)
    }
    /// Renders the conversation (with `tools` if given) and tokenizes it, each content split
    /// at `marker` (an image's place): the ids and, per marker, where in them it was. The
    /// default: image input is not available.
    fn encode_chat_media(
        &self,
        _messages: &[ChatMessage],
        _tools: Option<&Value>,
        _marker: &str,
    ) -> Result<(Vec<u32>, Vec<usize>)> {
        Err(memra_engine::Error::Unsupported(
            "this model does not take images".into(),
        ))
    }
    /// How the chat template handles tools (the default: the generic format).
    fn tool_style(&self) -> ToolStyle {
        ToolStyle::default()
    }
    /// The compiled grammar for `spec` (cached per model). The default: not available.
    fn grammar(&self, _spec: &GrammarSpec) -> Result<Arc<Grammar>> {
        Err(memra_engine::Error::Input(
            "structured output is not available for this model".into(),
        ))
    }
}

/// One served model as the routes see it (the engine's own `ModelInfo` describes its backend).
#[derive(Clone)]
pub struct ServedModel {
    /// The name clients pass as `model`.
    pub alias: String,
    /// Positions one request may use (prompt + generated): the model's context, or fewer when
    /// the KV pool holds fewer. Reported as `max_model_len`; requests are checked against it.
    pub context_len: usize,
    /// Unix seconds when it was loaded.
    pub created: u64,
    /// Where it runs (`cpu`, `cuda:0`) and the device profile in use, if any.
    pub backend: String,
    pub profile: Option<String>,
    /// How the model is split over pipeline stages (`--pp`), one line; `None`: unsplit.
    pub pipeline: Option<String>,
    /// The KV cache (absent for engines without one, e.g. the test engine).
    pub kv_cache: Option<KvCacheJson>,
    pub text: Arc<dyn ModelText>,
    /// The model's vision tower (`+mmproj=PATH`), when it takes images.
    pub vision: Option<Arc<crate::media::Vision>>,
}

/// The engine as the server sees it.
pub trait Generate: Send + Sync + 'static {
    /// Starts a request; dropping the returned stream cancels it and frees its KV.
    fn submit(&self, req: ValidRequest) -> std::result::Result<EventStream, SubmitError>;
    /// The loaded models (empty while loading).
    fn models(&self) -> Vec<ServedModel>;
    /// A snapshot of the engine's load (the `/metrics` gauges).
    fn stats(&self) -> EngineStats;
    /// Whether every configured model is loaded.
    fn ready(&self) -> bool;
    /// Refuses new submissions from now on (in-flight ones continue).
    fn drain(&self);
    /// Short device description for `system_fingerprint` (`cpu`, `cuda:0`, `fake`).
    fn device(&self) -> String;
}
