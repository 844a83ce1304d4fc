//! Small, complete, valid model files written to disk (a GGUF file and an HF safetensors folder:
//! 2 layers, hidden 64, a 260-token byte-level BPE and a ChatML template), and the whole load
//! path the binaries take (`load_model`, then `Engine::start` on the CPU and one request), for
//! the corrupt-model corpora to damage and load.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use memra_engine::Error;
use memra_engine::backend::Device;
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig, KvBudget};
use memra_engine::formats::gguf::MetaValue;
use memra_engine::formats::gguf_write::{TensorData, write_gguf};
use memra_engine::formats::safetensors::{HfFolderSpec, write_hf_folder};
use memra_engine::loader::load_model;
use memra_engine::models::ModelWeights;
use memra_engine::models::random::{random_weights, tiny_config};
use memra_engine::quant::DType;
use memra_engine::request::Event;
use memra_engine::testing::text_request;
use memra_engine::tokenizer::Tokenizer;

/// Tokens: the 256 byte symbols, "ab", then three control tokens.
pub const VOCAB: usize = 260;
pub const IM_START: u32 = 257;
pub const IM_END: u32 = 258;
pub const EOT: u32 = 259;

pub const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// GPT-2's byte -> printable character map.
pub fn gpt2_byte(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let extra = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + extra).unwrap_or('?')
}

fn s(v: &str) -> MetaValue {
    MetaValue::Str(v.to_string())
}

/// The tokenizer and chat-template metadata of the tiny GGUF.
pub fn tokenizer_meta() -> Vec<(String, MetaValue)> {
    let mut tokens: Vec<MetaValue> = (0..=255u8).map(|b| s(&gpt2_byte(b).to_string())).collect();
    for t in ["ab", "<|im_start|>", "<|im_end|>", "<|endoftext|>"] {
        tokens.push(s(t));
    }
    let mut types = vec![MetaValue::I32(1); 257];
    types.extend([MetaValue::I32(3), MetaValue::I32(3), MetaValue::I32(3)]);
    vec![
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("gpt2")),
        ("tokenizer.ggml.tokens".into(), MetaValue::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), MetaValue::Array(types)),
        (
            "tokenizer.ggml.merges".into(),
            MetaValue::Array(vec![s("a b")]),
        ),
        ("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(EOT)),
        ("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(IM_END)),
        ("tokenizer.chat_template".into(), s(CHATML)),
    ]
}

/// The config of both tiny models.
pub fn config() -> ModelConfig {
    tiny_config(Arch::Llama, VOCAB)
}

/// The model-shape metadata `ModelConfig::from_gguf` reads.
fn shape_meta(c: &ModelConfig) -> Vec<(String, MetaValue)> {
    let u = |v: usize| MetaValue::U32(v as u32);
    vec![
        ("general.architecture".into(), s("llama")),
        ("general.name".into(), s("tiny corrupt-corpus base")),
        ("llama.context_length".into(), u(c.max_ctx)),
        ("llama.embedding_length".into(), u(c.hidden)),
        ("llama.block_count".into(), u(c.n_layers)),
        ("llama.feed_forward_length".into(), u(c.ffn)),
        ("llama.attention.head_count".into(), u(c.n_heads)),
        ("llama.attention.head_count_kv".into(), u(c.n_kv_heads)),
        ("llama.attention.key_length".into(), u(c.head_dim)),
        ("llama.rope.freq_base".into(), MetaValue::F32(c.rope_theta)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            MetaValue::F32(c.rms_eps),
        ),
    ]
}

/// One GGUF tensor: name, type, dims in ggml order (row length first), bytes.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    pub name: String,
    pub dtype: DType,
    pub dims: Vec<u64>,
    pub data: Vec<u8>,
}

/// A GGUF file before it is written: metadata and tensors, each editable by a case.
#[derive(Clone, Debug)]
pub struct GgufParts {
    pub meta: Vec<(String, MetaValue)>,
    pub tensors: Vec<GgufTensor>,
}

impl GgufTensor {
    /// Every tensor of `w` under its GGUF name.
    pub fn all_of(w: &ModelWeights) -> Vec<GgufTensor> {
        w.iter()
            .map(|(role, t)| GgufTensor {
                name: role.gguf_name(),
                dtype: t.dtype,
                dims: t.shape.iter().rev().map(|&d| d as u64).collect(),
                data: t.data.to_vec(),
            })
            .collect()
    }
}

impl GgufParts {
    /// The valid tiny model: q8_0 matrices, f32 norms and a tied embedding.
    pub fn valid() -> GgufParts {
        let c = config();
        let w = random_weights(&c, 7, DType::Q8_0).expect("random weights");
        let tensors = GgufTensor::all_of(&w);
        let mut meta = shape_meta(&c);
        meta.extend(tokenizer_meta());
        GgufParts { meta, tensors }
    }

    /// Sets (`Some`) or removes (`None`) a metadata key, keeping its place when it exists.
    pub fn set(&mut self, key: &str, v: Option<MetaValue>) -> &mut Self {
        match (self.meta.iter().position(|(k, _)| k == key), v) {
            (Some(i), Some(v)) => self.meta[i].1 = v,
            (Some(i), None) => {
                self.meta.remove(i);
            }
            (None, Some(v)) => self.meta.push((key.to_string(), v)),
            (None, None) => {}
        }
        self
    }

    pub fn tensor(&mut self, name: &str) -> &mut GgufTensor {
        self.tensors
            .iter_mut()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("the base model has no tensor {name}"))
    }

    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|t| t.name != name);
        self
    }

    /// The tensors as the engine's GGUF writer takes them.
    pub fn data(&self) -> Vec<TensorData<'_>> {
        let t = self.tensors.iter();
        t.map(|t| {
            (
                t.name.as_str(),
                t.dtype,
                t.dims.as_slice(),
                t.data.as_slice(),
            )
        })
        .collect()
    }

    /// Writes the file with the engine's GGUF writer.
    pub fn write(&self, path: &Path) {
        write_gguf(path, &self.meta, &self.data()).expect("write the GGUF");
    }

    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("m.gguf");
        self.write(&p);
        std::fs::read(&p).expect("read back")
    }
}

/// The position right after the first occurrence of `needle` in `bytes`.
pub fn after(bytes: &[u8], needle: &[u8]) -> usize {
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + needle.len())
        .unwrap_or_else(|| panic!("{:?} is not in the file", String::from_utf8_lossy(needle)))
}

/// Overwrites `bytes[at..at + new.len()]`.
pub fn patch(bytes: &mut [u8], at: usize, new: &[u8]) {
    bytes[at..at + new.len()].copy_from_slice(new);
}

/// The valid tiny HF folder's parts (f32 tensors under HF names, config.json, tokenizer.json and
/// tokenizer_config.json with the chat template), sharded when `max_shard_bytes` is small.
pub struct HfParts {
    pub config_json: serde_json::Value,
    pub tokenizer_json: String,
    pub tokenizer_config_json: serde_json::Value,
    pub tensors: Vec<(String, memra_engine::weights::Tensor)>,
    pub max_shard_bytes: u64,
}

impl HfParts {
    pub fn valid() -> HfParts {
        let c = config();
        let w = random_weights(&c, 7, DType::F32).expect("random weights");
        let tensors = w
            .iter()
            .map(|(r, t)| (r.hf_name(c.arch), t.clone()))
            .collect();
        let meta = tokenizer_meta();
        let tok =
            Tokenizer::from_gguf_metadata(|k| meta.iter().find(|(m, _)| m == k).map(|p| &p.1))
                .expect("tiny tokenizer");
        HfParts {
            config_json: c.to_hf_json(Some(EOT), Some(IM_END)),
            tokenizer_json: tok.to_hf_json().expect("tokenizer.json"),
            tokenizer_config_json: serde_json::json!({
                "chat_template": CHATML,
                "bos_token": "<|endoftext|>",
                "eos_token": "<|im_end|>",
                "add_bos_token": false,
            }),
            tensors,
            max_shard_bytes: 1 << 30,
        }
    }

    /// Writes the folder `dir/name` and returns its path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let out = dir.join(name);
        let spec = HfFolderSpec {
            config_json: self.config_json.clone(),
            tokenizer_json: Some(self.tokenizer_json.clone()),
            tokenizer_config_json: Some(self.tokenizer_config_json.clone()),
            max_shard_bytes: self.max_shard_bytes,
        };
        write_hf_folder(&out, &spec, &self.tensors).expect("write the HF folder");
        out
    }
}

/// What a load through the whole path gave.
#[derive(Debug)]
pub struct Served {
    /// Tokens of one greedy request (3 tokens at most).
    pub tokens: Vec<u32>,
    /// The request's error event, if it failed.
    pub error: Option<String>,
}

/// Loads `path` the way memra-server and run-gen do (`load_model`, then the engine on the CPU
/// backend with a fixed small KV pool), renders and tokenizes a chat prompt, and runs one short
/// greedy request. Every error is the `Display` text the server would print.
pub fn load_whole(path: &Path) -> Result<Served, String> {
    let m = load_model(path).map_err(|e| e.to_string())?;
    let prompt = match &m.chat {
        Some(t) => {
            let msgs = [memra_engine::chat::ChatMessage::new("user", "abc")];
            let text = t.render(&msgs, true).map_err(|e| e.to_string())?;
            m.tokenizer
                .encode(&text, false)
                .map_err(|e| e.to_string())?
        }
        None => m
            .tokenizer
            .encode("abc", false)
            .map_err(|e| e.to_string())?,
    };
    let cfg = EngineConfig {
        device: Device::Cpu,
        threads: 1,
        kv: KvBudget::Blocks(32),
        ..EngineConfig::default()
    };
    let engine = Engine::start(vec![("m".into(), m, cfg)], AdmissionLimits::default())
        .map_err(|e: Error| e.to_string())?;
    let req = text_request(prompt, 3);
    let mut served = Served {
        tokens: Vec::new(),
        error: None,
    };
    let mut stream = match engine.submit(req) {
        Ok(s) => s,
        Err(e) => {
            engine.shutdown();
            return Err(e.to_string());
        }
    };
    while let Some(ev) = stream.blocking_recv() {
        match ev {
            Event::Token(t) => served.tokens.push(t.id),
            Event::Error(e) => served.error = Some(e),
            Event::Text(_) | Event::Done { .. } => {}
        }
    }
    engine.shutdown();
    Ok(served)
}
