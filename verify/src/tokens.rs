//! `memra-verify tokens`: greedy tokens of each fixture prompt on a backend vs the fixture, with
//! the fixture's top-1/top-2 logit margin at the first divergence.

use std::path::Path;

use memra_engine::backend::Backend;
use memra_engine::generate::{GenRequest, generate};
use memra_engine::{Error, Result};

/// Per prompt: name, matched tokens, and the first divergence if any.
pub struct PromptResult {
    pub name: String,
    pub n_tokens: usize,
    /// (step, expected, got, fixture margin at that step).
    pub divergence: Option<(usize, u32, u32, f64)>,
}

/// Below this fixture margin a divergence is a near-tie (reported, not failed).
pub const NEAR_TIE: f64 = 0.01;

fn ids(v: &serde_json::Value, what: &str) -> Result<Vec<u32>> {
    v.as_array()
        .ok_or_else(|| Error::Input(format!("fixture: `{what}` is not an array")))?
        .iter()
        .map(|x| {
            x.as_u64()
                .map(|x| x as u32)
                .ok_or_else(|| Error::Input(format!("fixture: `{what}` holds a non-integer")))
        })
        .collect()
}

fn margin(step: Option<&serde_json::Value>) -> f64 {
    let top = step.and_then(|s| s["top"].as_array());
    let logit = |i: usize| top.and_then(|t| t.get(i)).and_then(|p| p[1].as_f64());
    match (logit(0), logit(1)) {
        (Some(a), Some(b)) => a - b,
        _ => f64::NAN,
    }
}

pub fn run(backend: &mut dyn Backend, fixture: &Path) -> Result<Vec<PromptResult>> {
    let text = std::fs::read_to_string(fixture).map_err(|e| Error::io(fixture, e))?;
    let fx: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Input(format!("{}: {e}", fixture.display())))?;
    let prompts = fx["prompts"]
        .as_array()
        .ok_or_else(|| Error::Input("fixture has no `prompts` array".into()))?;
    let mut out = Vec::new();
    for p in prompts {
        let name = p["name"].as_str().unwrap_or("?").to_string();
        let prompt = ids(&p["prompt_ids"], "prompt_ids")?;
        let want = ids(&p["tokens"], "tokens")?;
        let res = generate(
            backend,
            &GenRequest::greedy(prompt, want.len()),
            &mut |_| Ok(()),
        )?;
        let steps = p["steps"].as_array();
        let divergence = want
            .iter()
            .zip(res.tokens.iter().chain(std::iter::repeat(&u32::MAX)))
            .position(|(a, b)| a != b)
            .map(|i| {
                let got = res.tokens.get(i).copied().unwrap_or(u32::MAX);
                (i, want[i], got, margin(steps.and_then(|s| s.get(i))))
            });
        out.push(PromptResult {
            name,
            n_tokens: want.len(),
            divergence,
        });
    }
    Ok(out)
}
