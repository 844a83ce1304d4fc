//! Bidirectional attention within an image (Gemma 3, backend/spans.rs) on the CPU, tiny random
//! gemma3 (window 4, shorter than the image: its local layers see the union of the window and
//! the image): the image rows see each other both ways and that changes the logits; any
//! chunking that never ends a chunk inside the image gives the whole prefill's bits (logits
//! and KV bytes), a step that would is refused; a sequence that reuses KV blocks ending inside
//! the image (a prefix-cache hit) computes the rest with the same bits. Through the engine
//! (a prefix-cache hit ending inside an image == a miss, an image larger than the step budget
//! refused): tests/it/vision.rs.

use std::ops::Range;
use std::sync::Arc;

use crate::common;

use memra_engine::backend::cpu::{CpuBackend, CpuOptions};
use memra_engine::backend::{Backend, RowEmbed};
use memra_engine::config::Arch;
use memra_engine::models::random::{random_weights, tiny_config, unit};
use memra_engine::quant::DType;

const VOCAB: usize = 300;
const HIDDEN: usize = 64;
/// The image: positions 5..14 of a 20-token prompt.
const IMG: Range<usize> = 5..14;
const N: usize = 20;

fn backend() -> CpuBackend {
    let cfg = tiny_config(Arch::Gemma3, VOCAB);
    let w = random_weights(&cfg, 11, DType::F32).expect("weights");
    let opts = CpuOptions {
        threads: 2,
        kv_blocks: 16,
        block_size: 4,
        ..Default::default()
    };
    CpuBackend::new(w, &opts).expect("backend")
}

fn tokens() -> Vec<u32> {
    (0..N as u32)
        .map(|i| (i * 37 + 11) % VOCAB as u32)
        .collect()
}

/// The image's rows: `IMG.len() x HIDDEN` values, the last row from `last_seed`.
fn image(last_seed: u64) -> Arc<[f32]> {
    let n = IMG.len() * HIDDEN;
    (0..n)
        .map(|i| {
            let seed = if i >= n - HIDDEN { last_seed } else { 3 };
            unit(seed, 1, i as u64) * 2.0
        })
        .collect()
}

/// How the image's rows are described to the backend.
#[derive(Clone, Copy, PartialEq)]
enum Spans {
    /// One span: the image (bidirectional).
    Image,
    /// Each row its own one-position span: causal attention over the same rows.
    PerRow,
}

/// Rows `r` of the prompt as one step of sequence 0 over `table`; every row wants logits.
fn step(
    b: &mut CpuBackend,
    r: Range<usize>,
    table: &[u32],
    img: &Arc<[f32]>,
    spans: Spans,
) -> memra_engine::error::Result<Vec<Vec<u32>>> {
    let mut batch = common::seq_step(&tokens(), r.clone(), table, Vec::new());
    for p in r.clone() {
        if IMG.contains(&p) {
            let span = match spans {
                Spans::Image => IMG.start as u32..IMG.end as u32,
                Spans::PerRow => p as u32..p as u32 + 1,
            };
            batch.embeds.push(RowEmbed {
                row: p - r.start,
                values: img.clone(),
                index: p - IMG.start,
                width: HIDDEN,
                span,
            });
        }
    }
    Ok(common::logit_bits(&b.step(&batch)?.logits))
}

/// Every position's logits bits and the KV bytes of blocks 0..5 after prefilling in chunks
/// ending at `ends` (the last is `N`).
fn prefill(ends: &[usize], img: &Arc<[f32]>, spans: Spans) -> (Vec<Vec<u32>>, Vec<Vec<u8>>) {
    let mut b = backend();
    let table: Vec<u32> = (0..5).collect();
    let (mut logits, mut start) = (Vec::new(), 0);
    for &end in ends {
        logits.extend(step(&mut b, start..end, &table, img, spans).expect("step"));
        start = end;
    }
    assert_eq!(start, N);
    let kv = (0..5)
        .map(|blk| b.kv_block_bytes(blk).expect("kv"))
        .collect();
    (logits, kv)
}

#[test]
fn image_rows_attend_to_their_whole_image() {
    let img = image(3);
    let (bidir, _) = prefill(&[N], &img, Spans::Image);
    let (causal, _) = prefill(&[N], &img, Spans::PerRow);
    // Text before the image: unchanged.
    assert_eq!(bidir[..IMG.start], causal[..IMG.start]);
    // The image's rows and the text after it: other logits.
    for p in IMG.start..N {
        assert_ne!(bidir[p], causal[p], "position {p}");
    }
    // The image's first row depends on its last row's embedding only when bidirectional.
    let other = image(99);
    let (bidir2, _) = prefill(&[N], &other, Spans::Image);
    let (causal2, _) = prefill(&[N], &other, Spans::PerRow);
    assert_ne!(bidir2[IMG.start], bidir[IMG.start]);
    assert_eq!(causal2[..IMG.end - 1], causal[..IMG.end - 1]);
}

#[test]
fn chunks_that_hold_the_image_whole_give_the_whole_prefill_s_bits() {
    let img = image(3);
    let whole = prefill(&[N], &img, Spans::Image);
    // Chunk ends before, at the start of, at the end of and after the image.
    let mut one_by_one: Vec<usize> = (1..=IMG.start).collect();
    one_by_one.extend(IMG.end..=N);
    for ends in [
        vec![IMG.start, N],
        vec![IMG.end, N],
        vec![3, IMG.start, IMG.end, 17, N],
        vec![2, IMG.end, N - 1, N],
        one_by_one,
    ] {
        assert_eq!(prefill(&ends, &img, Spans::Image), whole, "chunks {ends:?}");
    }
    // A step that ends inside the image is refused (its rows would miss the image's rest).
    let mut b = backend();
    let table: Vec<u32> = (0..5).collect();
    let e = step(&mut b, 0..IMG.start + 2, &table, &img, Spans::Image).unwrap_err();
    assert!(e.to_string().contains("image"), "{e}");
}

#[test]
fn reused_blocks_ending_inside_the_image_give_the_fresh_bits() {
    let img = image(3);
    let (whole, _) = prefill(&[N], &img, Spans::Image);
    let mut b = backend();
    let first: Vec<u32> = (0..5).collect();
    step(&mut b, 0..N, &first, &img, Spans::Image).expect("step");
    // A second sequence shares blocks 0 and 1 (positions 0..8, ending inside the image at
    // 5..14) and computes the rest in its own blocks, from inside the image.
    let second = [0, 1, 10, 11, 12];
    let rest = step(&mut b, 8..N, &second, &img, Spans::Image).expect("step");
    assert_eq!(rest, whole[8..]);
    for (i, blk) in [(2, 10), (3, 11), (4, 12)] {
        assert_eq!(
            b.kv_block_bytes(blk).unwrap(),
            b.kv_block_bytes(i).unwrap(),
            "block {i}"
        );
    }
}
