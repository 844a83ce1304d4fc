//! Chat templates rendered with minijinja, sandboxed and size-limited. Pending.
