//! A video part on a tower with the model's own video path (the Qwen ViT; engine
//! `vision::video`): what each [`super::MARKER`] of the request becomes.
//!
//! - Qwen2-VL / Qwen2.5-VL: the video stays one marker and becomes one span, `<|vision_start|>`,
//!   a `<|video_pad|>` per row, `<|vision_end|>` (what the model's chat template writes for a
//!   video part, `<|vision_start|><|video_pad|><|vision_end|>`, with the processor's pads), its
//!   frame groups placed in time by `MediaSpan::times`.
//! - Qwen3-VL: the processor replaces that placeholder with, per frame group, its timestamp text
//!   `<{seconds:.1f} seconds>` and the group's own `<|vision_start|>` pads `<|vision_end|>`: the
//!   video's marker becomes a timestamp and a marker per group ([`timestamped`]), so the
//!   timestamps are tokenized with the message text around them, as HF's tokenizer sees them.
//!
//! Gemma 3's tower has no video path: a video's kept frames are images, all at its marker. The
//! frame cap, the sampling and the limits are the same for both (`decode_all`).

use memra_engine::chat::ChatMessage;
use memra_engine::vision::VisionTower;
use memra_engine::vision::video::{self, Layout};

use super::{Decoded, Embedded, MARKER, Pixels, Vision};
use crate::errors::ApiError;

/// What stands at one marker of the rendered prompt.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Images: an image, or a video's frames on a tower without a video path.
    Images(Vec<Pixels>),
    /// A video's frames as one span of frame groups at `times` (Qwen2-VL, Qwen2.5-VL), or one
    /// frame group's two frames (Qwen3-VL; `times` empty).
    Video {
        frames: Vec<Pixels>,
        times: Vec<u32>,
    },
}

impl Part {
    /// The part's encoded images or video ([`Vision::embed`], [`Vision::embed_video`]).
    pub fn embed(&self, v: &Vision) -> memra_engine::Result<Vec<Embedded>> {
        match self {
            Part::Images(px) => px.iter().map(|p| v.embed(p)).collect(),
            Part::Video { frames, times } => Ok(vec![v.embed_video(frames, times.clone())?]),
        }
    }
}

/// The parts of the request's images and videos in marker order, and what each original
/// marker's text becomes (the marker itself, or a Qwen3-VL video's timestamps and markers).
/// A video whose temporal positions would run ahead of its tokens (Qwen2.5-VL: frames of a
/// few tokens at a low rate; `check_times`) is a 400 naming its part.
pub fn parts(
    decoded: Vec<Decoded>,
    tower: &VisionTower,
) -> Result<(Vec<Part>, Vec<String>), ApiError> {
    let mut parts = Vec::with_capacity(decoded.len());
    let mut markers = Vec::with_capacity(decoded.len());
    for d in decoded {
        let (Some((clock, param)), Some(q)) = (&d.video, tower.qwen_params()) else {
            parts.push(Part::Images(d.frames));
            markers.push(MARKER.to_string());
            continue;
        };
        match video::layout(q.kind, clock, q.tokens_per_second) {
            Layout::OneSpan { times } => {
                let grid = d.frames.first().map(|f| {
                    let (w, h) = (f.width as usize, f.height as usize);
                    tower.grid_for(w, h)
                });
                memra_engine::vision::check_times(grid, &times)
                    .map_err(|e| ApiError::param(param, format!("the video: {e}")))?;
                parts.push(Part::Video {
                    frames: d.frames,
                    times,
                });
                markers.push(MARKER.to_string());
            }
            Layout::PerGroup { seconds } => {
                let mut text = String::new();
                for ([a, b], s) in video::pairs(d.frames.len()).into_iter().zip(seconds) {
                    text.push_str(&video::timestamp_text(s));
                    text.push_str(MARKER);
                    parts.push(Part::Video {
                        frames: vec![d.frames[a].clone(), d.frames[b].clone()],
                        times: Vec::new(),
                    });
                }
                markers.push(text);
            }
        }
    }
    Ok((parts, markers))
}

/// `messages` with the `k`-th [`MARKER`] (in message order) replaced by `markers[k]`; the
/// messages themselves when every marker stays as it is.
pub fn timestamped(messages: &[ChatMessage], markers: &[String]) -> Vec<ChatMessage> {
    let mut out = messages.to_vec();
    if markers.iter().all(|m| m == MARKER) {
        return out;
    }
    let mut k = 0;
    for m in &mut out {
        if !m.content.contains(MARKER) {
            continue;
        }
        let mut text = String::with_capacity(m.content.len());
        for (i, piece) in m.content.split(MARKER).enumerate() {
            if i > 0 {
                text.push_str(markers.get(k).map_or(MARKER, String::as_str));
                k += 1;
            }
            text.push_str(piece);
        }
        m.content = text;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_replaced_in_order_across_messages() {
        let msgs = vec![
            ChatMessage::new("user", format!("a{MARKER}b{MARKER}")),
            ChatMessage::new("assistant", "x".to_string()),
            ChatMessage::new("user", format!("{MARKER}c")),
        ];
        let same = timestamped(&msgs, &[MARKER.into(), MARKER.into(), MARKER.into()]);
        assert_eq!(same, msgs);
        let marks = [
            MARKER.to_string(),
            format!("<0.5 seconds>{MARKER}<2.0 seconds>{MARKER}"),
            MARKER.to_string(),
        ];
        let got = timestamped(&msgs, &marks);
        assert_eq!(
            got[0].content,
            format!("a{MARKER}b<0.5 seconds>{MARKER}<2.0 seconds>{MARKER}")
        );
        assert_eq!(got[1].content, "x");
        assert_eq!(got[2].content, format!("{MARKER}c"));
    }
}
