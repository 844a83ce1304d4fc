//! The pipeline's memory plan: what each layer costs (weights as the backend stores them, KV
//! bytes per block, recurrent state), where to split the layers so the stages are balanced,
//! and whether each stage fits its device. Pure arithmetic over numbers the caller measures
//! (free memory), so it is tested without a device.

use std::ops::Range;

use crate::backend::cuda::plan::{TensorDesc, Upload, describe, weight_bytes};
use crate::error::{Error, Result};
use crate::kv_format::KvDtype;
use crate::models::{ModelWeights, Role};
use crate::quant::DType;

/// What one decoder layer costs the stage holding it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerCost {
    /// Its tensors as the backend stores them.
    pub weights: usize,
    /// Its K and V of one KV block (0 for a layer without attention KV).
    pub kv_per_block: usize,
    /// Its recurrent state for every slot (gated DeltaNet layers).
    pub state: usize,
}

/// What a model costs, layer by layer, and what only the first or the last stage holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Costs {
    pub layers: Vec<LayerCost>,
    /// The embedding table as the first stage loads it (a lookup table).
    pub first: usize,
    /// The final norm and the output matrix (a tied table: the table again, for lookups
    /// and products) as the last stage loads them.
    pub last: usize,
    /// Working space every stage allocates (activations, scratch; 0 where uncounted).
    pub workspace: usize,
}

/// How a backend stores weights and what it allocates besides them.
#[derive(Clone, Copy)]
pub struct Storage<'a> {
    /// Whether products read a type repacked (the CUDA v2 layout); the CPU stores as loaded.
    pub packs: &'a dyn Fn(DType) -> bool,
    pub block_size: usize,
    pub kv_dtype: KvDtype,
    /// Recurrent-state slots and the bytes one DeltaNet layer takes for them.
    pub state_per_layer: usize,
    /// Working space of one stage.
    pub workspace: usize,
}

impl Costs {
    /// The costs of `w` stored as `s` says.
    pub fn of(w: &ModelWeights, s: &Storage) -> Result<Costs> {
        let c = &w.config;
        let mut layers = vec![LayerCost::default(); c.n_layers];
        let (mut first, mut last) = (0usize, 0usize);
        let one = |d: TensorDesc| weight_bytes(&[d], s.packs);
        for ((role, _), d) in w.iter().zip(describe(w)) {
            match (role, role.layer()) {
                (_, Some(l)) if l < c.n_layers => layers[l].weights += one(d)?,
                // MTP layers belong to the drafter, not to the decoder's stages.
                (_, Some(_)) => {}
                (Role::TokenEmbd, None) if d.upload == Upload::Both => {
                    first += one(TensorDesc {
                        upload: Upload::Lookup,
                        ..d.clone()
                    })?;
                    last += one(d)?;
                }
                (Role::TokenEmbd, None) => first += one(d)?,
                (_, None) => last += one(d)?,
            }
        }
        let row = s.kv_dtype.row_bytes(c.n_kv_heads * c.head_dim);
        for (l, lc) in layers.iter_mut().enumerate() {
            let attention = c.hybrid.as_ref().is_none_or(|p| p.is_attention(l));
            if attention {
                lc.kv_per_block = 2 * s.block_size * row;
            } else {
                lc.state = s.state_per_layer;
            }
        }
        Ok(Costs {
            layers,
            first,
            last,
            workspace: s.workspace,
        })
    }

    /// The bytes stage `i` of `n` holding `layers` takes with a pool of `blocks` KV blocks
    /// (one more is allocated for the CUDA graphs' inert rows).
    pub fn stage(&self, i: usize, n: usize, layers: &Range<usize>, blocks: usize) -> StageBytes {
        let ls = &self.layers[layers.clone()];
        let sum = |f: fn(&LayerCost) -> usize| ls.iter().map(f).fold(0, usize::saturating_add);
        let mut weights = sum(|l| l.weights);
        if i == 0 {
            weights = weights.saturating_add(self.first);
        }
        if i + 1 == n {
            weights = weights.saturating_add(self.last);
        }
        StageBytes {
            weights,
            kv: sum(|l| l.kv_per_block).saturating_mul(blocks.saturating_add(1)),
            state: sum(|l| l.state),
            workspace: self.workspace,
        }
    }

    /// Bytes one KV block takes in `layers`.
    pub fn kv_per_block(&self, layers: &Range<usize>) -> usize {
        self.layers[layers.clone()]
            .iter()
            .map(|l| l.kv_per_block)
            .sum()
    }
}

/// What one stage takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageBytes {
    pub weights: usize,
    pub kv: usize,
    pub state: usize,
    pub workspace: usize,
}

impl StageBytes {
    pub fn total(&self) -> usize {
        self.weights
            .saturating_add(self.kv)
            .saturating_add(self.state)
            .saturating_add(self.workspace)
    }
}

/// Where a stage runs: a device name (`cpu`, `cuda:1`; stages naming the same device share
/// its memory) and its free bytes (`None`: not checked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageDevice {
    pub name: String,
    pub free: Option<usize>,
}

/// One planned stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagePlan {
    pub device: String,
    pub layers: Range<usize>,
    pub bytes: StageBytes,
}

/// The planned split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub stages: Vec<StagePlan>,
    pub kv_blocks: usize,
}

impl Split {
    /// One line: `pp 2: stage 0 cpu layers 0..12 (weights 1.20 GiB, KV 0.50 GiB), stage 1 ...`.
    pub fn summary(&self) -> String {
        let stages: Vec<String> = self
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let b = &s.bytes;
                let state = match b.state {
                    0 => String::new(),
                    n => format!(", state {}", mib(n)),
                };
                format!(
                    "stage {i} {} layers {}..{} (weights {}, KV {}{state})",
                    s.device,
                    s.layers.start,
                    s.layers.end,
                    mib(b.weights),
                    mib(b.kv)
                )
            })
            .collect();
        format!("pp {}: {}", self.stages.len(), stages.join(", "))
    }
}

fn mib(b: usize) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// The layer ranges of `n` stages. `starts` (the first layer of stages `1..n`) when given,
/// checked; else the split that makes the largest stage's fixed bytes (weights and recurrent
/// state) as small as they can be. The KV pool does not enter: it is sized afterwards from
/// what the stages leave ([`auto_blocks`]), and the split must not depend on its size.
pub fn ranges(costs: &Costs, n: usize, starts: Option<&[usize]>) -> Result<Vec<Range<usize>>> {
    let layers = costs.layers.len();
    if n == 0 || n > layers {
        return Err(Error::Input(format!(
            "--pp {n}: the model has {layers} layers; each of the stages needs at least one"
        )));
    }
    let bounds: Vec<usize> = match starts {
        Some(s) => {
            let ok = s.len() + 1 == n
                && s.windows(2).all(|w| w[0] < w[1])
                && s.first().is_none_or(|&f| f > 0)
                && s.last().is_none_or(|&l| l < layers);
            if !ok {
                return Err(Error::Input(format!(
                    "--pp-split {s:?}: expected {} increasing first layers of stages 1..{n}, \
                     each in 1..{layers}",
                    n - 1
                )));
            }
            s.to_vec()
        }
        None => balanced(costs, n),
    };
    let mut edges = vec![0];
    edges.extend(bounds);
    edges.push(layers);
    Ok(edges.windows(2).map(|w| w[0]..w[1]).collect())
}

/// Stage starts minimising the largest stage (dynamic programme over contiguous splits).
fn balanced(costs: &Costs, n: usize) -> Vec<usize> {
    let len = costs.layers.len();
    let weight = |i: usize, r: Range<usize>| {
        let b = costs.stage(i, n, &r, 0);
        b.weights.saturating_add(b.state)
    };
    // best[i][e]: the smallest largest stage of stages 0..=i covering layers 0..e.
    let mut best = vec![vec![usize::MAX; len + 1]; n];
    let mut from = vec![vec![0usize; len + 1]; n];
    for (e, b) in best[0].iter_mut().enumerate().skip(1) {
        *b = weight(0, 0..e);
    }
    for i in 1..n {
        for e in i + 1..=len {
            for s in i..e {
                let prev = best[i - 1][s];
                if prev == usize::MAX {
                    continue;
                }
                let m = prev.max(weight(i, s..e));
                if m < best[i][e] {
                    best[i][e] = m;
                    from[i][e] = s;
                }
            }
        }
    }
    let mut starts = vec![0; n - 1];
    let mut e = len;
    for i in (1..n).rev() {
        e = from[i][e];
        starts[i - 1] = e;
    }
    starts
}

/// The split of `ranges` on `devices` (one per stage) with `blocks` KV blocks, checked
/// against each device's free memory: a stage that does not fit is named with its layers,
/// what it needs and the bytes missing.
pub fn check(
    costs: &Costs,
    ranges: &[Range<usize>],
    devices: &[StageDevice],
    blocks: usize,
) -> Result<Split> {
    if devices.len() != ranges.len() {
        return Err(Error::Input(format!(
            "--pp {}: {} device(s) given (--devices names one per stage)",
            ranges.len(),
            devices.len()
        )));
    }
    let n = ranges.len();
    let stages: Vec<StagePlan> = ranges
        .iter()
        .zip(devices)
        .enumerate()
        .map(|(i, (r, d))| StagePlan {
            device: d.name.clone(),
            layers: r.clone(),
            bytes: costs.stage(i, n, r, blocks),
        })
        .collect();
    for (i, (s, d)) in stages.iter().zip(devices).enumerate() {
        let Some(free) = d.free else { continue };
        // Earlier stages on the same device come first.
        let before: usize = stages[..i]
            .iter()
            .filter(|o| o.device == s.device)
            .map(|o| o.bytes.total())
            .fold(0, usize::saturating_add);
        let need = s.bytes.total();
        let left = free.saturating_sub(before);
        if need > left {
            return Err(not_fit(i, s, free, before, need - left, blocks));
        }
    }
    Ok(Split {
        stages,
        kv_blocks: blocks,
    })
}

fn not_fit(
    i: usize,
    s: &StagePlan,
    free: usize,
    before: usize,
    missing: usize,
    blocks: usize,
) -> Error {
    let b = &s.bytes;
    let shared = match before {
        0 => String::new(),
        n => format!(
            " ({} of it taken by the earlier stages on {})",
            mib(n),
            s.device
        ),
    };
    Error::Input(format!(
        "pipeline stage {i} ({}, layers {}..{}) does not fit: it needs {} (weights {}, KV \
         cache {} for {blocks} blocks, recurrent state {}, working space {}) but {} has {} \
         free{shared}: {} ({missing} bytes) missing; split at other layers (--pp-split), \
         pass fewer KV blocks, use more stages or a smaller quantization",
        s.device,
        s.layers.start,
        s.layers.end,
        mib(b.total()),
        mib(b.weights),
        mib(b.kv),
        mib(b.state),
        mib(b.workspace),
        s.device,
        mib(free),
        mib(missing),
    ))
}

/// KV blocks every stage can hold in its device's free memory (stages on one device share
/// it): per device, `kv_blocks_from_memory` of what its stages leave, the smallest over the
/// devices; `cap` when no device is checked.
pub fn auto_blocks(
    costs: &Costs,
    ranges: &[Range<usize>],
    devices: &[StageDevice],
    (reserve, fraction, cap): (usize, f64, usize),
) -> usize {
    let n = ranges.len();
    let mut blocks = cap;
    let mut seen: Vec<&str> = Vec::new();
    for d in devices {
        let (Some(free), false) = (d.free, seen.contains(&d.name.as_str())) else {
            continue;
        };
        seen.push(&d.name);
        let on: Vec<usize> = (0..n.min(devices.len()))
            .filter(|&i| devices[i].name == d.name)
            .collect();
        let fixed = on
            .iter()
            .map(|&i| {
                let b = costs.stage(i, n, &ranges[i], 0);
                // The pool's extra block is fixed.
                b.total()
            })
            .fold(0usize, usize::saturating_add);
        let per_block = on
            .iter()
            .map(|&i| costs.kv_per_block(&ranges[i]))
            .fold(0usize, usize::saturating_add);
        let fit = crate::kv::kv_blocks_from_memory(
            free.saturating_sub(fixed),
            reserve,
            fraction,
            per_block,
            cap,
        );
        blocks = blocks.min(fit);
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(layers: &[usize], first: usize, last: usize) -> Costs {
        Costs {
            layers: layers
                .iter()
                .map(|&w| LayerCost {
                    weights: w,
                    kv_per_block: 2,
                    state: 0,
                })
                .collect(),
            first,
            last,
            workspace: 7,
        }
    }

    #[test]
    fn the_split_balances_weights_with_the_embedding_and_head() {
        // 8 layers of 10: equal ends split in the middle; a heavy embedding moves it up.
        assert_eq!(
            ranges(&costs(&[10; 8], 25, 25), 2, None).unwrap(),
            [0..4, 4..8]
        );
        assert_eq!(
            ranges(&costs(&[10; 8], 45, 5), 2, None).unwrap(),
            [0..2, 2..8]
        );
        // Uneven layers: the largest stage is as small as it can be.
        let c = costs(&[1, 1, 1, 1, 30, 1, 1, 1], 0, 0);
        assert_eq!(ranges(&c, 2, None).unwrap(), [0..4, 4..8]);
        let r = ranges(&costs(&[10; 9], 0, 0), 3, None).unwrap();
        assert_eq!(r, [0..3, 3..6, 6..9]);
        // One layer a stage at most.
        assert_eq!(
            ranges(&costs(&[10; 2], 0, 0), 2, None).unwrap(),
            [0..1, 1..2]
        );
        assert!(ranges(&costs(&[10; 2], 0, 0), 3, None).is_err());
    }

    #[test]
    fn stage_bytes_count_every_part() {
        let c = costs(&[10; 4], 100, 50);
        let b = c.stage(0, 2, &(0..2), 9);
        assert_eq!(
            b,
            StageBytes {
                weights: 120,
                kv: 4 * 10,
                state: 0,
                workspace: 7
            }
        );
        assert_eq!(c.stage(1, 2, &(2..4), 9).weights, 70);
        assert_eq!(c.stage(0, 1, &(0..4), 0).weights, 190);
    }

    #[test]
    fn auto_blocks_take_the_tightest_device() {
        let c = costs(&[10; 4], 0, 0);
        let r = ranges(&c, 2, Some(&[1])).unwrap();
        let dev = |name: &str, free| StageDevice {
            name: name.into(),
            free: Some(free),
        };
        // Stage 0: fixed 10 + 7 + one extra block (2); per block 2. Stage 1: 30 + 7 + 6; 6.
        let two = [dev("cuda:0", 1000), dev("cuda:1", 1000)];
        let n = auto_blocks(&c, &r, &two, (0, 1.0, 10_000));
        assert_eq!(n, (1000 - 43) / 6);
        // One shared device: both stages' fixed bytes and blocks together.
        let one = [dev("cuda:0", 1000), dev("cuda:0", 1000)];
        let n = auto_blocks(&c, &r, &one, (0, 1.0, 10_000));
        assert_eq!(n, (1000 - 43 - 19) / 8);
        assert_eq!(auto_blocks(&c, &r, &one, (0, 1.0, 5)), 5);
        // Whatever it gives fits.
        assert!(check(&c, &r, &one, (1000 - 43 - 19) / 8).is_ok());
    }
}
