//! qwen3moe (models/qwen3_moe.rs) on the CPU: a tiny MoE written as GGUF (3-D expert stacks)
//! and as an HF folder (one tensor per expert) gives bitwise-identical logits; a row's logits do
//! not depend on the rows that share (or do not share) its experts, nor on the prefill chunking;
//! equal router logits pick the lowest experts; malformed MoE files are refused clearly.

use std::path::{Path, PathBuf};

use memra_engine::backend::cpu::moe::route;
use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::backend::{Backend, StepBatch, StepRow};
use memra_engine::config::Arch;
use memra_engine::formats::gguf::MetaValue;
use memra_engine::formats::gguf_write::{TensorData, write_gguf};
use memra_engine::formats::safetensors::{HfFolderSpec, write_hf_folder};
use memra_engine::generate::{GenRequest, generate};
use memra_engine::loader::load_weights;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::models::roles::expert_name;
use memra_engine::models::{ModelWeights, Role};
use memra_engine::quant::DType;
use memra_engine::testing::tiny_gguf::gguf_meta;
use memra_engine::weights::{Bytes, Tensor};

use crate::common::bits;

pub const VOCAB: usize = 300;

pub fn tiny(seed: u64, dtype: DType) -> ModelWeights {
    random_weights(&tiny_config(Arch::Qwen3Moe, VOCAB), seed, dtype).expect("weights")
}

pub fn cpu(w: ModelWeights) -> CpuBackend {
    let opts = CpuOptions {
        threads: 2,
        kv_blocks: 32,
        block_size: 16,
        // The f64 reference keeps K and V exact.
        kv_dtype: memra_engine::backend::KvDtype::F32,
    };
    CpuBackend::new(w, &opts).expect("backend")
}

/// Changes a GGUF tensor (by name) before it is written: its dims and its bytes.
type EditTensor<'a> = dyn Fn(&str, &mut Vec<u64>, &mut Vec<u8>) + 'a;

/// Writes `w` as a GGUF file with `meta`; `edit` may change a tensor's dims and bytes.
pub fn write_gguf_with(
    w: &ModelWeights,
    meta: &[(String, MetaValue)],
    path: &Path,
    edit: &EditTensor<'_>,
) {
    write_gguf_tensors(w.iter(), meta, path, edit);
}

/// Writes `tensors` as a GGUF file with `meta`; `edit` may change a tensor's dims and bytes.
pub fn write_gguf_tensors<'a>(
    tensors: impl Iterator<Item = (Role, &'a Tensor)>,
    meta: &[(String, MetaValue)],
    path: &Path,
    edit: &EditTensor<'_>,
) {
    let owned: Vec<(String, DType, Vec<u64>, Vec<u8>)> = tensors
        .map(|(r, t)| {
            let (name, mut dims) = (
                r.gguf_name(),
                t.shape.iter().rev().map(|&d| d as u64).collect(),
            );
            let mut data = t.data.to_vec();
            edit(&name, &mut dims, &mut data);
            (name, t.dtype, dims, data)
        })
        .collect();
    let data: Vec<TensorData<'_>> = owned
        .iter()
        .map(|(n, d, dims, b)| (n.as_str(), *d, dims.as_slice(), b.as_slice()))
        .collect();
    write_gguf(path, meta, &data).expect("write the GGUF");
}

pub fn write_gguf_model(w: &ModelWeights, path: &Path) {
    write_gguf_with(w, &gguf_meta(&w.config), path, &|_, _, _| {});
}

/// `t` as F32 (quantized types dequantized; HF folders hold floats only).
fn float(t: &Tensor) -> Tensor {
    if t.dtype.is_float() {
        return t.clone();
    }
    Tensor::from_f32(t.name.clone(), t.shape.clone(), &t.to_f32().expect("f32")).expect("tensor")
}

/// The HF tensors of `w`: expert stacks split into one 2-D tensor per expert.
pub fn hf_tensors(w: &ModelWeights) -> Vec<(String, Tensor)> {
    let arch = w.config.arch;
    let mut out = Vec::new();
    for (r, t) in w.iter() {
        let t = float(t);
        if !r.is_experts() {
            out.push((r.hf_name(arch), t));
            continue;
        }
        let (n, shape) = (t.shape[0], t.shape[1..].to_vec());
        let per = t.data.len() / n;
        for e in 0..n {
            let bytes = Bytes::owned(t.data[e * per..(e + 1) * per].to_vec());
            let name = expert_name(&r.hf_name(arch), e);
            let one = Tensor::new(name.clone(), t.dtype, shape.clone(), bytes).expect("expert");
            out.push((name, one));
        }
    }
    out
}

pub fn write_hf_model(
    dir: &Path,
    config: serde_json::Value,
    tensors: &[(String, Tensor)],
) -> PathBuf {
    let spec = HfFolderSpec {
        config_json: config,
        tokenizer_json: None,
        tokenizer_config_json: None,
        max_shard_bytes: 1 << 30,
    };
    write_hf_folder(dir, &spec, tensors).expect("write the HF folder");
    dir.to_path_buf()
}

/// Logit bits of every prompt position (prefill in chunks of 5) and of 6 greedy tokens.
fn greedy_bits(w: ModelWeights) -> (Vec<u32>, Vec<Vec<u32>>) {
    let prompt: Vec<u32> = vec![3, 17, 250, 9, 40, 77, 12, 5, 6, 100, 2, 299];
    let mut req = GenRequest::greedy(prompt, 6);
    req.keep_logits = true;
    req.prefill_chunk = 5;
    let out = generate(&mut cpu(w), &req, &mut |_| Ok(())).expect("generate");
    (out.tokens, out.logits.iter().map(|l| bits(l)).collect())
}

#[test]
fn gguf_and_hf_copies_agree_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in [DType::F16, DType::Q8_0, DType::BF16] {
        let w = tiny(5, dtype);
        let gguf = dir.path().join(format!("moe-{dtype}.gguf"));
        write_gguf_model(&w, &gguf);
        let hf = dir.path().join(format!("moe-{dtype}-hf"));
        let cfg = w.config.to_hf_json(None, None);
        write_hf_model(&hf, cfg, &hf_tensors(&w));
        let (g, h) = (load_weights(&gguf).unwrap(), load_weights(&hf).unwrap());
        assert_eq!(g.config, h.config, "{dtype}");
        assert_eq!(g.config.moe, w.config.moe, "{dtype}");
        let (a, b) = (greedy_bits(g), greedy_bits(h));
        assert_eq!(a.0, b.0, "{dtype}: greedy tokens differ");
        assert_eq!(a.1, b.1, "{dtype}: logit bits differ");
        assert!(a.1.len() >= 6);
    }
}

fn row(token: u32, pos: usize, seq: usize) -> StepRow {
    StepRow {
        token,
        pos: pos as u32,
        seq,
        want_logits: true,
    }
}

/// The experts each row of a step picked in layer 0, from the dumped router logits.
fn layer0_experts(b: &mut CpuBackend, batch: &StepBatch) -> (Vec<Vec<u32>>, Vec<Vec<usize>>) {
    let p = b.config().moe.expect("moe");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    b.set_dump(Some(Box::new(move |name, layer, _m, data| {
        if name == "router" && layer == 0 {
            sink.lock().unwrap().push(data.to_vec());
        }
    })));
    let out = b.step(batch).expect("step");
    b.set_dump(None);
    let logits = seen.lock().unwrap().pop().expect("router dumped");
    let experts = logits
        .chunks_exact(p.n_experts)
        .map(|l| {
            route(l, p.n_used, p.norm_topk)
                .iter()
                .map(|x| x.0)
                .collect()
        })
        .collect();
    (out.logits.iter().map(|l| bits(l)).collect(), experts)
}

/// A row's logits alone equal its logits in a batch whose other rows share its experts and use
/// others (so the row count of every expert changes with the batch).
#[test]
fn a_row_does_not_depend_on_who_shares_its_experts() {
    let w = tiny(9, DType::Q8_0);
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % VOCAB as u32).collect();
    let rows = |seq: usize| -> Vec<StepRow> {
        prompt
            .iter()
            .enumerate()
            .map(|(p, &t)| row(t, p, seq))
            .collect()
    };
    // Alone: the prompt in one step, then one decode row.
    let mut solo = cpu(w.clone());
    let tables = vec![vec![0u32, 1]];
    // The prompt of sequence 0 in one step.
    let prefix = StepBatch {
        rows: rows(0),
        block_tables: tables.clone(),
        ..Default::default()
    };
    solo.step(&prefix).unwrap();
    let target = row(123, 20, 0);
    let one = StepBatch {
        rows: vec![target],
        block_tables: tables.clone(),
        ..Default::default()
    };
    let (alone, mine) = layer0_experts(&mut solo, &one);
    // Together: the same prefix, then the decode row among 24 other rows of other sequences.
    let mut pair = cpu(w);
    pair.step(&prefix).unwrap();
    let mut batch_rows = vec![];
    for i in 0..24u32 {
        batch_rows.push(row((i * 53 + 7) % VOCAB as u32, i as usize, 1));
        if i == 11 {
            batch_rows.push(target);
        }
    }
    let batch = StepBatch {
        embeds: Vec::new(),
        mrope: Vec::new(),
        rows: batch_rows,
        block_tables: vec![tables[0].clone(), vec![4, 5]],
        state_slots: Vec::new(),
    };
    let (together, experts) = layer0_experts(&mut pair, &batch);
    let at = batch.rows.iter().position(|r| r.seq == 0).unwrap();
    assert_eq!(
        experts[at], mine[0],
        "the target row routes the same in the batch"
    );
    assert_eq!(
        together[at], alone[0],
        "the target row's logits changed in the batch"
    );
    // Every expert of the target row also serves other rows here (its row count changed), and
    // the other rows use experts the target does not.
    for e in &mine[0] {
        let n = experts.iter().filter(|x| x.contains(e)).count();
        assert!(n > 1, "expert {e} serves only the target: {experts:?}");
    }
    let used: std::collections::BTreeSet<usize> = experts.iter().flatten().copied().collect();
    assert!(
        used.len() > mine[0].len(),
        "the batch uses no other expert: {used:?}"
    );
}

#[test]
fn prefill_chunking_and_threads_do_not_change_bits() {
    let w = tiny(4, DType::Q4_0);
    let run = |chunk: usize, threads: usize| {
        let opts = CpuOptions {
            threads,
            kv_blocks: 16,
            block_size: 16,
            ..Default::default()
        };
        let mut b = CpuBackend::new(w.clone(), &opts).unwrap();
        let mut req = GenRequest::greedy((0..37).map(|i| (i * 13 + 5) % 300).collect(), 8);
        req.keep_logits = true;
        req.prefill_chunk = chunk;
        let out = generate(&mut b, &req, &mut |_| Ok(())).unwrap();
        (
            out.tokens,
            out.logits.iter().map(|l| bits(l)).collect::<Vec<_>>(),
        )
    };
    let whole = run(0, 1);
    for (chunk, threads) in [(1, 2), (7, 3), (16, 2)] {
        assert_eq!(
            run(chunk, threads),
            whole,
            "chunk {chunk}, {threads} threads"
        );
    }
}

/// With an all-zero router every expert is equally likely: the lowest `n_used` experts are the
/// ones used, so changing any other expert changes nothing and changing expert 0 does.
#[test]
fn equal_router_logits_pick_the_lowest_experts() {
    let base = tiny(6, DType::F32);
    let p = base.config.moe.unwrap();
    let edit = |w: &ModelWeights, f: &dyn Fn(Role, usize, &mut [f32])| -> ModelWeights {
        let c = w.config.clone();
        let mut get = |r: Role| -> memra_engine::Result<Option<Tensor>> {
            let Some(t) = w.opt(r) else { return Ok(None) };
            let mut v = t.to_f32()?;
            f(r, t.shape[1..].iter().product::<usize>().max(1), &mut v);
            Tensor::from_f32(t.name.clone(), t.shape.clone(), &v).map(Some)
        };
        ModelWeights::build(&c, &mut get).unwrap()
    };
    let zero_router = edit(&base, &|r, _, v| {
        if matches!(r, Role::FfnGateInp(_)) {
            v.fill(0.0);
        }
    });
    // Scales expert `e` of every stack by 3.
    let bump = |e: usize| {
        move |r: Role, per: usize, v: &mut [f32]| {
            if r.is_experts() {
                v[e * per..(e + 1) * per].iter_mut().for_each(|x| *x *= 3.0);
            }
        }
    };
    let logits = |w: ModelWeights| greedy_bits(w).1;
    let want = logits(zero_router.clone());
    for e in p.n_used..p.n_experts {
        assert_eq!(
            logits(edit(&zero_router, &bump(e))),
            want,
            "expert {e} was used"
        );
    }
    for e in 0..p.n_used {
        assert_ne!(
            logits(edit(&zero_router, &bump(e))),
            want,
            "expert {e} was not used"
        );
    }
}

fn load_err(path: &Path) -> String {
    match load_weights(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn malformed_moe_files_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny(2, DType::F32);
    let meta = gguf_meta(&w.config);
    let with = |key: &str, v: Option<MetaValue>| {
        let mut m: Vec<_> = meta.iter().filter(|(k, _)| k != key).cloned().collect();
        if let Some(v) = v {
            m.push((key.to_string(), v));
        }
        m
    };
    type Meta = Vec<(String, MetaValue)>;
    let cases: Vec<(&str, Meta, &str)> = vec![
        (
            "count0",
            with("qwen3moe.expert_count", Some(MetaValue::U32(0))),
            "expert count is 0",
        ),
        (
            "used9",
            with("qwen3moe.expert_used_count", Some(MetaValue::U32(9))),
            "must be in 1..=8",
        ),
        (
            "used0",
            with("qwen3moe.expert_used_count", Some(MetaValue::U32(0))),
            "must be in 1..=8",
        ),
        (
            "nocount",
            with("qwen3moe.expert_count", None),
            "qwen3moe.expert_count",
        ),
        (
            "noffn",
            with("qwen3moe.expert_feed_forward_length", None),
            "expert_feed_forward_length",
        ),
        // The file holds 8 experts; the metadata claims 7.
        (
            "count7",
            with("qwen3moe.expert_count", Some(MetaValue::U32(7))),
            "expected [7, ",
        ),
    ];
    for (name, m, want) in cases {
        let p = dir.path().join(format!("{name}.gguf"));
        write_gguf_with(&w, &m, &p, &|_, _, _| {});
        let e = load_err(&p);
        assert!(e.contains(want), "{name}: {e}");
    }
    // An expert stack of the wrong shape: [8, 32, 64] declared as [4, 64, 64].
    let p = dir.path().join("shape.gguf");
    write_gguf_with(&w, &meta, &p, &|n, dims, _| {
        if n == "blk.1.ffn_gate_exps.weight" {
            *dims = vec![64, 64, 4];
        }
    });
    let e = load_err(&p);
    assert!(
        e.contains("blk.1.ffn_gate_exps.weight") && e.contains("shape"),
        "{e}"
    );
    // A 2-D stack.
    let p = dir.path().join("flat.gguf");
    write_gguf_with(&w, &meta, &p, &|n, dims, _| {
        if n == "blk.0.ffn_down_exps.weight" {
            *dims = vec![32, 64 * 8];
        }
    });
    let e = load_err(&p);
    assert!(e.contains("blk.0.ffn_down_exps.weight"), "{e}");
    // HF: an expert missing; an expert of another shape; dense layers.
    let cfg = w.config.to_hf_json(None, None);
    let all = hf_tensors(&w);
    let missing: Vec<_> = all
        .iter()
        .filter(|(n, _)| n != "model.layers.1.mlp.experts.5.up_proj.weight")
        .cloned()
        .collect();
    let e = load_err(&write_hf_model(
        &dir.path().join("hf-missing"),
        cfg.clone(),
        &missing,
    ));
    assert!(
        e.contains("model.layers.1.mlp.experts.5.up_proj.weight"),
        "{e}"
    );
    let mut odd = all.clone();
    let i = odd
        .iter()
        .position(|(n, _)| n == "model.layers.0.mlp.experts.3.gate_proj.weight")
        .unwrap();
    odd[i].1 = Tensor::from_f32("x", vec![16, 64], &[0.0; 16 * 64]).unwrap();
    let e = load_err(&write_hf_model(
        &dir.path().join("hf-odd"),
        cfg.clone(),
        &odd,
    ));
    assert!(
        e.contains("experts.3.gate_proj") && e.contains("expert 0"),
        "{e}"
    );
    let mut sparse = cfg.clone();
    sparse["mlp_only_layers"] = serde_json::json!([1]);
    let e = load_err(&write_hf_model(&dir.path().join("hf-dense"), sparse, &all));
    assert!(e.contains("mlp_only_layers"), "{e}");
    let mut used = cfg;
    used["num_experts_per_tok"] = 12.into();
    let e = load_err(&write_hf_model(&dir.path().join("hf-used"), used, &all));
    assert!(e.contains("must be in 1..=8"), "{e}");
}

/// The weight bytes one decode token reads, counted by hand from a model's tensor list (GGUF
/// names): every tensor whole, but `n_used / n_experts` of each expert stack (`*_exps`), one
/// row of the token embedding, and the embedding table again when it is the (tied) head; the
/// MTP layers (past `n_layers`) not at all.
fn read_by_hand(w: &ModelWeights) -> usize {
    let c = &w.config;
    let (mut whole, mut stacks) = (0, 0);
    for (role, t) in w.iter() {
        let name = role.gguf_name();
        let layer = name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .map(|l| l.parse::<usize>().unwrap());
        if layer.is_some_and(|l| l >= c.n_layers) {
            continue;
        }
        match name.as_str() {
            "token_embd.weight" => whole += t.data.len() / c.vocab,
            n if n.ends_with("_exps.weight") => stacks += t.data.len(),
            _ => whole += t.data.len(),
        }
    }
    if c.tie_embeddings {
        whole += w.get(Role::TokenEmbd).unwrap().data.len();
    }
    let moe = c.moe.unwrap();
    whole + stacks * moe.n_used / moe.n_experts
}

/// `ModelInfo::weight_token_bytes` of the tiny MoE models (qwen3moe; qwen3next with its shared
/// expert and DeltaNet layers) is the hand count: 3 of 8 experts read, the rest whole.
#[test]
fn a_decode_token_reads_the_routed_experts_only() {
    for arch in [Arch::Qwen3Moe, Arch::Qwen3Next] {
        let m = crate::common::tiny_model(arch);
        let want = read_by_hand(&m.weights);
        assert_eq!(m.weights.decode_read_bytes(), want, "{arch:?}");
        let stacks: usize = m
            .weights
            .iter()
            .filter(|(r, _)| r.is_experts())
            .map(|(_, t)| t.data.len())
            .sum();
        let embd = m.weights.get(Role::TokenEmbd).unwrap().data.len();
        assert!(stacks > 0 && m.weights.opt(Role::Output).is_some());
        assert_eq!(
            want,
            m.weights.nbytes() - embd + embd / m.config.vocab - stacks / 8 * 5,
            "{arch:?}"
        );
        let e = crate::common::start_cpu(arch, 32, 16);
        assert_eq!(e.models()[0].weight_token_bytes, want, "{arch:?}");
        e.shutdown();
    }
    // Tied embeddings (the head reads the table) and an MTP layer (a drafter's only).
    let c = memra_engine::config::ModelConfig {
        mtp_layers: 1,
        tie_embeddings: true,
        ..tiny_config(Arch::Qwen3Next, VOCAB)
    };
    let w = random_weights(&c, 12, DType::Q8_0).expect("weights");
    assert!(w.opt(Role::Output).is_none() && w.iter().any(|(r, _)| r.layer() == Some(2)));
    assert_eq!(w.decode_read_bytes(), read_by_hand(&w));
}
