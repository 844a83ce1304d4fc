//! The CPU forward of the real SmolLM2-135M-Instruct against logits from an independent numpy
//! implementation (verify/reference/smollm2_reference.py): identical greedy tokens for 32 tokens
//! on every prompt, and |logit diff| <= 1e-3 x max |logit| at every compared position.

use crate::common;

use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::generate::{GenRequest, generate};
use memra_engine::loader::load_weights;
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    n_tokens: usize,
    prompts: Vec<Prompt>,
}

#[derive(Deserialize)]
struct Prompt {
    name: String,
    prompt_ids: Vec<u32>,
    tokens: Vec<u32>,
    steps: Vec<Step>,
}

#[derive(Deserialize)]
struct Step {
    top: Vec<(u32, f64)>,
    max_abs_logit: f64,
    margin: f64,
}

#[test]
fn cpu_forward_matches_independent_reference() {
    let path = common::repo_path("verify/fixtures/smollm2-135m-reference.json");
    let text = std::fs::read_to_string(&path).expect("reference fixture");
    let fx: Fixture = serde_json::from_str(&text).expect("fixture JSON");
    assert!(
        fx.prompts.len() >= 8,
        "fixture should have at least 8 prompts"
    );
    let weights = load_weights(&common::real_model()).expect("load model");
    let mut worst = 0f64;
    for p in &fx.prompts {
        let opts = CpuOptions {
            threads: 0,
            kv_blocks: (p.prompt_ids.len() + fx.n_tokens).div_ceil(16),
            block_size: 16,
        };
        let mut b = CpuBackend::new(weights.clone(), &opts).expect("backend");
        let mut req = GenRequest::greedy(p.prompt_ids.clone(), fx.n_tokens);
        req.keep_logits = true;
        let out = generate(&mut b, &req, &mut |_| Ok(())).expect("generate");
        assert_eq!(out.tokens.len(), fx.n_tokens, "{}", p.name);
        for (i, step) in p.steps.iter().enumerate() {
            let ours = &out.logits[i];
            let tol = 1e-3 * step.max_abs_logit;
            for &(id, want) in &step.top {
                let got = ours[id as usize] as f64;
                let d = (got - want).abs();
                worst = worst.max(d / step.max_abs_logit);
                assert!(
                    d <= tol,
                    "{} step {i}: logit of token {id} is {got}, reference {want} (tol {tol})",
                    p.name
                );
            }
            if out.tokens[i] != p.tokens[i] {
                panic!(
                    "{} step {i}: greedy token {} differs from reference {} (reference margin {})",
                    p.name, out.tokens[i], p.tokens[i], step.margin
                );
            }
        }
    }
    eprintln!("worst relative logit difference: {worst:.2e}");
}
