//! Hugging Face safetensors folders. Implementation pending.
