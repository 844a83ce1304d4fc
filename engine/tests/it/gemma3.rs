//! gemma3 (models/gemma3.rs) on the CPU: the sliding window is in effect and depends on position
//! alone; the built-in instruct template; and, when the real Gemma 3 270M GGUF is present
//! (tools/fetch-models.sh gemma3), its tokenizer and greedy tokens against the independent numpy
//! reference (verify/reference/gemma3_reference.py, verify/fixtures/gemma3-270m-reference.json).

use std::path::PathBuf;

use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::chat::{ChatMessage, ChatTemplate};
use memra_engine::config::Arch;
use memra_engine::generate::{GenRequest, generate};
use memra_engine::loader::load_model;
use memra_engine::models::gemma3::CHAT_TEMPLATE;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::models::{ModelWeights, def};
use memra_engine::quant::DType;
use serde::Deserialize;

use crate::common;

fn cpu(w: ModelWeights, kv_blocks: usize) -> CpuBackend {
    let opts = CpuOptions {
        threads: 2,
        kv_blocks,
        block_size: 16,
        // The float64 reference keeps K and V exact: compare with an f32 cache.
        kv_dtype: memra_engine::backend::KvDtype::F32,
    };
    CpuBackend::new(w, &opts).expect("backend")
}

/// Logits of a greedy run over a fixed prompt of `n` tokens.
fn logits(w: &ModelWeights, n: usize, steps: usize) -> Vec<Vec<f32>> {
    let prompt = (0..n as u32).map(|i| (i * 37 + 11) % 300).collect();
    let mut req = GenRequest::greedy(prompt, steps);
    req.keep_logits = true;
    let mut b = cpu(w.clone(), 8);
    generate(&mut b, &req, &mut |_| Ok(()))
        .expect("generate")
        .logits
}

#[test]
fn sliding_window_bounds_the_local_layers() {
    let w = random_weights(&tiny_config(Arch::Gemma3, 300), 3, DType::Q8_0).expect("weights");
    let p = w.config.gemma3.expect("gemma3 params");
    assert_eq!((p.sliding_window, p.sliding_window_pattern), (4, 2));
    let mut wide = w.clone();
    wide.config.gemma3 = Some(memra_engine::config::Gemma3Params {
        sliding_window: 1 << 20,
        ..p
    });
    // Up to the window's length the window changes nothing; past it, it does.
    let (a, b) = (logits(&w, 3, 1), logits(&wide, 3, 1));
    assert_eq!(a, b);
    let (a, b) = (logits(&w, 9, 1), logits(&wide, 9, 1));
    assert_ne!(a, b);
}

#[test]
fn chat_template_is_the_gemma_turn_format() {
    assert_eq!(def(Arch::Gemma3).chat_template, Some(CHAT_TEMPLATE));
    let t = ChatTemplate::new(CHAT_TEMPLATE, "<bos>", "<eos>").expect("template");
    let m = |r: &str, c: &str| ChatMessage::new(r, c);
    let msgs = [
        m("system", "Be brief."),
        m("user", " Hi! "),
        m("assistant", "Hello."),
        m("user", "Name?"),
    ];
    let want = "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n\
                <start_of_turn>model\nHello.<end_of_turn>\n\
                <start_of_turn>user\nName?<end_of_turn>\n<start_of_turn>model\n";
    assert_eq!(t.render(&msgs, true).unwrap(), want);
    let one = t.render(&[m("user", "Q")], false).unwrap();
    assert_eq!(one, "<bos><start_of_turn>user\nQ<end_of_turn>\n");
    let err = t
        .render(&[m("user", "a"), m("user", "b")], true)
        .unwrap_err();
    assert!(err.to_string().contains("alternate"), "{err}");
}

/// The real Gemma 3 270M GGUF, if fetched (`MEMRA_GEMMA3_MODEL` overrides the cache path).
fn real_gemma() -> Option<PathBuf> {
    let p = memra_engine::settings::var_os("MEMRA_GEMMA3_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| memra_engine::settings::models_dir().join("gemma-3-270m-q4_k_m.gguf"));
    if p.exists() {
        return Some(p);
    }
    eprintln!(
        "skipped: {} is missing (tools/fetch-models.sh gemma3)",
        p.display()
    );
    None
}

#[derive(Deserialize)]
struct Fixture {
    n_tokens: usize,
    prompts: Vec<Prompt>,
}

#[derive(Deserialize)]
struct Prompt {
    name: String,
    kind: String,
    #[serde(default)]
    messages: Vec<Msg>,
    text: String,
    prompt_ids: Vec<u32>,
    tokens: Vec<u32>,
    completion: String,
    steps: Vec<Step>,
}

#[derive(Deserialize)]
struct Msg {
    role: String,
    content: String,
}

#[derive(Deserialize)]
struct Step {
    top: Vec<(u32, f64)>,
    max_abs_logit: f64,
    margin: f64,
}

fn fixture() -> Fixture {
    let path = common::repo_path("verify/fixtures/gemma3-270m-reference.json");
    let text = std::fs::read_to_string(&path).expect("gemma3 reference fixture");
    serde_json::from_str(&text).expect("fixture JSON")
}

#[test]
fn real_gemma3_tokenizer_and_template_match_the_reference() {
    let Some(path) = real_gemma() else { return };
    let fx = fixture();
    let model = load_model(&path).expect("load");
    let tok = &model.tokenizer;
    assert_eq!(tok.vocab_size(), 262_144);
    let chat = model.chat.as_ref().expect("built-in chat template");
    for p in &fx.prompts {
        let ids = if p.kind == "chat" {
            let msgs: Vec<ChatMessage> = p
                .messages
                .iter()
                .map(|m| ChatMessage::new(m.role.as_str(), m.content.as_str()))
                .collect();
            let rendered = chat.render(&msgs, true).expect("render");
            assert_eq!(rendered, p.text, "{}: rendered prompt", p.name);
            let contents: Vec<&str> = msgs.iter().map(|m| m.content.as_str()).collect();
            tok.encode_chat(&rendered, &contents).expect("encode chat")
        } else {
            tok.encode(&p.text, tok.add_bos_default()).expect("encode")
        };
        assert_eq!(ids, p.prompt_ids, "{}: prompt ids", p.name);
        let text = tok.decode(&p.tokens).expect("decode");
        assert_eq!(text, p.completion, "{}: decoded completion", p.name);
    }
}

/// Greedy tokens equal the reference's up to a near-tie: logits within 1e-3 x max |logit| of
/// the reference at every compared step, so a different token is allowed only where the
/// reference's top-2 margin is under twice that (then the rest of that prompt is not compared).
#[test]
fn real_gemma3_cpu_matches_independent_reference() {
    let Some(path) = real_gemma() else { return };
    let fx = fixture();
    let weights = memra_engine::loader::load_weights(&path).expect("load");
    let mut worst = 0f64;
    for p in &fx.prompts {
        let blocks = (p.prompt_ids.len() + fx.n_tokens).div_ceil(16);
        let mut b = cpu(weights.clone(), blocks);
        let mut req = GenRequest::greedy(p.prompt_ids.clone(), fx.n_tokens);
        req.keep_logits = true;
        let out = generate(&mut b, &req, &mut |_| Ok(())).expect("generate");
        for (i, step) in p.steps.iter().enumerate() {
            let tol = 1e-3 * step.max_abs_logit;
            for &(id, want) in &step.top {
                let d = (out.logits[i][id as usize] as f64 - want).abs();
                worst = worst.max(d / step.max_abs_logit);
                assert!(
                    d <= tol,
                    "{} step {i}: token {id} logit differs by {d} (tol {tol})",
                    p.name
                );
            }
            if out.tokens[i] != p.tokens[i] {
                assert!(
                    step.margin < 2.0 * tol,
                    "{} step {i}: greedy token {} vs reference {} (reference margin {})",
                    p.name,
                    out.tokens[i],
                    p.tokens[i],
                    step.margin
                );
                eprintln!("{}: near-tie at step {i} (margin {})", p.name, step.margin);
                break;
            }
        }
    }
    eprintln!("worst relative logit difference: {worst:.2e}");
}
