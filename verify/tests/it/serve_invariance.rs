//! `memra-verify serve-invariance` on the real SmolLM2-135M on the CPU (CI, small N).

use std::path::PathBuf;
use std::process::Command;

fn real_model() -> PathBuf {
    memra_engine::testing::real_model()
}

#[test]
fn serve_invariance_passes_on_cpu_with_smollm2() {
    let out = Command::new(env!("CARGO_BIN_EXE_memra-verify"))
        .arg("serve-invariance")
        .arg(real_model())
        .args(["--device", "cpu", "--requests", "6", "--max-tokens", "12"])
        .output()
        .expect("run memra-verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("0 differences"), "{stdout}");
    assert!(stdout.contains("ALL GREEN"), "{stdout}");
    let cached: usize = stdout
        .split(" prompt tokens from the cache")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("summary names the cached tokens");
    assert!(cached > 0, "{stdout}");
    // The speculative phase really drafted (and its output matched: 0 differences above).
    let drafts: usize = stdout
        .split(" drafts (")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("summary names the drafts");
    assert!(drafts > 0, "{stdout}");
    // Speculation as memra-server does it by default: SmolLM2 has no MTP layers.
    assert!(stdout.contains("drafter ngram:"), "{stdout}");
}

/// A long shared context (issue 11): its prompts are prefilled in many chunks, and the warm
/// phase serves at least the whole context from the prefix cache, with the cold run's bytes.
#[test]
fn serve_invariance_with_a_long_shared_context() {
    use memra_engine::backend::Device;
    use memra_verify::serve_invariance::{Options, run};
    let opts = Options {
        device: Device::Cpu,
        requests: 3,
        max_tokens: 3,
        kv_dtype: Default::default(),
        context: 300,
        pp: Default::default(),
        mmproj: None,
    };
    let rep = run(&real_model(), &opts).expect("serve-invariance");
    assert!(rep.failures.is_empty(), "{:?}", rep.failures);
    // Requests 0..2 share the 300-token context (request 3 would be the short one).
    assert!(
        rep.warm_cached_tokens >= 3 * 300,
        "cached {} prompt tokens",
        rep.warm_cached_tokens
    );
}

#[test]
fn serve_invariance_library_compares_every_request() {
    use memra_engine::backend::Device;
    use memra_verify::serve_invariance::{Options, run};
    let opts = Options {
        device: Device::Cpu,
        requests: 3,
        max_tokens: 4,
        kv_dtype: Default::default(),
        context: 0,
        pp: Default::default(),
        mmproj: None,
    };
    let rep = run(&real_model(), &opts).expect("serve-invariance");
    assert_eq!(rep.requests, 3);
    assert_eq!(rep.constrained, 1, "request 1 follows a JSON schema");
    assert!(rep.tokens_compared > 0);
    assert!(rep.failures.is_empty(), "{:?}", rep.failures);
}

/// The serve gate on a tiny qwen3moe with SmolLM2's tokenizer: concurrent, staggered and
/// cached requests change every expert's row count, never a byte of any stream.
#[test]
fn serve_invariance_passes_on_cpu_with_a_tiny_moe() {
    tiny_serve(memra_engine::config::Arch::Qwen3Moe, 0);
}

/// A tiny qwen3next (gated DeltaNet with a recurrent state per sequence): its warm phase takes
/// prefix hits from state snapshots (a 40-token shared context), byte-identical.
#[test]
fn serve_invariance_passes_on_cpu_with_a_tiny_recurrent_model() {
    tiny_serve(memra_engine::config::Arch::Qwen3Next, 40);
}

/// A tiny llama with an MTP layer wired to draft the model's own picks: the default
/// speculation drafts with the layer and n-gram lookup, and changes no byte.
#[test]
fn serve_invariance_default_speculation_with_mtp_layers() {
    let rep = tiny_serve_with(memra_engine::config::Arch::Llama, 0, true, 1);
    assert_eq!(rep.drafter, "mtp+ngram");
    assert!(rep.spec_accepted > 0, "{rep:?}");
}

/// serve-invariance on a tiny random model of `arch` with SmolLM2's tokenizer, 4 requests.
fn tiny_serve(arch: memra_engine::config::Arch, context: usize) {
    tiny_serve_with(arch, context, false, 1);
}

/// Served over two pipeline stages (`--pp 2` on the CPU): a recurrent model's prefix hits
/// restore every stage's state, a sliding-window model's layers split, and the MTP drafter
/// reads the last stage's hidden states; every phase byte-identical.
#[test]
fn serve_invariance_passes_split_over_two_stages() {
    use memra_engine::config::Arch;
    tiny_serve_with(Arch::Qwen3Next, 40, false, 2);
    tiny_serve_with(Arch::Gemma3, 0, false, 2);
    let rep = tiny_serve_with(Arch::Llama, 0, true, 2);
    assert_eq!(rep.drafter, "mtp+ngram");
    assert!(rep.spec_accepted > 0, "{rep:?}");
}

/// Image requests in the serve gate (`--mmproj`): a tiny Gemma 3 tower on a tiny gemma3, and
/// the Qwen ViT's (Qwen2.5-VL: windows; Qwen3-VL: deepstack rows) on the M-RoPE text models
/// (each image's rows placed by its grid). Three of 8 requests carry an image (one of them a
/// short prompt; the first image in two), under staggered load, preemption, a warm prefix
/// cache (over the image's blocks too) and speculation: byte-identical to each alone.
#[test]
fn serve_invariance_with_image_requests() {
    use memra_engine::backend::Device;
    use memra_verify::serve_invariance::{Options, run};
    use memra_verify::vision::Family;
    for family in [Family::Gemma3, Family::Qwen25vl, Family::Qwen3vl] {
        let arch = family.text_arch();
        let path = tiny_model_file(arch, false, "image");
        let mmproj = path.with_extension("mmproj.gguf");
        let hidden = memra_engine::models::random::tiny_config(arch, 49152).hidden;
        family.write_tiny(hidden, &mmproj).expect("tower");
        let opts = Options {
            device: Device::Cpu,
            requests: 8,
            max_tokens: 10,
            kv_dtype: Default::default(),
            context: 0,
            pp: Default::default(),
            mmproj: Some(mmproj.clone()),
        };
        let rep = run(&path, &opts);
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&mmproj);
        let rep = rep.expect("serve-invariance");
        assert_eq!((rep.requests, rep.image_requests), (8, 3), "{family:?}");
        assert_eq!(rep.tower, "cpu");
        assert!(rep.tokens_compared > 0);
        // The image's blocks too come from the cache when warm (the same bytes).
        assert!(rep.image_cached_tokens > 0, "{rep:?}");
        assert!(rep.failures.is_empty(), "{family:?}: {:?}", rep.failures);
        assert!(
            memra_verify::serve_invariance::summary(&rep).contains("3 with an image"),
            "{rep:?}"
        );
    }
}

/// A tiny random model of `arch` with SmolLM2's tokenizer (an oracle MTP layer when `mtp`),
/// written to a temporary file named by `tag`.
fn tiny_model_file(arch: memra_engine::config::Arch, mtp: bool, tag: &str) -> PathBuf {
    use memra_engine::formats::gguf::Gguf;
    use memra_engine::models::random::{random_weights, tiny_config};
    use memra_engine::quant::DType;
    use memra_engine::testing::tiny_gguf::{gguf_meta, write_model};
    let real = Gguf::open(&real_model()).expect("SmolLM2");
    let tok: Vec<_> = real
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .cloned()
        .collect();
    let w = if mtp {
        let cfg = memra_engine::config::ModelConfig {
            mtp_layers: 1,
            ..tiny_config(arch, 49152)
        };
        memra_engine::models::random::oracle_mtp_weights(&cfg, 3).expect("weights")
    } else {
        random_weights(&tiny_config(arch, 49152), 3, DType::Q8_0).expect("weights")
    };
    let mut meta = gguf_meta(&w.config);
    meta.extend(tok);
    let name = format!(
        "memra-serve-{}-mtp{mtp}-{tag}-{}.gguf",
        arch.gguf_name(),
        std::process::id()
    );
    let path = std::env::temp_dir().join(name);
    write_model(&w, &meta, &path).expect("write");
    path
}

/// [`tiny_serve`], with an oracle MTP layer when `mtp`, over `pp` pipeline stages; returns
/// the report.
fn tiny_serve_with(
    arch: memra_engine::config::Arch,
    context: usize,
    mtp: bool,
    pp: usize,
) -> memra_verify::serve_invariance::Report {
    use memra_engine::backend::Device;
    use memra_verify::serve_invariance::{Options, run};
    let path = tiny_model_file(arch, mtp, &format!("pp{pp}"));
    let opts = Options {
        device: Device::Cpu,
        requests: 4,
        max_tokens: 8,
        kv_dtype: Default::default(),
        context,
        pp: memra_engine::pipeline::PpConfig {
            stages: pp,
            ..Default::default()
        },
        mmproj: None,
    };
    let rep = run(&path, &opts);
    let _ = std::fs::remove_file(&path);
    let rep = rep.expect("serve-invariance");
    assert_eq!(rep.requests, 4);
    assert!(rep.tokens_compared > 0);
    assert!(rep.failures.is_empty(), "{:?}", rep.failures);
    rep
}
