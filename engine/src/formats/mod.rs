//! Model file formats: GGUF (read and write) and Hugging Face safetensors folders.

pub mod gguf;
pub mod gguf_write;
pub mod safetensors;
