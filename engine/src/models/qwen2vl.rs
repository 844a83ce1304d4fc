//! qwen2vl: the text model of Qwen2-VL and Qwen2.5-VL: qwen2 (biases on q/k/v) with M-RoPE,
//! the rotary frequencies in contiguous sections over the temporal, height and width positions
//! of each row (crate::vision::mrope). It takes image rows (a Qwen ViT's, `+mmproj=`).
//! GGUF: llama.cpp's `qwen2vl` with `qwen2vl.rope.dimension_sections` (four integers, the
//! fourth 0); HF: the flat config of the original Qwen2.5-VL release with
//! `rope_scaling.mrope_section` and `model.layers.*` text tensors (the tower's `visual.*`
//! ones are the mmproj's).

use super::{Arch, ArchDef, Forward, ModelWeights, Stage, TensorSpec, blocks, llama};
use crate::config::{ModelConfig, VlParams};
use crate::error::{Error, Result};
use crate::formats::gguf::MetaValue;
use crate::ops::Ops;
use crate::ops::rope::Sections;

pub const DEF: ArchDef = ArchDef {
    arch: Arch::Qwen2Vl,
    gguf_name: "qwen2vl",
    hf_class: "Qwen2_5_VLForConditionalGeneration",
    gguf_qk_permuted: false,
    hf_norm_offset: 0.0,
    chat_template: None,
    layer_names: &llama::NAMES,
    tensors,
    hf_config: |c, v| {
        v["attention_bias"] = true.into();
        hf_config(c, v);
    },
    hf_tensor: None,
};

fn tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    llama::decoder_tensors(c, |l| blocks::qkv_bias_tensors(c, l).to_vec())
}

/// The llama forward pass with this list's biases and the config's M-RoPE table.
pub fn build<O: Ops>(w: &ModelWeights, s: &Stage, ops: &mut O) -> Result<Box<dyn Forward<O>>> {
    llama::build_llama(w, s, ops, true)
}

/// The M-RoPE parameters of a qwen2vl / qwen3vl GGUF: `{arch}.rope.dimension_sections`
/// (required: three or four integers, a fourth one 0) and `qwen3vl.n_deepstack_layers`
/// (default 0). Shared by qwen3vl.rs.
pub fn gguf_params<'a>(
    c: &ModelConfig,
    get: &dyn Fn(&str) -> Option<&'a MetaValue>,
) -> Result<Option<VlParams>> {
    if !c.arch.is_vl() {
        return Ok(None);
    }
    let a = c.arch.gguf_name();
    let key = format!("{a}.rope.dimension_sections");
    let vals = get("rope.dimension_sections")
        .and_then(|v| v.as_array())
        .ok_or_else(|| {
            Error::Config(format!(
                "GGUF metadata `{key}` is missing or not an array (an M-RoPE model's sections)"
            ))
        })?;
    let ints: Option<Vec<u64>> = vals.iter().map(|v| v.as_u64()).collect();
    let sizes = sections_of(ints.as_deref(), &key)?;
    let deepstack = match get("n_deepstack_layers") {
        None => 0,
        Some(v) => v.as_u64().ok_or_else(|| {
            Error::Config(format!(
                "GGUF metadata `{a}.n_deepstack_layers` is not an integer"
            ))
        })? as usize,
    };
    Ok(Some(VlParams {
        sections: Sections {
            sizes,
            interleaved: c.arch == Arch::Qwen3Vl,
        },
        deepstack,
    }))
}

/// Three sections from `ints` (three, or four with the fourth 0: llama.cpp pads them to
/// four), each at most 2^16; an error naming `key` otherwise.
fn sections_of(ints: Option<&[u64]>, key: &str) -> Result<[usize; 3]> {
    let bad = |why: &str| Error::Config(format!("GGUF metadata `{key}` {why}"));
    let ints = ints.ok_or_else(|| bad("holds a value that is not a non-negative integer"))?;
    match ints {
        [t, h, w] | [t, h, w, 0] if [t, h, w].iter().all(|&&v| v <= 1 << 16) => {
            Ok([*t as usize, *h as usize, *w as usize])
        }
        [_, _, _, e] if *e != 0 => Err(bad(&format!(
            "{ints:?}: a fourth section ({e}) is not supported (temporal, height and width only)"
        ))),
        _ => Err(bad(&format!(
            "{ints:?}: want three sections (temporal, height, width), or four with the last 0"
        ))),
    }
}

/// The GGUF metadata keys [`gguf_params`] reads, for writers (synthetic models, conversions).
pub fn gguf_keys(arch: Arch, p: &VlParams) -> Vec<(String, MetaValue)> {
    let a = arch.gguf_name();
    let mut sections: Vec<MetaValue> = p
        .sections
        .sizes
        .iter()
        .map(|&v| MetaValue::I32(v as i32))
        .collect();
    sections.push(MetaValue::I32(0));
    let mut m = vec![(
        format!("{a}.rope.dimension_sections"),
        MetaValue::Array(sections),
    )];
    if arch == Arch::Qwen3Vl {
        m.push((
            format!("{a}.n_deepstack_layers"),
            MetaValue::U32(p.deepstack as u32),
        ));
    }
    m
}

/// The M-RoPE parameters of an HF config: `rope_scaling.mrope_section` (required) and, for
/// qwen3vl, `rope_scaling.mrope_interleaved` (true) and `n_deepstack_layers` (memra's own key;
/// default 0).
pub fn hf_params(c: &ModelConfig, v: &serde_json::Value) -> Result<Option<VlParams>> {
    if !c.arch.is_vl() {
        return Ok(None);
    }
    let key = "config.json `rope_scaling.mrope_section`";
    let ints: Option<Vec<u64>> = v
        .get("rope_scaling")
        .and_then(|r| r.get("mrope_section"))
        .and_then(|s| s.as_array())
        .ok_or_else(|| Error::Config(format!("{key} is missing (an M-RoPE model's sections)")))?
        .iter()
        .map(|x| x.as_u64())
        .collect();
    let sizes = sections_of(ints.as_deref(), key)?;
    Ok(Some(VlParams {
        sections: Sections {
            sizes,
            interleaved: c.arch == Arch::Qwen3Vl,
        },
        deepstack: v
            .get("n_deepstack_layers")
            .and_then(|x| x.as_u64())
            .unwrap_or(0) as usize,
    }))
}

/// Writes [`hf_params`]' keys.
pub fn hf_config(c: &ModelConfig, v: &mut serde_json::Value) {
    let Some(p) = c.vl else { return };
    v["rope_scaling"] = serde_json::json!({
        "type": "mrope",
        "mrope_section": p.sections.sizes,
        "mrope_interleaved": p.sections.interleaved,
    });
    if p.deepstack > 0 {
        v["n_deepstack_layers"] = p.deepstack.into();
    }
}
