//! GGUF reader and writer: the real SmolLM2 file, and writer -> reader round trips over every
//! metadata type, many tensor types, custom alignment and split files.

use std::path::PathBuf;

use memra_engine::formats::gguf::{Gguf, MetaValue};
use memra_engine::quant::DType;
use sha2::{Digest, Sha256};

/// The real test model: `MEMRA_TEST_MODEL` or the fetch-models.sh cache path.
fn real_model() -> PathBuf {
    let path = match std::env::var_os("MEMRA_TEST_MODEL") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/memra/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        }
    };
    assert!(
        path.is_file(),
        "test model {} is missing: run tools/fetch-models.sh",
        path.display()
    );
    path
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
