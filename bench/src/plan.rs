//! Which tensors a synthetic model has, their shapes, storage types and initialisation.

use memra_engine::config::Arch;
use memra_engine::config::ModelConfig;
use memra_engine::error::{Error, Result};
use memra_engine::models::random::{OracleFill, oracle_fill};
use memra_engine::models::{Kind, Role, def};
use memra_engine::quant::DType;

/// The `--dtype` of `synth`: one type for every matrix, or llama.cpp's Q4_K_M mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthDType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4KM,
    /// HF `fp8` checkpoints (e4m3, 128 x 128 block scales); HF folders only.
    Fp8,
    /// ModelOpt NVFP4 checkpoints; HF folders only.
    Nvfp4,
}

impl SynthDType {
    pub const ALL: [SynthDType; 8] = [
        SynthDType::F32,
        SynthDType::F16,
        SynthDType::BF16,
        SynthDType::Q8_0,
        SynthDType::Q4_0,
        SynthDType::Q4KM,
        SynthDType::Fp8,
        SynthDType::Nvfp4,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SynthDType::F32 => "f32",
            SynthDType::F16 => "f16",
            SynthDType::BF16 => "bf16",
            SynthDType::Q8_0 => "q8_0",
            SynthDType::Q4_0 => "q4_0",
            SynthDType::Q4KM => "q4_k_m",
            SynthDType::Fp8 => "fp8",
            SynthDType::Nvfp4 => "nvfp4",
        }
    }

    /// llama.cpp's `general.file_type` (enum llama_ftype).
    pub fn gguf_file_type(self) -> u32 {
        match self {
            SynthDType::F32 => 0,
            SynthDType::F16 => 1,
            SynthDType::Q4_0 => 2,
            SynthDType::Q8_0 => 7,
            SynthDType::Q4KM => 15,
            SynthDType::BF16 => 32,
            // Not GGUF types: synth refuses them with --format gguf.
            SynthDType::Fp8 | SynthDType::Nvfp4 => 0,
        }
    }

    /// The checkpoint type of an HF folder's quantized matrices (fp8, nvfp4).
    pub fn checkpoint_type(self) -> Option<DType> {
        match self {
            SynthDType::Fp8 => Some(DType::FP8),
            SynthDType::Nvfp4 => Some(DType::NVFP4),
            _ => None,
        }
    }

    /// config.json's `quantization_config` of an HF folder of this type, if quantized.
    pub fn quantization_config(self) -> Option<serde_json::Value> {
        match self {
            SynthDType::Fp8 => Some(serde_json::json!({
                "quant_method": "fp8",
                "fmt": "e4m3",
                "activation_scheme": "dynamic",
                "weight_block_size": [crate::sink::FP8_CKPT_BLOCK, crate::sink::FP8_CKPT_BLOCK],
            })),
            SynthDType::Nvfp4 => Some(serde_json::json!({
                "quant_method": "modelopt",
                "quant_algo": "NVFP4",
                "group_size": 16,
                "exclude_modules": ["lm_head"],
            })),
            _ => None,
        }
    }

    /// The plain float type, for formats that hold only floats (HF folders).
    pub fn float_type(self) -> Option<DType> {
        match self {
            SynthDType::F32 => Some(DType::F32),
            SynthDType::F16 => Some(DType::F16),
            SynthDType::BF16 => Some(DType::BF16),
            _ => None,
        }
    }
}

impl std::str::FromStr for SynthDType {
    type Err = Error;
    fn from_str(s: &str) -> Result<SynthDType> {
        let l = s.to_ascii_lowercase();
        SynthDType::ALL
            .into_iter()
            .find(|d| d.name() == l)
            .ok_or_else(|| {
                let names: Vec<&str> = SynthDType::ALL.iter().map(|d| d.name()).collect();
                Error::Input(format!(
                    "unknown --dtype `{s}` (known: {})",
                    names.join(", ")
                ))
            })
    }
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Roughly normal, mean 0, standard deviation `std`.
    Normal { std: f32 },
    /// Roughly normal around 1 (norm weights).
    NearOne { std: f32 },
    /// Roughly normal around -1 (decay coefficients).
    NearMinusOne { std: f32 },
    /// A constant pattern of the MTP oracle (zeros, ones, `[I, 0]`: `oracle_value`).
    Oracle(OracleFill),
}

/// One tensor of a synthetic model.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    pub arch: Arch,
    pub role: Role,
    /// Shape outermost first (HF order).
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub init: Init,
    /// The tensor whose random stream draws the values: this one, or the one it copies (the MTP
    /// oracle's shared norm draws the output norm's).
    pub draws: Role,
}

impl TensorPlan {
    pub fn hf_name(&self) -> String {
        self.role.hf_name(self.arch)
    }
    pub fn gguf_name(&self) -> String {
        self.role.gguf_name()
    }
    /// Dimensions in ggml order (row length first).
    pub fn gguf_dims(&self) -> Vec<u64> {
        self.shape.iter().rev().map(|&d| d as u64).collect()
    }
    /// (rows, row length).
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = *self.shape.last().unwrap_or(&1);
        (self.shape.iter().product::<usize>() / cols.max(1), cols)
    }
    pub fn nbytes(&self) -> u64 {
        let (rows, cols) = self.rows_cols();
        self.dtype.bytes_for(cols as u64).unwrap_or(0) * rows as u64
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third between.
pub fn use_more_bits(layer: usize, n_layers: usize) -> bool {
    // The first test guards the subtraction.
    layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2
}

/// llama.cpp's fallback when a row is not a multiple of the k-quant super-block.
fn fallback(d: DType, cols: usize) -> DType {
    if cols.is_multiple_of(d.block_size()) {
        return d;
    }
    let alt = match d {
        DType::Q4_K => DType::Q5_0,
        DType::Q5_K => DType::Q5_1,
        DType::Q6_K => DType::Q8_0,
        _ => DType::F16,
    };
    if cols.is_multiple_of(alt.block_size()) {
        alt
    } else {
        DType::F16
    }
}

/// The storage type of a matrix (or expert stack) with role `role` and row length `cols`. The
/// MoE router and the DeltaNet convolution stay F32 whatever the type, as llama.cpp's
/// converter and quantizer keep them.
fn matrix_type(dt: SynthDType, role: Role, cfg: &ModelConfig, cols: usize) -> DType {
    if matches!(role, Role::FfnGateInp(_) | Role::SsmConv(_)) {
        return DType::F32;
    }
    if let Some(q) = dt.checkpoint_type() {
        // Real checkpoints keep the embedding and the LM head in BF16 (ModelOpt's and
        // transformers' exclusions), and rows memra's blocks do not divide.
        let head = matches!(role, Role::TokenEmbd | Role::Output);
        return match head || !cols.is_multiple_of(q.block_size()) {
            true => DType::BF16,
            false => q,
        };
    }
    let base = match dt {
        SynthDType::F32 => DType::F32,
        SynthDType::F16 => DType::F16,
        SynthDType::BF16 => DType::BF16,
        SynthDType::Q8_0 => DType::Q8_0,
        SynthDType::Q4_0 => DType::Q4_0,
        SynthDType::Fp8 | SynthDType::Nvfp4 => DType::BF16,
        SynthDType::Q4KM => match role {
            Role::Output => DType::Q6_K,
            // Tied: the embedding is also the LM head, which llama.cpp keeps at Q6_K.
            Role::TokenEmbd if cfg.tie_embeddings => DType::Q6_K,
            Role::V(l) | Role::Down(l) | Role::DownExps(l) | Role::ShexpDown(l)
                if use_more_bits(l, cfg.n_layers) =>
            {
                DType::Q6_K
            }
            _ => DType::Q4_K,
        },
    };
    fallback(base, cols)
}

/// Every tensor of a model of config `cfg`, in file order (the architecture's list; a tied
/// output is left out).
pub fn plan(cfg: &ModelConfig, dt: SynthDType) -> Vec<TensorPlan> {
    (def(cfg.arch).tensors)(cfg)
        .into_iter()
        .filter(|s| !s.optional)
        .map(|s| {
            let (dtype, init) = match s.kind {
                Kind::Matrix => {
                    let cols = *s.shape.last().unwrap_or(&1);
                    let dtype = matrix_type(dt, s.role, cfg, cols);
                    (dtype, Init::Normal { std: 0.02 })
                }
                Kind::Norm => (DType::F32, Init::NearOne { std: 0.02 }),
                Kind::Bias => (DType::F32, Init::Normal { std: 0.01 }),
                Kind::Decay => (DType::F32, Init::NearMinusOne { std: 0.1 }),
            };
            TensorPlan {
                arch: cfg.arch,
                role: s.role,
                shape: s.shape,
                dtype,
                init,
                draws: s.role,
            }
        })
        .collect()
}

/// Wires `tensors` (the plan of an `oracle_config`) as the MTP oracle, by the engine's
/// `oracle_fill`: zero matrices keep their type (a zero row is exact in every GGUF type; the HF
/// checkpoint types become BF16), `[I, 0]` and the ones are F32, a copy takes its source's type,
/// initialisation and random stream.
pub fn oracle_plan(cfg: &ModelConfig, tensors: &mut [TensorPlan]) -> Result<()> {
    let base = tensors.to_vec();
    for t in tensors.iter_mut() {
        match oracle_fill(cfg, t.role) {
            OracleFill::Random => {}
            OracleFill::Zero => {
                t.init = Init::Oracle(OracleFill::Zero);
                if DType::HF_ONLY.contains(&t.dtype) {
                    t.dtype = DType::BF16;
                }
            }
            f @ (OracleFill::Identity | OracleFill::Ones) => {
                t.init = Init::Oracle(f);
                t.dtype = DType::F32;
            }
            OracleFill::CopyOf(of) => {
                let src = base.iter().find(|s| s.role == of && s.shape == t.shape);
                let src = src.ok_or_else(|| {
                    Error::Input(format!(
                        "MTP oracle: {} copies {}, which the plan lacks or shapes otherwise",
                        t.gguf_name(),
                        of.gguf_name()
                    ))
                })?;
                (t.dtype, t.init, t.draws) = (src.dtype, src.init, src.draws);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapes::Shape;

    #[test]
    fn more_bits_rule_matches_llama_cpp() {
        // 32 layers: 0..4, 28..32, and 4 + 2, 4 + 5, ... between.
        let picked: Vec<usize> = (0..32).filter(|&l| use_more_bits(l, 32)).collect();
        assert_eq!(
            picked,
            vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
    }

    #[test]
    fn q4_k_m_mix() {
        let cfg = Shape::Llama3_8b.config(49152);
        let p = plan(&cfg, SynthDType::Q4KM);
        let ty = |r: Role| p.iter().find(|t| t.role == r).map(|t| t.dtype);
        assert_eq!(ty(Role::Output), Some(DType::Q6_K));
        assert_eq!(ty(Role::TokenEmbd), Some(DType::Q4_K));
        assert_eq!(ty(Role::V(0)), Some(DType::Q6_K));
        assert_eq!(ty(Role::V(4)), Some(DType::Q4_K));
        assert_eq!(ty(Role::Down(6)), Some(DType::Q6_K));
        assert_eq!(ty(Role::Q(0)), Some(DType::Q4_K));
        assert_eq!(ty(Role::AttnNorm(0)), Some(DType::F32));
        // 32 layers * 9 + embedding + norm + output.
        assert_eq!(p.len(), 32 * 9 + 3);
        // SmolLM2's 576-wide rows are not a multiple of 256: llama.cpp's Q5_0 / Q8_0 fallback.
        let p = plan(&Shape::Smollm2_135m.config(49152), SynthDType::Q4KM);
        assert!(
            p.iter()
                .all(|t| t.dtype != DType::Q4_K || t.shape[1] % 256 == 0)
        );
        let ty = |r: Role| p.iter().find(|t| t.role == r).map(|t| t.dtype);
        assert_eq!(ty(Role::Q(1)), Some(DType::Q5_0));
        assert_eq!(ty(Role::TokenEmbd), Some(DType::Q8_0));
        assert_eq!(ty(Role::Down(4)), Some(DType::Q4_K)); // row length 1536 = 6 * 256
        assert_eq!(ty(Role::Down(5)), Some(DType::Q6_K)); // use_more_bits(5, 30)
    }

    #[test]
    fn qwen3_30b_a3b_plan() {
        let cfg = Shape::Qwen3_30bA3b.config(49152);
        cfg.validate().unwrap();
        let p = plan(&cfg, SynthDType::Q4KM);
        // 48 layers * (norm, q, k, v, q/k norms, o, ffn norm, router, 3 stacks) + 3.
        assert_eq!(p.len(), 48 * 12 + 3);
        let t = |r: Role| p.iter().find(|t| t.role == r).unwrap();
        assert_eq!(t(Role::FfnGateInp(5)).dtype, DType::F32);
        assert_eq!(t(Role::FfnGateInp(5)).shape, vec![128, 2048]);
        assert_eq!(t(Role::GateExps(5)).shape, vec![128, 768, 2048]);
        assert_eq!(t(Role::GateExps(5)).dtype, DType::Q4_K);
        assert_eq!(t(Role::DownExps(5)).shape, vec![128, 2048, 768]);
        assert_eq!(t(Role::DownExps(0)).dtype, DType::Q6_K);
        assert_eq!(t(Role::DownExps(7)).dtype, DType::Q4_K);
        // The router is F32 in float files too.
        let p = plan(&Shape::TinyQwen3Moe.config(100), SynthDType::BF16);
        let t = |r: Role| p.iter().find(|t| t.role == r).unwrap();
        assert_eq!(t(Role::FfnGateInp(0)).dtype, DType::F32);
        assert_eq!(t(Role::UpExps(1)).dtype, DType::BF16);
    }

    #[test]
    fn arch_specific_tensors() {
        let p = plan(&Shape::TinyQwen2.config(100), SynthDType::F16);
        assert!(
            p.iter()
                .any(|t| t.role == Role::QBias(1) && t.dtype == DType::F32)
        );
        assert!(p.iter().any(|t| t.role == Role::Output));
        let p = plan(&Shape::TinyQwen3.config(100), SynthDType::F16);
        assert!(
            p.iter()
                .any(|t| t.role == Role::KNorm(0) && t.shape == vec![16])
        );
        assert!(!p.iter().any(|t| t.role == Role::Output));
        let p = plan(&Shape::TinyLlama.config(100), SynthDType::Q8_0);
        assert!(
            p.iter()
                .all(|t| t.shape.len() == 1 || t.dtype == DType::Q8_0)
        );
    }
}
