//! safetensors HF folders: write -> open round trips (single file and sharded) and a table of
//! corrupt files, each a clean error naming the problem.

use std::path::{Path, PathBuf};

use memra_engine::config::{Arch, ModelConfig};
use memra_engine::error::Error;
use memra_engine::formats::safetensors::{
    HfFolderSpec, HfModel, SafetensorsFile, SafetensorsWriter, TensorDecl, shard_plan,
    write_hf_folder, write_safetensors,
};
use memra_engine::quant::DType;
use memra_engine::weights::{Bytes, Tensor};

fn tiny_config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        n_layers: 1,
        hidden: 8,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 4,
        ffn: 16,
        vocab: 32,
        rope_theta: 10000.0,
        rope_scaling: None,
        rms_eps: 1e-5,
        max_ctx: 128,
        tie_embeddings: true,
        gemma3: None,
        moe: None,
        mtp_layers: 0,
        hybrid: None,
        vl: None,
    }
}

/// Bytes that differ per tensor and position, so misplaced data is caught.
fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed.wrapping_mul(7))
        })
        .collect()
}

fn tensor(name: &str, dtype: DType, shape: Vec<usize>, seed: u8) -> (String, Tensor) {
    let n: usize = shape.iter().product::<usize>() * dtype.block_bytes();
    let t = Tensor::new(name, dtype, shape, Bytes::owned(pattern(seed, n))).unwrap();
    (name.to_string(), t)
}

fn tiny_tensors() -> Vec<(String, Tensor)> {
    vec![
        tensor("model.embed_tokens.weight", DType::F32, vec![32, 8], 1),
        tensor(
            "model.layers.0.input_layernorm.weight",
            DType::F32,
            vec![8],
            2,
        ),
        tensor(
            "model.layers.0.self_attn.q_proj.weight",
            DType::F16,
            vec![8, 8],
            3,
        ),
        tensor(
            "model.layers.0.self_attn.k_proj.weight",
            DType::BF16,
            vec![4, 8],
            4,
        ),
        tensor(
            "model.layers.0.self_attn.v_proj.weight",
            DType::BF16,
            vec![4, 8],
            5,
        ),
        tensor(
            "model.layers.0.self_attn.o_proj.weight",
            DType::F16,
            vec![8, 8],
            6,
        ),
        tensor(
            "model.layers.0.post_attention_layernorm.weight",
            DType::F32,
            vec![8],
            7,
        ),
        tensor(
            "model.layers.0.mlp.gate_proj.weight",
            DType::F32,
            vec![16, 8],
            8,
        ),
        tensor(
            "model.layers.0.mlp.up_proj.weight",
            DType::F32,
            vec![16, 8],
            9,
        ),
        tensor(
            "model.layers.0.mlp.down_proj.weight",
            DType::F32,
            vec![8, 16],
            10,
        ),
        tensor("model.norm.weight", DType::F32, vec![8], 11),
    ]
}

fn spec(max_shard_bytes: u64) -> HfFolderSpec {
    HfFolderSpec {
        config_json: tiny_config().to_hf_json(Some(1), Some(2)),
        tokenizer_json: Some("{\"version\":\"1.0\"}".into()),
        tokenizer_config_json: Some(serde_json::json!({"bos_token": "<s>"})),
        max_shard_bytes,
    }
}

fn assert_same(m: &HfModel, tensors: &[(String, Tensor)]) {
    let mut names = m.tensor_names();
    names.sort();
    let mut want: Vec<String> = tensors.iter().map(|(n, _)| n.clone()).collect();
    want.sort();
    assert_eq!(names, want);
    for (name, t) in tensors {
        let got = m.tensor(name).unwrap().unwrap();
        assert_eq!(got.name, *name);
        assert_eq!(got.dtype, t.dtype, "{name}");
        assert_eq!(got.shape, t.shape, "{name}");
        assert_eq!(&got.data[..], &t.data[..], "{name}");
        assert!(
            matches!(got.data, Bytes::Mapped { .. }),
            "{name} must be a view of the mapping"
        );
    }
    assert!(
        m.tensor("model.layers.9.mlp.up_proj.weight")
            .unwrap()
            .is_none()
    );
}

#[test]
fn round_trip_single_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model");
    let tensors = tiny_tensors();
    write_hf_folder(&out, &spec(1 << 30), &tensors).unwrap();
    assert!(out.join("model.safetensors").is_file());
    assert!(!out.join("model.safetensors.index.json").exists());
    assert!(!dir.path().join("model.tmp").exists());
    let m = HfModel::open(&out).unwrap();
    assert_eq!(m.config, tiny_config());
    assert_eq!(m.config_json["bos_token_id"], 1);
    assert_same(&m, &tensors);
    assert_eq!(m.tokenizer_json(), Some(out.join("tokenizer.json")));
    assert_eq!(
        m.tokenizer_config_json(),
        Some(out.join("tokenizer_config.json"))
    );
    assert_eq!(m.shard_paths().len(), 1);
    // Writing into an existing non-empty folder is refused.
    let e = write_hf_folder(&out, &spec(1 << 30), &tensors).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
}

#[test]
fn round_trip_sharded() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model");
    let tensors = tiny_tensors();
    // Largest tensor is 32*8*4 = 1024 bytes; 600-byte shards put it alone and split the rest.
    write_hf_folder(&out, &spec(600), &tensors).unwrap();
    let m = HfModel::open(&out).unwrap();
    // Plan: [embed 1024], [norm, q, k, v, o, norm = 448], [gate 512], [up 512], [down, norm = 544].
    assert_eq!(m.shard_paths().len(), 5, "{:?}", m.shard_paths());
    assert!(out.join("model.safetensors.index.json").is_file());
    assert!(out.join("model-00005-of-00005.safetensors").is_file());
    assert!(!out.join("model.safetensors").exists());
    assert_same(&m, &tensors);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let total: u64 = tensors.iter().map(|(_, t)| t.data.len() as u64).sum();
    assert_eq!(index["metadata"]["total_size"], total);
    assert_eq!(
        index["weight_map"].as_object().unwrap().len(),
        tensors.len()
    );
}

#[test]
fn shard_plan_respects_limit_and_order() {
    let decls: Vec<TensorDecl> = [100usize, 50, 50, 300, 10, 10]
        .iter()
        .enumerate()
        .map(|(i, &n)| TensorDecl::new(format!("t{i}"), DType::F32, vec![n / 4 * 4 / 4]))
        .collect();
    // bytes: 100, 48, 48, 300, 8, 8
    let plan = shard_plan(&decls, 200).unwrap();
    assert_eq!(plan, vec![vec![0, 1, 2], vec![3], vec![4, 5]]);
    assert_eq!(
        shard_plan(&decls, 10_000).unwrap(),
        vec![vec![0, 1, 2, 3, 4, 5]]
    );
}

#[test]
fn single_file_with_metadata_and_streaming_writer() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.safetensors");
    let meta = [("format".to_string(), "pt".to_string())].into();
    let tensors = tiny_tensors();
    write_safetensors(&p, &tensors, Some(meta)).unwrap();
    let f = SafetensorsFile::open(&p).unwrap();
    assert_eq!(f.metadata().unwrap()["format"], "pt");
    // Data order is declaration order.
    let want: Vec<String> = tensors.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(f.tensor_names(), want);
    // The reference implementation reads our file too.
    let bytes = std::fs::read(&p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(
        st.tensor("model.norm.weight").unwrap().data(),
        &tensors[10].1.data[..]
    );
    // The header is padded so the data section starts 8-byte aligned.
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(n % 8, 0);

    // Wrong byte count, too many tensors, unfinished writers leave nothing behind.
    let q = dir.path().join("y.safetensors");
    let decls = vec![TensorDecl::new("a", DType::F32, vec![2])];
    let mut w = SafetensorsWriter::create(&q, &decls, None).unwrap();
    assert!(
        w.write_tensor(&[0u8; 4])
            .unwrap_err()
            .to_string()
            .contains("needs 8 bytes")
    );
    drop(w);
    assert!(!q.exists());
    assert!(!dir.path().join("y.safetensors.tmp").exists());
    let w = SafetensorsWriter::create(&q, &decls, None).unwrap();
    assert!(w.finish().unwrap_err().to_string().contains("only 0 of 1"));
    assert!(!q.exists());
    let e = SafetensorsWriter::create(&q, &[TensorDecl::new("a", DType::Q8_0, vec![32])], None)
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
}

// ---------------------------------------------------------------- corrupt files

/// A safetensors file from a raw header string and data length.
fn raw_file(header: &str, data_len: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend(std::iter::repeat_n(0u8, data_len));
    v
}

fn open_bytes(bytes: &[u8]) -> Result<SafetensorsFile, Error> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.safetensors");
    std::fs::write(&p, bytes).unwrap();
    SafetensorsFile::open(&p)
}

fn expect_st_err(r: Result<SafetensorsFile, Error>, words: &str, case: &str) {
    match r {
        Err(Error::Safetensors { path, what }) => {
            assert!(
                what.contains(words),
                "case {case}: `{what}` should contain `{words}`"
            );
            assert!(
                path.ends_with("c.safetensors"),
                "case {case}: path {path:?}"
            );
        }
        Err(e) => panic!("case {case}: wrong error kind {e:?}"),
        Ok(_) => panic!("case {case}: corrupt file was accepted"),
    }
}

#[test]
fn corrupt_single_files() {
    let ok_t = r#""a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty file", vec![], "too short"),
        ("short file", vec![1, 2, 3], "too short"),
        (
            "truncated header",
            {
                let mut v = raw_file(&format!("{{{ok_t}}}"), 8);
                v.truncate(20);
                v
            },
            "runs past the end",
        ),
        (
            "huge header length",
            {
                let mut v = (1u64 << 40).to_le_bytes().to_vec();
                v.extend_from_slice(b"{}");
                v
            },
            "exceeds",
        ),
        (
            "header length u64::MAX",
            u64::MAX.to_le_bytes().to_vec(),
            "exceeds",
        ),
        ("bad JSON", raw_file("{\"a\": [1, 2", 0), "not a valid JSON"),
        (
            "header not an object",
            raw_file("[1,2,3]", 0),
            "not a valid JSON",
        ),
        (
            "invalid UTF-8",
            {
                let mut v = 4u64.to_le_bytes().to_vec();
                v.extend_from_slice(&[b'{', 0xff, 0xfe, b'}']);
                v
            },
            "UTF-8",
        ),
        (
            "overlapping offsets",
            raw_file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                12,
            ),
            "overlaps",
        ),
        (
            "same offsets twice",
            raw_file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                8,
            ),
            "overlaps",
        ),
        (
            "wrong nbytes",
            raw_file(
                r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}"#,
                8,
            ),
            "needs 16 bytes",
        ),
        (
            "end before start",
            raw_file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#,
                8,
            ),
            "needs 8 bytes",
        ),
        (
            "gap",
            raw_file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                12,
            ),
            "gap",
        ),
        (
            "offset past end",
            raw_file(&format!("{{{ok_t}}}"), 4),
            "runs past the end of the 4-byte data section",
        ),
        (
            "trailing data",
            raw_file(&format!("{{{ok_t}}}"), 16),
            "cover 8",
        ),
        (
            "unknown dtype",
            raw_file(
                r#"{"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,1]}}"#,
                1,
            ),
            "unknown dtype `Q4`",
        ),
        (
            "shape overflow",
            raw_file(
                r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}}"#,
                8,
            ),
            "overflows",
        ),
        (
            "negative dim",
            raw_file(
                r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#,
                8,
            ),
            "not a dimension",
        ),
        (
            "missing offsets",
            raw_file(r#"{"a":{"dtype":"F32","shape":[2]}}"#, 8),
            "no `data_offsets`",
        ),
        (
            "bad offsets",
            raw_file(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}}"#, 8),
            "[start, end]",
        ),
        (
            "duplicate tensor",
            raw_file(&format!("{{{ok_t},{ok_t}}}"), 8),
            "twice",
        ),
        (
            "bad metadata",
            raw_file(&format!("{{\"__metadata__\":{{\"k\":1}},{ok_t}}}"), 8),
            "not a string",
        ),
        (
            "too many dims",
            raw_file(
                r#"{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}"#,
                4,
            ),
            "dimensions",
        ),
    ];
    assert!(cases.len() >= 20);
    for (case, bytes, words) in cases {
        expect_st_err(open_bytes(&bytes), words, case);
    }
}

#[test]
fn unsupported_dtype_is_named_on_access() {
    let f = open_bytes(&raw_file(
        r#"{"pos":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},"w":{"dtype":"BF16","shape":[2],"data_offsets":[16,20]}}"#,
        20,
    ))
    .unwrap();
    let e = f.tensor("pos").unwrap_err().to_string();
    assert!(e.contains("`pos`") && e.contains("I64"), "{e}");
    assert_eq!(f.tensor("w").unwrap().unwrap().dtype, DType::BF16);
}

/// A valid folder (two shards: 1472 and 1568 bytes), then `damage` applied to it.
fn damaged_folder(damage: impl FnOnce(&Path)) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m");
    write_hf_folder(&out, &spec(1600), &tiny_tensors()).unwrap();
    damage(&out);
    (dir, out)
}

fn edit_index(out: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = out.join("model.safetensors.index.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
}

type Damage = Box<dyn FnOnce(&Path)>;

/// Maps tensor `name` to `shard` in the folder's index.
fn map_to(name: &'static str, shard: &'static str) -> Damage {
    Box::new(move |o: &Path| edit_index(o, |v| v["weight_map"][name] = shard.into()))
}

#[test]
fn corrupt_folders() {
    let cases: Vec<(&str, Damage, &str)> = vec![
        (
            "missing shard",
            Box::new(|o: &Path| {
                std::fs::remove_file(o.join("model-00002-of-00002.safetensors")).unwrap()
            }),
            "shard model-00002-of-00002.safetensors named by the index is missing",
        ),
        (
            "tensor missing from its shard",
            map_to(
                "model.layers.0.extra.weight",
                "model-00001-of-00002.safetensors",
            ),
            "`model.layers.0.extra.weight` is mapped to model-00001-of-00002.safetensors, which has no such tensor",
        ),
        (
            "tensor mapped to the wrong shard",
            map_to("model.norm.weight", "model-00001-of-00002.safetensors"),
            "but is in",
        ),
        (
            "duplicate tensor across shards",
            Box::new(|o: &Path| {
                let t = vec![tensor("model.norm.weight", DType::F32, vec![8], 11)];
                write_safetensors(&o.join("model-00001-of-00002.safetensors"), &t, None).unwrap();
                std::fs::copy(
                    o.join("model-00001-of-00002.safetensors"),
                    o.join("model-00002-of-00002.safetensors"),
                )
                .unwrap();
            }),
            "is in both",
        ),
        (
            "path traversal in shard name",
            map_to("model.norm.weight", "../evil.safetensors"),
            "not a plain file name",
        ),
        (
            "index without weight_map",
            Box::new(|o: &Path| {
                std::fs::write(o.join("model.safetensors.index.json"), b"{\"metadata\":{}}")
                    .unwrap()
            }),
            "no `weight_map`",
        ),
        (
            "index bad JSON",
            Box::new(|o: &Path| {
                std::fs::write(o.join("model.safetensors.index.json"), b"{\"weight_map\":").unwrap()
            }),
            "not a valid JSON",
        ),
        (
            "no weights",
            Box::new(|o: &Path| {
                std::fs::remove_file(o.join("model.safetensors.index.json")).unwrap()
            }),
            "neither model.safetensors nor",
        ),
        (
            "bad config.json",
            Box::new(|o: &Path| {
                std::fs::write(o.join("config.json"), b"{\"architectures\": [").unwrap()
            }),
            "not a valid JSON",
        ),
        (
            "truncated shard",
            Box::new(|o: &Path| {
                let p = o.join("model-00001-of-00002.safetensors");
                let b = std::fs::read(&p).unwrap();
                std::fs::write(&p, &b[..b.len() - 3]).unwrap();
            }),
            "runs past the end",
        ),
    ];
    for (case, damage, words) in cases {
        let (_d, out) = damaged_folder(damage);
        match HfModel::open(&out) {
            Err(Error::Safetensors { what, .. }) => {
                assert!(
                    what.contains(words),
                    "case {case}: `{what}` should contain `{words}`"
                )
            }
            Err(e) => panic!("case {case}: wrong error kind {e:?}"),
            Ok(_) => panic!("case {case}: corrupt folder was accepted"),
        }
    }
}

/// The error of opening a valid folder whose config.json is the tiny config's with `edit`.
fn open_with_config(edit: impl FnOnce(&mut serde_json::Value)) -> Error {
    let (_d, out) = damaged_folder(|o| {
        let mut v = tiny_config().to_hf_json(None, None);
        edit(&mut v);
        std::fs::write(o.join("config.json"), v.to_string()).unwrap()
    });
    HfModel::open(&out).unwrap_err()
}

#[test]
fn bad_configs() {
    let e = open_with_config(|v| v["architectures"] = serde_json::json!(["GPT2LMHeadModel"]));
    assert!(
        matches!(&e, Error::Unsupported(m) if m.contains("GPT2LMHeadModel") && m.contains("config.json")),
        "{e}"
    );

    let e = open_with_config(|v| {
        v.as_object_mut().unwrap().remove("hidden_size");
    });
    assert!(
        matches!(&e, Error::Config(m) if m.contains("hidden_size")),
        "{e}"
    );

    let e = open_with_config(|v| v["num_key_value_heads"] = 3.into());
    assert!(
        matches!(&e, Error::Config(m) if m.contains("n_kv_heads")),
        "{e}"
    );

    let (_d, out) = damaged_folder(|o| std::fs::remove_file(o.join("config.json")).unwrap());
    let e = HfModel::open(&out).unwrap_err();
    assert!(e.to_string().contains("no config.json"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let e = HfModel::open(&dir.path().join("nope")).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
}
