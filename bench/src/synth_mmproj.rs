//! `memra-bench synth-mmproj`: a random vision tower as an mmproj GGUF (llama.cpp's layout), to
//! pair with a text model of the same width: Gemma 3's (`synth --shape tiny-gemma3`: 64;
//! `gemma3-270m`: 640; Gemma 3 4B: 2560) or the Qwen ViT's (`tiny-qwen2vl` / `tiny-qwen3vl`,
//! the M-RoPE text models: 64, Qwen3-VL's deepstack rows on top; Qwen2.5-VL-7B's text model:
//! 3584).

use std::path::PathBuf;

use memra_engine::error::{Error, Result};
use memra_engine::quant::DType;
use memra_engine::vision::random::{random_qwen, random_tower, write_mmproj, write_qwen_mmproj};
use memra_engine::vision::{QwenKind, QwenParams, TowerParams};

/// What to write.
#[derive(Clone, Debug)]
pub struct SynthMmproj {
    /// A name of [`SHAPES`].
    pub shape: String,
    /// The paired text model's hidden size.
    pub text_hidden: usize,
    pub seed: u64,
    /// f32 or f16.
    pub dtype: String,
    pub out: PathBuf,
}

/// The shapes `--shape` takes, with what they are.
pub const SHAPES: [(&str, &str); 8] = [
    (
        "tiny",
        "Gemma 3's tower, 64x64 images, 16 tokens, 2 layers of 32",
    ),
    (
        "tiny-long",
        "Gemma 3's tower, 60x60 images of 2x2 patches: 225 tokens (near the real 256), 2 layers",
    ),
    (
        "gemma3",
        "Gemma 3's SigLIP so400m at 896x896, 256 tokens, 27 layers of 1152",
    ),
    (
        "tiny-qwen2vl",
        "Qwen2-VL's ViT, 4-pixel patches, 48x48: 36 tokens, 2 layers of 32",
    ),
    (
        "tiny-qwen25vl",
        "Qwen2.5-VL's ViT (window attention in layer 0), 48x48: 36 tokens",
    ),
    (
        "tiny-qwen3vl",
        "Qwen3-VL's ViT (6x6 positions, a deepstack merger), 48x48: 36 tokens",
    ),
    (
        "qwen25vl-7b",
        "Qwen2.5-VL-7B's ViT: 32 layers of 1280, up to 1024 tokens (896x896)",
    ),
    (
        "qwen3vl-8b",
        "Qwen3-VL-8B's ViT: 27 layers of 1152, 3 deepstack mergers",
    ),
];

/// A tower shape of either family.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    Gemma3(TowerParams),
    Qwen(QwenParams),
}

/// The tower shape named `shape` for a text width.
pub fn tower_shape(shape: &str, text_hidden: usize) -> Result<Shape> {
    Ok(match shape {
        "tiny" => Shape::Gemma3(TowerParams::tiny(text_hidden)),
        "tiny-long" => Shape::Gemma3(TowerParams::tiny_long(text_hidden)),
        "gemma3" => Shape::Gemma3(TowerParams::gemma3(text_hidden)),
        "tiny-qwen2vl" => Shape::Qwen(QwenParams::tiny(QwenKind::Qwen2Vl, text_hidden)),
        "tiny-qwen25vl" => Shape::Qwen(QwenParams::tiny(QwenKind::Qwen25Vl, text_hidden)),
        "tiny-qwen3vl" => Shape::Qwen(QwenParams::tiny(QwenKind::Qwen3Vl, text_hidden)),
        "qwen25vl-7b" => Shape::Qwen(QwenParams::qwen25vl_7b(text_hidden)),
        "qwen3vl-8b" => Shape::Qwen(QwenParams::qwen3vl_8b(text_hidden)),
        s => {
            let names: Vec<&str> = SHAPES.iter().map(|(n, _)| *n).collect();
            return Err(Error::Input(format!(
                "mmproj shape `{s}`: expected one of {}",
                names.join(", ")
            )));
        }
    })
}

/// Writes the tower; returns a line saying what it is (image size, tokens, widths).
pub fn synth_mmproj(a: &SynthMmproj) -> Result<String> {
    let shape = tower_shape(&a.shape, a.text_hidden)?;
    let dtype = match a.dtype.as_str() {
        "f32" => DType::F32,
        "f16" => DType::F16,
        d => return Err(Error::Input(format!("mmproj dtype `{d}`: f32 or f16"))),
    };
    match shape {
        Shape::Gemma3(p) => {
            write_mmproj(&p, &random_tower(&p, a.seed), dtype, &a.out)?;
            Ok(format!(
                "{}x{} images, {} tokens of {}",
                p.image_size,
                p.image_size,
                p.tokens_per_image(),
                p.text_hidden
            ))
        }
        Shape::Qwen(p) => {
            write_qwen_mmproj(&p, &random_qwen(&p, a.seed)?, dtype, &a.out)?;
            let s = p.image_size;
            Ok(format!(
                "{} ViT; {s}x{s} images: {} tokens of {} (any aspect ratio, multiples of {} \
                 pixels, {}..{} pixels)",
                p.kind.projector(),
                p.tokens(s, s),
                p.out_width(),
                p.factor(),
                p.min_pixels,
                p.max_pixels
            ))
        }
    }
}
