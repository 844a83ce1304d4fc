//! Opens a model path (GGUF file or HF folder). Pending.
