//! Speculative decoding of one sequence equals plain decoding: tokens, finish reason and the
//! logits bytes of every committed position, for every drafter, K = 1..8, greedy and seeded
//! sampling (tiny random models on the CPU backend).

use crate::common;

use memra_engine::backend::Backend;
use memra_engine::backend::Device;
use memra_engine::backend::cpu::CpuBackend;
use memra_engine::config::Arch;
use memra_engine::generate::{GenOutput, GenRequest, generate};
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::sampling::SamplingParams;
use memra_engine::spec::draft_model::DraftModelDrafter;
use memra_engine::spec::generate::{SpecOptions, generate_spec};
use memra_engine::spec::ngram::NgramDrafter;
use memra_engine::spec::{DraftReq, Drafter};
use memra_engine::testing::small_cpu;

const VOCAB: usize = 48;

fn backend(seed: u64) -> CpuBackend {
    let w = random_weights(&tiny_config(Arch::Llama, VOCAB), seed, DType::Q8_0).unwrap();
    small_cpu(w)
}

/// Drafts the known plain continuation, corrupting every `every`-th draft token: acceptance
/// paths of every length are taken.
struct Oracle {
    plain: Vec<u32>,
    every: usize,
    calls: usize,
}

impl Drafter for Oracle {
    fn name(&self) -> String {
        "oracle".into()
    }
    fn draft(&mut self, reqs: &[DraftReq]) -> memra_engine::Result<Vec<Vec<u32>>> {
        Ok(reqs
            .iter()
            .map(|r| {
                let from = r.tokens.len();
                let end = (from + r.k).min(self.plain.len());
                (from.min(end)..end)
                    .map(|p| {
                        self.calls += 1;
                        if self.calls.is_multiple_of(self.every) {
                            (self.plain[p] + 1) % VOCAB as u32
                        } else {
                            self.plain[p]
                        }
                    })
                    .collect()
            })
            .collect())
    }
}

fn request(prompt: Vec<u32>, params: SamplingParams) -> GenRequest {
    GenRequest {
        params,
        keep_logits: true,
        stop_ids: vec![7],
        ..GenRequest::greedy(prompt, 40)
    }
}

pub(super) fn bits(o: &GenOutput) -> Vec<Vec<u32>> {
    common::logit_bits(&o.logits)
}

pub(super) fn same(plain: &GenOutput, spec: &GenOutput, what: &str) {
    assert_eq!(plain.tokens, spec.tokens, "{what}: tokens");
    assert_eq!(plain.finish_reason, spec.finish_reason, "{what}: finish");
    assert!(bits(plain) == bits(spec), "{what}: logits bytes differ");
}

fn params() -> Vec<(&'static str, SamplingParams)> {
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        seed: 1234,
        repetition_penalty: 1.1,
        ..Default::default()
    };
    vec![("greedy", SamplingParams::default()), ("sampled", sampled)]
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 2, 3, 4, 5, 1, 2, 3],
        vec![9, 10, 11, 9, 10, 11, 9, 10, 11, 9, 10],
        (0..23).map(|i| (i * 5 % 40) as u32 + 8).collect(),
    ]
}

#[test]
fn ngram_and_oracle_drafts_match_plain_for_every_k() {
    let mut b = backend(3);
    let mut accepted_any = false;
    for prompt in prompts() {
        for (pname, p) in params() {
            let req = request(prompt.clone(), p);
            let plain = generate(&mut b, &req, &mut |_| Ok(())).unwrap();
            let mut plain_ids = prompt.clone();
            plain_ids.extend(&plain.tokens);
            for k in 1..=8 {
                let o = SpecOptions { k, adaptive: false };
                let mut ng = NgramDrafter::default();
                let (s, _) = generate_spec(&mut b, &mut ng, &req, o, &mut |_| Ok(())).unwrap();
                same(&plain, &s, &format!("ngram {pname} k={k}"));
                let mut or = Oracle {
                    plain: plain_ids.clone(),
                    every: 3 + k % 3,
                    calls: 0,
                };
                let (s, c) = generate_spec(&mut b, &mut or, &req, o, &mut |_| Ok(())).unwrap();
                same(&plain, &s, &format!("oracle {pname} k={k}"));
                accepted_any |= c.accepted > 0;
                assert!(c.accepted <= c.drafted);
            }
            let o = SpecOptions {
                k: 4,
                adaptive: true,
            };
            let (s, _) = generate_spec(&mut b, &mut NgramDrafter::default(), &req, o, &mut |_| {
                Ok(())
            })
            .unwrap();
            same(&plain, &s, &format!("ngram adaptive {pname}"));
        }
    }
    assert!(
        accepted_any,
        "no draft was ever accepted: the test proves nothing"
    );
}

#[test]
fn draft_model_drafts_match_plain() {
    let mut b = backend(3);
    // The target itself as a draft model accepts (nearly) everything; another seed rarely.
    for (seed, must_accept) in [(3, true), (5, false)] {
        let w = random_weights(&tiny_config(Arch::Llama, VOCAB), seed, DType::Q8_0).unwrap();
        let mut d = DraftModelDrafter::from_weights(w, "tiny", Device::Cpu, 2, VOCAB).unwrap();
        for prompt in prompts() {
            let req = request(prompt.clone(), SamplingParams::default());
            let plain = generate(&mut b, &req, &mut |_| Ok(())).unwrap();
            for k in [1, 3, 8] {
                let o = SpecOptions { k, adaptive: false };
                let (s, c) = generate_spec(&mut b, &mut d, &req, o, &mut |_| Ok(())).unwrap();
                same(&plain, &s, &format!("draft seed {seed} k={k}"));
                if must_accept && c.drafted > 0 {
                    assert!(c.accepted * 10 >= c.drafted * 9, "{c:?}");
                }
            }
        }
    }
}

#[test]
fn draft_model_with_another_vocabulary_is_refused() {
    let w = random_weights(&tiny_config(Arch::Llama, VOCAB + 1), 1, DType::Q8_0).unwrap();
    let e = DraftModelDrafter::from_weights(w, "x", Device::Cpu, 1, VOCAB)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("same") || e.contains("tokenizer"), "{e}");
    let _ = backend(1).name();
}
