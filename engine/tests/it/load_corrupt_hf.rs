//! Damaged copies of a small valid HF safetensors folder (config.json, weights, tokenizer.json,
//! tokenizer_config.json), each loaded through the whole path the binaries take: a clear error
//! naming the problem, never a panic, never an allocation sized from a claimed count. The
//! safetensors parser alone has its own cases (safetensors.rs).

use std::path::Path;

use serde_json::{Value, json};

use crate::gguf_corrupt::largest_alloc;
use crate::tiny_files::{HfParts, load_whole};

fn dir_bytes(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len() as usize)
                .sum()
        })
        .unwrap_or(0)
}

/// The last shard file of a sharded folder.
fn last_shard(dir: &Path) -> std::path::PathBuf {
    let mut shards: Vec<_> = std::fs::read_dir(dir)
        .expect("read_dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("-of-"))
        .collect();
    shards.sort();
    shards.pop().expect("a sharded folder")
}

/// Rewrites the JSON header of a safetensors file (the data section is kept).
fn edit_header(file: &Path, f: impl FnOnce(&mut Value)) {
    let b = std::fs::read(file).expect("read shard");
    let n = u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as usize;
    let mut h: Value = serde_json::from_slice(&b[8..8 + n]).expect("header JSON");
    f(&mut h);
    let text = serde_json::to_vec(&h).expect("header");
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&b[8 + n..]);
    std::fs::write(file, out).expect("write shard");
}

type Parts = Box<dyn Fn(&mut HfParts)>;
type Files = Box<dyn Fn(&Path)>;

/// A case edits the parts before writing and/or the written folder.
struct Case {
    name: &'static str,
    parts: Parts,
    files: Files,
    words: &'static [&'static str],
}

fn parts(
    name: &'static str,
    f: impl Fn(&mut HfParts) + 'static,
    words: &'static [&'static str],
) -> Case {
    Case {
        name,
        parts: Box::new(f),
        files: Box::new(|_| {}),
        words,
    }
}

fn files(name: &'static str, f: impl Fn(&Path) + 'static, words: &'static [&'static str]) -> Case {
    Case {
        name,
        parts: Box::new(|_| {}),
        files: Box::new(f),
        words,
    }
}

fn set(key: &'static str, v: Value) -> impl Fn(&mut HfParts) {
    move |p: &mut HfParts| p.config_json[key] = v.clone()
}

fn table() -> Vec<Case> {
    let two_shards = |p: &mut HfParts| p.max_shard_bytes = 200_000;
    vec![
        // ---- config.json
        files(
            "config.json missing",
            |d| std::fs::remove_file(d.join("config.json")).expect("rm"),
            &["no config.json"],
        ),
        files(
            "config.json not JSON",
            |d| std::fs::write(d.join("config.json"), b"{\"hidden_size\": 6").expect("w"),
            &["config.json", "not a valid JSON"],
        ),
        parts(
            "hidden_size missing",
            |p| {
                p.config_json
                    .as_object_mut()
                    .map(|o| o.remove("hidden_size"));
            },
            &["`hidden_size` is missing or not an integer"],
        ),
        parts(
            "num_attention_heads a string",
            set("num_attention_heads", json!("4")),
            &["`num_attention_heads` is missing or not an integer"],
        ),
        parts(
            "num_attention_heads 0",
            set("num_attention_heads", json!(0)),
            &["n_heads is 0"],
        ),
        parts(
            "num_key_value_heads not dividing the heads",
            set("num_key_value_heads", json!(3)),
            &["n_heads 4 is not a multiple of n_kv_heads 3"],
        ),
        parts(
            "head_dim not dividing the hidden size",
            |p| {
                p.config_json.as_object_mut().map(|o| o.remove("head_dim"));
                p.config_json["num_attention_heads"] = json!(6);
                p.config_json["num_key_value_heads"] = json!(6);
            },
            &["hidden_size 64 is not a multiple of num_attention_heads 6"],
        ),
        parts(
            "num_hidden_layers 2^24",
            set("num_hidden_layers", json!(1 << 24)),
            &["claims 16777216 layers", "only"],
        ),
        parts(
            "rope_theta negative",
            set("rope_theta", json!(-1.0)),
            &["rope theta -1 is invalid"],
        ),
        parts(
            "vocab_size larger than the embedding",
            set("vocab_size", json!(300)),
            &[
                "model.embed_tokens.weight",
                "has shape [260, 64], expected [300, 64]",
            ],
        ),
        parts(
            "vocab_size smaller than the tokenizer",
            |p| {
                p.config_json["vocab_size"] = json!(200);
                for (n, t) in p.tensors.iter_mut() {
                    if n == "model.embed_tokens.weight" {
                        t.shape = vec![200, 64];
                        let mut v = t.data.to_vec();
                        v.truncate(200 * 64 * 4);
                        t.data = memra_engine::weights::Bytes::owned(v);
                    }
                }
            },
            &["the tokenizer has 260 tokens", "200"],
        ),
        // ---- weights
        parts(
            "tensor missing",
            |p| {
                p.tensors
                    .retain(|(n, _)| n != "model.layers.1.mlp.down_proj.weight")
            },
            &["missing tensor", "model.layers.1.mlp.down_proj.weight"],
        ),
        files(
            "tensor dtype flipped to I32",
            |d| {
                edit_header(&d.join("model.safetensors"), |h| {
                    h["model.norm.weight"]["dtype"] = json!("I32")
                })
            },
            &["model.norm.weight", "I32"],
        ),
        files(
            "tensor shape inconsistent with its bytes",
            |d| {
                edit_header(&d.join("model.safetensors"), |h| {
                    h["model.norm.weight"]["shape"] = json!([65])
                })
            },
            &["model.norm.weight", "needs 260 bytes"],
        ),
        files(
            "tensor offsets past the data",
            |d| {
                edit_header(&d.join("model.safetensors"), |h| {
                    h["model.norm.weight"]["data_offsets"] = json!([0, 1u64 << 40])
                })
            },
            &["model.norm.weight"],
        ),
        files(
            "header length 2^40",
            |d| {
                let f = d.join("model.safetensors");
                let mut b = std::fs::read(&f).expect("read");
                b[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
                std::fs::write(&f, b).expect("write");
            },
            &["exceeds"],
        ),
        files(
            "weights truncated",
            |d| {
                let f = d.join("model.safetensors");
                let b = std::fs::read(&f).expect("read");
                std::fs::write(&f, &b[..b.len() / 2]).expect("write");
            },
            &["runs past the end"],
        ),
        Case {
            name: "shard missing",
            parts: Box::new(two_shards),
            files: Box::new(|d| std::fs::remove_file(last_shard(d)).expect("rm")),
            words: &["named by the index is missing"],
        },
        Case {
            name: "index naming an absent tensor",
            parts: Box::new(two_shards),
            files: Box::new(|d| {
                let p = d.join("model.safetensors.index.json");
                let mut v: Value =
                    serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("json");
                let first = v["weight_map"]["model.norm.weight"].clone();
                v["weight_map"]["model.extra.weight"] = first;
                std::fs::write(&p, v.to_string()).expect("write");
            }),
            words: &["model.extra.weight", "has no such tensor"],
        },
        // ---- tokenizer and template
        files(
            "tokenizer.json missing",
            |d| std::fs::remove_file(d.join("tokenizer.json")).expect("rm"),
            &["has no tokenizer.json"],
        ),
        parts(
            "tokenizer.json not JSON",
            |p| p.tokenizer_json = "{\"model\": ".into(),
            &["tokenizer.json"],
        ),
        parts(
            "tokenizer.json with a wrong-typed vocab",
            |p| {
                let mut v: Value = serde_json::from_str(&p.tokenizer_json).expect("json");
                v["model"]["vocab"] = json!([1, 2, 3]);
                p.tokenizer_json = v.to_string();
            },
            &["tokenizer.json"],
        ),
        parts(
            "eos token not in the vocabulary",
            |p| p.tokenizer_config_json["eos_token"] = json!("<|nope|>"),
            &["eos_token \"<|nope|>\" is not in the vocabulary"],
        ),
        parts(
            "chat template syntax error",
            |p| p.tokenizer_config_json["chat_template"] = json!("{{ messages[0"),
            &["template"],
        ),
        parts(
            "chat template of the wrong type",
            |p| p.tokenizer_config_json["chat_template"] = json!(17),
            &["chat_template must be a string or a list"],
        ),
        parts(
            "chat template that never ends",
            |p| {
                p.tokenizer_config_json["chat_template"] = json!(
                    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                )
            },
            // Fuel stops it first on an idle machine; the render time limit on a loaded one.
            &["fuel|time limit"],
        ),
    ]
}

#[test]
fn valid_tiny_hf_folder_loads_and_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, shard) in [("one", 1u64 << 30), ("two", 200_000)] {
        let mut p = HfParts::valid();
        p.max_shard_bytes = shard;
        let out = p.write(dir.path(), name);
        let s = load_whole(&out).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(s.tokens.len(), 3, "{name}: {s:?}");
    }
    assert!(last_shard(&dir.path().join("two")).ends_with("model-00002-of-00002.safetensors"));
}

#[test]
fn damaged_hf_folders_give_clean_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = table();
    assert!(cases.len() >= 10, "only {} cases", cases.len());
    let mut failed = Vec::new();
    for (i, c) in cases.into_iter().enumerate() {
        let mut p = HfParts::valid();
        (c.parts)(&mut p);
        let out = p.write(dir.path(), &format!("case{i}"));
        (c.files)(&out);
        let len = dir_bytes(&out);
        let (r, largest) = largest_alloc(|| load_whole(&out));
        if largest > 8 * len + (4 << 20) {
            failed.push(format!(
                "{}: allocated {largest} bytes for a {len}-byte folder",
                c.name
            ));
        }
        match r {
            Err(msg) => {
                // A word `a|b` is satisfied by either alternative.
                let lacks = |w: &&&str| !w.split('|').any(|alt| msg.contains(alt));
                if let Some(w) = c.words.iter().find(lacks) {
                    failed.push(format!("{}: `{msg}` lacks `{w}`", c.name));
                }
                eprintln!("{}: {msg}", c.name);
            }
            Ok(s) => failed.push(format!("{}: the damaged folder loaded: {s:?}", c.name)),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    eprintln!("{} damaged HF folders, each a clean error", table().len());
}

/// NaN/Inf weights and an unused extra tensor load and serve (inspect --scan reports the former).
#[test]
fn accepted_hf_damage_loads_and_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut nan = HfParts::valid();
    for (n, t) in nan.tensors.iter_mut() {
        if n == "model.norm.weight" {
            let mut v = t.data.to_vec();
            v[..4].copy_from_slice(&f32::NAN.to_le_bytes());
            v[4..8].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
            t.data = memra_engine::weights::Bytes::owned(v);
        }
    }
    let mut extra = HfParts::valid();
    let t = memra_engine::weights::Tensor::new(
        "model.extra.weight",
        memra_engine::quant::DType::F32,
        vec![4],
        memra_engine::weights::Bytes::owned(vec![0; 16]),
    )
    .expect("tensor");
    extra.tensors.push(("model.extra.weight".into(), t));
    for (name, p) in [("nan", nan), ("extra", extra)] {
        let out = p.write(dir.path(), name);
        let s = load_whole(&out).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(s.tokens.len() == 3 || s.error.is_some(), "{name}: {s:?}");
    }
}
