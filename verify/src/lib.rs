//! memra-verify: exactness gates (EXACTNESS.md). `kernels` (every CUDA kernel vs the CPU
//! reference), `invariance` (same rows, same bits under any batch or chunking, any backend),
//! `tokens` (greedy tokens vs the reference fixture), `spec` (speculative vs plain decoding;
//! with the MTP drafter on a GPU also its hand-over against the CPU's, `mtp_check`),
//! `inspect` (a model file validated the way the engine loads it), `pp` (a model split over
//! pipeline stages vs the unsplit model), `vision` (image input: the tower vs a numpy
//! reference, image prompts under load and in the prefix cache).

mod attention_check;
mod attention_rig;
mod attention_span_check;
mod attention_window_check;
pub mod case;
pub mod delta_check;
mod fused_check;
mod glu_check;
pub mod golden;
pub mod graph;
pub mod inspect;
pub mod invariance;
pub mod kernels;
mod kernels_select;
mod kv_write_check;
mod moe_check;
mod mrope_check;
pub mod mtp_check;
pub mod peer_logits;
pub mod peer_vision;
pub mod pp;
mod products_check;
mod rope_kv_run;
pub mod serve_invariance;
mod siglip_f64;
pub mod spec;
pub mod tokens;
pub mod vision;
mod vision_check;
pub mod vision_qwen;
mod vision_rows;
pub mod vision_text;
pub mod vision_video;
