//! ModelConfig: the shape and hyper-parameters of a model, from GGUF metadata or config.json.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::formats::gguf::Gguf;
pub use crate::models::Arch;

/// Llama 3 style RoPE frequency scaling.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: u32,
}

/// Gemma 3's own hyper-parameters: interleaved sliding-window (local) and global attention
/// layers, each kind with its own RoPE base.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gemma3Params {
    /// Local layers attend to the last `sliding_window` positions (the row's own included).
    pub sliding_window: usize,
    /// Every `sliding_window_pattern`-th layer (layer l with `(l + 1) % pattern == 0`) is global.
    pub sliding_window_pattern: usize,
    /// RoPE base of the local layers (`rope_theta` is the global layers').
    pub rope_local_theta: f32,
    /// Attention scores are scaled by `query_pre_attn_scalar^-0.5`.
    pub query_pre_attn_scalar: f32,
    /// Logits become `cap * tanh(logits / cap)` when set.
    pub final_logit_softcap: Option<f32>,
    /// Linear RoPE scaling of the global layers (positions divided by the factor), when set.
    pub rope_linear_factor: Option<f32>,
}

impl Gemma3Params {
    /// Checks the values are usable.
    pub fn validate(&self) -> Result<()> {
        let finite_pos = |v: f32| v.is_finite() && v > 0.0;
        if self.sliding_window == 0 || self.sliding_window_pattern == 0 {
            return Err(Error::Config(format!(
                "gemma3 sliding window {} / pattern {} must be positive",
                self.sliding_window, self.sliding_window_pattern
            )));
        }
        let floats = [
            ("rope local base", Some(self.rope_local_theta)),
            ("query_pre_attn_scalar", Some(self.query_pre_attn_scalar)),
            ("final logit softcap", self.final_logit_softcap),
            ("rope linear scaling factor", self.rope_linear_factor),
        ];
        for (name, v) in floats {
            if let Some(v) = v
                && !finite_pos(v)
            {
                return Err(Error::Config(format!("gemma3 {name} {v} is invalid")));
            }
        }
        Ok(())
    }

    /// Whether layer `l` is a global-attention layer.
    pub fn is_global(&self, l: usize) -> bool {
        (l + 1).is_multiple_of(self.sliding_window_pattern)
    }
}

/// A mixture-of-experts FFN's hyper-parameters (qwen3moe): every layer's FFN is `n_experts`
/// SwiGLU experts of `expert_ffn` each, of which a router picks `n_used` per token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeParams {
    pub n_experts: usize,
    /// Experts per token (top-k).
    pub n_used: usize,
    /// Intermediate size of one expert.
    pub expert_ffn: usize,
    /// Divide the top-k routing weights by their sum (HF `norm_topk_prob`).
    pub norm_topk: bool,
}

impl MoeParams {
    /// Checks the values are usable: at least one expert, `1 <= n_used <= n_experts`.
    pub fn validate(&self) -> Result<()> {
        if self.n_experts == 0 {
            return Err(Error::Config("MoE expert count is 0".into()));
        }
        if self.n_used == 0 || self.n_used > self.n_experts {
            return Err(Error::Config(format!(
                "MoE experts used per token {} must be in 1..={} (the expert count)",
                self.n_used, self.n_experts
            )));
        }
        if self.expert_ffn == 0 {
            return Err(Error::Config("MoE expert FFN size is 0".into()));
        }
        let big = [self.n_experts, self.expert_ffn];
        if big.iter().any(|&v| v > (1 << 24)) {
            return Err(Error::Config(format!(
                "MoE sizes {big:?} are implausibly large"
            )));
        }
        Ok(())
    }
}

/// A hybrid model's gated DeltaNet layers (qwen3next): every `full_attn_interval`-th layer
/// (layer l with `(l + 1) % full_attn_interval == 0`) is gated full attention with partial RoPE
/// over the first `rope_dim` values of each head; the others are linear attention with a
/// recurrent state (`n_k_heads` q/k heads of `head_k`, `n_v_heads` value heads of `head_v`, a
/// causal convolution of `conv_kernel` taps). Every FFN is a MoE with one shared expert of
/// `shared_ffn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HybridParams {
    pub conv_kernel: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub head_k: usize,
    pub head_v: usize,
    pub full_attn_interval: usize,
    pub rope_dim: usize,
    pub shared_ffn: usize,
}

impl HybridParams {
    /// Checks the values are usable against the attention's `head_dim`.
    pub fn validate(&self, head_dim: usize) -> Result<()> {
        let nz = [
            ("linear conv kernel", self.conv_kernel),
            ("linear key heads", self.n_k_heads),
            ("linear value heads", self.n_v_heads),
            ("linear key head size", self.head_k),
            ("linear value head size", self.head_v),
            ("full attention interval", self.full_attn_interval),
            ("rope dimension count", self.rope_dim),
            ("shared expert FFN size", self.shared_ffn),
        ];
        for (name, v) in nz {
            if v == 0 || v > (1 << 20) {
                return Err(Error::Config(format!(
                    "qwen3next {name} {v} is out of range"
                )));
            }
        }
        let max = crate::backend::state::MAX_CONV_KERNEL;
        if self.conv_kernel > max {
            return Err(Error::Config(format!(
                "qwen3next conv kernel {} is wider than the supported {max}",
                self.conv_kernel
            )));
        }
        if !self.n_v_heads.is_multiple_of(self.n_k_heads) {
            return Err(Error::Config(format!(
                "qwen3next linear value heads {} are not a multiple of the key heads {}",
                self.n_v_heads, self.n_k_heads
            )));
        }
        if !self.rope_dim.is_multiple_of(2) || self.rope_dim > head_dim {
            return Err(Error::Config(format!(
                "qwen3next rope dimension count {} must be even and at most head_dim {head_dim}",
                self.rope_dim
            )));
        }
        Ok(())
    }

    /// Whether layer `l` is a full-attention layer (else gated DeltaNet).
    pub fn is_attention(&self, l: usize) -> bool {
        (l + 1).is_multiple_of(self.full_attn_interval)
    }

    /// The shapes of the gated DeltaNet ops.
    pub fn delta(&self) -> crate::ops::DeltaParams {
        crate::ops::DeltaParams {
            n_k_heads: self.n_k_heads,
            n_v_heads: self.n_v_heads,
            head_k: self.head_k,
            head_v: self.head_v,
            conv_kernel: self.conv_kernel,
        }
    }
}

/// A Qwen-VL text model's own hyper-parameters (qwen2vl, qwen3vl): M-RoPE sections and
/// Qwen3-VL's deepstack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VlParams {
    /// Which rotary frequencies take which position axis (crate::ops::rope::Sections;
    /// crate::vision::mrope says the positions): contiguous for qwen2vl, interleaved for
    /// qwen3vl.
    pub sections: crate::ops::rope::Sections,
    /// Qwen3-VL's deepstack: an image row carries `deepstack` more parts of `hidden` values
    /// after its input embedding (the tower's deepstack mergers' rows), part `k + 1` added into
    /// the residual after layer `k` (GGUF `qwen3vl.n_deepstack_layers`). 0 for qwen2vl.
    pub deepstack: usize,
}

impl VlParams {
    /// Checks the sections cover the rotated pairs (`head_dim / 2`) and the deepstack layers
    /// exist; `key` names the sections' source in errors.
    pub fn validate(&self, arch: Arch, head_dim: usize, n_layers: usize, key: &str) -> Result<()> {
        let s = &self.sections;
        let half = head_dim / 2;
        if s.sizes.iter().sum::<usize>() != half {
            return Err(Error::Config(format!(
                "{key} {:?}: the sections must add up to the {half} rotated pairs of a head \
                 of {head_dim}",
                s.sizes
            )));
        }
        if s.interleaved != (arch == Arch::Qwen3Vl) {
            return Err(Error::Config(format!(
                "{key}: {} takes {} M-RoPE sections",
                arch.gguf_name(),
                if arch == Arch::Qwen3Vl {
                    "interleaved"
                } else {
                    "contiguous"
                }
            )));
        }
        if self.deepstack > n_layers || (arch != Arch::Qwen3Vl && self.deepstack > 0) {
            return Err(Error::Config(format!(
                "{} deepstack layers {} on a model of {n_layers} layers",
                arch.gguf_name(),
                self.deepstack
            )));
        }
        Ok(())
    }
}

/// The model's shape and hyper-parameters, shared by every format and backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub rope_theta: f32,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub rms_eps: f32,
    pub max_ctx: usize,
    pub tie_embeddings: bool,
    /// Set for (and only for) gemma3.
    #[serde(default)]
    pub gemma3: Option<Gemma3Params>,
    /// Set for (and only for) mixture-of-experts architectures (qwen3moe).
    #[serde(default)]
    pub moe: Option<MoeParams>,
    /// Multi-token-prediction layers after the `n_layers` decoder layers (GGUF
    /// `{arch}.nextn_predict_layers`, HF `num_nextn_predict_layers`): layer `n_layers + j`
    /// holds MTP module `j` (models/mtp.rs). 0 for most models.
    #[serde(default)]
    pub mtp_layers: usize,
    /// Set for (and only for) hybrid gated-DeltaNet architectures (qwen3next).
    #[serde(default)]
    pub hybrid: Option<HybridParams>,
    /// Set for (and only for) the Qwen-VL text architectures (qwen2vl, qwen3vl).
    #[serde(default)]
    pub vl: Option<VlParams>,
}

impl ModelConfig {
    /// Checks the values are usable (non-zero, divisible, bounded).
    pub fn validate(&self) -> Result<()> {
        let c = self;
        let nz = [
            ("n_layers", c.n_layers),
            ("hidden", c.hidden),
            ("n_heads", c.n_heads),
            ("n_kv_heads", c.n_kv_heads),
            ("head_dim", c.head_dim),
            ("ffn", c.ffn),
            ("vocab", c.vocab),
            ("max_ctx", c.max_ctx),
        ];
        for (name, v) in nz {
            if v == 0 {
                return Err(Error::Config(format!("{name} is 0")));
            }
            if v > (1 << 24) {
                return Err(Error::Config(format!("{name} = {v} is implausibly large")));
            }
        }
        if !c.n_heads.is_multiple_of(c.n_kv_heads) {
            return Err(Error::Config(format!(
                "n_heads {} is not a multiple of n_kv_heads {}",
                c.n_heads, c.n_kv_heads
            )));
        }
        if !c.head_dim.is_multiple_of(2) {
            return Err(Error::Config(format!("head_dim {} is odd", c.head_dim)));
        }
        if !(c.rope_theta.is_finite() && c.rope_theta > 0.0) {
            return Err(Error::Config(format!(
                "rope theta {} is invalid",
                c.rope_theta
            )));
        }
        if !(c.rms_eps.is_finite() && c.rms_eps > 0.0) {
            return Err(Error::Config(format!("rms eps {} is invalid", c.rms_eps)));
        }
        match (c.arch, &c.gemma3) {
            (Arch::Gemma3, Some(p)) => p.validate()?,
            (Arch::Gemma3, None) => {
                return Err(Error::Config("gemma3 config without its parameters".into()));
            }
            (_, Some(_)) => {
                return Err(Error::Config(format!(
                    "gemma3 parameters on a {} config",
                    c.arch.gguf_name()
                )));
            }
            (_, None) => {}
        }
        match (c.arch.is_moe(), &c.moe) {
            (true, Some(p)) => p.validate()?,
            (true, None) => {
                return Err(Error::Config(format!(
                    "{} config without its expert parameters",
                    c.arch.gguf_name()
                )));
            }
            (false, Some(_)) => {
                return Err(Error::Config(format!(
                    "expert parameters on a {} config",
                    c.arch.gguf_name()
                )));
            }
            (false, None) => {}
        }
        match (c.arch.is_recurrent(), &c.hybrid) {
            (true, Some(p)) => p.validate(c.head_dim)?,
            (true, None) => {
                return Err(Error::Config(format!(
                    "{} config without its linear-attention parameters",
                    c.arch.gguf_name()
                )));
            }
            (false, Some(_)) => {
                return Err(Error::Config(format!(
                    "linear-attention parameters on a {} config",
                    c.arch.gguf_name()
                )));
            }
            (false, None) => {}
        }
        match (c.arch.is_vl(), &c.vl) {
            (true, Some(p)) => p.validate(
                c.arch,
                c.head_dim,
                c.n_layers,
                &format!("{}.rope.dimension_sections", c.arch.gguf_name()),
            )?,
            (true, None) => {
                return Err(Error::Config(format!(
                    "{} config without its M-RoPE sections",
                    c.arch.gguf_name()
                )));
            }
            (false, Some(_)) => {
                return Err(Error::Config(format!(
                    "M-RoPE sections on a {} config",
                    c.arch.gguf_name()
                )));
            }
            (false, None) => {}
        }
        crate::models::mtp::validate(c)?;
        Ok(())
    }

    /// Values per input embedding row (an image row): `hidden`, times one plus the deepstack
    /// parts of a qwen3vl model.
    pub fn embed_width(&self) -> usize {
        self.hidden * (1 + self.vl.map_or(0, |v| v.deepstack))
    }

    /// Reads the config from GGUF metadata (`{arch}.block_count`, ...).
    pub fn from_gguf(g: &Gguf) -> Result<ModelConfig> {
        let arch_name = g
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| Error::Config("GGUF has no general.architecture".into()))?;
        let arch = Arch::from_gguf_name(arch_name)?;
        let a = arch.gguf_name();
        let uint = |key: &str| -> Result<usize> {
            let k = format!("{a}.{key}");
            g.get(&k)
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
                .ok_or_else(|| {
                    Error::Config(format!("GGUF metadata `{k}` is missing or not an integer"))
                })
        };
        let float = |key: &str| -> Option<f32> {
            g.get(&format!("{a}.{key}"))
                .and_then(|v| v.as_f64())
                .map(|v| v as f32)
        };
        let hidden = uint("embedding_length")?;
        let n_heads = uint("attention.head_count")?;
        let n_kv_heads = uint("attention.head_count_kv").unwrap_or(n_heads);
        let head_dim = match uint("attention.key_length") {
            Ok(v) => v,
            Err(_) if n_heads > 0 && hidden.is_multiple_of(n_heads) => hidden / n_heads,
            Err(_) if n_heads > 0 => {
                return Err(Error::Config(format!(
                    "`{a}.embedding_length` {hidden} is not a multiple of `{a}.attention.head_count` {n_heads} (and `{a}.attention.key_length` is not given)"
                )));
            }
            Err(e) => return Err(e),
        };
        let token_embd = g.tensor_info("token_embd.weight");
        let vocab = match g.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
            Some(t) => t.len(),
            None => token_embd
                .and_then(|t| t.dims.get(1).copied())
                .ok_or_else(|| Error::Config("cannot determine the vocabulary size".into()))?
                as usize,
        };
        let vocab = token_embd
            .and_then(|t| t.dims.get(1).copied())
            .map(|v| v as usize)
            .unwrap_or(vocab);
        let rope_scaling = match g
            .get(&format!("{a}.rope.scaling.type"))
            .and_then(|v| v.as_str())
        {
            Some("llama3") => Some(Llama3RopeScaling {
                factor: float("rope.scaling.factor").unwrap_or(8.0),
                low_freq_factor: float("rope.scaling.low_freq_factor").unwrap_or(1.0),
                high_freq_factor: float("rope.scaling.high_freq_factor").unwrap_or(4.0),
                original_max_position_embeddings: uint("rope.scaling.original_context_length")
                    .unwrap_or(8192) as u32,
            }),
            _ => None,
        };
        // llama.cpp counts the MTP (`nextn`) layers in `block_count`.
        let mtp_layers = uint("nextn_predict_layers").unwrap_or(0);
        let blocks = uint("block_count")?;
        let cfg = ModelConfig {
            arch,
            n_layers: blocks.checked_sub(mtp_layers).ok_or_else(|| {
                Error::Config(format!(
                    "`{a}.nextn_predict_layers` {mtp_layers} exceeds `{a}.block_count` {blocks}"
                ))
            })?,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn: uint("feed_forward_length")?,
            vocab,
            rope_theta: float("rope.freq_base").unwrap_or(10000.0),
            rope_scaling,
            rms_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            max_ctx: uint("context_length").unwrap_or(2048),
            tie_embeddings: g.tensor_info("output.weight").is_none(),
            gemma3: None,
            moe: None,
            mtp_layers,
            hybrid: None,
            vl: None,
        };
        let get = |k: &str| g.get(&format!("{a}.{k}"));
        let cfg = ModelConfig {
            gemma3: crate::models::gemma3::gguf_params(&cfg, &get)?,
            moe: crate::models::qwen3_moe::gguf_params(&cfg, &get)?,
            hybrid: crate::models::qwen3next::gguf_params(&cfg, &get)?,
            vl: crate::models::qwen2vl::gguf_params(&cfg, &get)?,
            ..cfg
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads the config from an HF `config.json` value.
    pub fn from_hf_json(v: &serde_json::Value) -> Result<ModelConfig> {
        let class = v
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(|a| a.as_str())
            .ok_or_else(|| Error::Config("config.json has no `architectures`".into()))?;
        let arch = Arch::from_hf_class(class)?;
        let uint = |key: &str| -> Result<usize> {
            v.get(key)
                .and_then(|x| x.as_u64())
                .map(|x| x as usize)
                .ok_or_else(|| {
                    Error::Config(format!("config.json `{key}` is missing or not an integer"))
                })
        };
        let float = |key: &str| v.get(key).and_then(|x| x.as_f64()).map(|x| x as f32);
        let hidden = uint("hidden_size")?;
        let n_heads = uint("num_attention_heads")?;
        let rope_scaling = match v.get("rope_scaling") {
            Some(rs)
                if rs
                    .get("rope_type")
                    .or_else(|| rs.get("type"))
                    .and_then(|t| t.as_str())
                    == Some("llama3") =>
            {
                let f = |k: &str, d: f64| rs.get(k).and_then(|x| x.as_f64()).unwrap_or(d) as f32;
                Some(Llama3RopeScaling {
                    factor: f("factor", 8.0),
                    low_freq_factor: f("low_freq_factor", 1.0),
                    high_freq_factor: f("high_freq_factor", 4.0),
                    original_max_position_embeddings: rs
                        .get("original_max_position_embeddings")
                        .and_then(|x| x.as_u64())
                        .unwrap_or(8192)
                        as u32,
                })
            }
            _ => None,
        };
        let cfg = ModelConfig {
            arch,
            n_layers: uint("num_hidden_layers")?,
            hidden,
            n_heads,
            n_kv_heads: uint("num_key_value_heads").unwrap_or(n_heads),
            head_dim: match uint("head_dim") {
                Ok(v) => v,
                Err(_) if n_heads > 0 && !hidden.is_multiple_of(n_heads) => {
                    return Err(Error::Config(format!(
                        "hidden_size {hidden} is not a multiple of num_attention_heads {n_heads} (and head_dim is not given)"
                    )));
                }
                Err(_) => hidden / n_heads.max(1),
            },
            ffn: uint("intermediate_size")?,
            vocab: uint("vocab_size")?,
            rope_theta: float("rope_theta").unwrap_or(10000.0),
            rope_scaling,
            rms_eps: float("rms_norm_eps").unwrap_or(1e-6),
            max_ctx: uint("max_position_embeddings").unwrap_or(2048),
            tie_embeddings: v
                .get("tie_word_embeddings")
                .and_then(|x| x.as_bool())
                .unwrap_or(false),
            gemma3: None,
            moe: None,
            mtp_layers: uint("num_nextn_predict_layers").unwrap_or(0),
            hybrid: None,
            vl: None,
        };
        let cfg = ModelConfig {
            gemma3: crate::models::gemma3::hf_params(&cfg, v)?,
            moe: crate::models::qwen3_moe::hf_params(&cfg, v)?,
            hybrid: crate::models::qwen3next::hf_params(&cfg, v)?,
            vl: crate::models::qwen2vl::hf_params(&cfg, v)?,
            ..cfg
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The HF `config.json` value for this config (used by conversions).
    pub fn to_hf_json(&self, bos: Option<u32>, eos: Option<u32>) -> serde_json::Value {
        let mut v = serde_json::json!({
            "architectures": [self.arch.hf_class()],
            "model_type": self.arch.gguf_name(),
            "hidden_size": self.hidden,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.ffn,
            "vocab_size": self.vocab,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_eps,
            "max_position_embeddings": self.max_ctx,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        });
        if let Some(rs) = self.rope_scaling {
            v["rope_scaling"] = serde_json::json!({
                "rope_type": "llama3",
                "factor": rs.factor,
                "low_freq_factor": rs.low_freq_factor,
                "high_freq_factor": rs.high_freq_factor,
                "original_max_position_embeddings": rs.original_max_position_embeddings,
            });
        }
        if self.mtp_layers > 0 {
            v["num_nextn_predict_layers"] = self.mtp_layers.into();
        }
        (crate::models::def(self.arch).hf_config)(self, &mut v);
        if let Some(b) = bos {
            v["bos_token_id"] = b.into();
        }
        if let Some(e) = eos {
            v["eos_token_id"] = e.into();
        }
        v
    }
}
