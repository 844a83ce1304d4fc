//! Video input for the Qwen ViT: the model's own video path as HF transformers defines it
//! (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: the processors' frame grouping and timestamps,
//! `get_rope_index` for videos).
//!
//! A video's frames (already sampled, all of one input size) go through the tower two at a
//! time (the temporal patch of 2): frames `2k` and `2k + 1` make frame group `k`, frame `2k`
//! meeting the patch convolution's first temporal kernel and `2k + 1` its second; an odd count
//! repeats the last frame ([`pairs`]). Each group is encoded on its own
//! ([`super::qwenvit::forward_pair`]: the ViT attends within a group), so a video's rows are its
//! groups' rows, group after group, `rows x cols` tokens each (HF's `grid_thw` is `(T / 2, h,
//! w)` in patches).
//!
//! Where the rows sit in the prompt ([`Layout`]), by the tower's family:
//!
//! - Qwen2-VL and Qwen2.5-VL: one span (`<|vision_start|>`, a `<|video_pad|>` per row,
//!   `<|vision_end|>`) whose groups share its text position `s`; group `g`'s rows are at
//!   `(s + times[g], s + row, s + col)` ([`super::MediaSpan::times`]): Qwen2-VL `times[g] = g`,
//!   Qwen2.5-VL `g x second_per_grid_t x tokens_per_second` truncated, `second_per_grid_t = 2 /
//!   fps` ([`scaled_times`]); the text after it continues one past its largest position.
//! - Qwen3-VL: each group is its own span placed like an image, preceded by the text
//!   `<{seconds:.1f} seconds>` ([`timestamp_text`]) of the mean time of its two frames
//!   ([`group_seconds`]; HF `Qwen3VLProcessor._calculate_timestamps`).

use super::QwenKind;

/// Frames per temporal patch (HF `temporal_patch_size`; the two patch kernels of an mmproj).
pub const TEMPORAL_PATCH: usize = 2;

/// The frame groups of `n` frames: `(2k, 2k + 1)`, the last frame repeated when `n` is odd.
pub fn pairs(n: usize) -> Vec<[usize; 2]> {
    (0..n.div_ceil(TEMPORAL_PATCH))
        .map(|k| [2 * k, (2 * k + 1).min(n.saturating_sub(1))])
        .collect()
}

/// When a video's kept frames were taken: their indices in the frames sent, the rate those
/// were sent at, and the rate the kept ones stand for (the sampling rate, or the sent rate
/// when every frame was kept).
#[derive(Clone, Debug, PartialEq)]
pub struct Clock {
    pub indices: Vec<usize>,
    pub fps: f64,
    pub sampled_fps: f64,
}

/// How a video's frame groups stand in the prompt.
#[derive(Clone, Debug, PartialEq)]
pub enum Layout {
    /// One span of every group's rows; each group's temporal position offset
    /// ([`super::MediaSpan::times`]). Qwen2-VL, Qwen2.5-VL.
    OneSpan { times: Vec<u32> },
    /// A span per group placed like an image, each after its timestamp text
    /// ([`timestamp_text`] of these seconds). Qwen3-VL.
    PerGroup { seconds: Vec<f64> },
}

/// The layout of a video of `clock.indices.len()` kept frames for a tower of `kind`.
pub fn layout(kind: QwenKind, clock: &Clock, tokens_per_second: usize) -> Layout {
    let groups = pairs(clock.indices.len()).len();
    match kind {
        QwenKind::Qwen2Vl => Layout::OneSpan {
            times: (0..groups as u32).collect(),
        },
        QwenKind::Qwen25Vl => Layout::OneSpan {
            times: scaled_times(groups, clock.sampled_fps, tokens_per_second),
        },
        QwenKind::Qwen3Vl => Layout::PerGroup {
            seconds: group_seconds(&clock.indices, clock.fps),
        },
    }
}

/// Qwen2.5-VL's temporal positions of `groups` frame groups sampled at `fps`: group `g` at
/// `(g x second_per_grid_t) x tokens_per_second` truncated, with `second_per_grid_t = 2 / fps`
/// (the processor's, a float32 tensor) and the products in float32 (HF `get_rope_index`:
/// `expanded_range * second_per_grid_t * tokens_per_second`, then `.long()`).
pub fn scaled_times(groups: usize, fps: f64, tokens_per_second: usize) -> Vec<u32> {
    let per = (TEMPORAL_PATCH as f64 / fps) as f32;
    let tps = tokens_per_second as f32;
    (0..groups)
        .map(|g| {
            let t = (g as f32 * per) * tps;
            if t.is_finite() && t > 0.0 {
                t.min(u32::MAX as f32) as u32
            } else {
                0
            }
        })
        .collect()
}

/// Qwen3-VL's timestamp of each frame group, in seconds: a frame's time is its index over
/// `fps`, a group's the mean of its first and last frame's (the last frame's index repeated
/// for an odd count).
pub fn group_seconds(indices: &[usize], fps: f64) -> Vec<f64> {
    let at = |i: usize| indices[i] as f64 / fps;
    pairs(indices.len())
        .into_iter()
        .map(|[a, b]| (at(a) + at(b)) / 2.0)
        .collect()
}

/// The text before a Qwen3-VL frame group: `<{seconds:.1f} seconds>` (one decimal, the value
/// rounded as Python's format rounds it: to the nearest, ties of the exact binary value to
/// even).
pub fn timestamp_text(seconds: f64) -> String {
    format!("<{seconds:.1} seconds>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_pair_up_and_an_odd_one_repeats() {
        assert_eq!(pairs(1), vec![[0, 0]]);
        assert_eq!(pairs(3), vec![[0, 1], [2, 2]]);
        assert_eq!(pairs(4), vec![[0, 1], [2, 3]]);
        assert!(pairs(0).is_empty());
    }

    #[test]
    fn qwen25_times_scale_by_seconds_and_truncate() {
        // 1 fps: 2 s a group, 2 tokens a second: 4 a group.
        assert_eq!(scaled_times(3, 1.0, 2), vec![0, 4, 8]);
        // 4 fps: half a second a group, one position (not truncated to 0 first).
        assert_eq!(scaled_times(4, 4.0, 2), vec![0, 1, 2, 3]);
        // 3 fps: 2/3 s, 4/3 positions a group: 0, 1.33, 2.67, 4.0 -> 0, 1, 2, 4.
        assert_eq!(scaled_times(4, 3.0, 2), vec![0, 1, 2, 4]);
        // 2 fps, 25 tokens a second (HF's docstring example): 0, 50, 100.
        assert_eq!(scaled_times(3, 1.0, 25), vec![0, 50, 100]);
    }

    #[test]
    fn layouts_of_the_three_families() {
        let clock = Clock {
            indices: vec![0, 2, 4],
            fps: 2.0,
            sampled_fps: 1.0,
        };
        assert_eq!(
            layout(QwenKind::Qwen2Vl, &clock, 2),
            Layout::OneSpan { times: vec![0, 1] }
        );
        assert_eq!(
            layout(QwenKind::Qwen25Vl, &clock, 2),
            Layout::OneSpan { times: vec![0, 4] }
        );
        // Frames at 0, 1 and 2 s: groups (0, 1) and (2, 2).
        assert_eq!(
            layout(QwenKind::Qwen3Vl, &clock, 2),
            Layout::PerGroup {
                seconds: vec![0.5, 2.0]
            }
        );
    }

    #[test]
    fn timestamps_have_one_decimal_rounded_as_python() {
        assert_eq!(timestamp_text(0.5), "<0.5 seconds>");
        assert_eq!(timestamp_text(2.0), "<2.0 seconds>");
        assert_eq!(timestamp_text(10.85), "<10.8 seconds>"); // 10.85 is 10.8499.. in binary
        assert_eq!(timestamp_text(0.25), "<0.2 seconds>"); // an exact tie: to even
        assert_eq!(timestamp_text(1.0 / 3.0), "<0.3 seconds>");
    }
}
