//! The engine/server seam: a validated request in, a stream of events out.
//!
//! `EngineHandle::submit(ValidRequest) -> Result<EventStream, SubmitError>` (engine.rs). Each
//! request has its own channel; dropping the [`EventStream`] cancels the request and frees its
//! KV blocks. The server never sees a tensor; the engine never sees HTTP.

use std::collections::VecDeque;

use tokio::sync::mpsc;

use crate::engine::output::{EndRequest, Msg, OutputStage};
use crate::generate::FinishReason;
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;

/// A request already parsed, tokenized and checked by the server.
#[derive(Clone, Debug)]
pub struct ValidRequest {
    /// Model alias.
    pub model: String,
    /// Tenant (from the API key; `default` when the server is open).
    pub tenant: String,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub params: SamplingParams,
    /// Stop strings: generation ends when the text contains one; it is not emitted.
    pub stop: Vec<String>,
    /// `Some(n)`: report each token's logprob and the `n` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Extra prefix-cache namespace (with the tenant).
    pub cache_salt: Option<String>,
    pub ignore_eos: bool,
    /// The tenant's limit on its requests in flight in the engine (queued + running), carried
    /// with the request from its one source (the server: the keyring entry, else
    /// `--tenant-max-in-flight`); `None`: `AdmissionLimits::max_in_flight_per_tenant`.
    pub tenant_max_in_flight: Option<usize>,
    /// Whether the model's speculative decoding may run for this request (`false`: plain
    /// decoding; the output is the same either way).
    pub speculative: bool,
    /// Structured output: the compiled grammar the output must follow (its mask applies to
    /// every pick; once complete, the request ends with `stop`).
    pub grammar: Option<std::sync::Arc<crate::grammar::Grammar>>,
    /// Images: embedding rows that replace the prompt's placeholder tokens at their positions
    /// (in order, inside the prompt; crate::vision). Their content hashes enter the prefix
    /// cache's block hashes.
    pub media: Vec<crate::vision::MediaSpan>,
}

/// One generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    pub id: u32,
    /// The text this token completes (may be empty while a UTF-8 sequence or a possible stop
    /// string is held back).
    pub text: String,
    /// Natural-log probability of the token under the model's distribution (after penalties,
    /// before temperature), when asked.
    pub logprob: Option<f32>,
    /// The most likely tokens and their logprobs, descending, when asked.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Draft tokens checked by speculative decoding.
    pub drafted_tokens: usize,
    /// Draft tokens accepted (emitted without a step of their own).
    pub accepted_tokens: usize,
}

/// What a request's stream carries: tokens, at most one `Text`, then exactly one `Done` or
/// `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Token(TokenEvent),
    /// Text that belongs to no generated token: at the end of sequence, the text still held back
    /// (an unfinished UTF-8 character, flushed lossily, or the start of a stop string that did
    /// not match). Comes right before `Done`; never carries a logprob.
    Text(String),
    /// The last token's text includes everything held back when the request ends by length.
    Done {
        finish_reason: FinishReason,
        usage: Usage,
    },
    Error(String),
}

/// Why a request was refused at submission (nothing was started).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("model `{0}` does not exist")]
    ModelNotFound(String),
    #[error(
        "this model's maximum context length is {ctx} tokens; the request has {prompt} prompt tokens and asks for {max_tokens} more"
    )]
    ContextLength {
        prompt: usize,
        max_tokens: usize,
        ctx: usize,
    },
    #[error("{0}")]
    Invalid(String),
    /// The tenant's concurrent or queued request limit is reached (HTTP 429).
    #[error("tenant `{tenant}` has too many requests in flight; retry after {retry_after_s} s")]
    TenantLimit { tenant: String, retry_after_s: u64 },
    /// The global queue is full (HTTP 503).
    #[error("the server is overloaded; retry after {retry_after_s} s")]
    Overloaded { retry_after_s: u64 },
    /// The engine is shutting down (HTTP 503).
    #[error("the server is shutting down")]
    Draining,
}

/// `Done` or `Error`: nothing follows.
fn is_last(e: &Event) -> bool {
    matches!(e, Event::Done { .. } | Event::Error(_))
}

/// The receiving end of a request. Dropping it cancels the request.
///
/// For the engine's requests the stream also does the request's output work as it is read
/// (detokenization, stop strings: [`crate::engine::output`]), on the reader's thread or task, so
/// the model thread only sends token ids. When a stop string matches, the stream ends the
/// request itself: it tells the model thread, which ends the sequence before its next step.
/// The last event (`Done` or `Error`) is returned once the model thread has let the request go
/// (its admission slot is free again), so a client that sends its next request on `Done` never
/// finds its previous one still counted.
pub struct EventStream {
    source: Source,
    /// Events made from one message, not yet returned.
    pending: VecDeque<Event>,
}

enum Source {
    /// Events as sent (`EventStream::channel`).
    Events(mpsc::UnboundedReceiver<Event>),
    /// A model thread's messages and the request's output stage.
    Engine(mpsc::UnboundedReceiver<Msg>, Box<OutputStage>),
}

impl EventStream {
    /// A stream of events as sent, and its sending end (the sender's `is_closed()` tells it
    /// the client went away).
    pub fn channel() -> (mpsc::UnboundedSender<Event>, EventStream) {
        let (tx, rx) = mpsc::unbounded_channel();
        let s = EventStream {
            source: Source::Events(rx),
            pending: VecDeque::new(),
        };
        (tx, s)
    }

    /// The stream of an engine request: the model thread sends [`Msg`]s, the stream makes the
    /// events.
    pub(crate) fn engine(
        tok: &Tokenizer,
        req: &ValidRequest,
        end: EndRequest,
    ) -> (mpsc::UnboundedSender<Msg>, EventStream) {
        let (tx, rx) = mpsc::unbounded_channel();
        let stage = Box::new(OutputStage::new(tok, req, end));
        let s = EventStream {
            source: Source::Engine(rx, stage),
            pending: VecDeque::new(),
        };
        (tx, s)
    }

    /// The next event; `None` after the last one.
    pub async fn recv(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.pending.front() {
                if is_last(e)
                    && let Source::Engine(rx, _) = &mut self.source
                {
                    // Until the model thread drops its sender: it has ended the request.
                    while rx.recv().await.is_some() {}
                }
                return self.pending.pop_front();
            }
            match &mut self.source {
                Source::Events(rx) => return rx.recv().await,
                Source::Engine(rx, stage) => {
                    if stage.is_done() {
                        return None;
                    }
                    stage.on(rx.recv().await?, &mut self.pending);
                }
            }
        }
    }

    /// The next event, blocking the thread (not for async code).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.pending.front() {
                if is_last(e)
                    && let Source::Engine(rx, _) = &mut self.source
                {
                    while rx.blocking_recv().is_some() {}
                }
                return self.pending.pop_front();
            }
            match &mut self.source {
                Source::Events(rx) => return rx.blocking_recv(),
                Source::Engine(rx, stage) => {
                    if stage.is_done() {
                        return None;
                    }
                    stage.on(rx.blocking_recv()?, &mut self.pending);
                }
            }
        }
    }
}
