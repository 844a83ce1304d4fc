//! GGUF reader and writer: the real SmolLM2 file, and writer -> reader round trips over every
//! metadata type, many tensor types, custom alignment and split files.

use std::path::PathBuf;

use memra_engine::formats::gguf::{Gguf, MetaValue};
use memra_engine::quant::DType;
use sha2::{Digest, Sha256};

/// The real test model (`MEMRA_TEST_MODEL` or the fetch-models.sh cache path).
fn real_model() -> PathBuf {
    memra_engine::testing::real_model()
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Facts of the real file, checked against values read by the independent `gguf` Python package.
#[test]
fn real_smollm2_file() {
    let g = Gguf::open(&real_model()).expect("open SmolLM2 GGUF");
    assert_eq!(g.version, 3);
    assert_eq!(g.tensors().len(), 272);
    assert_eq!(g.metadata().len(), 33);
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.data_offset(), 1_785_664);
    assert_eq!(g.get_str("general.architecture"), Some("llama"));
    assert_eq!(g.get("llama.block_count"), Some(&MetaValue::U32(30)));
    assert_eq!(g.get_u32("llama.embedding_length"), Some(576));
    assert_eq!(g.get_u32("llama.attention.head_count_kv"), Some(3));
    assert_eq!(
        g.get("llama.rope.freq_base"),
        Some(&MetaValue::F32(100000.0))
    );
    assert_eq!(
        g.get("tokenizer.ggml.add_bos_token"),
        Some(&MetaValue::Bool(false))
    );
    assert_eq!(g.get_str("tokenizer.ggml.model"), Some("gpt2"));
    assert_eq!(g.get_str("tokenizer.ggml.pre"), Some("smollm"));
    assert_eq!(
        g.get("general.languages"),
        Some(&MetaValue::Array(vec![MetaValue::Str("en".into())]))
    );

    let tokens = g.get_str_array("tokenizer.ggml.tokens").expect("tokens");
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[0], "<|endoftext|>");
    assert_eq!(tokens[1], "<|im_start|>");
    assert_eq!(tokens[100], "t");
    assert_eq!(tokens[49151], "ectable");
    let merges = g.get_str_array("tokenizer.ggml.merges").expect("merges");
    assert_eq!(merges.len(), 48900);
    assert_eq!(merges[0], "Ġ t");
    let types = g
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array())
        .expect("types");
    assert_eq!(types.len(), 49152);
    assert_eq!(types[0], MetaValue::I32(3));
    assert!(
        g.get_str("tokenizer.chat_template")
            .unwrap_or("")
            .contains("<|im_start|>")
    );

    let emb = g.tensor_info("token_embd.weight").expect("token_embd");
    assert_eq!(emb.dtype, DType::Q8_0);
    assert_eq!(emb.dims, vec![576, 49152]);
    assert_eq!(emb.shape(), vec![49152, 576]);
    assert_eq!(emb.file, 0);
    assert_eq!(emb.offset, 1_785_664);
    assert_eq!(emb.nbytes, 30_081_024);
    let t = g.tensor("token_embd.weight").expect("tensor view");
    assert_eq!(
        sha256_hex(&t.data),
        "0d728edd2a012d1663a6069567240d124c752bab88b6fcbe1a985eae428193c3"
    );

    let norm = g.tensor("blk.0.attn_norm.weight").expect("attn_norm");
    assert_eq!(norm.dtype, DType::F32);
    assert_eq!(norm.shape, vec![576]);
    assert_eq!(
        g.tensor_info("blk.0.attn_norm.weight").map(|t| t.offset),
        Some(31_866_688)
    );
    let v = norm.to_f32().expect("f32");
    let bits: Vec<u32> = v[..3].iter().map(|x| x.to_bits()).collect();
    assert_eq!(bits, vec![0x3c65_0000, 0x3cc3_0000, 0xbca2_0000]);
    assert_eq!(
        sha256_hex(&norm.data),
        "2469079d969a361823be8145fa36e15e4c1b933b5261d669357b3deead825cba"
    );
    let down = g.tensor_info("blk.0.ffn_down.weight").expect("ffn_down");
    assert_eq!(
        (down.dtype, down.dims.clone()),
        (DType::Q4_1, vec![1536, 576])
    );
    let last = g.tensors().last().expect("tensors");
    assert_eq!(last.name, "output_norm.weight");
    assert_eq!(
        g.tensor_bytes("output_norm.weight")
            .map(sha256_hex)
            .as_deref(),
        Some("3b87f8e27335e67fc08f159cabfd2d18f205d6c5b225a6f978153552bf01d559")
    );
    // Every tensor has a view of the right size.
    for info in g.tensors() {
        let t = g.tensor(&info.name).expect("every tensor has a view");
        assert_eq!(t.data.len() as u64, info.nbytes);
    }
}

use memra_engine::Error;
use memra_engine::formats::gguf_write::{GgufWriter, TensorData, write_gguf, write_gguf_split};

use memra_engine::testing::pseudo_bytes as bytes;

fn all_types_meta() -> Vec<(String, MetaValue)> {
    use MetaValue::*;
    let v = vec![
        ("t.u8", U8(255)),
        ("t.i8", I8(-128)),
        ("t.u16", U16(65535)),
        ("t.i16", I16(-32768)),
        ("t.u32", U32(u32::MAX)),
        ("t.i32", I32(i32::MIN)),
        ("t.f32", F32(-1.5e-7)),
        ("t.bool.true", Bool(true)),
        ("t.bool.false", Bool(false)),
        ("t.str", Str("héllo wörld ✓ 🦀".into())),
        ("t.str.empty", Str(String::new())),
        ("t.u64", U64(u64::MAX)),
        ("t.i64", I64(i64::MIN)),
        ("t.f64", F64(std::f64::consts::PI)),
        ("t.arr.u8", Array(vec![U8(0), U8(1), U8(255)])),
        ("t.arr.i16", Array(vec![I16(-1), I16(7)])),
        ("t.arr.f32", Array(vec![F32(0.5), F32(-2.0), F32(f32::MAX)])),
        ("t.arr.bool", Array(vec![Bool(true), Bool(false)])),
        (
            "t.arr.str",
            Array(vec![Str("a".into()), Str(String::new()), Str("ü".into())]),
        ),
        ("t.arr.u64", Array(vec![U64(1 << 40)])),
        ("t.arr.i64", Array(vec![I64(-5), I64(i64::MAX)])),
        ("t.arr.f64", Array(vec![F64(1e300)])),
        ("t.arr.empty", Array(vec![])),
        (
            "t.arr.nested",
            Array(vec![
                Array(vec![I32(1), I32(2), I32(3)]),
                Array(vec![]),
                Array(vec![I32(-4)]),
            ]),
        ),
        (
            "t.arr.nested3",
            Array(vec![Array(vec![Array(vec![Str("deep".into())])])]),
        ),
    ];
    v.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

#[test]
fn every_metadata_type_round_trips() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("meta.gguf");
    let meta = all_types_meta();
    let data = bytes(64 * 4, 1);
    write_gguf(&path, &meta, &[("w", DType::F32, &[64], &data)]).expect("write");
    let g = Gguf::open(&path).expect("read back");
    assert_eq!(g.version, 3);
    assert_eq!(g.metadata(), &meta[..]);
    assert_eq!(g.get("t.i64"), Some(&MetaValue::I64(i64::MIN)));
    assert_eq!(g.tensor_bytes("w"), Some(&data[..]));
    assert!(!dir.path().join("meta.gguf.tmp").exists());
}

#[test]
fn every_tensor_type_round_trips() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("types.gguf");
    let mut owned = Vec::new();
    for (i, dt) in DType::ALL.into_iter().enumerate() {
        let dims = vec![dt.block_size() as u64 * 2, 3, (i % 2 + 1) as u64];
        let n = dt.bytes_for(dims.iter().product()).expect("size") as usize;
        owned.push((format!("t{i}.{dt}"), dt, dims, bytes(n, i as u64 + 10)));
    }
    let tensors: Vec<TensorData<'_>> = owned
        .iter()
        .map(|(n, d, dims, b)| (n.as_str(), *d, &dims[..], &b[..]))
        .collect();
    write_gguf(&path, &[], &tensors).expect("write");
    let g = Gguf::open(&path).expect("read back");
    assert_eq!(g.tensors().len(), DType::ALL.len());
    for ((name, dt, dims, b), info) in owned.iter().zip(g.tensors()) {
        assert_eq!(&info.name, name);
        assert_eq!(info.dtype, *dt);
        assert_eq!(&info.dims, dims);
        assert_eq!(info.nbytes as usize, b.len());
        assert_eq!(info.offset % 32, 0, "{name} aligned");
        assert_eq!(g.tensor_bytes(name), Some(&b[..]), "{name} bytes");
        let t = g.tensor(name).expect("view");
        assert_eq!(
            t.shape,
            dims.iter().rev().map(|&d| d as usize).collect::<Vec<_>>()
        );
    }
}

#[test]
fn custom_alignment_round_trips() {
    for align in [1u32, 8, 64, 4096] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.gguf");
        let mut w = GgufWriter::new(align);
        w.add_meta("general.architecture", MetaValue::Str("llama".into()));
        let a = bytes(34 * 3, 2);
        let b = bytes(4 * 5, 3);
        w.add_tensor("a", DType::Q8_0, &[32, 3]).expect("decl a");
        w.add_tensor("b", DType::F32, &[5]).expect("decl b");
        let mut d = w.begin(&path).expect("begin");
        d.write_tensor(&a).expect("a");
        d.write_tensor(&b).expect("b");
        d.finish().expect("finish");
        let g = Gguf::open(&path).expect("read");
        assert_eq!(g.alignment(), align as u64);
        let expect_key = (align != 32).then_some(MetaValue::U32(align));
        assert_eq!(g.get("general.alignment"), expect_key.as_ref());
        assert_eq!(g.data_offset() % align as u64, 0);
        for t in g.tensors() {
            assert_eq!(
                t.offset % align as u64,
                0,
                "align {align} tensor {}",
                t.name
            );
        }
        assert_eq!(g.tensor_bytes("a"), Some(&a[..]));
        assert_eq!(g.tensor_bytes("b"), Some(&b[..]));
    }
}

#[test]
fn split_files_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let meta = all_types_meta();
    let owned: Vec<(String, Vec<u64>, Vec<u8>)> = (0..7)
        .map(|i| {
            (
                format!("blk.{i}.w"),
                vec![32, i + 1],
                bytes(34 * (i as usize + 1), i),
            )
        })
        .collect();
    let tensors: Vec<TensorData<'_>> = owned
        .iter()
        .map(|(n, dims, b)| (n.as_str(), DType::Q8_0, &dims[..], &b[..]))
        .collect();
    for n_parts in [1u32, 3, 9] {
        let prefix = dir.path().join(format!("model{n_parts}"));
        let paths = write_gguf_split(&prefix, n_parts, &meta, &tensors).expect("split write");
        assert_eq!(paths.len(), n_parts as usize);
        let first = dir
            .path()
            .join(format!("model{n_parts}-00001-of-{n_parts:05}.gguf"));
        assert_eq!(paths[0], first);
        for open_path in [&paths[0], &paths[paths.len() - 1]] {
            let g = Gguf::open(open_path).expect("open split");
            assert_eq!(g.paths(), &paths[..]);
            assert_eq!(
                g.get("t.arr.nested"),
                meta.iter()
                    .find(|(k, _)| k == "t.arr.nested")
                    .map(|(_, v)| v)
            );
            assert_eq!(g.get_u64("split.count"), Some(n_parts as u64));
            assert_eq!(g.get_u64("split.no"), Some(0));
            assert_eq!(g.get_u64("split.tensors.count"), Some(7));
            assert_eq!(g.tensors().len(), 7);
            let files: std::collections::BTreeSet<usize> =
                g.tensors().iter().map(|t| t.file).collect();
            assert!(files.iter().all(|&f| f < n_parts as usize));
            if n_parts <= 3 {
                assert_eq!(files.len(), n_parts as usize, "every part holds tensors");
            }
            for (name, dims, b) in &owned {
                let info = g.tensor_info(name).expect("tensor");
                assert_eq!(&info.dims, dims);
                assert_eq!(g.tensor_bytes(name), Some(&b[..]));
                assert_eq!(g.tensor(name).map(|t| t.data.to_vec()), Some(b.clone()));
            }
        }
        // Each later part is a complete GGUF file with only split metadata.
        if n_parts > 1 {
            let data = std::fs::read(&paths[1]).expect("part 2");
            let part = Gguf::from_bytes(&data, &paths[1]).expect("part 2 alone");
            assert_eq!(part.get_u64("split.no"), Some(1));
            assert!(part.get("t.u8").is_none());
        }
    }
}

#[test]
fn split_part_missing_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = bytes(4 * 8, 5);
    let tensors: Vec<TensorData<'_>> =
        vec![("a", DType::F32, &[8], &b), ("b", DType::F32, &[8], &b)];
    let paths = write_gguf_split(&dir.path().join("m"), 2, &[], &tensors).expect("write");
    std::fs::remove_file(&paths[1]).expect("remove part 2");
    match Gguf::open(&paths[0]) {
        Err(Error::Io { path, .. }) => assert_eq!(path, paths[1]),
        other => panic!("expected an I/O error naming part 2, got {:?}", other.err()),
    }
}

fn no_files_left(dir: &std::path::Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

fn expect_input_err(r: Result<(), Error>, words: &str) {
    match r {
        Err(Error::Input(m)) => assert!(m.contains(words), "`{m}` lacks `{words}`"),
        other => panic!("expected an input error with `{words}`, got {other:?}"),
    }
}

#[test]
fn writer_rejects_bad_input_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.gguf");

    // Wrong byte count: error, no .tmp and no final file.
    let mut w = GgufWriter::new(32);
    w.add_tensor("a", DType::Q4_0, &[64, 2]).expect("decl");
    let mut d = w.begin(&path).expect("begin");
    expect_input_err(d.write_tensor(&[0u8; 10]), "needs 72 bytes, got 10");
    drop(d);
    no_files_left(dir.path());

    // Finish before all tensors are written.
    let mut w = GgufWriter::new(32);
    w.add_tensor("a", DType::F32, &[4]).expect("decl");
    w.add_tensor("b", DType::F32, &[4]).expect("decl");
    let mut d = w.begin(&path).expect("begin");
    d.write_tensor(&[0u8; 16]).expect("a");
    expect_input_err(
        d.finish(),
        "finish after 1 of 2 tensors (next: `b`, 0 bytes of it written)",
    );
    no_files_left(dir.path());

    // Too many tensors written.
    let mut w = GgufWriter::new(32);
    w.add_tensor("a", DType::F32, &[1]).expect("decl");
    let mut d = w.begin(&path).expect("begin");
    d.write_tensor(&[0u8; 4]).expect("a");
    expect_input_err(d.write_tensor(&[0u8; 4]), "more often than the 1 declared");
    drop(d);
    no_files_left(dir.path());

    // Declarations.
    let mut w = GgufWriter::new(32);
    expect_input_err(w.add_tensor("", DType::F32, &[1]), "name is empty");
    expect_input_err(w.add_tensor("a", DType::F32, &[]), "has 0 dims");
    expect_input_err(
        w.add_tensor("a", DType::F32, &[1, 1, 1, 1, 1]),
        "has 5 dims",
    );
    expect_input_err(w.add_tensor("a", DType::F32, &[4, 0]), "dim 1 is 0");
    expect_input_err(
        w.add_tensor("a", DType::Q4_K, &[255]),
        "not a multiple of the q4_k block size 256",
    );
    expect_input_err(
        w.add_tensor("a", DType::F32, &[1 << 62, 1 << 62]),
        "byte size overflows",
    );
    w.add_tensor("a", DType::F32, &[1]).expect("ok");
    expect_input_err(w.add_tensor("a", DType::F32, &[1]), "declared twice");

    type Case = (u32, Vec<(&'static str, MetaValue)>, &'static str);
    let cases: Vec<Case> = vec![
        (3, vec![], "alignment 3 is not a non-zero power of two"),
        (0, vec![], "alignment 0 is not a non-zero power of two"),
        (
            32,
            vec![("k", MetaValue::U8(1)), ("k", MetaValue::U8(2))],
            "`k` added twice",
        ),
        (32, vec![("", MetaValue::U8(1))], "key is empty"),
        (
            64,
            vec![("general.alignment", MetaValue::U32(32))],
            "differs from the writer alignment 64",
        ),
        (
            32,
            vec![("general.alignment", MetaValue::U64(32))],
            "differs from the writer alignment 32",
        ),
        (
            32,
            vec![(
                "k",
                MetaValue::Array(vec![MetaValue::U8(1), MetaValue::I8(1)]),
            )],
            "mixed types",
        ),
        (
            32,
            vec![(
                "k",
                MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::Array(vec![
                    MetaValue::Array(vec![MetaValue::Array(vec![])]),
                ])])]),
            )],
            "nested deeper than 4",
        ),
    ];
    for (align, meta, words) in cases {
        let mut w = GgufWriter::new(align);
        for (k, v) in meta {
            w.add_meta(k, v);
        }
        expect_input_err(w.begin(&path).map(drop), words);
    }
    let mut w = GgufWriter::new(32);
    w.add_meta("split.count", MetaValue::U16(2));
    expect_input_err(
        w.begin_split(&dir.path().join("s"), 2).map(drop),
        "written by the split writer",
    );
    expect_input_err(
        GgufWriter::new(32)
            .begin_split(&dir.path().join("s"), 0)
            .map(drop),
        "not in 1..=65535",
    );
    no_files_left(dir.path());
}

/// Rewriting the real model's metadata and tensors reproduces the file byte for byte, and a
/// 3-part split of it reads back the same tensors.
#[test]
fn real_smollm2_rewrite_is_identical() {
    let src = real_model();
    let g = Gguf::open(&src).expect("open");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("copy.gguf");
    let mut w = GgufWriter::new(32);
    for (k, v) in g.metadata() {
        w.add_meta(k.clone(), v.clone());
    }
    for t in g.tensors() {
        w.add_tensor(t.name.clone(), t.dtype, &t.dims)
            .expect("declare");
    }
    let mut d = w.begin(&out).expect("begin");
    for t in g.tensors() {
        d.write_tensor(g.tensor_bytes(&t.name).expect("bytes"))
            .expect("write");
    }
    d.finish().expect("finish");
    let a = std::fs::read(&src).expect("read src");
    let b = std::fs::read(&out).expect("read copy");
    assert_eq!(a.len(), b.len());
    assert!(a == b, "rewritten file differs from the original");

    let tensors: Vec<TensorData<'_>> = g
        .tensors()
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.dtype,
                &t.dims[..],
                g.tensor_bytes(&t.name).unwrap_or(&[]),
            )
        })
        .collect();
    let paths =
        write_gguf_split(&dir.path().join("smol"), 3, g.metadata(), &tensors).expect("split");
    let s = Gguf::open(&paths[1]).expect("open split");
    assert_eq!(s.tensors().len(), 272);
    assert_eq!(
        s.get("tokenizer.ggml.tokens"),
        g.get("tokenizer.ggml.tokens")
    );
    for t in g.tensors() {
        assert_eq!(
            s.tensor_bytes(&t.name),
            g.tensor_bytes(&t.name),
            "{}",
            t.name
        );
    }
}

/// Writing tensors in chunks gives the same file as writing them whole, across split parts too.
#[test]
fn chunked_writes_match_whole_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = bytes(34 * 6, 7);
    let b = bytes(4 * 3, 8);
    let declare = || {
        let mut w = GgufWriter::new(64);
        w.add_meta("k", MetaValue::Str("v".into()));
        w.add_tensor("a", DType::Q8_0, &[64, 3]).expect("a");
        w.add_tensor("b", DType::F32, &[3]).expect("b");
        w
    };
    let mut d = declare()
        .begin(&dir.path().join("whole.gguf"))
        .expect("begin");
    d.write_tensor(&a).expect("a");
    d.write_tensor(&b).expect("b");
    d.finish().expect("finish");
    let mut d = declare()
        .begin(&dir.path().join("chunks.gguf"))
        .expect("begin");
    for c in a.chunks(50) {
        d.write_tensor_chunk(c).expect("chunk of a");
    }
    d.write_tensor_chunk(&[]).expect("empty chunk");
    d.write_tensor_chunk(&b[..5]).expect("chunk of b");
    expect_input_err(d.write_tensor(&b), "needs 12 bytes, got 17");
    expect_input_err(d.write_tensor_chunk(&b), "needs 12 bytes, got 17 so far");
    d.write_tensor_chunk(&b[5..]).expect("rest of b");
    d.finish().expect("finish");
    let whole = std::fs::read(dir.path().join("whole.gguf")).expect("whole");
    let chunks = std::fs::read(dir.path().join("chunks.gguf")).expect("chunks");
    assert!(whole == chunks, "chunked file differs");

    let mut d = declare()
        .begin_split(&dir.path().join("sp"), 2)
        .expect("split");
    d.write_tensor_chunk(&a[..100]).expect("part of a");
    expect_input_err(
        d.finish(),
        "finish after 0 of 2 tensors (next: `a`, 100 bytes of it written)",
    );
    let mut d = declare()
        .begin_split(&dir.path().join("sp"), 2)
        .expect("split");
    d.write_tensor_chunk(&a[..100]).expect("part of a");
    d.write_tensor_chunk(&a[100..]).expect("rest of a");
    for c in b.chunks(4) {
        d.write_tensor_chunk(c).expect("b");
    }
    d.finish().expect("finish");
    let g = Gguf::open(&dir.path().join("sp-00002-of-00002.gguf")).expect("open");
    assert_eq!(g.tensor_bytes("a"), Some(&a[..]));
    assert_eq!(g.tensor_bytes("b"), Some(&b[..]));
    assert_eq!(g.tensor_info("b").map(|t| t.file), Some(1));
    assert_eq!(g.alignment(), 64);
}
