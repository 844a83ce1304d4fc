//! GGUF writer (version 3), for synthetic models, conversions and tests. Implementation pending.
