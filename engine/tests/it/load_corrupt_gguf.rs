//! Damaged copies of a small valid GGUF model, each loaded through the whole path the binaries
//! take (`load_model`: header, config, weights, tokenizer, chat template; then the engine on the
//! CPU and one request): a clear error naming the problem, never a panic, never an allocation
//! sized from a claimed count. The parser alone has its own corpus (gguf_corrupt.rs).

use std::path::Path;

use memra_engine::formats::gguf::MetaValue;
use memra_engine::formats::gguf_write::write_gguf_split;
use memra_engine::quant::DType;

use crate::gguf_corrupt::largest_alloc;
use crate::tiny_files::{GgufParts, after, load_whole, patch};

/// Largest single allocation accepted while loading a damaged file of `len` bytes.
fn alloc_bound(len: usize) -> usize {
    8 * len + (4 << 20)
}

type Edit = Box<dyn Fn(&mut GgufParts)>;
type Damage = Box<dyn Fn(&mut Vec<u8>)>;

/// A case: a metadata/tensor edit before writing or a byte patch after, and the words the error
/// must hold.
enum How {
    Edit(Edit),
    Bytes(Damage),
}

fn edit(f: impl Fn(&mut GgufParts) + 'static) -> How {
    How::Edit(Box::new(f))
}

fn bytes(f: impl Fn(&mut Vec<u8>) + 'static) -> How {
    How::Bytes(Box::new(f))
}

fn u32v(v: u32) -> Option<MetaValue> {
    Some(MetaValue::U32(v))
}

fn sv(v: &str) -> Option<MetaValue> {
    Some(MetaValue::Str(v.into()))
}

/// Offset of the tensor-info field `field_at` bytes after the name of tensor `name` (its n_dims
/// is at 0, dims at 4, then type, then offset).
fn info_at(b: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    after(b, &needle)
}

/// The offset field of a 1-d tensor (`output_norm.weight`) and of a 2-d one.
fn offset_1d(b: &[u8], name: &str) -> usize {
    info_at(b, name) + 4 + 8 + 4
}

fn table() -> Vec<(&'static str, How, &'static [&'static str])> {
    let key_value = |b: &[u8], key: &str| {
        let mut needle = (key.len() as u64).to_le_bytes().to_vec();
        needle.extend_from_slice(key.as_bytes());
        after(b, &needle) + 4
    };
    vec![
        // ---- the header and metadata encoding
        ("bad magic", bytes(|b| patch(b, 0, b"GGUX")), &["bad magic"]),
        (
            "version 4",
            bytes(|b| patch(b, 4, &4u32.to_le_bytes())),
            &["version 4 is not supported"],
        ),
        (
            "tensor count u64::MAX",
            bytes(|b| patch(b, 8, &u64::MAX.to_le_bytes())),
            &["tensor count", "too large"],
        ),
        (
            "kv count u64::MAX",
            bytes(|b| patch(b, 16, &u64::MAX.to_le_bytes())),
            &["metadata kv count", "too large"],
        ),
        (
            "kv count one too many",
            bytes(|b| {
                let n = u64::from_le_bytes(b[16..24].try_into().unwrap());
                patch(b, 16, &(n + 1).to_le_bytes())
            }),
            &["tensor #0 name length", "larger than"],
        ),
        (
            "huge string length (general.name)",
            bytes(move |b| {
                let at = key_value(b, "general.name");
                patch(b, at, &(u64::MAX / 2).to_le_bytes())
            }),
            &["`general.name` value length", "larger than"],
        ),
        (
            "huge token array length",
            bytes(move |b| {
                let at = key_value(b, "tokenizer.ggml.tokens") + 4;
                patch(b, at, &(1u64 << 40).to_le_bytes())
            }),
            &["`tokenizer.ggml.tokens` value array length", "too large"],
        ),
        (
            "token array element type flipped to u64",
            bytes(move |b| {
                let at = key_value(b, "tokenizer.ggml.tokens");
                patch(b, at, &10u32.to_le_bytes())
            }),
            &["gguf"],
        ),
        (
            "duplicate key (bos renamed to eos)",
            bytes(|b| {
                let at = after(b, b"tokenizer.ggml.bos_token_id") - 12;
                patch(b, at, b"eos_token_id")
            }),
            &["`tokenizer.ggml.eos_token_id` is a duplicate"],
        ),
        (
            "alignment 48",
            bytes(move |b| {
                let mut p = GgufParts::valid();
                p.set("general.alignment", u32v(64));
                *b = p.bytes();
                let at = key_value(b, "general.alignment");
                patch(b, at, &48u32.to_le_bytes())
            }),
            &["general.alignment", "48 is not a non-zero power of two"],
        ),
        // ---- tensor infos
        (
            "tensor offset past the end",
            bytes(|b| {
                let at = offset_1d(b, "output_norm.weight");
                patch(b, at, &(1u64 << 40).to_le_bytes())
            }),
            &["tensor `output_norm.weight` data", "outside the file"],
        ),
        (
            "tensor offset unaligned",
            bytes(|b| {
                let at = offset_1d(b, "output_norm.weight");
                let off = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
                patch(b, at, &(off + 4).to_le_bytes())
            }),
            &[
                "tensor `output_norm.weight` offset",
                "not a multiple of the alignment",
            ],
        ),
        (
            "tensor dim grown past the file",
            bytes(|b| {
                let at = info_at(b, "output_norm.weight") + 4;
                patch(b, at, &(1u64 << 30).to_le_bytes())
            }),
            &["tensor `output_norm.weight` data", "outside the file"],
        ),
        (
            "tensor type flipped to 99",
            bytes(|b| {
                let at = info_at(b, "output_norm.weight") + 12;
                patch(b, at, &99u32.to_le_bytes())
            }),
            &["tensor `output_norm.weight` type 99"],
        ),
        (
            "tensor n_dims 5",
            bytes(|b| {
                let at = info_at(b, "output_norm.weight");
                patch(b, at, &5u32.to_le_bytes())
            }),
            &["n_dims 5"],
        ),
        (
            "duplicate tensor name",
            bytes(|b| {
                let at = after(b, b"blk.1.ffn_up.weight") - 15;
                patch(b, at, b"0")
            }),
            &["`blk.0.ffn_up.weight` is a duplicate"],
        ),
        // ---- the config
        (
            "no architecture",
            edit(|p| {
                p.set("general.architecture", None);
            }),
            &["general.architecture"],
        ),
        (
            "unknown architecture",
            edit(|p| {
                p.set("general.architecture", sv("gptj"));
            }),
            &["gptj"],
        ),
        (
            "block_count missing",
            edit(|p| {
                p.set("llama.block_count", None);
            }),
            &["`llama.block_count` is missing or not an integer"],
        ),
        (
            "block_count a string",
            edit(|p| {
                p.set("llama.block_count", sv("2"));
            }),
            &["`llama.block_count` is missing or not an integer"],
        ),
        (
            "block_count 0",
            edit(|p| {
                p.set("llama.block_count", u32v(0));
            }),
            &["n_layers is 0"],
        ),
        (
            "block_count one more than the tensors",
            edit(|p| {
                p.set("llama.block_count", u32v(3));
            }),
            &["missing tensor `blk.2.attn_norm.weight`"],
        ),
        (
            "block_count 2^24",
            edit(|p| {
                p.set("llama.block_count", u32v(1 << 24));
            }),
            &["claims 16777216 layers", "only"],
        ),
        (
            "head_count 0",
            edit(|p| {
                p.set("llama.attention.head_count", u32v(0));
            }),
            &["n_heads is 0"],
        ),
        (
            "head_count_kv not dividing head_count",
            edit(|p| {
                p.set("llama.attention.head_count_kv", u32v(3));
            }),
            &["n_heads 4 is not a multiple of n_kv_heads 3"],
        ),
        (
            "head_dim odd",
            edit(|p| {
                p.set("llama.attention.key_length", u32v(15));
            }),
            &["head_dim 15 is odd"],
        ),
        (
            "head_dim not dividing the hidden size",
            edit(|p| {
                p.set("llama.attention.key_length", None);
                p.set("llama.attention.head_count", u32v(6));
                p.set("llama.attention.head_count_kv", u32v(6));
            }),
            &["64 is not a multiple of", "head_count", "6"],
        ),
        (
            "head_dim inconsistent with the weights",
            edit(|p| {
                p.set("llama.attention.key_length", u32v(32));
            }),
            &["blk.0.attn_q.weight", "has shape"],
        ),
        (
            "embedding_length inconsistent with the weights",
            edit(|p| {
                p.set("llama.embedding_length", u32v(128));
            }),
            &["has shape", "expected"],
        ),
        (
            "rope theta NaN",
            edit(|p| {
                p.set("llama.rope.freq_base", Some(MetaValue::F32(f32::NAN)));
            }),
            &["rope theta NaN is invalid"],
        ),
        (
            "rms eps negative",
            edit(|p| {
                p.set(
                    "llama.attention.layer_norm_rms_epsilon",
                    Some(MetaValue::F32(-1.0)),
                );
            }),
            &["rms eps -1 is invalid"],
        ),
        (
            "context_length 0",
            edit(|p| {
                p.set("llama.context_length", u32v(0));
            }),
            &["max_ctx is 0"],
        ),
        // ---- the weights
        (
            "tensor missing",
            edit(|p| {
                p.remove_tensor("blk.1.ffn_down.weight");
            }),
            &["missing tensor `blk.1.ffn_down.weight`"],
        ),
        (
            "tensor with transposed shape",
            edit(|p| {
                let t = p.tensor("blk.0.ffn_up.weight");
                t.dtype = DType::F32;
                t.dims = vec![128, 64];
                t.data = vec![0; 128 * 64 * 4];
            }),
            &[
                "blk.0.ffn_up.weight",
                "has shape [64, 128], expected [128, 64]",
            ],
        ),
        (
            "embedding rows fewer than the tokenizer's tokens",
            edit(|p| {
                let t = p.tensor("token_embd.weight");
                t.dims = vec![64, 200];
                t.data.truncate(200 * 68);
            }),
            &["the tokenizer has 260 tokens", "200"],
        ),
        (
            "rope_freqs of the wrong length",
            edit(|p| {
                p.tensors.push(crate::tiny_files::GgufTensor {
                    name: "rope_freqs.weight".into(),
                    dtype: DType::F32,
                    dims: vec![3],
                    data: vec![0; 12],
                });
            }),
            &["rope_freqs.weight has 3 values, expected 8"],
        ),
        // ---- the tokenizer
        (
            "tokenizer tokens missing",
            edit(|p| {
                p.set("tokenizer.ggml.tokens", None);
            }),
            &["tokenizer.ggml.tokens is missing"],
        ),
        (
            "tokenizer model unknown",
            edit(|p| {
                p.set("tokenizer.ggml.model", sv("bert"));
            }),
            &["unsupported tokenizer model \"bert\""],
        ),
        (
            "tokenizer tokens of the wrong type",
            edit(|p| {
                let n = crate::tiny_files::VOCAB;
                p.set(
                    "tokenizer.ggml.tokens",
                    Some(MetaValue::Array(vec![MetaValue::U32(1); n])),
                );
            }),
            &["tokenizer.ggml.tokens"],
        ),
        (
            "token_type of the wrong length",
            edit(|p| {
                p.set(
                    "tokenizer.ggml.token_type",
                    Some(MetaValue::Array(vec![MetaValue::I32(1); 7])),
                );
            }),
            &["token_type has 7 entries but tokenizer.ggml.tokens has 260"],
        ),
        (
            "merge of an unknown token",
            edit(|p| {
                p.set(
                    "tokenizer.ggml.merges",
                    Some(MetaValue::Array(vec![MetaValue::Str("a zz".into())])),
                );
            }),
            &["references unknown token \"zz\""],
        ),
        (
            "eos id out of range",
            edit(|p| {
                p.set("tokenizer.ggml.eos_token_id", u32v(1000));
            }),
            &["tokenizer.ggml.eos_token_id", "1000"],
        ),
        (
            "token listed twice",
            edit(|p| {
                if let Some((_, MetaValue::Array(t))) = p
                    .meta
                    .iter_mut()
                    .find(|(k, _)| k == "tokenizer.ggml.tokens")
                {
                    t[256] = MetaValue::Str("a".into());
                }
            }),
            &["holds \"a\" twice"],
        ),
        // ---- the chat template
        (
            "chat template syntax error",
            edit(|p| {
                p.set("tokenizer.chat_template", sv("{% for m in messages %}"));
            }),
            &["template"],
        ),
        (
            "chat template not a string",
            edit(|p| {
                p.set("tokenizer.chat_template", u32v(7));
            }),
            &["tokenizer.chat_template must be a string"],
        ),
        (
            "chat template that never ends",
            edit(|p| {
                p.set(
                    "tokenizer.chat_template",
                    sv("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
                );
            }),
            // Fuel stops it first on an idle machine; the render time limit on a loaded one.
            &["fuel|time limit"],
        ),
        (
            "chat template with huge output",
            edit(|p| {
                p.set(
                    "tokenizer.chat_template",
                    sv("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}"),
                );
            }),
            &["limit"],
        ),
        (
            "chat template reading a file",
            edit(|p| {
                p.set("tokenizer.chat_template", sv("{% include '/etc/passwd' %}"));
            }),
            &["template"],
        ),
    ]
}

/// Loads `path` through the whole path, checking the error and the largest allocation; the
/// error text, or what was wrong.
fn check_error(name: &str, path: &Path, words: &[&str]) -> Result<String, String> {
    let len = std::fs::metadata(path)
        .map(|m| m.len() as usize)
        .unwrap_or(0);
    let (r, largest) = largest_alloc(|| load_whole(path));
    if largest > alloc_bound(len) {
        return Err(format!(
            "{name}: allocated {largest} bytes for a {len}-byte file"
        ));
    }
    match r {
        // A word `a|b` is satisfied by either alternative.
        Err(msg) => match words
            .iter()
            .find(|w| !w.split('|').any(|alt| msg.contains(alt)))
        {
            Some(w) => Err(format!("{name}: `{msg}` lacks `{w}`")),
            None => Ok(msg),
        },
        Ok(s) => Err(format!("{name}: the damaged model loaded and served {s:?}")),
    }
}

fn expect_error(name: &str, path: &Path, words: &[&str]) -> String {
    check_error(name, path, words).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn valid_tiny_gguf_loads_and_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("ok.gguf");
    GgufParts::valid().write(&p);
    let s = load_whole(&p).expect("the base model loads");
    assert_eq!(s.tokens.len(), 3, "{s:?}");
    assert_eq!(s.error, None);
}

#[test]
fn damaged_gguf_models_give_clean_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = table();
    let mut names = std::collections::HashSet::new();
    let mut failed = Vec::new();
    let mut n = 0;
    for (name, how, words) in cases {
        assert!(names.insert(name), "case `{name}` repeated");
        let path = dir.path().join(format!("case{n}.gguf"));
        n += 1;
        match how {
            How::Edit(f) => {
                let mut p = GgufParts::valid();
                f(&mut p);
                p.write(&path);
            }
            How::Bytes(f) => {
                let mut b = GgufParts::valid().bytes();
                f(&mut b);
                std::fs::write(&path, &b).expect("write");
            }
        }
        match check_error(name, &path, words) {
            Ok(msg) => eprintln!("{name}: {msg}"),
            Err(e) => failed.push(e),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert!(n >= 30, "only {n} cases");
    eprintln!("{n} damaged GGUF files, each a clean error");
}

/// Every truncation of the file (header, metadata, tensor infos, data): a clean error.
#[test]
fn truncated_gguf_models_give_clean_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = GgufParts::valid().bytes();
    let data_start = memra_engine::formats::gguf::Gguf::from_bytes(&full, Path::new("m.gguf"))
        .expect("valid")
        .data_offset() as usize;
    let mut cuts: Vec<usize> = (0..64).collect();
    cuts.extend((64..data_start).step_by(997));
    cuts.extend((data_start..full.len()).step_by(full.len() / 40));
    cuts.push(full.len() - 1);
    eprintln!("{} truncations of a {}-byte file", cuts.len(), full.len());
    for cut in cuts {
        let p = dir.path().join("cut.gguf");
        std::fs::write(&p, &full[..cut]).expect("write");
        expect_error(&format!("cut at {cut}"), &p, &[]);
    }
}

/// A split model with its second part gone; then a part from another model.
#[test]
fn split_gguf_with_a_part_missing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = GgufParts::valid();
    let paths = write_gguf_split(&dir.path().join("m"), 2, &p.meta, &p.data()).expect("split");
    assert!(load_whole(&paths[0]).is_ok(), "the whole split model loads");
    std::fs::remove_file(&paths[1]).expect("remove part 2");
    let msg = expect_error("part 2 missing", &paths[0], &["m-00002-of-00002.gguf"]);
    assert!(msg.to_lowercase().contains("no such file"), "{msg}");
}

/// Damage the engine accepts: an unused extra tensor, and NaN/Inf weights (a valid file with bad
/// numbers; `memra-verify inspect --scan` reports them). Loading and one request still work.
#[test]
fn accepted_damage_loads_and_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut extra = GgufParts::valid();
    extra.tensors.push(crate::tiny_files::GgufTensor {
        name: "blk.0.unused.weight".into(),
        dtype: DType::F32,
        dims: vec![8],
        data: vec![0; 32],
    });
    let mut nan = GgufParts::valid();
    let norm = nan.tensor("blk.0.attn_norm.weight");
    norm.data[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    norm.data[4..8].copy_from_slice(&f32::INFINITY.to_le_bytes());
    for (name, parts) in [("extra tensor", extra), ("NaN and Inf weights", nan)] {
        let p = dir.path().join("accepted.gguf");
        parts.write(&p);
        let s = load_whole(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            s.tokens.len() == 3 || s.error.is_some(),
            "{name}: the request neither finished nor failed: {s:?}"
        );
    }
}
