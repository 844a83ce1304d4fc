//! llama.cpp's `mmproj` GGUF layout of the Qwen vision towers (`clip.projector_type`
//! `qwen2vl_merger`, `qwen2.5vl_merger`, `qwen3vl_merger`; converter: llama.cpp
//! conversion/qwenvl.py and qwen3vl.py): the metadata keys, the tensor names and shapes, loading,
//! and the shapes memra writes (`memra-bench synth-mmproj --shape tiny-qwen25vl|...`).
//!
//! Tensors (shapes outermost first, as numpy; GGUF dims are the reverse): the 3D patch
//! convolution split by frame, `v.patch_embd.weight [hidden, 3, patch, patch]` (frame 0) and
//! `v.patch_embd.weight.1` (frame 1), Qwen3-VL also `v.patch_embd.bias [hidden]` and
//! `v.position_embd.weight [grid^2, hidden]`; per block `v.blk.{i}.ln1` / `ln2` (`.weight`, and
//! `.bias` for LayerNorm), `attn_q` / `attn_k` / `attn_v` (`[hidden, hidden]` + bias) or one
//! `attn_qkv` (`[3 hidden, hidden]`, Qwen3-VL), `attn_out`, `ffn_up [ffn, hidden]`,
//! `ffn_gate` (Qwen2.5-VL), `ffn_down [hidden, ffn]` (all with biases); the merger's norm
//! `v.post_ln` (HF `merger.ln_q` / `merger.norm`), `mm.0 [4 hidden, 4 hidden]`, `mm.2
//! [text, 4 hidden]` (+ biases); Qwen3-VL deepstack mergers `v.deepstack.{layer}.norm [4
//! hidden]`, `.fc1`, `.fc2` (+ biases). Keys: `clip.vision.*` as Gemma 3's (mmproj.rs), plus
//! `spatial_merge_size`, `n_wa_pattern` (Qwen2.5-VL), `window_size`, `is_deepstack_layers`,
//! `image_min_pixels` / `image_max_pixels` and `tokens_per_second` (memra's; llama.cpp has its
//! own limits and no video positions), and
//! `clip.use_silu` / `clip.use_gelu` choosing the block FFN's activation (neither: QuickGELU).

use super::mmproj::{meta_triplet, meta_usize, tensor_f32};
use super::qwenvit::{
    CLIP_MEAN, CLIP_STD, Merger, QwenKind, QwenLayer, QwenParams, QwenWeights, VitAct,
};
use crate::error::{Error, Result};
use crate::formats::gguf::{Gguf, MetaValue};

/// Output tokens of an image at most, where the file does not say (`image_max_pixels`).
pub const DEFAULT_MAX_TOKENS: usize = 256;
/// Output tokens of an image at least (HF's `min_pixels` 56 x 56 at 28 pixels a token).
pub const DEFAULT_MIN_TOKENS: usize = 4;
/// Temporal positions per second of video where the file does not say (`tokens_per_second`;
/// the released Qwen2.5-VL models' `vision_config.tokens_per_second`).
pub const DEFAULT_TOKENS_PER_SECOND: usize = 2;

impl QwenParams {
    /// A tiny tower of `kind` for tests: 4-pixel patches, 2 x 2 merge, width 32 in 4 heads,
    /// 48 x 48 images (36 tokens). Qwen2.5-VL: 2 layers, the first windowed (windows of 2 x 2
    /// tokens); Qwen3-VL: 3 layers, a 6 x 6 position grid, a deepstack merger after layer 1.
    pub fn tiny(kind: QwenKind, text_hidden: usize) -> QwenParams {
        let f = 8;
        let mut p = QwenParams {
            kind,
            act: default_act(kind),
            patch_size: 4,
            merge: 2,
            hidden: 32,
            ffn: 48,
            layers: 2,
            heads: 4,
            eps: 1e-6,
            text_hidden,
            mean: default_mean(kind).0,
            std: default_mean(kind).1,
            wa_pattern: 0,
            window: 112,
            pos_grid: 0,
            deepstack: Vec::new(),
            image_size: 48,
            min_pixels: DEFAULT_MIN_TOKENS * f * f,
            max_pixels: 64 * f * f,
            tokens_per_second: DEFAULT_TOKENS_PER_SECOND,
        };
        match kind {
            QwenKind::Qwen2Vl => {}
            QwenKind::Qwen25Vl => (p.wa_pattern, p.window) = (2, 2 * f),
            QwenKind::Qwen3Vl => {
                (p.layers, p.pos_grid, p.deepstack) = (3, 6, vec![1]);
            }
        }
        p
    }

    /// Qwen2.5-VL-7B's tower (HF vision_config: 32 blocks of 1280 / 3420, 16 heads, 14-pixel
    /// patches, windows of 112 pixels, full attention every 8th block) into a text width
    /// (3584 for the 7B), taking images of up to 1024 tokens (896 x 896).
    pub fn qwen25vl_7b(text_hidden: usize) -> QwenParams {
        QwenParams {
            kind: QwenKind::Qwen25Vl,
            act: VitAct::SiluGated,
            patch_size: 14,
            merge: 2,
            hidden: 1280,
            ffn: 3420,
            layers: 32,
            heads: 16,
            eps: 1e-6,
            text_hidden,
            mean: CLIP_MEAN,
            std: CLIP_STD,
            wa_pattern: 8,
            window: 112,
            pos_grid: 0,
            deepstack: Vec::new(),
            image_size: 896,
            min_pixels: DEFAULT_MIN_TOKENS * 28 * 28,
            max_pixels: 1024 * 28 * 28,
            tokens_per_second: DEFAULT_TOKENS_PER_SECOND,
        }
    }

    /// Qwen3-VL-8B's tower (27 blocks of 1152 / 4304, 16 heads, 16-pixel patches, a 48 x 48
    /// position grid, deepstack after blocks 8, 16, 24) into a text width (4096 for the 8B).
    pub fn qwen3vl_8b(text_hidden: usize) -> QwenParams {
        QwenParams {
            kind: QwenKind::Qwen3Vl,
            act: VitAct::GeluTanh,
            patch_size: 16,
            merge: 2,
            hidden: 1152,
            ffn: 4304,
            layers: 27,
            heads: 16,
            eps: 1e-6,
            text_hidden,
            mean: [0.5; 3],
            std: [0.5; 3],
            wa_pattern: 0,
            window: 112,
            pos_grid: 48,
            deepstack: vec![8, 16, 24],
            image_size: 768,
            min_pixels: DEFAULT_MIN_TOKENS * 32 * 32,
            max_pixels: 1024 * 32 * 32,
            tokens_per_second: DEFAULT_TOKENS_PER_SECOND,
        }
    }

    /// The metadata an mmproj file of this shape carries.
    pub fn gguf_meta(&self) -> Vec<(String, MetaValue)> {
        let u = |v: usize| MetaValue::U32(v as u32);
        let arr = |a: [f32; 3]| MetaValue::Array(a.iter().map(|&x| MetaValue::F32(x)).collect());
        let k = |s: &str| format!("clip.vision.{s}");
        let mut m = vec![
            ("general.architecture".into(), MetaValue::Str("clip".into())),
            (
                "clip.projector_type".into(),
                MetaValue::Str(self.kind.projector().into()),
            ),
            ("clip.has_vision_encoder".into(), MetaValue::Bool(true)),
            ("clip.has_text_encoder".into(), MetaValue::Bool(false)),
            (k("image_size"), u(self.image_size)),
            (k("patch_size"), u(self.patch_size)),
            (k("embedding_length"), u(self.hidden)),
            (k("feed_forward_length"), u(self.ffn)),
            (k("block_count"), u(self.layers)),
            (k("attention.head_count"), u(self.heads)),
            (k("attention.layer_norm_epsilon"), MetaValue::F32(self.eps)),
            (k("projection_dim"), u(self.text_hidden)),
            (k("spatial_merge_size"), u(self.merge)),
            (k("image_mean"), arr(self.mean)),
            (k("image_std"), arr(self.std)),
            (k("image_min_pixels"), u(self.min_pixels)),
            (k("image_max_pixels"), u(self.max_pixels)),
            (k("tokens_per_second"), u(self.tokens_per_second)),
        ];
        match self.act {
            VitAct::GeluTanh => m.push(("clip.use_gelu".into(), MetaValue::Bool(true))),
            VitAct::SiluGated => m.push(("clip.use_silu".into(), MetaValue::Bool(true))),
            VitAct::QuickGelu => {}
        }
        if self.wa_pattern > 0 {
            m.push((k("n_wa_pattern"), u(self.wa_pattern)));
            m.push((k("window_size"), u(self.window)));
        }
        if !self.deepstack.is_empty() {
            let flags = (0..self.layers)
                .map(|l| MetaValue::Bool(self.deepstack.contains(&l)))
                .collect();
            m.push((k("is_deepstack_layers"), MetaValue::Array(flags)));
        }
        m
    }

    /// Every tensor of the file: name and shape (outermost first).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, f, p, t) = (self.hidden, self.ffn, self.patch_size, self.text_hidden);
        let wide = h * self.merge * self.merge;
        let rms = self.kind.rms();
        let mut v = vec![
            ("v.patch_embd.weight".to_string(), vec![h, 3, p, p]),
            ("v.patch_embd.weight.1".to_string(), vec![h, 3, p, p]),
        ];
        let norm = |v: &mut Vec<(String, Vec<usize>)>, name: String, n: usize| {
            v.push((format!("{name}.weight"), vec![n]));
            if !rms {
                v.push((format!("{name}.bias"), vec![n]));
            }
        };
        let lin = |v: &mut Vec<(String, Vec<usize>)>, name: String, o: usize, i: usize| {
            v.push((format!("{name}.weight"), vec![o, i]));
            v.push((format!("{name}.bias"), vec![o]));
        };
        if self.kind == QwenKind::Qwen3Vl {
            v.push(("v.patch_embd.bias".into(), vec![h]));
        }
        if self.pos_grid > 0 {
            let n = self.pos_grid * self.pos_grid;
            v.push(("v.position_embd.weight".into(), vec![n, h]));
        }
        for i in 0..self.layers {
            let b = |s: &str| format!("v.blk.{i}.{s}");
            norm(&mut v, b("ln1"), h);
            if self.kind == QwenKind::Qwen3Vl {
                lin(&mut v, b("attn_qkv"), 3 * h, h);
            } else {
                for m in ["attn_q", "attn_k", "attn_v"] {
                    lin(&mut v, b(m), h, h);
                }
            }
            lin(&mut v, b("attn_out"), h, h);
            norm(&mut v, b("ln2"), h);
            lin(&mut v, b("ffn_up"), f, h);
            if self.act == VitAct::SiluGated {
                lin(&mut v, b("ffn_gate"), f, h);
            }
            lin(&mut v, b("ffn_down"), h, f);
        }
        norm(&mut v, "v.post_ln".into(), h);
        lin(&mut v, "mm.0".into(), wide, wide);
        lin(&mut v, "mm.2".into(), t, wide);
        for &l in &self.deepstack {
            norm(&mut v, format!("v.deepstack.{l}.norm"), wide);
            lin(&mut v, format!("v.deepstack.{l}.fc1"), wide, wide);
            lin(&mut v, format!("v.deepstack.{l}.fc2"), t, wide);
        }
        v
    }
}

fn default_act(kind: QwenKind) -> VitAct {
    match kind {
        QwenKind::Qwen2Vl => VitAct::QuickGelu,
        QwenKind::Qwen25Vl => VitAct::SiluGated,
        QwenKind::Qwen3Vl => VitAct::GeluTanh,
    }
}

/// The family's image mean and std (HF preprocessor_config.json).
fn default_mean(kind: QwenKind) -> ([f32; 3], [f32; 3]) {
    match kind {
        QwenKind::Qwen3Vl => ([0.5; 3], [0.5; 3]),
        _ => (CLIP_MEAN, CLIP_STD),
    }
}

fn meta_opt(g: &Gguf, key: &str, default: usize) -> Result<usize> {
    match g.get(key) {
        None => Ok(default),
        Some(_) => meta_usize(g, key),
    }
}

fn meta_bool(g: &Gguf, key: &str) -> bool {
    g.get(key).and_then(MetaValue::as_bool).unwrap_or(false)
}

/// Reads the tower's shape from an mmproj file of a Qwen projector.
pub fn params(g: &Gguf, kind: QwenKind) -> Result<QwenParams> {
    let k = |s: &str| format!("clip.vision.{s}");
    let act = match (meta_bool(g, "clip.use_gelu"), meta_bool(g, "clip.use_silu")) {
        (true, true) => {
            return Err(Error::Config(
                "mmproj: both clip.use_gelu and clip.use_silu are set".into(),
            ));
        }
        (true, false) => VitAct::GeluTanh,
        (false, true) => VitAct::SiluGated,
        (false, false) => VitAct::QuickGelu,
    };
    if act == VitAct::SiluGated && g.tensor_info("v.blk.0.ffn_gate.weight").is_none() {
        return Err(Error::Unsupported(
            "mmproj: a SiLU FFN without ffn_gate tensors".into(),
        ));
    }
    let (mean, std) = default_mean(kind);
    let merge = meta_opt(g, &k("spatial_merge_size"), 2)?;
    let patch_size = meta_usize(g, &k("patch_size"))?;
    let f = patch_size * merge;
    let deepstack = match g
        .get(&k("is_deepstack_layers"))
        .and_then(MetaValue::as_array)
    {
        None => Vec::new(),
        Some(a) => a
            .iter()
            .enumerate()
            .filter(|(_, v)| v.as_bool() == Some(true))
            .map(|(l, _)| l)
            .collect(),
    };
    let pos_grid = match g.tensor_info("v.position_embd.weight") {
        None => 0,
        Some(t) => {
            let n = t.shape().first().copied().unwrap_or(0);
            let side = (n as f64).sqrt().round() as usize;
            if side * side != n || side == 0 {
                return Err(Error::Weights(format!(
                    "mmproj: v.position_embd.weight has {n} rows, not a square grid"
                )));
            }
            side
        }
    };
    // The text width is the second projection's output (projection_dim may be absent).
    let text_hidden = g
        .tensor_info("mm.2.weight")
        .ok_or_else(|| Error::Weights("mmproj: missing tensor mm.2.weight".into()))?
        .shape()
        .first()
        .copied()
        .unwrap_or(0);
    let mut p = QwenParams {
        kind,
        act,
        patch_size,
        merge,
        hidden: meta_usize(g, &k("embedding_length"))?,
        ffn: meta_usize(g, &k("feed_forward_length"))?,
        layers: meta_usize(g, &k("block_count"))?,
        heads: meta_usize(g, &k("attention.head_count"))?,
        eps: g
            .get_f64(&k("attention.layer_norm_epsilon"))
            .unwrap_or(1e-6) as f32,
        text_hidden,
        mean: meta_triplet(g, &k("image_mean"), mean)?,
        std: meta_triplet(g, &k("image_std"), std)?,
        wa_pattern: meta_opt(g, &k("n_wa_pattern"), 0)?,
        window: meta_opt(g, &k("window_size"), 112)?,
        pos_grid,
        deepstack,
        image_size: f,
        min_pixels: meta_opt(g, &k("image_min_pixels"), DEFAULT_MIN_TOKENS * f * f)?,
        max_pixels: meta_opt(g, &k("image_max_pixels"), DEFAULT_MAX_TOKENS * f * f)?,
        tokens_per_second: meta_opt(g, &k("tokens_per_second"), DEFAULT_TOKENS_PER_SECOND)?,
    };
    if kind == QwenKind::Qwen25Vl && p.wa_pattern == 0 {
        return Err(Error::Config(
            "mmproj: qwen2.5vl_merger without clip.vision.n_wa_pattern".into(),
        ));
    }
    p.check()?;
    // The square the tower takes as is: the file's image size as the preprocessing resizes it.
    let s = meta_opt(g, &k("image_size"), 28 * f)?.clamp(1, 4096);
    p.image_size = p.input_size(s, s)?.0;
    p.check()?;
    Ok(p)
}

/// The values of a tensor, its shape checked (`Getter` of [`build`]).
pub type Getter<'a> = dyn FnMut(&str, &[usize]) -> Result<Vec<f32>> + 'a;

/// A norm's weight and (LayerNorm) bias.
fn norm_of(get: &mut Getter<'_>, rms: bool, name: &str, n: usize) -> Result<[Vec<f32>; 2]> {
    let w = get(&format!("{name}.weight"), &[n])?;
    let b = match rms {
        true => Vec::new(),
        false => get(&format!("{name}.bias"), &[n])?,
    };
    Ok([w, b])
}

/// A linear layer's `[o][i]` weight and bias.
fn lin_of(get: &mut Getter<'_>, name: &str, o: usize, i: usize) -> Result<[Vec<f32>; 2]> {
    Ok([
        get(&format!("{name}.weight"), &[o, i])?,
        get(&format!("{name}.bias"), &[o])?,
    ])
}

/// A merger named by its norm and its two products.
fn merger_of(get: &mut Getter<'_>, p: &QwenParams, names: [&str; 3], n: usize) -> Result<Merger> {
    let wide = p.hidden * p.merge * p.merge;
    let [norm_w, norm_b] = norm_of(get, p.kind.rms(), names[0], n)?;
    let [fc1_w, fc1_b] = lin_of(get, names[1], wide, wide)?;
    let [fc2_w, fc2_b] = lin_of(get, names[2], p.text_hidden, wide)?;
    Ok(Merger {
        norm_w,
        norm_b,
        fc1_w,
        fc1_b,
        fc2_w,
        fc2_b,
    })
}

/// Block `i`'s weights.
fn layer_of(
    get: &mut Getter<'_>,
    has: &dyn Fn(&str) -> bool,
    p: &QwenParams,
    i: usize,
) -> Result<QwenLayer> {
    let (h, f, rms) = (p.hidden, p.ffn, p.kind.rms());
    let b = |s: &str| format!("v.blk.{i}.{s}");
    let [norm1_w, norm1_b] = norm_of(get, rms, &b("ln1"), h)?;
    let [[q_w, q_b], [k_w, k_b], [v_w, v_b]] = if has(&b("attn_qkv.weight")) {
        let [w, bias] = lin_of(get, &b("attn_qkv"), 3 * h, h)?;
        let part = |s: usize| {
            [
                w[s * h * h..(s + 1) * h * h].to_vec(),
                bias[s * h..(s + 1) * h].to_vec(),
            ]
        };
        [part(0), part(1), part(2)]
    } else {
        [
            lin_of(get, &b("attn_q"), h, h)?,
            lin_of(get, &b("attn_k"), h, h)?,
            lin_of(get, &b("attn_v"), h, h)?,
        ]
    };
    let [o_w, o_b] = lin_of(get, &b("attn_out"), h, h)?;
    let [norm2_w, norm2_b] = norm_of(get, rms, &b("ln2"), h)?;
    let [up_w, up_b] = lin_of(get, &b("ffn_up"), f, h)?;
    let [gate_w, gate_b] = match p.act {
        VitAct::SiluGated => lin_of(get, &b("ffn_gate"), f, h)?,
        _ => [Vec::new(), Vec::new()],
    };
    let [down_w, down_b] = lin_of(get, &b("ffn_down"), h, f)?;
    Ok(QwenLayer {
        norm1_w,
        norm1_b,
        q_w,
        q_b,
        k_w,
        k_b,
        v_w,
        v_b,
        o_w,
        o_b,
        norm2_w,
        norm2_b,
        up_w,
        up_b,
        gate_w,
        gate_b,
        down_w,
        down_b,
    })
}

/// Builds the weights from the file's tensors (`get(name, shape)`: the values, the shape
/// checked; `has(name)`: whether the file has it).
pub fn build(
    p: &QwenParams,
    get: &mut Getter<'_>,
    has: &dyn Fn(&str) -> bool,
) -> Result<QwenWeights> {
    let (h, ps) = (p.hidden, p.patch_size);
    let wide = h * p.merge * p.merge;
    let frame0 = get("v.patch_embd.weight", &[h, 3, ps, ps])?;
    let frame1 = get("v.patch_embd.weight.1", &[h, 3, ps, ps])?;
    let k = 3 * ps * ps;
    let mut patch_w = Vec::with_capacity(2 * h * k);
    for j in 0..h {
        patch_w.extend_from_slice(&frame0[j * k..(j + 1) * k]);
        patch_w.extend_from_slice(&frame1[j * k..(j + 1) * k]);
    }
    let patch_b = match has("v.patch_embd.bias") {
        true => get("v.patch_embd.bias", &[h])?,
        false => vec![0.0; h],
    };
    let pos = match p.pos_grid {
        0 => Vec::new(),
        n => get("v.position_embd.weight", &[n * n, h])?,
    };
    let layers = (0..p.layers)
        .map(|i| layer_of(get, has, p, i))
        .collect::<Result<_>>()?;
    let merger = merger_of(get, p, ["v.post_ln", "mm.0", "mm.2"], h)?;
    let deepstack = p
        .deepstack
        .iter()
        .map(|l| {
            let d = |s: &str| format!("v.deepstack.{l}.{s}");
            merger_of(get, p, [&d("norm"), &d("fc1"), &d("fc2")], wide)
        })
        .collect::<Result<_>>()?;
    Ok(QwenWeights {
        patch_w,
        patch_b,
        pos,
        layers,
        merger,
        deepstack,
    })
}

/// The file's tensors of `w` in [`QwenParams::tensor_shapes`] order (the inverse of [`build`]).
pub fn file_tensors(p: &QwenParams, w: &QwenWeights) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let h = p.hidden;
    let k = 3 * p.patch_size * p.patch_size;
    let frame = |f: usize| -> Vec<f32> {
        (0..h)
            .flat_map(|j| {
                w.patch_w[(2 * j + f) * k..(2 * j + f + 1) * k]
                    .iter()
                    .copied()
            })
            .collect()
    };
    let mut by_name: Vec<(String, Vec<f32>)> = vec![
        ("v.patch_embd.weight".into(), frame(0)),
        ("v.patch_embd.weight.1".into(), frame(1)),
        ("v.patch_embd.bias".into(), w.patch_b.clone()),
        ("v.position_embd.weight".into(), w.pos.clone()),
    ];
    let mut push = |n: String, v: &[f32]| by_name.push((n, v.to_vec()));
    for (i, l) in w.layers.iter().enumerate() {
        let b = |s: &str| format!("v.blk.{i}.{s}");
        push(b("ln1.weight"), &l.norm1_w);
        push(b("ln1.bias"), &l.norm1_b);
        push(b("attn_qkv.weight"), &[&l.q_w[..], &l.k_w, &l.v_w].concat());
        push(b("attn_qkv.bias"), &[&l.q_b[..], &l.k_b, &l.v_b].concat());
        for (m, wt, bias) in [
            ("attn_q", &l.q_w, &l.q_b),
            ("attn_k", &l.k_w, &l.k_b),
            ("attn_v", &l.v_w, &l.v_b),
            ("attn_out", &l.o_w, &l.o_b),
            ("ffn_up", &l.up_w, &l.up_b),
            ("ffn_gate", &l.gate_w, &l.gate_b),
            ("ffn_down", &l.down_w, &l.down_b),
        ] {
            push(b(&format!("{m}.weight")), wt);
            push(b(&format!("{m}.bias")), bias);
        }
        push(b("ln2.weight"), &l.norm2_w);
        push(b("ln2.bias"), &l.norm2_b);
    }
    let mut merger = |norm: &str, fc1: &str, fc2: &str, m: &Merger| {
        push(format!("{norm}.weight"), &m.norm_w);
        push(format!("{norm}.bias"), &m.norm_b);
        push(format!("{fc1}.weight"), &m.fc1_w);
        push(format!("{fc1}.bias"), &m.fc1_b);
        push(format!("{fc2}.weight"), &m.fc2_w);
        push(format!("{fc2}.bias"), &m.fc2_b);
    };
    merger("v.post_ln", "mm.0", "mm.2", &w.merger);
    for (&l, m) in p.deepstack.iter().zip(&w.deepstack) {
        let d = |s: &str| format!("v.deepstack.{l}.{s}");
        merger(&d("norm"), &d("fc1"), &d("fc2"), m);
    }
    p.tensor_shapes()
        .into_iter()
        .map(|(name, shape)| {
            let v = by_name
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            (name, shape, v)
        })
        .collect()
}

/// Loads the tower: its shape and every tensor dequantized to f32, shapes checked.
pub fn load(g: &Gguf, kind: QwenKind) -> Result<(QwenParams, QwenWeights)> {
    let p = params(g, kind)?;
    let mut get = |name: &str, shape: &[usize]| tensor_f32(g, name, shape);
    let has = |name: &str| g.tensor_info(name).is_some();
    let w = build(&p, &mut get, &has)?;
    Ok((p, w))
}
