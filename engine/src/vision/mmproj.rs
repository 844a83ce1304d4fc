//! llama.cpp's `mmproj` GGUF layout for Gemma 3's tower (`general.architecture = clip`,
//! `clip.projector_type = gemma3`): the metadata keys, the tensor names and shapes, loading.
//!
//! Tensors (shapes outermost first, as numpy; GGUF dims are the reverse):
//! `v.patch_embd.weight [hidden, 3, patch, patch]` + `.bias`, `v.position_embd.weight
//! [patches, hidden]`, per block `v.blk.{i}.{ln1,ln2}.{weight,bias}`,
//! `v.blk.{i}.{attn_q,attn_k,attn_v,attn_out}.{weight [hidden, hidden],bias}`,
//! `v.blk.{i}.ffn_up.weight [ffn, hidden]`, `v.blk.{i}.ffn_down.weight [hidden, ffn]` (+ biases),
//! `v.post_ln.{weight,bias}`, `mm.soft_emb_norm.weight [hidden]` (the multiplier itself: the
//! converter stores Gemma's `1 + w`), `mm.input_projection.weight [hidden, text_hidden]` (HF's
//! `mm_input_projection_weight` as is: `out = x @ W`).

use super::siglip::{Layer, TowerWeights};
use crate::error::{Error, Result};
use crate::formats::gguf::{Gguf, MetaValue};

/// The shape of a Gemma 3 vision tower.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TowerParams {
    pub image_size: usize,
    pub patch_size: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub layers: usize,
    pub heads: usize,
    pub eps: f32,
    /// Side of the average-pooling window over the patch grid (llama.cpp `n_merge`; 4).
    pub pool: usize,
    /// Width of the output rows (the text model's hidden size).
    pub text_hidden: usize,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl TowerParams {
    /// Patches per side.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    pub fn patches(&self) -> usize {
        self.grid() * self.grid()
    }

    pub fn tokens_per_image(&self) -> usize {
        let side = self.grid() / self.pool;
        side * side
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Gemma 3's real tower (SigLIP so400m at 896, 256 tokens) for a text width.
    pub fn gemma3(text_hidden: usize) -> TowerParams {
        TowerParams {
            image_size: 896,
            patch_size: 14,
            hidden: 1152,
            ffn: 4304,
            layers: 27,
            heads: 16,
            eps: 1e-6,
            pool: 4,
            text_hidden,
            mean: [0.5; 3],
            std: [0.5; 3],
        }
    }

    /// A tiny tower for tests (64x64 images, 8x8 patches, 4 tokens per side: 16 tokens).
    pub fn tiny(text_hidden: usize) -> TowerParams {
        TowerParams {
            image_size: 64,
            patch_size: 8,
            hidden: 32,
            ffn: 64,
            layers: 2,
            heads: 4,
            eps: 1e-6,
            pool: 2,
            text_hidden,
            mean: [0.5; 3],
            std: [0.5; 3],
        }
    }

    /// A tiny tower with a near real-size image span (60x60 images, 2x2 patches, pool 2: 225
    /// tokens, the real Gemma 3 tower's being 256, from 900 patches through 2 layers of 32;
    /// an image prompt still fits the tiny text models' context of 256), for the serving
    /// checks of long images without the real tower's cost.
    pub fn tiny_long(text_hidden: usize) -> TowerParams {
        TowerParams {
            image_size: 60,
            patch_size: 2,
            ..TowerParams::tiny(text_hidden)
        }
    }

    /// Refuses shapes the forward cannot run (a corrupt or foreign file).
    pub fn check(&self) -> Result<()> {
        let bad = |w: String| Err(Error::Config(format!("mmproj: {w}")));
        if self.patch_size == 0
            || self.image_size == 0
            || !self.image_size.is_multiple_of(self.patch_size)
        {
            return bad(format!(
                "image size {} is not a multiple of the patch size {}",
                self.image_size, self.patch_size
            ));
        }
        if self.image_size > 4096 {
            return bad(format!("image size {} is over 4096", self.image_size));
        }
        if self.pool == 0 || !self.grid().is_multiple_of(self.pool) {
            return bad(format!(
                "the {}-patch grid does not split into pooling windows of {}",
                self.grid(),
                self.pool
            ));
        }
        if self.heads == 0 || !self.hidden.is_multiple_of(self.heads) || self.hidden == 0 {
            return bad(format!(
                "{} heads do not divide the width {}",
                self.heads, self.hidden
            ));
        }
        if self.ffn == 0 || self.text_hidden == 0 || self.layers > 256 {
            return bad(format!(
                "ffn {}, text width {}, {} layers",
                self.ffn, self.text_hidden, self.layers
            ));
        }
        if !(self.eps > 0.0 && self.eps < 1.0) || self.std.iter().any(|&s| s.abs() < 1e-6) {
            return bad("epsilon or image std out of range".into());
        }
        Ok(())
    }

    /// The metadata an mmproj file of this shape carries.
    pub fn gguf_meta(&self) -> Vec<(String, MetaValue)> {
        let u = |v: usize| MetaValue::U32(v as u32);
        let arr = |a: [f32; 3]| MetaValue::Array(a.iter().map(|&x| MetaValue::F32(x)).collect());
        let k = |s: &str| format!("clip.vision.{s}");
        vec![
            ("general.architecture".into(), MetaValue::Str("clip".into())),
            (
                "clip.projector_type".into(),
                MetaValue::Str("gemma3".into()),
            ),
            ("clip.has_vision_encoder".into(), MetaValue::Bool(true)),
            ("clip.has_text_encoder".into(), MetaValue::Bool(false)),
            ("clip.use_gelu".into(), MetaValue::Bool(true)),
            (k("image_size"), u(self.image_size)),
            (k("patch_size"), u(self.patch_size)),
            (k("embedding_length"), u(self.hidden)),
            (k("feed_forward_length"), u(self.ffn)),
            (k("block_count"), u(self.layers)),
            (k("attention.head_count"), u(self.heads)),
            (k("attention.layer_norm_epsilon"), MetaValue::F32(self.eps)),
            (k("projection_dim"), u(self.text_hidden)),
            (k("projector.scale_factor"), u(self.pool)),
            (k("image_mean"), arr(self.mean)),
            (k("image_std"), arr(self.std)),
        ]
    }

    /// Every tensor of the file: name and shape (outermost first).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, f, p) = (self.hidden, self.ffn, self.patch_size);
        let mut v = vec![
            ("v.patch_embd.weight".to_string(), vec![h, 3, p, p]),
            ("v.patch_embd.bias".to_string(), vec![h]),
            (
                "v.position_embd.weight".to_string(),
                vec![self.patches(), h],
            ),
        ];
        for i in 0..self.layers {
            let b = |s: &str| format!("v.blk.{i}.{s}");
            for ln in ["ln1", "ln2"] {
                v.push((b(&format!("{ln}.weight")), vec![h]));
                v.push((b(&format!("{ln}.bias")), vec![h]));
            }
            for m in ["attn_q", "attn_k", "attn_v", "attn_out"] {
                v.push((b(&format!("{m}.weight")), vec![h, h]));
                v.push((b(&format!("{m}.bias")), vec![h]));
            }
            v.push((b("ffn_up.weight"), vec![f, h]));
            v.push((b("ffn_up.bias"), vec![f]));
            v.push((b("ffn_down.weight"), vec![h, f]));
            v.push((b("ffn_down.bias"), vec![h]));
        }
        v.push(("v.post_ln.weight".into(), vec![h]));
        v.push(("v.post_ln.bias".into(), vec![h]));
        v.push(("mm.soft_emb_norm.weight".into(), vec![h]));
        v.push((
            "mm.input_projection.weight".into(),
            vec![h, self.text_hidden],
        ));
        v
    }
}

pub(super) fn meta_usize(g: &Gguf, key: &str) -> Result<usize> {
    g.get_u64(key)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| Error::Config(format!("mmproj: missing or invalid `{key}`")))
}

/// Three numbers (an image mean or std); `default` where the key is absent.
pub(super) fn meta_triplet(g: &Gguf, key: &str, default: [f32; 3]) -> Result<[f32; 3]> {
    match g.get(key).and_then(MetaValue::as_array) {
        None => Ok(default),
        Some(a) if a.len() == 3 => {
            let mut out = [0f32; 3];
            for (o, v) in out.iter_mut().zip(a) {
                *o = v
                    .as_f64()
                    .ok_or_else(|| Error::Config(format!("mmproj: `{key}` is not numeric")))?
                    as f32;
            }
            Ok(out)
        }
        Some(a) => Err(Error::Config(format!(
            "mmproj: `{key}` has {} values, not 3",
            a.len()
        ))),
    }
}

/// Reads the tower's shape from an mmproj file's metadata.
pub fn params(g: &Gguf) -> Result<TowerParams> {
    match g.get_str("clip.projector_type") {
        Some("gemma3") => {}
        other => {
            return Err(Error::Unsupported(format!(
                "mmproj projector {other:?}: only Gemma 3's (`gemma3`) is supported"
            )));
        }
    }
    let k = |s: &str| format!("clip.vision.{s}");
    let p = TowerParams {
        image_size: meta_usize(g, &k("image_size"))?,
        patch_size: meta_usize(g, &k("patch_size"))?,
        hidden: meta_usize(g, &k("embedding_length"))?,
        ffn: meta_usize(g, &k("feed_forward_length"))?,
        layers: meta_usize(g, &k("block_count"))?,
        heads: meta_usize(g, &k("attention.head_count"))?,
        eps: g
            .get_f64(&k("attention.layer_norm_epsilon"))
            .unwrap_or(1e-6) as f32,
        pool: g
            .get_u64(&k("projector.scale_factor"))
            .map_or(Ok(4), usize::try_from)
            .map_err(|_| Error::Config("mmproj: invalid scale factor".into()))?,
        text_hidden: 0,
        mean: meta_triplet(g, &k("image_mean"), [0.5; 3])?,
        std: meta_triplet(g, &k("image_std"), [0.5; 3])?,
    };
    // The text width is the projection's second dimension (projection_dim may be absent).
    let proj = g
        .tensor_info("mm.input_projection.weight")
        .ok_or_else(|| Error::Weights("mmproj: missing mm.input_projection.weight".into()))?;
    let text_hidden = proj.shape().last().copied().unwrap_or(0);
    let p = TowerParams { text_hidden, ..p };
    p.check()?;
    Ok(p)
}

/// The tensor `name` of an mmproj file dequantized to f32, its shape checked.
pub(super) fn tensor_f32(g: &Gguf, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let t = g
        .tensor(name)
        .ok_or_else(|| Error::Weights(format!("mmproj: missing tensor {name}")))?;
    if t.shape != shape {
        return Err(Error::Weights(format!(
            "mmproj: {name} has shape {:?}, expected {shape:?}",
            t.shape
        )));
    }
    t.to_f32()
}

/// Loads the tower: its shape and every tensor dequantized to f32, shapes checked.
pub fn load(g: &Gguf) -> Result<(TowerParams, TowerWeights)> {
    let p = params(g)?;
    let get = |name: &str, shape: &[usize]| tensor_f32(g, name, shape);
    let (h, f, ps) = (p.hidden, p.ffn, p.patch_size);
    let mut layers = Vec::with_capacity(p.layers);
    for i in 0..p.layers {
        let n = |s: &str| format!("v.blk.{i}.{s}");
        layers.push(Layer {
            ln1_w: get(&n("ln1.weight"), &[h])?,
            ln1_b: get(&n("ln1.bias"), &[h])?,
            q_w: get(&n("attn_q.weight"), &[h, h])?,
            q_b: get(&n("attn_q.bias"), &[h])?,
            k_w: get(&n("attn_k.weight"), &[h, h])?,
            k_b: get(&n("attn_k.bias"), &[h])?,
            v_w: get(&n("attn_v.weight"), &[h, h])?,
            v_b: get(&n("attn_v.bias"), &[h])?,
            o_w: get(&n("attn_out.weight"), &[h, h])?,
            o_b: get(&n("attn_out.bias"), &[h])?,
            ln2_w: get(&n("ln2.weight"), &[h])?,
            ln2_b: get(&n("ln2.bias"), &[h])?,
            up_w: get(&n("ffn_up.weight"), &[f, h])?,
            up_b: get(&n("ffn_up.bias"), &[f])?,
            down_w: get(&n("ffn_down.weight"), &[h, f])?,
            down_b: get(&n("ffn_down.bias"), &[h])?,
        });
    }
    let w = TowerWeights {
        patch_w: get("v.patch_embd.weight", &[h, 3, ps, ps])?,
        patch_b: get("v.patch_embd.bias", &[h])?,
        pos: get("v.position_embd.weight", &[p.patches(), h])?,
        layers,
        post_w: get("v.post_ln.weight", &[h])?,
        post_b: get("v.post_ln.bias", &[h])?,
        soft_norm: get("mm.soft_emb_norm.weight", &[h])?,
        proj: get("mm.input_projection.weight", &[h, p.text_hidden])?,
    };
    Ok((p, w))
}
