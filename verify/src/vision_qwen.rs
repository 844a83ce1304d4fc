//! `memra-verify vision` for either tower family: `--family` (the synthetic tower and the
//! default text model), the gate's images (Gemma 3: squares of its size; the Qwen ViT: a
//! square, a wide and a tall image, each at an input size of the tower, so windows are cut at
//! the grid's edges too), and a Qwen3-VL tower's main rows (the part a text model takes).

use std::path::Path;

use memra_engine::config::{Arch, ModelConfig};
use memra_engine::error::{Error, Result};
use memra_engine::quant::DType;
use memra_engine::vision::random::{random_qwen, random_tower, write_mmproj, write_qwen_mmproj};
use memra_engine::vision::{QwenKind, QwenParams, TowerParams, VisionTower};

/// The synthetic tower of the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Family {
    /// Gemma 3's SigLIP tower (a gemma3 text model).
    Gemma3,
    /// Qwen2-VL's ViT (a qwen2vl text model: M-RoPE).
    Qwen2vl,
    /// Qwen2.5-VL's ViT, window attention (a qwen2vl text model).
    Qwen25vl,
    /// Qwen3-VL's ViT, learned positions, a deepstack merger (a qwen3vl text model:
    /// interleaved M-RoPE, deepstack).
    Qwen3vl,
}

impl Family {
    fn kind(self) -> Option<QwenKind> {
        match self {
            Family::Gemma3 => None,
            Family::Qwen2vl => Some(QwenKind::Qwen2Vl),
            Family::Qwen25vl => Some(QwenKind::Qwen25Vl),
            Family::Qwen3vl => Some(QwenKind::Qwen3Vl),
        }
    }

    /// The default text model's architecture.
    pub fn text_arch(self) -> Arch {
        match self {
            Family::Gemma3 => Arch::Gemma3,
            Family::Qwen2vl | Family::Qwen25vl => Arch::Qwen2Vl,
            Family::Qwen3vl => Arch::Qwen3Vl,
        }
    }

    /// Writes the family's tiny random tower into a text width of `hidden`.
    pub fn write_tiny(self, hidden: usize, path: &Path) -> Result<()> {
        match self.kind() {
            None => {
                let p = TowerParams::tiny(hidden);
                write_mmproj(&p, &random_tower(&p, 7), DType::F32, path)
            }
            Some(k) => {
                let p = QwenParams::tiny(k, hidden);
                write_qwen_mmproj(&p, &random_qwen(&p, 7)?, DType::F32, path)
            }
        }
    }
}

/// Whether a text model of `arch` takes the rows of `tower` (the Qwen ViT's: the Qwen-VL text
/// models, M-RoPE; also a plain qwen2 / qwen3, consecutive positions).
pub fn text_model_fits(tower: &VisionTower, arch: Arch) -> bool {
    match tower.qwen_params() {
        None => arch == Arch::Gemma3,
        Some(_) => matches!(
            arch,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen2Vl | Arch::Qwen3Vl
        ),
    }
}

/// The values of each of `tower`'s rows a text model of `cfg` takes: its embedding width (whole
/// rows, a qwen3vl's with the deepstack values; or a Qwen3-VL tower's main rows for a plain
/// qwen3); an error when the model takes none of them.
pub fn rows_taken(tower: &VisionTower, cfg: &ModelConfig) -> Result<usize> {
    if !text_model_fits(tower, cfg.arch) {
        return Err(Error::Input(format!(
            "the text model is {}, which does not take this tower's rows (Gemma 3's: gemma3; \
             the Qwen ViT's: qwen2, qwen3)",
            cfg.arch.gguf_name()
        )));
    }
    let width = tower.out_width();
    let take = cfg.embed_width();
    if width != take && tower.qwen_params().is_none_or(|q| q.text_hidden != take) {
        return Err(Error::Input(format!(
            "the tower's rows have {width} values, the model's embeddings {take}"
        )));
    }
    Ok(take)
}

/// One test image at an input size of the tower.
#[derive(Clone, Debug)]
pub struct Image {
    pub w: usize,
    pub h: usize,
    pub rgb: Vec<u8>,
}

/// `n` deterministic images: squares of Gemma 3's size; for the Qwen ViT, its square, then a
/// wide and a tall one (input sizes of `image_size + 2f` by `image_size - 3f` and the
/// transpose of `image_size - f` by `image_size / 2`), in turn.
pub fn images(tower: &VisionTower, n: usize) -> Result<Vec<Image>> {
    let s = tower.image_size();
    let sizes: Vec<(usize, usize)> = match tower.qwen_params() {
        None => vec![(s, s)],
        Some(p) => {
            let f = p.factor();
            vec![
                (s, s),
                (s + 2 * f, s.saturating_sub(3 * f).max(f)),
                ((s / 2).max(f), s.saturating_sub(f).max(f)),
            ]
        }
    };
    (0..n)
        .map(|i| {
            let (w, h) = sizes[i % sizes.len()];
            let (w, h) = tower.input_size(w, h)?;
            Ok(Image {
                w,
                h,
                rgb: test_image(w, h, i as u32),
            })
        })
        .collect()
}

/// A deterministic `w x h` RGB image: gradients and a hash-like texture by `seed` (a square's
/// bytes are those of `crate::vision::test_image`).
pub fn test_image(w: usize, h: usize, seed: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(w * h * 3);
    let size = w.max(h);
    for y in 0..h {
        for x in 0..w {
            for c in 0..3u32 {
                let hh = (x as u32 * 31 + y as u32 * 17 + c * 7 + seed * 101)
                    .wrapping_mul(2_654_435_761)
                    >> 24;
                let g = ((x + y * (c as usize + 1)) * 255 / (2 * size)) as u32;
                v.push(((hh / 2 + g + seed * 40) & 0xff) as u8);
            }
        }
    }
    v
}

/// The first `hidden` values of each row of `width` (a Qwen3-VL tower's main merger's rows;
/// the rows themselves where `width == hidden`).
pub fn main_rows(rows: &[f32], width: usize, hidden: usize) -> Vec<f32> {
    if width == hidden {
        return rows.to_vec();
    }
    rows.chunks(width)
        .flat_map(|r| r[..hidden.min(r.len())].iter().copied())
        .collect()
}
