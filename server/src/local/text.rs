//! [`ModelText`] for a loaded model: its tokenizer and sandboxed chat template.

use memra_engine::chat::{ChatMessage, ChatTemplate};
use memra_engine::tokenizer::Tokenizer;
use memra_engine::{Error, Result};

use crate::engine::ModelText;

pub struct ModelTextImpl {
    pub tokenizer: Tokenizer,
    pub chat: Option<ChatTemplate>,
}

impl ModelText for ModelTextImpl {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer
            .encode(text, self.tokenizer.add_bos_default())
    }

    fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let t = self.chat.as_ref().ok_or_else(|| {
            Error::Template("this model has no chat template; use /v1/completions".into())
        })?;
        let rendered = t.render(messages, true)?;
        self.tokenizer.encode(&rendered, false)
    }

    fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id]).unwrap_or_default()
    }

    fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }
}
