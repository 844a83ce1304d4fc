//! `memra-bench synth-mmproj`: a random Gemma 3 vision tower as an mmproj GGUF (llama.cpp's
//! layout), to pair with a text model of the same width (`synth --shape tiny-gemma3`: 64;
//! `gemma3-270m`: 640; Gemma 3 4B: 2560).

use std::path::PathBuf;

use memra_engine::error::{Error, Result};
use memra_engine::quant::DType;
use memra_engine::vision::TowerParams;
use memra_engine::vision::random::{random_tower, write_mmproj};

/// What to write.
#[derive(Clone, Debug)]
pub struct SynthMmproj {
    /// `tiny` (64x64 images, 16 tokens, 2 layers of 32) or `gemma3` (SigLIP so400m at 896,
    /// 256 tokens, 27 layers of 1152).
    pub shape: String,
    /// The paired text model's hidden size.
    pub text_hidden: usize,
    pub seed: u64,
    /// f32 or f16.
    pub dtype: String,
    pub out: PathBuf,
}

/// The tower shape named `shape` for a text width.
pub fn tower_shape(shape: &str, text_hidden: usize) -> Result<TowerParams> {
    match shape {
        "tiny" => Ok(TowerParams::tiny(text_hidden)),
        "gemma3" => Ok(TowerParams::gemma3(text_hidden)),
        s => Err(Error::Input(format!(
            "mmproj shape `{s}`: expected tiny or gemma3"
        ))),
    }
}

/// Writes the tower; returns its shape.
pub fn synth_mmproj(a: &SynthMmproj) -> Result<TowerParams> {
    let p = tower_shape(&a.shape, a.text_hidden)?;
    let dtype = match a.dtype.as_str() {
        "f32" => DType::F32,
        "f16" => DType::F16,
        d => return Err(Error::Input(format!("mmproj dtype `{d}`: f32 or f16"))),
    };
    let w = random_tower(&p, a.seed);
    write_mmproj(&p, &w, dtype, &a.out)?;
    Ok(p)
}
