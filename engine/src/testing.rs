//! Helpers shared by the test suites of every crate and by the verification and benchmark tools
//! (feature `test-util`; the serving binaries never call them).

use std::path::PathBuf;

pub mod fuzz;
pub mod quant_folder;
pub mod tiny_gguf;

/// File name of the default real model (tools/fetch-models.sh).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The real SmolLM2-135M-Instruct GGUF: `MEMRA_TEST_MODEL`, else `$MEMRA_MODELS_DIR/…`, else
/// `~/.cache/memra/models/…`. Panics with the fix (run tools/fetch-models.sh) when it is missing,
/// so a test that needs it fails loudly instead of skipping; CI always fetches it.
pub fn real_model() -> PathBuf {
    let p = crate::settings::var_os("MEMRA_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::settings::models_dir().join(DEFAULT_MODEL_FILE));
    assert!(
        p.exists(),
        "test model {} is missing: run tools/fetch-models.sh (tools/test.sh does), or set MEMRA_TEST_MODEL",
        p.display()
    );
    p
}

/// Deterministic pseudo-random values (xorshift) in about [-3.5, 3.5), roughly N(0, 1)-shaped,
/// without extra crates: the quantization tests' and the benches' inputs.
pub fn pseudo_normal(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| (0..4).map(|_| next()).sum::<f32>() * 1.732 - 3.464)
        .collect()
}

/// Deterministic pseudo-random bytes (xorshift): any bit pattern is a valid quantized block for a
/// byte round trip (the repack, GGUF and expert-stack tests, the repack bench).
pub fn pseudo_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// A CPU backend over `w` with a small KV pool (2 threads, 64 blocks of 4 positions): the
/// speculation tests' backend.
pub fn small_cpu(w: crate::models::ModelWeights) -> crate::backend::cpu::CpuBackend {
    let opts = crate::backend::cpu::CpuOptions {
        threads: 2,
        kv_blocks: 64,
        block_size: 4,
        ..Default::default()
    };
    crate::backend::cpu::CpuBackend::new(w, &opts).expect("CPU backend")
}

/// A random Q8_0 model of `arch` at the tiny shape (weights seed 3) with SmolLM2's tokenizer
/// and chat template, its context `max_ctx`: the serving tests' model.
pub fn tiny_chat_model(arch: crate::config::Arch, max_ctx: usize) -> crate::loader::Model {
    use crate::models::random::{random_weights, tiny_config};
    let g = crate::formats::gguf::Gguf::open(&real_model()).expect("open SmolLM2");
    let tokenizer = crate::tokenizer::Tokenizer::from_gguf(&g).expect("tokenizer");
    let chat = crate::chat::ChatTemplate::from_gguf(&g, &tokenizer).expect("template");
    let mut config = tiny_config(arch, tokenizer.vocab_size());
    config.max_ctx = max_ctx;
    let weights = random_weights(&config, 3, crate::quant::DType::Q8_0).expect("weights");
    crate::loader::Model {
        path: "tiny".into(),
        config,
        weights,
        tokenizer,
        chat,
    }
}

/// A greedy request to model "m" (tenant "t") of `max_tokens` tokens, EOS ignored: no
/// logprobs, stop strings, cache salt, grammar, media or speculation. Tests override fields
/// with `ValidRequest { .., ..text_request(..) }`.
pub fn text_request(prompt: Vec<u32>, max_tokens: usize) -> crate::request::ValidRequest {
    crate::request::ValidRequest {
        model: "m".into(),
        tenant: "t".into(),
        prompt,
        max_tokens,
        params: crate::sampling::SamplingParams::GREEDY,
        stop: Vec::new(),
        logprobs: None,
        cache_salt: None,
        ignore_eos: true,
        tenant_max_in_flight: None,
        speculative: false,
        grammar: None,
        media: Vec::new(),
    }
}

/// A greedy request to model "m" of `max_tokens` tokens (EOS ignored, logprobs on) with its
/// media spans.
pub fn media_request(
    prompt: Vec<u32>,
    media: Vec<crate::vision::MediaSpan>,
    max_tokens: usize,
    speculative: bool,
) -> crate::request::ValidRequest {
    crate::request::ValidRequest {
        logprobs: Some(1),
        speculative,
        media,
        ..text_request(prompt, max_tokens)
    }
}

/// Token ids with logprob bits, and the cached prompt tokens, of one request on `e`.
pub fn run_request(
    e: &crate::engine::EngineHandle,
    r: crate::request::ValidRequest,
) -> crate::Result<(Vec<(u32, u32)>, usize)> {
    use crate::request::Event;
    let mut s = e
        .submit(r)
        .map_err(|e| crate::Error::Input(format!("submit: {e}")))?;
    let mut out = Vec::new();
    loop {
        match s.blocking_recv() {
            Some(Event::Token(t)) => out.push((t.id, t.logprob.map_or(0, f32::to_bits))),
            Some(Event::Text(_)) => {}
            Some(Event::Done { usage, .. }) => return Ok((out, usage.cached_tokens)),
            Some(Event::Error(m)) => {
                return Err(crate::Error::Input(format!("request failed: {m}")));
            }
            None => return Err(crate::Error::Input("the stream ended without Done".into())),
        }
    }
}

/// Positions per KV block of [`engine_config`].
pub const BLOCK_SIZE: usize = 4;

/// The engine configuration of the serving tests and gates: `device`, 2 threads, blocks of
/// [`BLOCK_SIZE`] positions, `kv_blocks` of them, steps of `budget` tokens, `running` sequences at most (per
/// tenant too), the prefix cache on, no speculation.
pub fn engine_config(
    device: crate::backend::Device,
    kv_blocks: usize,
    budget: usize,
    running: usize,
) -> crate::engine::EngineConfig {
    use crate::engine::{EngineConfig, KvBudget};
    use crate::scheduler::SchedulerConfig;
    EngineConfig {
        device,
        threads: 2,
        block_size: BLOCK_SIZE,
        kv: KvBudget::Blocks(kv_blocks),
        kv_dtype: Default::default(),
        scheduler: SchedulerConfig {
            max_batch_tokens: budget,
            max_running: running,
            max_running_per_tenant: running,
            admit_reserve_blocks: 1,
            recurrent: false,
            state_snapshots: None,
        },
        prefix_cache: true,
        spec: None,
        pp: Default::default(),
    }
}
