//! memra-verify: exactness gates (EXACTNESS.md). `kernels` (every CUDA kernel vs the CPU
//! reference), `invariance` (same rows, same bits under any batch or chunking, any backend),
//! `tokens` (greedy tokens vs the reference fixture).

mod attention_check;
pub mod invariance;
pub mod kernels;
pub mod serve_invariance;
pub mod tokens;
