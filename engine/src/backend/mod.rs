//! The narrow Backend trait: run one step over a batch of token rows against a paged KV cache.
//!
//! Everything above it (scheduler, prefix cache, speculation, sampling policy) is backend-agnostic.
//! A backend must be row-invariant (../EXACTNESS.md): a row's logits and KV bytes depend only on
//! that row's token, position and its sequence's earlier KV, never on the other rows or on M.

pub mod cpu;
pub mod cuda;
pub mod exec;
pub mod runner;
pub mod spans;
pub mod state;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
pub use crate::kv_format::KvDtype;
use crate::models::ModelWeights;
use crate::sampling::{
    SampleJob, SamplingParams, apply_mask, logprobs, sample, sample_masked, sample_rows,
};

/// One token row of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRow {
    pub token: u32,
    /// Position of the token in its sequence.
    pub pos: u32,
    /// Index into [`StepBatch::block_tables`].
    pub seq: usize,
    /// Whether the caller wants this row's logits.
    pub want_logits: bool,
}

/// The rows of one step and, per sequence, its KV block table. A row's K/V is written at
/// `block_tables[seq][pos / block_size]`, slot `pos % block_size`; attention reads positions
/// `0..=pos` of the same sequence. Rows of one sequence within a step must be in position order.
///
/// `state_slots` (one per sequence, or empty) names each sequence's recurrent-state slot: a
/// model with gated DeltaNet layers keeps its per-sequence state there (state.rs) and refuses
/// a batch without them; other models ignore them.
#[derive(Clone, Debug, Default)]
pub struct StepBatch {
    pub rows: Vec<StepRow>,
    pub block_tables: Vec<Vec<u32>>,
    pub state_slots: Vec<u32>,
    /// Rows whose input is a given embedding instead of their token's (an image's soft
    /// tokens, crate::vision): at most one per row, in row order. Empty for text-only steps.
    pub embeds: Vec<RowEmbed>,
    /// The M-RoPE positions (temporal, height, width) of every row, for a model whose RoPE has
    /// sections (qwen2vl, qwen3vl: crate::vision::mrope); each at most the row's `pos`. Empty:
    /// every row's are `(pos, pos, pos)` (the scheduler fills them for a step holding a
    /// sequence with images; other models ignore them).
    pub mrope: Vec<[u32; 3]>,
}

/// A step row's input embedding: row `index` of `values` (rows of `width` values), injected
/// after the token embedding and its scaling (`Ops::inject`: the first hidden-size values;
/// Qwen3-VL's deepstack parts after them, `Ops::inject_add`).
#[derive(Clone, Debug, PartialEq)]
pub struct RowEmbed {
    /// The step row.
    pub row: usize,
    pub values: std::sync::Arc<[f32]>,
    pub index: usize,
    /// Values per row of `values`: the model's input embedding width
    /// (`ModelConfig::embed_width`).
    pub width: usize,
    /// The positions of the image the row belongs to (its own position inside). An
    /// architecture whose attention is bidirectional within an image (`AttnParams::spans`,
    /// Gemma 3) lets the row see the whole span: the step must hold the span's last position
    /// or follow a step that did ([`spans::check_spans`]).
    pub span: std::ops::Range<u32>,
}

/// Checks a step's given embeddings: rows in order, inside the step, each naming a whole row
/// of `width` values.
pub fn check_embeds(batch: &StepBatch, width: usize) -> Result<()> {
    let mut next = 0;
    for e in &batch.embeds {
        let ok = e.width == width
            && e.row >= next
            && e.row < batch.rows.len()
            && (e.index + 1)
                .checked_mul(width)
                .is_some_and(|end| end <= e.values.len());
        if !ok {
            return Err(Error::Input(format!(
                "step embedding for row {} (index {} of {} values in rows of {}, the model's \
                 {width}) is out of order or out of range",
                e.row,
                e.index,
                e.values.len(),
                e.width
            )));
        }
        next = e.row + 1;
    }
    Ok(())
}

/// Logits of the rows that asked for them, in row order.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    pub logits: Vec<Vec<f32>>,
}

/// How to pick the next token from one row's logits: exactly `sampling::sample(logits, history,
/// params, pos)` (`sampling::sample_masked` with the row's grammar mask when it has one).
#[derive(Clone, Copy, Debug)]
pub struct SelectParams<'a> {
    pub params: &'a SamplingParams,
    /// The sequence's tokens so far (for the penalties).
    pub history: &'a [u32],
    /// The position of the token being picked (the RNG counter).
    pub pos: u64,
    /// Structured output: the tokens the row's grammar allows (a vocabulary bitmask,
    /// `sampling::apply_mask`); the row's token is `sampling::sample_masked`'s. The host
    /// selection ([`select_on_host`]) is the reference; the CUDA backend picks masked rows on
    /// the device (cuda/select.rs: `mask_rows` before the penalties, then the same argmax /
    /// top-k kernels) and must pick exactly the same token.
    pub mask: Option<&'a [u32]>,
}

/// What [`Backend::step_select`] returns for one row that wanted logits.
#[derive(Clone, Debug, PartialEq)]
pub enum Selected {
    /// The token picked (the row had `Some` select params).
    Token(u32),
    /// The row's logits (the row had `None`).
    Logits(Vec<f32>),
    /// The token picked, its logprob and the most likely alternatives with theirs, exactly as
    /// [`crate::sampling::logprobs`] gives them ([`Backend::step_select_logprobs`] rows that
    /// asked for logprobs).
    Scored {
        token: u32,
        logprob: f32,
        top: Vec<(u32, f32)>,
    },
}

impl Selected {
    /// The result as bits, for bitwise comparisons (gates, tests): a kind tag (0 token, 1
    /// logits, 2 scored) and the token ids and the values' bit patterns in order.
    pub fn bits(&self) -> (u8, Vec<u32>) {
        match self {
            Selected::Token(t) => (0, vec![*t]),
            Selected::Logits(l) => (1, l.iter().map(|v| v.to_bits()).collect()),
            Selected::Scored {
                token,
                logprob,
                top,
            } => {
                let mut v = vec![*token, logprob.to_bits()];
                v.extend(top.iter().flat_map(|(t, l)| [*t, l.to_bits()]));
                (2, v)
            }
        }
    }
}

/// Per row that wanted logits, in row order.
#[derive(Clone, Debug, Default)]
pub struct StepSelected {
    pub rows: Vec<Selected>,
}

/// The grammar masks of one step's picking rows ([`Backend::step_select_lazy_masks`]): one
/// entry per `select` entry, in the same order; `Some` for a row its grammar constrains (a
/// vocabulary bitmask as in [`SelectParams::mask`]).
pub type StepMasks = Vec<Option<Vec<u32>>>;

/// Computes a step's masks when the backend asks for them: once per step, after the forward
/// pass is launched and before any token is picked.
pub type MaskFn<'a> = dyn FnMut() -> Result<StepMasks> + 'a;

/// Receives named intermediates (`attn_norm`, `q`, `k`, `v`, `attn_out`, `ffn_out`, ...) per layer:
/// `(name, layer, rows, values)` with `values.len()` a multiple of `rows`.
pub type DumpFn = Box<dyn FnMut(&str, usize, usize, &[f32]) + Send>;

/// A compute backend holding one model's weights and its KV cache.
pub trait Backend: Send {
    /// Whether steps may carry given embeddings ([`StepBatch::embeds`], image rows): the
    /// architecture injects them and the backend writes them. The default: no.
    fn accepts_embeds(&self) -> bool {
        false
    }

    /// Short name (`cpu`, `cuda:0`).
    fn name(&self) -> String;
    /// The tuned parameters in use, one line (the CUDA device profile), for the startup log
    /// and `/v1/models`; `None` when there are none.
    fn profile(&self) -> Option<String> {
        None
    }
    /// How the model is split over pipeline stages, one line (crate::pipeline), for the
    /// startup log and `/v1/models`; `None` for an unsplit model.
    fn pipeline(&self) -> Option<String> {
        None
    }
    fn config(&self) -> &ModelConfig;
    /// Positions per KV block.
    fn kv_block_size(&self) -> usize;
    /// KV blocks the backend holds.
    fn kv_blocks(&self) -> usize;
    /// The KV cache's element format.
    fn kv_dtype(&self) -> KvDtype;
    /// Runs one step: writes the rows' K/V and returns the logits asked for.
    fn step(&mut self, batch: &StepBatch) -> Result<StepOutput>;
    /// The raw bytes of one KV block (all layers, K then V), for invariance checks.
    fn kv_block_bytes(&self, block: u32) -> Result<Vec<u8>>;
    /// Installs (or removes) a sink for named intermediates; backends may ignore it.
    fn set_dump(&mut self, _dump: Option<DumpFn>) {}
    /// Keeps (or stops keeping) the final hidden state of every row of the following steps:
    /// the residual stream after the last decoder layer, before the output norm (an MTP
    /// drafter's input, spec/mtp.rs). Backends that cannot expose it refuse.
    fn keep_hidden(&mut self, on: bool) -> Result<()> {
        if !on {
            return Ok(());
        }
        Err(Error::Unsupported(format!(
            "mtp speculation is not yet supported on {}",
            self.name()
        )))
    }
    /// The hidden states kept since the last call: (row, values) in step and row order.
    fn take_hidden(&mut self) -> Vec<(StepRow, Vec<f32>)> {
        Vec::new()
    }
    /// How far behind its last step's first row a sequence's next step may start (recurrent
    /// state, state.rs [`state::StateBook::set_keep`]): 0 by default; a draft model, which
    /// rewinds its drafts one step each, asks for more. Other models ignore it.
    fn set_state_keep(&mut self, _positions: usize) {}
    /// Whether [`Backend::save_state`] and [`Backend::restore_state`] work: the model has
    /// recurrent-state layers and the backend can snapshot them. The engine takes prefix-cache
    /// hits for a recurrent model only then.
    fn state_snapshots(&self) -> bool {
        false
    }
    /// The most snapshots the backend holds (ids `0..n`), when it holds a fixed number (the
    /// GPU allocates them up front); `None`: as many as asked for.
    fn state_snapshot_capacity(&self) -> Option<usize> {
        None
    }
    /// Stores state slot `slot`'s recurrent state as of position `pos` (every position
    /// `< pos` folded in, and the convolution inputs of positions `pos - K + 1 .. pos`) as
    /// snapshot `snap`, replacing any earlier snapshot of that id. Valid iff the slot holds
    /// state committed at `C` and written to `W` with `C <= pos <= W` (state.rs): the state at
    /// `pos` is then computed by replaying the kept inputs of `C..pos` from the committed
    /// state, the same arithmetic as a step, so it has the bits the sequence's own steps give
    /// it there. The slot itself is unchanged. An error otherwise (and the snapshot id then
    /// holds no snapshot).
    fn save_state(&mut self, _slot: u32, _pos: u32, _snap: u32) -> Result<()> {
        Err(Error::Unsupported(format!(
            "recurrent-state snapshots are not supported on {}",
            self.name()
        )))
    }
    /// Loads snapshot `snap` into state slot `slot` (state and convolution tail); the slot is
    /// then committed and written to the snapshot's position, which is returned: the slot's
    /// next step must start there. An error for an unknown snapshot (the slot then holds no
    /// state).
    fn restore_state(&mut self, _slot: u32, _snap: u32) -> Result<u32> {
        Err(Error::Unsupported(format!(
            "recurrent-state snapshots are not supported on {}",
            self.name()
        )))
    }
    /// Runs one step like [`Backend::step`] and picks tokens: `select` has one entry per row
    /// that wants logits (in row order); `Some` rows get the token `sampling::sample` picks from
    /// their logits, `None` rows get their logits. The default runs `step` and samples on the
    /// host; a backend may pick on the device, but must pick exactly the same token.
    fn step_select(
        &mut self,
        batch: &StepBatch,
        select: &[Option<SelectParams>],
    ) -> Result<StepSelected> {
        check_select(batch, select)?;
        let out = self.step(batch)?;
        Ok(select_on_host(out.logits, select))
    }
    /// [`Backend::step_select`] where some rows also want logprobs: a row with `Some(n)` in
    /// `logprobs` (and `Some` select params) gets [`Selected::Scored`] with the `n` most likely
    /// alternatives; the others are as in `step_select`. The default asks `step_select` for the
    /// logits of the logprob rows only (the other rows, masked ones included, are picked as the
    /// backend picks them, on the device for CUDA) and scores those rows on the host (under
    /// their mask when they have one). A backend may score on the device
    /// (returning only the k pairs), but must give exactly the same token and values.
    fn step_select_logprobs(
        &mut self,
        batch: &StepBatch,
        select: &[Option<SelectParams>],
        logprobs: &[Option<usize>],
    ) -> Result<StepSelected> {
        check_select(batch, select)?;
        check_logprobs(select, logprobs)?;
        let out = self.step_select(batch, &logits_for_scoring(select, logprobs))?;
        Ok(score_on_host(out, select, logprobs))
    }
    /// [`Backend::step_select_logprobs`] with the rows' grammar masks computed late, so that
    /// the host computes them while the device runs the forward pass (a row's forward never
    /// depends on its mask; only its pick does). `masks` is called once, after the forward
    /// pass of `batch` is launched and before any token is picked; its entry `i` becomes the
    /// `mask` of `select[i]` (replacing the one given there; a `None` row must get `None`).
    /// The result is exactly `step_select_logprobs` with those masks in `select`, token for
    /// token and bit for bit. An error from `masks` is the step's error; the rows' KV may
    /// then have been written, as after any failed step.
    ///
    /// The default computes the masks first, then runs `step_select_logprobs` (no overlap).
    /// The generic runner (runner.rs, the CPU and CUDA backends) launches the forward first:
    /// on the CPU that is the whole forward, on CUDA the kernels (or the step's graph) are
    /// enqueued and not waited for.
    fn step_select_lazy_masks(
        &mut self,
        batch: &StepBatch,
        select: &[Option<SelectParams>],
        logprobs: &[Option<usize>],
        masks: &mut MaskFn,
    ) -> Result<StepSelected> {
        check_select(batch, select)?;
        check_logprobs(select, logprobs)?;
        let m = masks()?;
        let select = with_masks(select, &m)?;
        self.step_select_logprobs(batch, &select, logprobs)
    }
}

/// Checks that `logprobs` has one entry per `select` entry.
pub fn check_logprobs(select: &[Option<SelectParams>], logprobs: &[Option<usize>]) -> Result<()> {
    if logprobs.len() != select.len() {
        return Err(Error::Input(format!(
            "step_select_logprobs: {} logprob entries for {} rows",
            logprobs.len(),
            select.len()
        )));
    }
    Ok(())
}

/// The selection the default [`Backend::step_select_logprobs`] asks the backend for: rows that
/// want logprobs come back as logits (`None`), for [`score_on_host`]; the others as given.
pub fn logits_for_scoring<'a>(
    select: &[Option<SelectParams<'a>>],
    logprobs: &[Option<usize>],
) -> Vec<Option<SelectParams<'a>>> {
    select
        .iter()
        .zip(logprobs)
        .map(|(s, lp)| if lp.is_some() { None } else { *s })
        .collect()
}

/// `select` with each entry's mask replaced by its entry of `masks`
/// ([`Backend::step_select_lazy_masks`]): one entry per row, and none for a `None` row.
pub fn with_masks<'a>(
    select: &[Option<SelectParams<'a>>],
    masks: &'a [Option<Vec<u32>>],
) -> Result<Vec<Option<SelectParams<'a>>>> {
    if masks.len() != select.len() {
        return Err(Error::Input(format!(
            "step_select_lazy_masks: {} masks for {} rows",
            masks.len(),
            select.len()
        )));
    }
    select
        .iter()
        .zip(masks)
        .enumerate()
        .map(|(i, (s, m))| match (s, m) {
            (Some(s), m) => Ok(Some(SelectParams {
                mask: m.as_deref(),
                ..*s
            })),
            (None, None) => Ok(None),
            (None, Some(_)) => Err(Error::Input(format!(
                "step_select_lazy_masks: a mask for row {i}, which returns its logits"
            ))),
        })
        .collect()
}

/// The host side of the default [`Backend::step_select_logprobs`]: rows that came back as
/// logits because they want logprobs or have a grammar mask are sampled (under their mask)
/// and, when asked, scored (the logprobs are those of the masked distribution).
pub fn score_on_host(
    out: StepSelected,
    select: &[Option<SelectParams>],
    want: &[Option<usize>],
) -> StepSelected {
    let rows = out
        .rows
        .into_iter()
        .zip(select.iter().zip(want))
        .map(|(row, sel)| match (row, sel) {
            (Selected::Logits(mut l), (Some(s), n)) => {
                let token = match s.mask {
                    Some(m) => {
                        let t = sample_masked(&l, s.history, s.params, s.pos, m);
                        apply_mask(&mut l, m);
                        t
                    }
                    None => sample(&l, s.history, s.params, s.pos),
                };
                match n {
                    Some(n) => {
                        let (logprob, top) = logprobs(&l, s.history, s.params, token, *n);
                        Selected::Scored {
                            token,
                            logprob,
                            top,
                        }
                    }
                    None => Selected::Token(token),
                }
            }
            (row, _) => row,
        })
        .collect();
    StepSelected { rows }
}

/// Checks every row of `batch` against the vocabulary and the KV cache (`blocks` blocks of
/// `block_size` positions) of backend `backend`: its sequence has a block table that reaches
/// its position, and every block the row uses exists.
pub fn check_batch(
    batch: &StepBatch,
    vocab: usize,
    block_size: usize,
    blocks: usize,
    backend: &str,
) -> Result<()> {
    let err = |what: String| Error::Backend {
        backend: backend.to_string(),
        what,
    };
    for (i, r) in batch.rows.iter().enumerate() {
        if r.token as usize >= vocab {
            return Err(Error::Input(format!(
                "token id {} is outside the vocabulary (size {vocab})",
                r.token
            )));
        }
        let table = batch
            .block_tables
            .get(r.seq)
            .ok_or_else(|| err(format!("row {i}: sequence {} has no block table", r.seq)))?;
        let need = r.pos as usize / block_size;
        let used = table.get(..=need).ok_or_else(|| {
            err(format!(
                "row {i}: position {} is beyond its block table",
                r.pos
            ))
        })?;
        if let Some(b) = used.iter().find(|&&b| b as usize >= blocks) {
            return Err(err(format!("row {i}: KV block {b} does not exist")));
        }
    }
    check_mrope(batch)
}

/// Checks a step's M-RoPE positions: none, or one triple per row, each component at most the
/// row's position (so a table of the context's positions holds them).
pub fn check_mrope(batch: &StepBatch) -> Result<()> {
    if batch.mrope.is_empty() {
        return Ok(());
    }
    if batch.mrope.len() != batch.rows.len() {
        return Err(Error::Input(format!(
            "step: {} M-RoPE positions for {} rows",
            batch.mrope.len(),
            batch.rows.len()
        )));
    }
    for (i, (r, m)) in batch.rows.iter().zip(&batch.mrope).enumerate() {
        if m.iter().any(|&v| v > r.pos) {
            return Err(Error::Input(format!(
                "row {i}: M-RoPE positions {m:?} past its position {}",
                r.pos
            )));
        }
    }
    Ok(())
}

/// Checks that `select` has one entry per row that wants logits.
pub fn check_select(batch: &StepBatch, select: &[Option<SelectParams>]) -> Result<()> {
    let want = batch.rows.iter().filter(|r| r.want_logits).count();
    if want != select.len() {
        return Err(Error::Input(format!(
            "step_select: {} select entries for {want} rows that want logits",
            select.len()
        )));
    }
    Ok(())
}

/// The host selection: `sample` (`sample_masked` for masked rows) for `Some` rows, the logits
/// for `None` rows.
pub fn select_on_host(logits: Vec<Vec<f32>>, select: &[Option<SelectParams>]) -> StepSelected {
    let jobs: Vec<(&[f32], SelectParams)> = logits
        .iter()
        .zip(select)
        .filter_map(|(l, s)| s.map(|s| (l.as_slice(), s)))
        .collect();
    let mut tokens = pick_on_host(&jobs).into_iter();
    let rows = logits
        .into_iter()
        .zip(select)
        .map(|(l, s)| match s {
            Some(_) => Selected::Token(tokens.next().unwrap_or_default()),
            None => Selected::Logits(l),
        })
        .collect();
    StepSelected { rows }
}

/// The token of each `(logits, params)` row on the host: [`sample_masked`] for a masked row,
/// [`sample`] otherwise (the unmasked rows together through [`sample_rows`], in parallel when
/// they are many). In order.
pub fn pick_on_host(rows: &[(&[f32], SelectParams)]) -> Vec<u32> {
    let jobs: Vec<SampleJob> = rows
        .iter()
        .filter(|(_, s)| s.mask.is_none())
        .map(|(l, s)| (*l, s.history, s.params, s.pos))
        .collect();
    let mut plain = sample_rows(&jobs).into_iter();
    rows.iter()
        .map(|(l, s)| match s.mask {
            Some(m) => sample_masked(l, s.history, s.params, s.pos, m),
            None => plain.next().unwrap_or_default(),
        })
        .collect()
}

/// Which backend to run on, as given by `--device auto|cpu|cuda[:N]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Auto,
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    crate::Error::Input(format!("device `{s}`: expected auto, cpu, cuda or cuda:N"))
                }),
        }
    }
}

/// Opens the backend `device` asks for: `auto` picks CUDA device 0 when available, else the CPU;
/// `cuda:N` without CUDA is an error saying so. `threads` applies to the CPU backend only.
pub fn open_backend(
    device: Device,
    weights: ModelWeights,
    (kv_blocks, block_size, kv_dtype): (usize, usize, KvDtype),
    threads: usize,
) -> Result<Box<dyn Backend>> {
    let opts = OpenOptions {
        kv_blocks,
        block_size,
        threads,
        graphs: cuda::graphs_default(),
        kv_dtype,
        state_slots: DEFAULT_STATE_SLOTS,
    };
    open_backend_opts(device, weights, &opts)
}

/// Recurrent-state slots of a backend opened without a scheduler's count (a model with gated
/// DeltaNet layers: one slot per sequence a step may hold; the CPU grows them on use).
pub const DEFAULT_STATE_SLOTS: usize = 64;

/// Options of [`open_backend_opts`].
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions {
    /// KV blocks to allocate.
    pub kv_blocks: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// CPU worker threads (0 = all cores).
    pub threads: usize,
    /// Run CUDA steps of up to 64 rows as CUDA graphs (ignored by the CPU backend).
    pub graphs: bool,
    /// Recurrent-state slots allocated up front (CUDA; the CPU grows them on use).
    pub state_slots: usize,
    /// The KV cache's element format.
    pub kv_dtype: KvDtype,
}

/// The CPU backend's part of the options (the pipeline's CPU stages take the same).
impl From<&OpenOptions> for cpu::CpuOptions {
    fn from(o: &OpenOptions) -> cpu::CpuOptions {
        cpu::CpuOptions {
            threads: o.threads,
            kv_blocks: o.kv_blocks,
            block_size: o.block_size,
            kv_dtype: o.kv_dtype,
        }
    }
}

/// [`open_backend`] with every option explicit.
pub fn open_backend_opts(
    device: Device,
    weights: ModelWeights,
    o: &OpenOptions,
) -> Result<Box<dyn Backend>> {
    let cpu = |w| -> Result<Box<dyn Backend>> {
        Ok(Box::new(cpu::CpuBackend::new(
            w,
            &cpu::CpuOptions::from(o),
        )?))
    };
    let cuda = |w, n| -> Result<Box<dyn Backend>> {
        let opts = cuda::CudaOptions {
            device: n,
            kv_blocks: o.kv_blocks,
            block_size: o.block_size,
            graphs: o.graphs,
            kv_dtype: o.kv_dtype,
            state_slots: o.state_slots,
        };
        Ok(Box::new(cuda::CudaBackend::new(w, &opts)?))
    };
    match device {
        Device::Cpu => cpu(weights),
        Device::Auto if cuda::cuda_available() => cuda(weights, 0),
        Device::Auto => cpu(weights),
        Device::Cuda(n) => match cuda::device_count() {
            Ok(c) if n < c => cuda(weights, n),
            Ok(c) => Err(Error::Input(format!(
                "--device cuda:{n}: {c} CUDA device(s) present; use --device cpu"
            ))),
            Err(e) => Err(Error::Input(format!(
                "--device cuda:{n}: CUDA is not available ({e}); use --device cpu"
            ))),
        },
    }
}
