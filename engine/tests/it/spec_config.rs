//! Draft-model configurations the engine refuses at start, with a message that names the
//! problem (a missing or unreadable file, another vocabulary, another tokenizer), and one it
//! accepts (the target's own file as its draft model: every draft accepted, output unchanged).

use std::path::Path;

use memra_engine::backend::Device;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig, EngineHandle, KvBudget};
use memra_engine::formats::gguf::MetaValue;
use memra_engine::loader::load_model;
use memra_engine::request::{Event, ValidRequest};
use memra_engine::sampling::SamplingParams;
use memra_engine::spec::{DrafterKind, SpecConfig};
use memra_engine::testing::text_request;

use memra_engine::config::Arch;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;

use crate::tiny_files::{GgufParts, GgufTensor};

fn start(target: &Path, drafter: DrafterKind) -> Result<EngineHandle, String> {
    let m = load_model(target).map_err(|e| e.to_string())?;
    let cfg = EngineConfig {
        device: Device::Cpu,
        threads: 1,
        kv: KvBudget::Blocks(32),
        spec: Some(SpecConfig::new(drafter, 3).unwrap()),
        ..EngineConfig::default()
    };
    Engine::start(vec![("m".into(), m, cfg)], AdmissionLimits::default()).map_err(|e| e.to_string())
}

fn refused(target: &Path, drafter: DrafterKind, want: &[&str]) {
    let label = drafter.label();
    let e = match start(target, drafter) {
        Ok(h) => {
            h.shutdown();
            panic!("{label}: started");
        }
        Err(e) => e,
    };
    assert!(e.contains("model `m`"), "{label}: {e}");
    for w in want {
        assert!(e.contains(w), "{label}: `{w}` not in: {e}");
    }
}

/// The tokens of one request with `params`, its checked and its accepted drafts.
fn run(h: &EngineHandle, params: &SamplingParams) -> (Vec<u32>, usize, usize) {
    let req = ValidRequest {
        params: params.clone(),
        speculative: true,
        ..text_request(vec![97, 98, 99, 97, 98, 99, 97], 12)
    };
    let mut s = h.submit(req).unwrap();
    let mut toks = Vec::new();
    loop {
        match s.blocking_recv() {
            Some(Event::Token(t)) => toks.push(t.id),
            Some(Event::Done { usage, .. }) => {
                return (toks, usage.drafted_tokens, usage.accepted_tokens);
            }
            Some(Event::Error(e)) => panic!("{e}"),
            Some(Event::Text(_)) => {}
            None => panic!("no Done"),
        }
    }
}

#[test]
fn bad_draft_models_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.gguf");
    GgufParts::valid().write(&target);
    for auto in [false, true] {
        let kind = |p: &Path| {
            if auto {
                DrafterKind::Auto(Some(p.to_path_buf()))
            } else {
                DrafterKind::Model(p.to_path_buf())
            }
        };
        // Missing.
        let missing = dir.path().join("missing.gguf");
        refused(&target, kind(&missing), &["missing.gguf", "No such file"]);
        // Not a model: a text file, an empty file, a folder without config.json.
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "hello, not a model").unwrap();
        refused(&target, kind(&text), &["notes.txt", "not a GGUF file"]);
        let empty = dir.path().join("empty.gguf");
        std::fs::write(&empty, b"").unwrap();
        refused(&target, kind(&empty), &["empty.gguf"]);
        let folder = dir.path().join("folder");
        std::fs::create_dir_all(&folder).unwrap();
        refused(&target, kind(&folder), &["config.json"]);
        // Another tokenizer of the same size: one token differs.
        let other = dir.path().join("other-tokens.gguf");
        let mut p = GgufParts::valid();
        let meta = p
            .meta
            .iter_mut()
            .find(|(k, _)| k == "tokenizer.ggml.tokens")
            .unwrap();
        if let MetaValue::Array(v) = &mut meta.1 {
            v[256] = MetaValue::Str("ba".into());
        }
        p.set(
            "tokenizer.ggml.merges",
            Some(MetaValue::Array(vec![MetaValue::Str("b a".into())])),
        );
        p.write(&other);
        refused(
            &target,
            kind(&other),
            &[
                "other-tokens.gguf",
                "differs from the target's at 1 of 260",
                "\"ba\"",
            ],
        );
    }
    // Unreadable: no permission (root reads anything, so only checked when it is refused).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let locked = dir.path().join("locked.gguf");
        GgufParts::valid().write(&locked);
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        if std::fs::File::open(&locked).is_err() {
            refused(
                &target,
                DrafterKind::Model(locked.clone()),
                &["locked.gguf", "ermission denied"],
            );
        }
    }
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    // More embedding rows and tokens than the target: named by both counts.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.gguf");
    GgufParts::valid().write(&target);
    let big = dir.path().join("big-vocab.gguf");
    let mut p = GgufParts::valid();
    for (key, more) in [
        ("tokenizer.ggml.tokens", MetaValue::Str("zz".into())),
        ("tokenizer.ggml.token_type", MetaValue::I32(1)),
    ] {
        let meta = p.meta.iter_mut().find(|(k, _)| k == key).unwrap();
        if let MetaValue::Array(v) = &mut meta.1 {
            v.push(more);
        }
    }
    let w = random_weights(&tiny_config(Arch::Llama, 261), 7, DType::Q8_0).unwrap();
    p.tensors = GgufTensor::all_of(&w);
    p.write(&big);
    refused(
        &target,
        DrafterKind::Model(big),
        &["big-vocab.gguf", "261 tokens, the target's 260"],
    );
}

#[test]
fn the_target_as_its_own_draft_model_is_accepted_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.gguf");
    GgufParts::valid().write(&target);
    let m = load_model(&target).unwrap();
    let plain_cfg = EngineConfig {
        device: Device::Cpu,
        threads: 1,
        kv: KvBudget::Blocks(32),
        ..EngineConfig::default()
    };
    let plain =
        Engine::start(vec![("m".into(), m, plain_cfg)], AdmissionLimits::default()).unwrap();
    // Greedy, and sampled with penalties: the draft model picks its drafts as the target picks
    // (the same penalties, the same keyed draw), so the target's own weights draft every token
    // the target goes on to pick.
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.95,
        repetition_penalty: 1.1,
        seed: 5,
        ..SamplingParams::default()
    };
    let params = [SamplingParams::default(), sampled];
    let want: Vec<Vec<u32>> = params.iter().map(|p| run(&plain, p).0).collect();
    plain.shutdown();
    assert_ne!(
        want[0], want[1],
        "the sampled request picks other tokens than greedy"
    );
    let kinds = [
        DrafterKind::Model(target.clone()),
        DrafterKind::Auto(Some(target.clone())),
    ];
    for kind in kinds {
        let h = start(&target, kind.clone()).unwrap();
        for (p, want) in params.iter().zip(&want) {
            let label = format!("{} t={}", kind.label(), p.temperature);
            let (got, drafted, accepted) = run(&h, p);
            assert_eq!(&got, want, "{label}");
            assert!(accepted > 0, "{label}: nothing accepted");
            if matches!(kind, DrafterKind::Model(_)) {
                assert_eq!(
                    accepted, drafted,
                    "{label}: a draft of the target's own weights"
                );
            }
        }
        h.shutdown();
    }
}
