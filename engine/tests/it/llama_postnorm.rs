//! The llama-postnorm architecture (models/llama_postnorm.rs) on the CPU: its layer is the recipe
//! it says (checked from the named intermediates against the CPU's own row functions, bit for
//! bit), and it is row-invariant like every architecture.

use crate::common;

use std::sync::{Arc, Mutex};

use memra_engine::backend::cpu::ops::rms_norm;
use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::backend::{Backend, StepBatch, StepRow};
use memra_engine::config::Arch;
use memra_engine::generate::{GenRequest, generate};
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::models::{ModelWeights, Role};
use memra_engine::quant::{DType, dequantize_row};

type Dumps = Arc<Mutex<Vec<(String, usize, Vec<f32>)>>>;

fn weights() -> ModelWeights {
    random_weights(&tiny_config(Arch::LlamaPostNorm, 300), 9, DType::Q8_0).expect("weights")
}

fn backend(w: ModelWeights, threads: usize) -> CpuBackend {
    let opts = CpuOptions {
        threads,
        kv_blocks: 32,
        block_size: 16,
        ..Default::default()
    };
    CpuBackend::new(w, &opts).expect("backend")
}

fn norm_rows(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (o, r) in out.chunks_exact_mut(w.len()).zip(x.chunks_exact(w.len())) {
        rms_norm(r, w, eps, o);
    }
    out
}

fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

#[test]
fn layer_is_pre_norm_attention_post_norm_then_pre_norm_ffn() {
    let w = weights();
    let c = w.config.clone();
    let mut b = backend(w.clone(), 2);
    let dumps: Dumps = Arc::default();
    let sink = dumps.clone();
    b.set_dump(Some(Box::new(move |name, layer, _rows, v| {
        sink.lock().unwrap().push((name.into(), layer, v.to_vec()));
    })));
    let tokens = [5u32, 77, 250];
    let rows = tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| StepRow {
            token: t,
            pos: i as u32,
            seq: 0,
            want_logits: i == 2,
        })
        .collect();
    b.step(&StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows,
        block_tables: vec![vec![0]],
        state_slots: Vec::new(),
    })
    .unwrap();
    let d = dumps.lock().unwrap();
    let get = |name: &str, l: usize| -> Vec<f32> {
        d.iter()
            .find(|(n, layer, _)| n == name && *layer == l)
            .map(|(_, _, v)| v.clone())
            .unwrap_or_else(|| panic!("no dump {name} of layer {l}"))
    };
    let vecf = |r: Role| w.get(r).unwrap().to_f32().unwrap();
    let embed = w.get(Role::TokenEmbd).unwrap();
    let mut x = vec![0f32; tokens.len() * c.hidden];
    for (xr, &t) in x.chunks_exact_mut(c.hidden).zip(&tokens) {
        dequantize_row(embed.dtype, embed.row(t as usize), xr).unwrap();
    }
    for l in 0..c.n_layers {
        let eps = c.rms_eps;
        assert_eq!(
            get("attn_norm", l),
            norm_rows(&x, &vecf(Role::AttnNorm(l)), eps)
        );
        let post = norm_rows(&get("attn_out", l), &vecf(Role::AttnPostNorm(l)), eps);
        assert_eq!(get("attn_post_norm", l), post, "layer {l}");
        let x1 = add(&x, &post);
        assert_eq!(
            get("ffn_norm", l),
            norm_rows(&x1, &vecf(Role::FfnNorm(l)), eps)
        );
        x = add(&x1, &get("ffn_out", l));
        assert_eq!(get("l_out", l), x, "layer {l}");
    }
}

fn run(b: &mut CpuBackend, chunk: usize) -> (Vec<u32>, Vec<Vec<u32>>, Vec<Vec<u8>>) {
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 300).collect();
    let mut req = GenRequest::greedy(prompt, 8);
    req.prefill_chunk = chunk;
    req.keep_logits = true;
    let out = generate(b, &req, &mut |_| Ok(())).expect("generate");
    let bits = common::logit_bits(&out.logits);
    let kv = (0..3).map(|blk| b.kv_block_bytes(blk).unwrap()).collect();
    (out.tokens, bits, kv)
}

#[test]
fn threads_and_chunking_do_not_change_bits() {
    let base = run(&mut backend(weights(), 1), 0);
    assert_eq!(base.0.len(), 8);
    for (threads, chunk) in [(3, 0), (2, 1), (2, 7)] {
        let other = run(&mut backend(weights(), threads), chunk);
        assert_eq!(base, other, "{threads} threads, chunk {chunk}");
    }
}
