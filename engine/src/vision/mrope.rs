//! M-RoPE positions: where the rotary angles of a Qwen2-VL / Qwen2.5-VL / Qwen3-VL text model
//! (architectures qwen2vl, qwen3vl) place each row of a sequence holding images, as HF
//! transformers' `get_rope_index` does for images.
//!
//! A row has three positions (temporal, height, width; [`crate::ops::rope::Sections`] says
//! which frequencies take which). A text row's three are equal: its text position. The rows of
//! an image of `rows x cols` tokens (raster order) at text position `s` (one after the text
//! before it) are at `(s, s + row, s + col)`, and the text after the image continues at
//! `s + max(rows, cols)`: an image of `rows x cols` tokens moves the text after it by
//! `max(rows, cols)` positions, not `rows * cols`. Text positions start at 0. A video span
//! (Qwen2-VL, Qwen2.5-VL: [`MediaSpan::times`]) is its frame groups' grids one after another,
//! group `g` at `(s + times[g], s + row, s + col)`, and the text after it continues at
//! `s + max(times, rows - 1, cols - 1) + 1` ([`MediaSpan::advance`]; HF's `get_rope_index` for
//! videos; Qwen3-VL's groups are spans of their own, images to this rule).
//!
//! The triple of a position depends only on the images at or before it in its sequence (their
//! places and grids), never on how the sequence's steps were cut, what else ran beside it, or
//! whether its prefix came from the prefix cache: a prefix-cache hit's blocks are keyed by the
//! images they touch (their content hashes, which fix their sizes and so their grids), and the
//! positions after a hit are recomputed from the request's own image list. Every component is
//! at most the row's sequence position (an image of `n` tokens advances the text by at most
//! `n`; a video's times are checked to keep it so: [`super::check_times`]), so tables sized for
//! the context hold them.

use super::MediaSpan;

/// The token grid `(rows, cols)` of an image: its own, else one row of its tokens.
fn grid(m: &MediaSpan) -> (usize, usize) {
    m.grid.unwrap_or((1, m.rows()))
}

/// The M-RoPE positions (temporal, height, width) of sequence positions `start..start + n`
/// of a sequence whose prompt holds `media` (in position order, not overlapping:
/// [`super::check_spans`]).
pub fn positions(media: &[MediaSpan], start: usize, n: usize) -> Vec<[u32; 3]> {
    let mut out = Vec::with_capacity(n);
    // Text position minus sequence position before the next image: each image passed
    // subtracts its tokens and adds its advance.
    let mut shift = 0i64;
    let mut next = 0;
    for pos in start..start + n {
        while let Some(m) = media.get(next).filter(|m| m.range().end <= pos) {
            shift += m.advance() as i64 - m.rows() as i64;
            next += 1;
        }
        let at = |v: i64| v.max(0) as u32;
        out.push(match media.get(next).filter(|m| pos >= m.start) {
            Some(m) => {
                let (r, c) = grid(m);
                let per = (r * c).max(1);
                let (g, i) = ((pos - m.start) / per, ((pos - m.start) % per) as i64);
                let t = m.times.get(g).copied().unwrap_or(0) as i64;
                let s = m.start as i64 + shift;
                let c = c.max(1) as i64;
                [at(s + t), at(s + i / c), at(s + i % c)]
            }
            None => [at(pos as i64 + shift); 3],
        });
    }
    out
}

/// The M-RoPE position of one sequence position ([`positions`]).
pub fn position(media: &[MediaSpan], pos: usize) -> [u32; 3] {
    positions(media, pos, 1)[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(start: usize, rows: usize, cols: usize) -> MediaSpan {
        MediaSpan {
            start,
            embeds: vec![0f32; rows * cols].into(),
            width: 1,
            hash: 0,
            grid: Some((rows, cols)),
            times: Vec::new(),
        }
    }

    #[test]
    fn text_only_is_the_plain_position() {
        assert_eq!(positions(&[], 5, 3), vec![[5; 3], [6; 3], [7; 3]]);
    }

    #[test]
    fn an_image_is_a_grid_and_text_continues_past_its_larger_side() {
        // 2 text tokens, a 2 x 3 image, 2 text tokens.
        let m = [img(2, 2, 3)];
        let p = positions(&m, 0, 10);
        assert_eq!(p[..2], [[0; 3], [1; 3]]);
        assert_eq!(
            p[2..8],
            [
                [2, 2, 2],
                [2, 2, 3],
                [2, 2, 4],
                [2, 3, 2],
                [2, 3, 3],
                [2, 3, 4]
            ]
        );
        assert_eq!(p[8..], [[5; 3], [6; 3]]);
        // Any window of it is the same.
        for s in 0..10 {
            for n in 0..10 - s {
                assert_eq!(positions(&m, s, n), p[s..s + n]);
            }
        }
    }

    #[test]
    fn images_back_to_back_and_tall_ones() {
        // A 3 x 1 image at 1, then a 1 x 2 image right after it.
        let m = [img(1, 3, 1), img(4, 1, 2)];
        let p = positions(&m, 0, 8);
        assert_eq!(
            p,
            vec![
                [0; 3],
                [1, 1, 1],
                [1, 2, 1],
                [1, 3, 1],
                [4, 4, 4],
                [4, 4, 5],
                [6; 3],
                [7; 3]
            ]
        );
        // Every component is at most the sequence position.
        for (i, t) in p.iter().enumerate() {
            assert!(t.iter().all(|&v| v as usize <= i), "{i}: {t:?}");
        }
    }

    #[test]
    fn a_video_is_its_groups_at_their_times() {
        // 1 text token, a video of 3 groups of 1 x 2 tokens at times 0, 4, 8 (Qwen2.5-VL at
        // 1 fps would need 4 tokens a group: these times are the rule's, not its check's).
        let mut v = img(1, 1, 6);
        v.grid = Some((1, 2));
        v.times = vec![0, 1, 2];
        let p = positions(&[v.clone()], 0, 9);
        assert_eq!(
            p,
            vec![
                [0; 3],
                [1, 1, 1],
                [1, 1, 2],
                [2, 1, 1],
                [2, 1, 2],
                [3, 1, 1],
                [3, 1, 2],
                // One past the largest offset (2 + 1): 1 + 3.
                [4; 3],
                [5; 3]
            ]
        );
        v.times = vec![0, 0, 0];
        assert_eq!(positions(&[v], 7, 1), vec![[3; 3]]);
    }

    #[test]
    fn a_span_without_a_grid_is_one_row() {
        let mut m = img(0, 1, 3);
        m.grid = None;
        assert_eq!(
            positions(&[m], 0, 4),
            vec![[0, 0, 0], [0, 0, 1], [0, 0, 2], [3; 3]]
        );
    }
}
