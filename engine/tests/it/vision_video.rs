//! Video input on the Qwen ViT (tiny random towers, the CPU): frames two at a time through the
//! temporal patch (an odd count repeats its last frame, one frame is the image), each frame
//! group's rows its own; the M-RoPE positions of a video for each family against a port of HF
//! transformers' `get_rope_index` for videos (Qwen2-VL: the group index; Qwen2.5-VL: scaled by
//! seconds and truncated; Qwen3-VL: a span per group after its timestamp text, each placed like
//! an image); times that would run ahead of the rows refused; and through the engine: the same
//! video and rate again a prefix-cache hit past it with the same bits, another rate a miss.
//! The tower against the numpy reference: `memra-verify vision --family ...` (its video case).

use crate::common;
use crate::common::run_request as run;
use crate::common::{bits, image as frame};

use std::sync::Arc;

use memra_engine::config::Arch;
use memra_engine::engine::EngineHandle;
use memra_engine::request::ValidRequest;
use memra_engine::vision::random::tiny_qwen;
use memra_engine::vision::video::{self, Clock, Layout};
use memra_engine::vision::{MediaSpan, QwenKind, check_spans, mrope};

const HIDDEN: usize = 64;

/// Frames two at a time: a group's rows are its pair's (not the two frames' images'), an odd
/// count repeats its last frame, a one-frame video is the image, groups are independent.
#[test]
fn frames_go_through_the_temporal_patch_in_pairs() {
    for kind in [QwenKind::Qwen2Vl, QwenKind::Qwen25Vl, QwenKind::Qwen3Vl] {
        let tower = tiny_qwen(kind, HIDDEN, 3).unwrap();
        let (w, h) = (48, 32);
        let per = tower.tokens_for(w, h) * tower.out_width();
        let f: Vec<Vec<u8>> = (0..4).map(|s| frame(w, h, s)).collect();
        let fr = |ix: &[usize]| -> Vec<&[u8]> { ix.iter().map(|&i| &f[i][..]).collect() };
        let three = tower.encode_video(w, h, &fr(&[0, 1, 2])).unwrap();
        assert_eq!(three.len(), 2 * per, "{kind:?}");
        // An odd count repeats its last frame.
        let padded = tower.encode_video(w, h, &fr(&[0, 1, 2, 2])).unwrap();
        assert_eq!(bits(&three), bits(&padded), "{kind:?}");
        // Each group is its own: group 1 of (0, 1, 2) is the video (2) alone, which is the
        // image of frame 2 (both temporal kernels on one frame).
        let alone = tower.encode_video(w, h, &fr(&[2])).unwrap();
        assert_eq!(bits(&three[per..]), bits(&alone), "{kind:?}");
        assert_eq!(
            bits(&alone),
            bits(&tower.encode_image(w, h, &f[2]).unwrap()),
            "{kind:?}"
        );
        let pair = tower.encode_video(w, h, &fr(&[0, 1])).unwrap();
        assert_eq!(bits(&three[..per]), bits(&pair), "{kind:?}");
        // Frame 0 and frame 1 meet different kernels: the pair is neither frame's image, and
        // the order matters.
        let img0 = tower.encode_image(w, h, &f[0]).unwrap();
        assert_ne!(bits(&pair), bits(&img0), "{kind:?}");
        let swapped = tower.encode_video(w, h, &fr(&[1, 0])).unwrap();
        assert_ne!(bits(&pair), bits(&swapped), "{kind:?}");
        // The hash is of the frames in order.
        let hash = |ix: &[usize]| tower.hash_video(w, h, &fr(ix));
        assert_eq!(hash(&[0, 1, 2]), hash(&[0, 1, 2]));
        assert_ne!(hash(&[0, 1, 2]), hash(&[1, 0, 2]));
        assert_ne!(hash(&[2]), tower.hash_image(w, h, &f[2]));
        // Frames of another size, or none, are refused.
        assert!(tower.encode_video(w, h, &[&f[0][1..]]).is_err());
        assert!(tower.encode_video(w, h, &[]).is_err());
    }
    // Gemma 3's tower has no video path.
    let g = memra_engine::vision::random::tiny_tower(HIDDEN, 1);
    assert!(!g.takes_video());
    let s = g.image_size();
    assert!(g.encode_video(s, s, &[&frame(s, s, 1)]).is_err());
}

/// HF's `get_rope_index` for one sequence of `n` tokens holding images and videos, each
/// `(start, t, rows, cols, t_index)`: chunk by chunk, the text before each at one past the
/// previous chunk's largest position, the media's `(t_index[t], row, col)` grids after it.
fn hf_rope_index(n: usize, media: &[(usize, usize, usize, usize, Vec<i64>)]) -> Vec<[i64; 3]> {
    let mut all: Vec<[i64; 3]> = Vec::new();
    let top = |a: &Vec<[i64; 3]>| a.iter().flatten().max().map_or(0, |m| m + 1);
    let mut st = 0;
    for (ed, t, h, w, t_index) in media {
        let st_idx = top(&all);
        let text_len = (ed - st) as i64;
        all.extend((0..text_len).map(|i| [st_idx + i; 3]));
        for &tt in &t_index[..*t] {
            for hh in 0..*h as i64 {
                for ww in 0..*w as i64 {
                    all.push([tt, hh, ww].map(|v| v + text_len + st_idx));
                }
            }
        }
        st = ed + t * h * w;
    }
    let st_idx = top(&all);
    all.extend((0..(n - st) as i64).map(|i| [st_idx + i; 3]));
    all
}

fn video_span(start: usize, grid: (usize, usize), times: Vec<u32>) -> MediaSpan {
    let groups = times.len().max(1);
    MediaSpan {
        start,
        embeds: vec![0f32; groups * grid.0 * grid.1].into(),
        width: 1,
        hash: start as u128,
        grid: Some(grid),
        times,
    }
}

/// A video of 5 frames (3 groups, the last repeated) of 2 x 3 tokens a group, at 1 fps, between
/// text and an image: the positions of each family's layout equal HF's.
#[test]
fn video_positions_follow_hf_for_each_family() {
    let clock = Clock {
        indices: vec![0, 2, 4, 6, 8],
        fps: 2.0,
        sampled_fps: 1.0,
    };
    let (r, c) = (2, 3);
    for kind in [QwenKind::Qwen2Vl, QwenKind::Qwen25Vl, QwenKind::Qwen3Vl] {
        let lay = video::layout(kind, &clock, 2);
        let (media, hf, n) = match &lay {
            Layout::OneSpan { times } => {
                // HF's t index: Qwen2-VL arange(3); Qwen2.5-VL arange(3) x (2 / 1) x 2.
                let want: Vec<i64> = match kind {
                    QwenKind::Qwen2Vl => vec![0, 1, 2],
                    _ => vec![0, 4, 8],
                };
                assert_eq!(times.iter().map(|&t| t as i64).collect::<Vec<_>>(), want);
                // 3 text, the video (18 rows), 2 text, a 2 x 2 image, 3 text.
                let n = 3 + 18 + 2 + 4 + 3;
                let media = vec![
                    video_span(3, (r, c), times.clone()),
                    video_span(23, (2, 2), Vec::new()),
                ];
                let hf = vec![(3, 3, r, c, want), (23, 1, 2, 2, vec![0])];
                (media, hf, n)
            }
            Layout::PerGroup { seconds } => {
                // Frames at 0, 1, 2, 3, 4 s: groups (0, 1), (2, 3), (4, 4).
                assert_eq!(seconds, &vec![0.5, 2.5, 4.0]);
                assert_eq!(video::timestamp_text(seconds[1]), "<2.5 seconds>");
                // 3 text, then per group 4 timestamp tokens and its 6 rows, 3 text: HF splits
                // the video into groups of t = 1, images to its rule.
                let mut media = Vec::new();
                let mut hf = Vec::new();
                let mut at = 3;
                for _ in seconds {
                    at += 4;
                    media.push(video_span(at, (r, c), Vec::new()));
                    hf.push((at, 1, r, c, vec![0]));
                    at += r * c;
                }
                (media, hf, at + 3)
            }
        };
        check_spans(&media, n, 1).unwrap();
        let got: Vec<[i64; 3]> = mrope::positions(&media, 0, n)
            .iter()
            .map(|t| t.map(i64::from))
            .collect();
        assert_eq!(got, hf_rope_index(n, &hf), "{kind:?}");
        // Every component at most its sequence position (tables of the context hold them).
        for (i, t) in got.iter().enumerate() {
            assert!(t.iter().all(|&v| v <= i as i64), "{kind:?} {i}: {t:?}");
        }
    }
}

/// Times that would run ahead of the rows (Qwen2.5-VL at a low rate with small frames) and
/// spans whose rows are not their groups' grids are refused.
#[test]
fn video_times_are_checked() {
    // 2 x 2 tokens a group: group 1 at 4 is fine, at 5 runs past.
    check_spans(&[video_span(0, (2, 2), vec![0, 4])], 8, 1).unwrap();
    let e = check_spans(&[video_span(0, (2, 2), vec![0, 5])], 8, 1).unwrap_err();
    assert!(e.to_string().contains("frame group 1"), "{e}");
    // 0.25 fps, 2 tokens a second: 16 positions a group.
    let times = video::scaled_times(3, 0.25, 2);
    assert_eq!(times, vec![0, 16, 32]);
    assert!(check_spans(&[video_span(0, (2, 2), times)], 12, 1).is_err());
    // Rows that are not groups x grid.
    let mut bad = video_span(0, (2, 2), vec![0, 1]);
    bad.embeds = vec![0f32; 6].into();
    assert!(check_spans(&[bad], 8, 1).is_err());
    // Times without a grid.
    let mut bare = video_span(0, (2, 2), vec![0, 1]);
    bare.grid = None;
    assert!(check_spans(&[bare], 8, 1).is_err());
}

fn start(arch: Arch, budget: usize) -> EngineHandle {
    common::start_cpu(arch, 128, budget)
}

fn request(prompt: Vec<u32>, media: Vec<MediaSpan>) -> ValidRequest {
    common::media_request(prompt, media, 8, false)
}

/// A Qwen2.5-VL video through a qwen2vl engine: the same frames at the same rate again are a
/// prefix-cache hit past the video with the same bits; the same frames at another rate (other
/// times, so other positions) miss from the video on and give a fresh engine's bits; times
/// that run ahead are refused at submit.
#[test]
fn a_served_video_is_keyed_by_its_frames_and_rate() {
    let tower = tiny_qwen(QwenKind::Qwen25Vl, HIDDEN, 2).unwrap();
    let (w, h) = (48, 32);
    let frames: Vec<Vec<u8>> = (0..3).map(|s| frame(w, h, 10 + s)).collect();
    let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    let rows: Arc<[f32]> = tower.encode_video(w, h, &refs).unwrap().into();
    let hash = tower.hash_video(w, h, &refs);
    let grid = tower.grid_for(w, h);
    let n = rows.len() / tower.out_width();
    let prompt = |fps: f64| {
        let mut ids: Vec<u32> = vec![11, 12, 13];
        let media = vec![MediaSpan {
            start: ids.len(),
            embeds: rows.clone(),
            width: tower.out_width(),
            hash,
            grid: Some(grid),
            times: video::scaled_times(2, fps, 2),
        }];
        ids.extend(std::iter::repeat_n(0, n));
        ids.extend([21, 22, 23, 24, 25]);
        (ids, media)
    };
    let e = start(Arch::Qwen2Vl, 64);
    let (ids, media) = prompt(1.0);
    let first = run(&e, request(ids.clone(), media.clone()));
    let again = run(&e, request(ids.clone(), media.clone()));
    assert_eq!(again.0, first.0);
    assert!(again.1 >= media[0].range().end, "{} cached", again.1);
    // Another rate: other times, a miss from the video on, a fresh engine's bits.
    let (ids2, media2) = prompt(2.0);
    assert_ne!(media2[0].times, media[0].times);
    let other = run(&e, request(ids2.clone(), media2.clone()));
    assert!(other.1 <= media[0].start, "{} cached", other.1);
    let fresh = run(&start(Arch::Qwen2Vl, 64), request(ids2, media2));
    assert_eq!(other.0, fresh.0);
    assert_ne!(other.0, first.0, "the times reach the positions");
    // Times that run ahead of the rows: refused at submit.
    let (ids3, mut media3) = prompt(1.0);
    media3[0].times = vec![0, n as u32];
    let err = match e.submit(request(ids3, media3)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("times past the rows were taken"),
    };
    assert!(err.contains("frame group"), "{err}");
}
